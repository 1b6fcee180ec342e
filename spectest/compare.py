"""Bring your own samples: ``spectest compare`` on two files an external engine produced.

Owns: reading and checking the pair of files (same cells in both), the arms and test settings of
a comparison (no teeth, no white-box), its result directory (``results/compare-<hash>``, hashed on
the data and the settings). Knows nothing about models; the tests and the verdict go through the
same ``judge.compare_all`` / ``judge.finish_run`` as a protocol run.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from spectest import schema
from spectest.byo import read_samples_file
from spectest.errors import ConfigError, InputError
from spectest.files import make_provenance
from spectest.judge import RunResult, TokenFloorClaim, compare_all, finish_run
from spectest.plan import Arm, SeedRange
from spectest.progress import ProgressFn, no_progress
from spectest.protocol import TestsSpec
from spectest.stats.analyze import OptionError
from spectest.store import RunDir
from spectest.summary import Header

FLAGS = {"alpha": "--alpha", "multiplicity": "--multiplicity", "max_mde_tv": "--max-mde-tv"}


def byo_arms() -> list[Arm]:
    return [
        Arm("reference", "reference", None, SeedRange(0, 0), "reference"),
        Arm("candidate", "candidate", None, SeedRange(0, 0), "subject"),
    ]


def byo_tests(**given: Any) -> TestsSpec:
    """A comparison's test settings: the ``given`` ones (None: the default), the protocol's
    defaults otherwise, and no white-box family (the files hold tokens only). A value its rules
    refuse is one line naming the flag."""
    try:
        return TestsSpec(**{k: v for k, v in given.items() if v is not None}, whitebox=False)
    except OptionError as err:
        flag = FLAGS.get(err.option, err.option)
        raise ConfigError(f"{flag}: {err.rule}, got {err.value!r}") from None


def _check_floor(
    paths: tuple[str | Path, str | Path], pair: list[pd.DataFrame], cells: set[tuple[Any, ...]]
) -> None:
    """The floor pair holds the same cells as each other and shares one with the comparison;
    else one line naming the file."""
    got = [
        set(map(tuple, df[list(schema.CELL)].drop_duplicates().to_numpy().tolist())) for df in pair
    ]
    if got[0] != got[1]:
        which, cell = (
            (paths[0], sorted(got[0] - got[1]))
            if got[0] - got[1]
            else (paths[1], sorted(got[1] - got[0]))
        )
        raise InputError(
            f"{which}: cell (prompt_id, config_id) = {cell[0]!r} is not in the other --floor "
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


def _digest(frames: list[pd.DataFrame], tests: TestsSpec) -> str:
    """The comparison's hash: the data of every file and the settings."""
    digest = hashlib.sha256()
    for df in frames:
        digest.update(
            pd.util.hash_pandas_object(df[[f.name for f in schema.BYO_SCHEMA]], index=False)
            .to_numpy()
            .tobytes()
        )
    digest.update(repr(sorted(tests.canonical().items())).encode())
    return digest.hexdigest()


def _readout(
    ref: pd.DataFrame, cand: pd.DataFrame, pair: list[pd.DataFrame], alpha: float, h: str
) -> dict[str, Any]:
    """``--floor``'s token-drift readout, its bootstrap seeded by the comparison's hash."""
    from spectest.judge import stable_seed
    from spectest.stats.token_drift import token_drift

    rng = np.random.default_rng(stable_seed("token-drift", h))
    return token_drift(ref, cand, pair[0], pair[1], alpha=alpha, rng=rng).to_dict()


def _same_cells(
    reference: str | Path, candidate: str | Path, ref: pd.DataFrame, cand: pd.DataFrame
) -> set[tuple[Any, ...]]:
    """The cells both files hold; one line naming the file with a cell the other lacks."""
    cells_r = set(map(tuple, ref[list(schema.CELL)].drop_duplicates().to_numpy().tolist()))
    cells_c = set(map(tuple, cand[list(schema.CELL)].drop_duplicates().to_numpy().tolist()))
    if cells_r != cells_c:
        only_r, only_c = sorted(cells_r - cells_c), sorted(cells_c - cells_r)
        which, cell, other = (
            (reference, only_r[0], candidate) if only_r else (candidate, only_c[0], reference)
        )
        raise InputError(
            f"{which}: cell (prompt_id, config_id) = {cell!r} is not in {other} "
            f"({len(only_r) + len(only_c)} cell(s) not shared; "
            "the two files must hold the same cells)"
        )
    return cells_r


