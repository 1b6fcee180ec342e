"""``spectest hunt``: run every set-up engine's speculative-vs-plain protocol, print one table.

Thin: calls ``spectest.hunt.hunt`` and prints its rows (a rich table) plus ``hunt.json``."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from spectest.cli.common import boundary, console


@boundary
def hunt(
    out: Annotated[Path, typer.Option("--out", help="where the runs go")] = Path("results/hunt"),
    only: Annotated[
        list[str] | None,
        typer.Option("--only", help="protocol name(s) to run (default: every hunted engine)"),
    ] = None,
    seeds: Annotated[
        int | None, typer.Option("--seeds", help="seeds per arm for every run (a quick look)")
    ] = None,
) -> None:
    """Which of this machine's engines preserve the law: each engine that is set up runs its
    shipped speculative-vs-plain protocol (its own `spectest run`); the others are listed with
    the command that sets them up. Exit 0 when every run that ran gave a verdict."""
    from spectest.hunt import hunt as run_hunt

    extra = ["--seeds", str(seeds)] if seeds else []
    rows = run_hunt(out, tuple(only or ()), extra)
    print_table(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hunt.json").write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    typer.echo(
        f"hunt: {sum(r.status == 'ran' for r in rows)} of {len(rows)} engines ran; "
        f"table in {out / 'hunt.json'}"
    )
    if any(r.status == "ran" and r.exit_code not in (0, 1, 3) for r in rows):
        raise typer.Exit(4)


def print_table(rows: list[Any]) -> None:
    """One row per hunted engine (``spectest.hunt.HuntRow``), wide enough not to wrap."""
    from rich.console import Console

    table = Table(title="spectest hunt: speculative vs plain, per engine")
    notes = any(r.note for r in rows)
    for col in (
        "engine",
        "version",
        "protocol",
        "verdict",
        "rejections",
        "max TV excess",
        "seeds",
        "wall (s)",
        *(["note"] if notes else []),
    ):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r.engine,
            r.version,
            r.protocol,
            f"{r.verdict} ({r.exit_code})" if r.status == "ran" else "not set up",
            "" if r.rejections is None else str(r.rejections),
            "" if r.max_tv_excess is None else f"{r.max_tv_excess:.3f}",
            r.seeds,
            "" if r.wall_s is None else f"{r.wall_s:.0f}",
            *([r.note] if notes else []),
        )
    Console(highlight=False, width=max(console().width, 150)).print(table)
