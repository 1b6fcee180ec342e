"""``spectest run``: load a protocol (with overrides), run it, print the verdict, exit with it."""

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
    err_console,
    progress_bars,
    show_result,
)
from spectest.report.escape import printable


@boundary
def run(
    config: ConfigOpt,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Run directory (default: <protocol output>/<name>-<hash>; re-running resumes)."
        ),
    ] = None,
    device: DeviceOpt = None,
    seeds: Annotated[int | None, typer.Option(help="Override seeds.per_arm.")] = None,
    positions: Annotated[
        int | None, typer.Option(help="Override positions (tokens per sequence).")
    ] = None,
    set_: SetOpt = None,
    junit: Annotated[Path | None, typer.Option(help="Also write JUnit XML here.")] = None,
    summary_md: Annotated[
        Path | None, typer.Option(help="Also write a markdown summary here (CI step summary).")
    ] = None,
    threads: ThreadsOpt = None,
    progress: ProgressOpt = True,
    fast: Annotated[
        bool,
        typer.Option(
            help="Run the built-in arms (teeth included) on the fast engine: static KV cache, "
            "CUDA graphs on CUDA, sort-free sampling; same tokens (README 'Speed')."
        ),
    ] = False,
    devices: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated devices, one worker process each (e.g. cuda:0,cuda:1; cpu,cpu). "
            "Default: every visible GPU of a cuda run."
        ),
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            help="Run the shards as Ray tasks: auto (this host's cluster), an address, or local "
            "(needs spectest[ray])."
        ),
    ] = None,
) -> None:
    """Run a protocol: generate both arms and the teeth, store, test, print the verdict."""
    from spectest.protocol import load_protocol
    from spectest.runner import run_protocol

    protocol = load_protocol(
        config,
        overrides={"models.device": device, "seeds.per_arm": seeds, "positions": positions},
        sets=set_ or [],
    )
    from spectest.shipped import shipped_name

    if shipped_name(protocol.source) and not Path(config).is_file():
        shipped = printable(protocol.source)
        err_console().print(f"using the shipped protocol {shipped}", markup=False)
    with progress_bars(progress) as cb:
        result = run_protocol(
            protocol, out=out, progress=cb, junit=junit, summary_md=summary_md, threads=threads,
            fast=fast, ray=ray,
            devices=[d.strip() for d in devices.split(",") if d.strip()] if devices else None,
        )  # fmt: skip
    show_result(result)  # exits with the stored verdict's code, even if printing fails
