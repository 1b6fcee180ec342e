"""``spectest compare``: black-box tests on two samples files an external engine produced."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from spectest.cli.common import ProgressOpt, boundary, progress_bars
from spectest.cli.printing import show_result
from spectest.errors import ConfigError

FromRunOpt = Annotated[
    Path | None,
    typer.Option(
        help="A stored run directory instead of --reference/--candidate: compare two of its "
        "arms (--arms; docs/compare.md).",
        readable=False,
    ),
]
ArmsOpt = Annotated[
    str,
    typer.Option(
        help="With --from-run: CANDIDATE,REFERENCE arms of the run (e.g. null,reference or "
        "mutant:always_accept,reference)."
    ),
]
DecideFloorOpt = Annotated[
    bool,
    typer.Option(
        help="With --floor: decide claim (b) from the four files (within: can pass; beyond: "
        "exit 1; unresolved: exit 3) instead of the readout (docs/numerics.md).",
    ),
]
FloorMarginOpt = Annotated[
    float | None,
    typer.Option(
        help="With --decide-floor: the margin in TV per token, applied to the squared-L2 "
        "statistic as 2m² (default 0.01; docs/numerics.md).",
    ),
]
ReferenceOpt = Annotated[
    Path | None,
    typer.Option(help="Samples of plain decoding (Parquet, or CSV with a header).", readable=False),
]
CandidateOpt = Annotated[
    Path | None,
    typer.Option(help="Samples of the speculative sampler under test.", readable=False),
]
FloorOpt = Annotated[
    tuple[Path, Path] | None,
    typer.Option(
        help="Two plain-decode samples files of the engine (A B, e.g. in the serving batch "
        "and alone): prints the token-law drift of reference vs candidate beside A vs B "
        "(a readout, docs/numerics.md; no verdict changes).",
        readable=False,
    ),
]


def _arm_pair(
    from_run: Path | None, reference: Path | None, candidate: Path | None, arms: str
) -> tuple[str, str]:
    """``--arms`` as (candidate, reference), after checking the sources fit together."""
    pair = tuple(a.strip() for a in arms.split(","))
    if from_run is not None and (reference is not None or candidate is not None):
        raise ConfigError("compare: --from-run DIR takes no --reference / --candidate")
    for opt, given in (("--reference", reference), ("--candidate", candidate)):
        if from_run is None and given is None:
            raise ConfigError(f"compare: Missing option '{opt}' (or give --from-run DIR)")
    if len(pair) != 2 or not all(pair):
        raise ConfigError(f"--arms: expected CANDIDATE,REFERENCE, got {arms!r}")
    return pair[0], pair[1]


@boundary
def compare(
    reference: ReferenceOpt = None,
    candidate: CandidateOpt = None,
    alpha: Annotated[
        float, typer.Option(help="Significance level after the multiplicity correction.")
    ] = 0.05,
    multiplicity: Annotated[str, typer.Option(help="bh, by or maxT.")] = "bh",
    max_mde_tv: Annotated[
        float | None,
        typer.Option(
            help="Required resolution: the median per-cell MDE (TV) must be at most this, else "
            "exit 3. Default 0.15 (compare runs no teeth; README 'Reading the verdict'); "
            "1 accepts any."
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Result directory (default: results/compare-<hash>).")
    ] = None,
    progress: ProgressOpt = True,
    floor: FloorOpt = None,
    decide_floor: DecideFloorOpt = False,
    floor_margin: FloorMarginOpt = None,
    from_run: FromRunOpt = None,
    arms: ArmsOpt = "candidate,reference",
) -> None:
    """Compare two samples files (or two arms of a run: --from-run). Columns: prompt_id
    (string), config_id (string), seed (int64), position (int32, 0 = first generated token),
    token_id (int64); one row per generated token."""
    from spectest.byo_compare import compare_files, compare_run_arms

    pair = _arm_pair(from_run, reference, candidate, arms)
    kw: dict[str, Any] = dict(
        alpha=alpha,
        multiplicity=multiplicity,
        max_mde_tv=max_mde_tv,
        out=out,
        floor=floor,
        decide_floor=decide_floor,
        floor_margin=floor_margin,
    )
    with progress_bars(progress) as cb:
        if from_run is not None:
            result = compare_run_arms(from_run, pair, progress=cb, **kw)
        else:
            assert reference is not None and candidate is not None
            result = compare_files(reference, candidate, progress=cb, **kw)
    if "token_drift" in result.summary:
        typer.echo(result.summary["token_drift"]["line"])
    show_result(result)  # exits with the stored verdict's code, even if printing fails
