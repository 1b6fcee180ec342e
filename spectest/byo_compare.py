"""Bring your own samples: ``spectest compare`` on two files an external engine produced (the
pair checked, the arms and settings of a comparison, its result directory).

The why and the details: docs/internals.md "spectest/byo_compare.py".
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from spectest import schema
from spectest.byo import checked_samples, read_samples_file
from spectest.decision.claims import TokenFloorClaim, stable_seed
from spectest.decision.header import Header
from spectest.decision.judge import RunResult, compare_all, finish_run
from spectest.errors import ConfigError, InputError
from spectest.files import make_provenance
from spectest.plan import Arm, RunSettings, SeedRange
from spectest.progress import ProgressFn, no_progress
from spectest.stats.options import AnalysisOptions, OptionError, flags
from spectest.store import RunDir

FLAGS = flags()  # a setting → its flag (``stats.options.Option.flag``)


def byo_arms() -> list[Arm]:
    return [
        Arm("reference", "reference", None, SeedRange(0, 0), "reference"),
        Arm("candidate", "candidate", None, SeedRange(0, 0), "subject"),
    ]


def byo_tests(**given: Any) -> AnalysisOptions:
    """A comparison's test settings: the ``given`` ones (None: the default; a setting with a
    ``FLAGS`` entry), the protocols' defaults otherwise, and no white-box family (the files hold
    tokens only). A value its rules refuse is one line naming the flag."""
    try:
        return AnalysisOptions(**{k: v for k, v in given.items() if v is not None}, whitebox=False)
    except OptionError as err:
        flag = FLAGS.get(err.option, err.option)
        raise ConfigError(f"{flag}: {err.rule}, got {err.value!r}") from None


def byo_settings(tests: AnalysisOptions) -> RunSettings:
    """A comparison's run-level settings: ``tests`` as they are, no readout arm, no teeth."""
    return RunSettings(options=tests, key="compare", run_alpha=tests.alpha)


def _cells(df: pd.DataFrame) -> set[tuple[Any, ...]]:
    return set(map(tuple, df[list(schema.CELL)].drop_duplicates().to_numpy().tolist()))


def _odd_cell(a: set[tuple[Any, ...]], b: set[tuple[Any, ...]]) -> tuple[int, Any, int]:
    """Where two cell sets differ: the side (0: ``a``) holding the first cell the other lacks,
    that cell, and how many cells are not shared."""
    only = (sorted(a - b), sorted(b - a))
    side = 0 if only[0] else 1
    return side, only[side][0], len(only[0]) + len(only[1])


def _check_floor(
    paths: tuple[str | Path, str | Path], pair: list[pd.DataFrame], cells: set[tuple[Any, ...]]
) -> None:
    """The floor pair holds the same cells as each other and shares one with the comparison;
    else one line naming the file."""
    got = [_cells(df) for df in pair]
    if got[0] != got[1]:
        side, cell, _ = _odd_cell(*got)
        raise InputError(
            f"{paths[side]}: cell (prompt_id, config_id) = {cell!r} is not in the other --floor "
            "file (the floor pair must hold the same cells)"
        )
    if not got[0] & cells:
        raise InputError(
            f"{paths[0]}: the --floor files share no cell (prompt_id, config_id) with the "
            "reference and candidate"
        )


def _floor_margin(
    floor: tuple[str | Path, str | Path] | None, decide: bool, margin: float | None
) -> float | None:
    """The margin claim (b) is decided at (None: the readout only); one line naming the flag
    when the flags do not fit together."""
    from spectest.stats.token_floor import DEFAULT_TOKEN_MARGIN

    if margin is not None and not (0 < margin < 1):
        raise ConfigError(f"--floor-margin: expected a TV per token in (0, 1), got {margin!r}")
    if (decide or margin is not None) and floor is None:
        flag = "--decide-floor" if decide else "--floor-margin"
        raise ConfigError(f"{flag}: needs --floor A B (two plain-decode files of the engine)")
    if not decide:
        if margin is not None:
            raise ConfigError("--floor-margin: only with --decide-floor (the readout has none)")
        return None
    return DEFAULT_TOKEN_MARGIN if margin is None else float(margin)


