"""``spectest analyze``: recompute every test of a completed run from its stored Parquet."""

from __future__ import annotations

from spectest.cli.common import ProgressOpt, RunDirArg, boundary, progress_bars
from spectest.cli.printing import show_result
from spectest.cli.supervised import (
    DEFAULT_TIMEOUT_S,
    engines_only,
    protocol_plugins,
    supervise_or_continue,
)


@boundary
def analyze(
    run_dir: RunDirArg,
    progress: ProgressOpt = True,
) -> None:
    """Recompute the tests and the verdict from stored samples, without any model."""
    # the stored protocol's entry-point engines are imported (kernels are not): supervised
    plugins = engines_only(protocol_plugins(run_dir / "protocol.yaml"))
    supervise_or_continue(plugins, DEFAULT_TIMEOUT_S, verdict=True)
    from spectest.analyze import analyze_run

    with progress_bars(progress) as cb:
        result = analyze_run(run_dir, progress=cb)
    show_result(result)  # exits with the stored verdict's code, even if printing fails
