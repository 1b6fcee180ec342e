"""``spectest report``: write report.md and a self-contained report.html for a completed run."""

from __future__ import annotations

from typing import Annotated

import typer

from spectest.cli.common import JunitOpt, RunDirArg, boundary, console, optional_output
from spectest.report.escape import printable


@boundary
def report(
    run_dir: RunDirArg,
    junit: JunitOpt = None,
    summary_md: Annotated[
        str | None, typer.Option(help="Also write a markdown summary here (empty: skipped).")
    ] = None,
) -> None:
    """Render the reports of a run from its stored results (nothing is recomputed)."""
    from spectest.report import write_reports

    junit_path = optional_output(junit, "--junit")
    summary_path = optional_output(summary_md, "--summary-md")
    for path in write_reports(run_dir, junit=junit_path, summary_md=summary_path):
        console().print(f"wrote {printable(path)}", markup=False)
