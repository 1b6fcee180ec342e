"""``spectest report``: write report.md and a self-contained report.html for a completed run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spectest.cli.common import boundary, console
from spectest.report.escape import printable


@boundary
def report(
    run_dir: Annotated[
        Path, typer.Argument(help="A completed run directory (with manifest.json).")
    ],
    junit: Annotated[Path | None, typer.Option(help="Also write JUnit XML here.")] = None,
    summary_md: Annotated[
        Path | None, typer.Option(help="Also write a markdown summary here.")
    ] = None,
) -> None:
    """Render the reports of a run from its stored results (nothing is recomputed)."""
    from spectest.report import write_reports

    for path in write_reports(run_dir, junit=junit, summary_md=summary_md):
        console().print(f"wrote {printable(path)}", markup=False)
