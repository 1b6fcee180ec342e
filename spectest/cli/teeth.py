"""``spectest teeth``: run only the reference, the null and the ε / mutant arms of a protocol."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spectest.cli.common import boundary, exit_with, print_result, progress_bars


@boundary
def teeth(
    config: Annotated[Path, typer.Option("--config", "-c", help="Protocol YAML file.")],
    out: Annotated[
        Path | None, typer.Option(help="Run directory (default: <output>/<name>-<hash>-teeth).")
    ] = None,
    device: Annotated[str | None, typer.Option(help="Override models.device: cpu or cuda.")] = None,
    seeds: Annotated[
        int | None, typer.Option(help="Override seeds.per_arm (and the teeth's default).")
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set", metavar="KEY=VALUE", help="Override any field (YAML value; repeatable)."
        ),
    ] = None,
    threads: Annotated[
        int | None,
        typer.Option(
            help="torch CPU threads (default 1 unless OMP_NUM_THREADS is set; see README)."
        ),
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show progress bars on stderr.")] = True,
) -> None:
    """Check the harness's teeth: the null must pass, every ε arm and mutant must be killed."""
    from spectest.protocol import load_protocol
    from spectest.runner import run_protocol

    protocol = load_protocol(
        config, overrides={"models.device": device, "seeds.per_arm": seeds}, sets=set_ or []
    )
    with progress_bars(progress) as cb:
        result = run_protocol(protocol, out=out, progress=cb, teeth_only=True, threads=threads)
    print_result(result)
    exit_with(result.verdict.exit_code)
