"""``spectest protocols``: list the shipped protocols with what each needs on this machine."""

from __future__ import annotations

import typer

from spectest.cli.common import boundary


def _needs_column(path: str) -> str:
    """``ready``, or what is missing (``needs spectest setup llamacpp``, ``needs GPU``)."""
    import yaml

    from spectest.readiness import file_needs

    try:
        with open(path, encoding="utf-8") as f:
            needs = file_needs(yaml.safe_load(f))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        return f"unreadable ({type(err).__name__})"
    missing = [n.what for n in needs if not n.ready]
    if missing:
        return "needs " + ", ".join(missing)
    return "ready" + (f" ({', '.join(n.what.split()[-1] for n in needs)})" if needs else "")


@boundary
def protocols() -> None:
    """List the protocols shipped with spectest, one per line: name, whether it can run on this
    machine now (``ready``, or ``needs spectest setup ENGINE`` / ``needs GPU``), description.
    ``spectest run --config NAME`` runs one from anywhere; a local file of that name wins."""
    from spectest.errors import InfrastructureError
    from spectest.shipped import list_shipped, shipped_dir

    items = list_shipped()
    if not items:
        raise InfrastructureError(
            "no shipped protocols in this install (spectest/protocols_data is missing)"
        )
    status = {p.name: _needs_column(str(p.file)) for p in items}
    width = max(len(p.name) for p in items)
    swidth = max(len(s) for s in status.values())
    for p in items:
        typer.echo(f"{p.name:<{width}}  {status[p.name]:<{swidth}}  {p.description}")
    n_ready = sum(s.startswith("ready") for s in status.values())
    typer.echo(
        f"({len(items)} protocols in {shipped_dir()}, {n_ready} ready here; "
        "run one: spectest run --config NAME; set one up: spectest setup ENGINE)"
    )