def _digest(frames: list[pd.DataFrame], tests: AnalysisOptions, margin: float | None) -> str:
    """The comparison's hash: the data of every file and the settings (a claim-(b) decision,
    ``margin`` set, has its own)."""
    digest = hashlib.sha256()
    for df in frames:
        digest.update(
            pd.util.hash_pandas_object(df[[f.name for f in schema.BYO_SCHEMA]], index=False)
            .to_numpy()
            .tobytes()
        )
    digest.update(repr(sorted(tests.canonical().items())).encode())
    h = digest.hexdigest()
    if margin is None:
        return h
    return hashlib.sha256(f"{h}\x1ftoken-floor\x1f{margin!r}".encode()).hexdigest()


def _same_cells(
    reference: str | Path, candidate: str | Path, ref: pd.DataFrame, cand: pd.DataFrame
) -> set[tuple[Any, ...]]:
    """The cells both files hold; one line naming the file with a cell the other lacks."""
    got, files = (_cells(ref), _cells(cand)), (reference, candidate)
    if got[0] != got[1]:
        side, cell, n = _odd_cell(*got)
        raise InputError(
            f"{files[side]}: cell (prompt_id, config_id) = {cell!r} is not in {files[1 - side]} "
            f"({n} cell(s) not shared; the two files must hold the same cells)"
        )
    return got[0]


def _floor_outputs(
    ref: pd.DataFrame,
    cand: pd.DataFrame,
    pair: list[pd.DataFrame],
    margin: float | None,
    alpha: float,
    h: str,
) -> tuple[dict[str, Any], TokenFloorClaim | None]:
    """``--floor``'s token-drift readout (no margin; its bootstrap seeded by the comparison's
    hash) or its claim-(b) decision (``--decide-floor``)."""
    from spectest.stats.token_floor import token_drift

    if not pair:
        return {}, None
    if margin is None:
        rng = np.random.default_rng(stable_seed("token-drift", h))
        drift = token_drift(ref, cand, pair[0], pair[1], alpha=alpha, rng=rng)
        return {"token_drift": drift.to_dict()}, None
    return {}, TokenFloorClaim(ref, cand, pair[0], pair[1], margin, alpha, h, "floor pair A vs B")


def _read_floor(
    floor: tuple[str | Path, str | Path] | None,
    reference: str | Path,
    ref: pd.DataFrame,
    cells_r: Any,
) -> list[pd.DataFrame]:
    """The floor pair's samples (a floor file that is the reference file itself is ``ref``),
    checked against the comparison's cells; [] without ``--floor``."""
    if floor is None:
        return []
    same = [Path(f).resolve() == Path(reference).resolve() for f in floor]
    pair = [ref if s else read_samples_file(f) for s, f in zip(same, floor, strict=True)]
    _check_floor(floor, pair, cells_r)
    return pair


def _two_arms(ref: pd.DataFrame, cand: pd.DataFrame) -> pd.DataFrame:
    """The two files as one samples table (arms reference, candidate). Engine-reported
    probabilities, when a file has them, are kept: claim (a) from them (the reported-p family;
    no teacher here, so no cross-check); every other extra column is dropped."""
    samples = pd.concat(
        [ref.assign(**{schema.ARM: "reference"}), cand.assign(**{schema.ARM: "candidate"})],
        ignore_index=True,
    )
    reported = [c for c in schema.REPORTED_COLUMNS if c in samples.columns]
    return samples[[f.name for f in schema.SAMPLES_SCHEMA] + reported]


