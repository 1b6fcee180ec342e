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
    show_result,
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
) -> None:
    """Check the harness's teeth: the null must pass, every ε arm and mutant must be killed."""
    from spectest.protocol import load_protocol
    from spectest.runner import run_protocol

    protocol = load_protocol(
        config, overrides={"models.device": device, "seeds.per_arm": seeds}, sets=set_ or []
    )
    with progress_bars(progress) as cb:
        result = run_protocol(protocol, out=out, progress=cb, teeth_only=True, threads=threads)
    show_result(result)  # exits with the stored verdict's code, even if printing fails