def _floor_outputs(
    ref: pd.DataFrame,
    cand: pd.DataFrame,
    pair: list[pd.DataFrame],
    margin: float | None,
    alpha: float,
    h: str,
) -> tuple[dict[str, Any], TokenFloorClaim | None]:
    """``--floor``'s readout (no margin) or its claim-(b) decision (``--decide-floor``)."""
    if not pair:
        return {}, None
    if margin is None:
        return {"token_drift": _readout(ref, cand, pair, alpha, h)}, None
    return {}, TokenFloorClaim(ref, cand, pair[0], pair[1], margin, alpha, h, "floor pair A vs B")


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
) -> RunResult:
    """Black-box tests on two bring-your-own samples files; results stored like a run's.

    ``alpha``, ``multiplicity``: None = the protocols' defaults (``TestsSpec``).
    ``max_mde_tv``: the required per-cell resolution (median MDE in TV); ``None`` applies
    ``spectest.verdict.DEFAULT_MAX_MDE_TV``, since a comparison runs no teeth (see there).
    ``floor``: two plain-decode files of the engine (A, B): the token-drift readout
    (``stats.token_drift``) is stored in ``summary.json`` as ``token_drift``; no verdict changes.
    ``decide_floor`` (needs ``floor``): claim (b) decided from the four files instead
    (``stats.token_floor``: within / beyond = exit 1 / unresolved = exit 3 at ``floor_margin``,
    TV per token, default ``token_floor.DEFAULT_TOKEN_MARGIN``), in the verdict and stored as
    ``verdict.numerics``; the readout is then not printed. A floor file that is the reference
    file itself (the same path) is resampled jointly with it.
    """
    t0 = time.perf_counter()
    progress = progress or no_progress
    tests = byo_tests(alpha=alpha, multiplicity=multiplicity, max_mde_tv=max_mde_tv)
    margin = _floor_margin(floor, decide_floor, floor_margin)
    ref = read_samples_file(reference)
    cand = read_samples_file(candidate)
    cells_r = _same_cells(reference, candidate, ref, cand)
    pair: list[pd.DataFrame] = []
    if floor is not None:
        same = [Path(f).resolve() == Path(reference).resolve() for f in floor]
        pair = [ref if s else read_samples_file(f) for s, f in zip(same, floor, strict=True)]
        _check_floor(floor, pair, cells_r)
    samples = pd.concat(
        [ref.assign(**{schema.ARM: "reference"}), cand.assign(**{schema.ARM: "candidate"})],
        ignore_index=True,
    )
    samples = samples[[f.name for f in schema.SAMPLES_SCHEMA]]
    h = _digest([ref, cand, *pair], tests)
    if margin is not None:  # a decision has its own settings: its own hash
        h = hashlib.sha256(f"{h}\x1ftoken-floor\x1f{margin!r}".encode()).hexdigest()
    run_dir = Path(out) if out is not None else Path("results") / f"compare-{h[:10]}"
    rd = RunDir.open(
        run_dir,
        {
            "kind": "compare",
            "protocol_hash": h,
            "name": "compare",
            "reference": str(reference),
            "candidate": str(candidate),
            **({"floor": [str(f) for f in floor]} if floor is not None else {}),
        },
        replace=True,  # nothing to resume: a re-run (after a failure, or of new data) replaces it
    )
    provenance = make_provenance(protocol_hash=h, device="n/a", seed_ranges={}, kind="compare")
    results = compare_all(samples, None, byo_arms(), tests.analysis_options(), "compare", progress)
    name = f"{Path(reference).name} vs {Path(candidate).name}"
    extra, claim = _floor_outputs(ref, cand, pair, margin, tests.alpha, h)
    verdict, comparisons, summary = finish_run(
        rd,
        samples=samples,
        rounds=None,
        results=results,
        header=Header("compare", name, h, tests.canonical()),
        provenance=provenance,
        max_mde_tv=max_mde_tv,
        junit=None,
        summary_md=None,
        extra=extra,
        numerics=claim,
    )
    return RunResult(rd.path, verdict, comparisons, summary, 0, 0, time.perf_counter() - t0)