def compare_files(
    reference: str | Path,
    candidate: str | Path,
    *,
    alpha: float | None = None,
    multiplicity: str | None = None,
    max_mde_tv: float | None = None,
    out: str | Path | None = None,
    progress: ProgressFn | None = None,
    floor: tuple[str | Path, str | Path] | None = None,
    decide_floor: bool = False,
    floor_margin: float | None = None,
    frames: tuple[pd.DataFrame, pd.DataFrame] | None = None,
) -> RunResult:
    """The ``RunResult`` of the black-box tests on two bring-your-own samples files, stored
    like a run's (docs/compare.md).

    Parameters
    ----------
    alpha, multiplicity, max_mde_tv : None: the protocols' defaults (``AnalysisOptions``,
        ``decision.claims.DEFAULT_MAX_MDE_TV``).
    floor : two plain-decode files of the engine: the token-drift readout in ``summary.json``;
        with ``decide_floor``, claim (b) decided at ``floor_margin`` instead (docs/compare.md
        "Claim (b) from files: `--floor A B --decide-floor`").
    frames : the two files' samples, already read (``checked_samples``): ``compare_run_arms``.
    """
    t0 = time.perf_counter()
    tests = byo_tests(alpha=alpha, multiplicity=multiplicity, max_mde_tv=max_mde_tv)
    margin = _floor_margin(floor, decide_floor, floor_margin)
    ref, cand = frames or (read_samples_file(reference), read_samples_file(candidate))
    pair = _read_floor(floor, reference, ref, _same_cells(reference, candidate, ref, cand))
    samples = _two_arms(ref, cand)
    h = _digest([ref, cand, *pair], tests, margin)
    run_dir = Path(out) if out is not None else Path("results") / f"compare-{h[:10]}"
    src = (str(reference), str(candidate))  # as run.json and the header name them
    info: dict[str, Any] = {"kind": "compare", "protocol_hash": h, "name": "compare"}
    info |= {"reference": src[0], "candidate": src[1]}
    if floor is not None:
        info["floor"] = [str(f) for f in floor]
    rd = RunDir.open(run_dir, info, replace=True)  # nothing to resume: a re-run replaces it
    provenance = make_provenance(protocol_hash=h, device="n/a", seed_ranges={}, kind="compare")
    settings = byo_settings(tests)
    results = compare_all(samples, None, byo_arms(), settings, progress or no_progress)
    name = f"{Path(src[0]).name} vs {Path(src[1]).name}"
    extra, claim = _floor_outputs(ref, cand, pair, margin, tests.alpha, h)
    verdict, comparisons, summary = finish_run(
        rd,
        samples=samples,
        rounds=None,
        results=results,
        header=Header("compare", name, h, tests.canonical()),
        provenance=provenance,
        settings=settings,
        junit=None,
        summary_md=None,
        extra=extra,
        numerics=claim,
    )
    return RunResult(rd.path, verdict, comparisons, summary, 0, 0, time.perf_counter() - t0)


def compare_run_arms(
    run_dir: str | Path, arms: tuple[str, str] = ("candidate", "reference"), **kw: Any
) -> RunResult:
    """``compare_files`` on two arms of a stored run (``spectest compare --from-run DIR``):
    the rows of ``samples.parquet`` whose ``arm`` is ``arms[1]`` (the reference side) and
    ``arms[0]`` (the candidate side), with the bring-your-own columns only (``arm`` and the
    ``wb_*`` white-box columns dropped), checked as a samples file would be. The run must be
    complete (``stored.load_run``); an arm it does not hold is one line listing the arms it
    does. ``kw``: ``compare_files``'s options."""
    from spectest.store import SAMPLES
    from spectest.stored import load_run

    stored = load_run(run_dir)
    samples = stored.table(SAMPLES)
    if samples is None:
        raise InputError(f"{stored.path}: no {SAMPLES} in this run directory")
    held = list(dict.fromkeys(samples[schema.ARM]))
    for arm in arms:
        if arm not in held:
            raise ConfigError(
                f"--from-run {run_dir}: --arms: no arm {arm!r} in {stored.path / SAMPLES} "
                f"(its arms: {', '.join(map(str, held))})"
            )
    cols = [f.name for f in schema.BYO_SCHEMA]
    names = [f"{stored.path / SAMPLES}[arm={a}]" for a in (arms[1], arms[0])]
    ref, cand = (
        checked_samples(
            Path(name), samples.loc[samples[schema.ARM] == arm, cols].reset_index(drop=True)
        )
        for name, arm in zip(names, (arms[1], arms[0]), strict=True)
    )
    return compare_files(names[0], names[1], frames=(ref, cand), **kw)
