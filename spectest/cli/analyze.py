"""``spectest analyze``: recompute every test of a completed run from its stored Parquet."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spectest.cli.common import boundary, progress_bars
from spectest.cli.printing import show_result
from spectest.cli.supervised import (
    DEFAULT_TIMEOUT_S,
    engines_only,
    protocol_plugins,
    supervise_or_continue,
)


@boundary
def analyze(
    run_dir: Annotated[
        Path, typer.Argument(help="A completed run directory (with manifest.json).")
    ],
    progress: Annotated[bool, typer.Option(help="Show progress bars on stderr.")] = True,
) -> None:
    """Recompute the tests and the verdict from stored samples, without any model."""
    # the stored protocol's entry-point engines are imported (kernels are not): supervised
    plugins = engines_only(protocol_plugins(run_dir / "protocol.yaml"))
    supervise_or_continue(plugins, DEFAULT_TIMEOUT_S, verdict=True)
    from spectest.analyze import analyze_run

    with progress_bars(progress) as cb:
        result = analyze_run(run_dir, progress=cb)
    show_result(result)  # exits with the stored verdict's code, even if printing fails
