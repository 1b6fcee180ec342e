"""``spectest run``: load a protocol (with overrides), run it, print the verdict, exit with it;
and ``spectest teeth``: the same run of the reference, the null and the ε / mutant arms only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spectest.cli.common import (
    ConfigOpt,
    DeviceOpt,
    JunitOpt,
    ProgressOpt,
    SetOpt,
    ThreadsOpt,
    boundary,
    optional_output,
    progress_bars,
)
from spectest.cli.printing import show_result
from spectest.cli.supervised import (
    DEFAULT_TIMEOUT_S,
    PluginTimeoutOpt,
    protocol_plugins,
    supervise_or_continue,
)

# `spectest run`'s own options (the shared ones are in cli.common)
FastOpt = Annotated[
    bool,
    typer.Option(
        help="Run the built-in arms (teeth included) on the fast engine: static KV cache, "
        "CUDA graphs on CUDA, sort-free sampling; same tokens (docs/speed.md)."
    ),
]
DevicesOpt = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated devices, one worker process each (e.g. cuda:0,cuda:1; cpu,cpu). "
        "Default: every visible GPU of a cuda run."
    ),
]
RayOpt = Annotated[
    str | None,
    typer.Option(
        help="Run the shards on Ray actors: auto (this host's cluster), an address, or local "
        "(needs spectest[ray])."
    ),
]
AnalysisProcsOpt = Annotated[
    int | None,
    typer.Option(
        help="Processes for the sequence family's permutation statistics (cells spread "
        "over them; same results). Default: this process."
    ),
]
ReuseOpt = Annotated[
    Path | None,
    typer.Option(
        help="Take the generation of this run directory (a protocol that differs only in "
        "settings decided after generation, e.g. tests.numerics_floor_sequences): its shards "
        "are copied, claim (b) and the tests run again (docs/run-directory.md)."
    ),
]
OutOpt = Annotated[
    Path | None,
    typer.Option(
        help="Run directory (default: <protocol output>/<name>-<hash>; re-running resumes)."
    ),
]
SeedsOpt = Annotated[int | None, typer.Option(help="Override seeds.per_arm.")]
PositionsOpt = Annotated[int | None, typer.Option(help="Override positions (tokens per sequence).")]
SummaryMdOpt = Annotated[
    str | None,
    typer.Option(help="Also write a markdown summary here (CI step summary; empty: skipped)."),
]


@boundary
def run(
    config: ConfigOpt,
    out: OutOpt = None,
    device: DeviceOpt = None,
    seeds: SeedsOpt = None,
    positions: PositionsOpt = None,
    set_: SetOpt = None,
    junit: JunitOpt = None,
    summary_md: SummaryMdOpt = None,
    threads: ThreadsOpt = None,
    progress: ProgressOpt = True,
    fast: FastOpt = False,
    devices: DevicesOpt = None,
    ray: RayOpt = None,
    analysis_procs: AnalysisProcsOpt = None,
    reuse: ReuseOpt = None,
    plugin_timeout: PluginTimeoutOpt = DEFAULT_TIMEOUT_S,
) -> None:
    """Run a protocol: generate both arms and the teeth, store, test, print the verdict."""
    supervise_or_continue(protocol_plugins(config, set_ or []), plugin_timeout, verdict=True)
    from spectest.protocol import load_protocol
    from spectest.runner import RunOptions, run_dir_for, run_protocol

    junit_path = optional_output(junit, "--junit")
    summary_path = optional_output(summary_md, "--summary-md")
    with progress_bars(progress) as cb:  # from the start: loading torch takes seconds
        cb("load protocol", 0, 1)
        protocol = load_protocol(
            config,
            overrides={"models.device": device, "seeds.per_arm": seeds, "positions": positions},
            sets=set_ or [],
        )
        from spectest.readiness import require_ready
        from spectest.shipped import shipped_name

        require_ready(protocol)  # a missing engine set-up: one line, exit 4, before any work
        if shipped_name(protocol.source) and not Path(config).is_file():
            cb.say(f"using the shipped protocol {protocol.source}")
        cb("load protocol", 1, 1)
        run_dir = run_dir_for(protocol, out)
        cb.header(
            f"spectest run {protocol.name}  protocol {protocol.hash[:12]}  → {run_dir}"
        )  # the header first; the result repeats it on stdout
        options = RunOptions(
            fast=fast,
            threads=threads,
            devices=tuple(d.strip() for d in (devices or "").split(",") if d.strip()),
            ray=ray,
            analysis_procs=analysis_procs,
            reuse=reuse,
        )
        result = run_protocol(
            protocol,
            out=out,
            options=options,
            progress=cb,
            junit=junit_path,
            summary_md=summary_path,
        )
    show_result(result)  # exits with the stored verdict's code, even if printing fails


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
