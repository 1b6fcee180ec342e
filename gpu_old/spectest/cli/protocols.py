"""``spectest protocols``: list the shipped protocols with their one-line descriptions."""

from __future__ import annotations

import typer

from spectest.cli.common import boundary


@boundary
def protocols() -> None:
    """List the protocols shipped with spectest, one per line: name, then description
    (``spectest run --config NAME`` runs one from anywhere; a local file of that name wins)."""
    from spectest.errors import InfrastructureError
    from spectest.shipped import list_shipped, shipped_dir

    items = list_shipped()
    if not items:
        raise InfrastructureError(
            "no shipped protocols in this install (spectest/protocols_data is missing)"
        )
    width = max(len(p.name) for p in items)
    for p in items:
        typer.echo(f"{p.name:<{width}}  {p.description}")
    typer.echo(f"({len(items)} protocols in {shipped_dir()}; run one: spectest run --config NAME)")
