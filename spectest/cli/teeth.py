"""``spectest teeth``: run only the reference, the null and the ε / mutant arms of a protocol."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spectest.cli.common import (
    ConfigOpt,
    DeviceOpt,
    ProgressOpt,
    SetOpt,
    ThreadsOpt,
    boundary,
    progress_bars,
)
from spectest.cli.printing import show_result
from spectest.cli.supervised import (
    DEFAULT_TIMEOUT_S,
    PluginTimeoutOpt,
    protocol_plugins,
    supervise_or_continue,
)


@boundary
def teeth(
    config: ConfigOpt,
    out: Annotated[
        Path | None, typer.Option(help="Run directory (default: <output>/<name>-<hash>-teeth).")
    ] = None,
    device: DeviceOpt = None,
    seeds: Annotated[
        int | None, typer.Option(help="Override seeds.per_arm (and the teeth's default).")
    ] = None,
    set_: SetOpt = None,
    threads: ThreadsOpt = None,
    progress: ProgressOpt = True,
    plugin_timeout: PluginTimeoutOpt = DEFAULT_TIMEOUT_S,
) -> None:
    """Check the harness's teeth: the null must pass, every ε arm and mutant must be killed."""
    supervise_or_continue(protocol_plugins(config, set_ or []), plugin_timeout, verdict=True)
    from spectest.protocol import load_protocol
    from spectest.runner import RunOptions, run_protocol

    protocol = load_protocol(
        config, overrides={"models.device": device, "seeds.per_arm": seeds}, sets=set_ or []
    )
    with progress_bars(progress) as cb:
        options = RunOptions(teeth_only=True, threads=threads)
        result = run_protocol(protocol, out=out, options=options, progress=cb)
    show_result(result)  # exits with the stored verdict's code, even if printing fails
