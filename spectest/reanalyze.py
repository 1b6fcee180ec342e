"""Re-analysis: every test and the verdict of a completed run, again, from its stored Parquet.

Owns: ``analyze_run`` (``spectest analyze``): read a run directory (no model is loaded and the
directory is not modified), rebuild its arms and test settings — a protocol run's from its
stored ``protocol.yaml`` (refused when its hash is not ``run.json``'s; a sequential run at its
last look's α), a comparison's from its summary — and decide through ``spectest.judge`` as the
run did. The result's summary is printed, not stored.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from spectest.compare import byo_arms
from spectest.errors import InputError
from spectest.generation import readout_arms, whitebox_mode
from spectest.judge import (
    NumericsClaim,
    RunResult,
    TokenFloorClaim,
    compare_all,
    judge,
    token_floor_claim,
)
from spectest.plan import Arm, make_plan
from spectest.progress import ProgressFn, no_progress
from spectest.protocol import TestsSpec, load_protocol
from spectest.store import NUMERICS, ROUNDS, SAMPLES, TOOTH_SIZES, StoredRun, load_run
from spectest.summary import Header, build_summary


def analyze_run(run_dir: str | Path, *, progress: ProgressFn | None = None) -> RunResult:
    """Recompute every test and the verdict of a completed run from its stored Parquet."""
    t0 = time.perf_counter()
    stored = load_run(run_dir)
    samples = stored.table(SAMPLES)
    if samples is None:
        raise InputError(f"{stored.path}: no {SAMPLES} in the run directory")
    rounds = stored.table(ROUNDS)
    kind = str(stored.info.get("kind", "run"))
    arms, options, key, max_mde, readout, numerics = _settings(stored)
    results = compare_all(samples, rounds, arms, options, key, progress or no_progress, readout)
    comparisons, verdict = judge(
        results, max_mde, kind=kind, rounds=rounds, sizes=stored.table(TOOTH_SIZES),
        numerics=numerics,
    )  # fmt: skip
    base = stored.summary
    was = base["verdict"]["decision"]
    header = Header(
        kind=str(base.get("kind")),
        name=str(base.get("name")),
        protocol_hash=base.get("protocol_hash"),
        analysis=base.get("analysis"),
        notes=(f"re-analysed from stored samples; stored decision was {was!r}",),
    )
    summary = build_summary(header, run_dir=stored.path, comparisons=comparisons, verdict=verdict)
    return RunResult(stored.path, verdict, comparisons, summary, 0, 0, time.perf_counter() - t0)


def _settings(
    stored: StoredRun,
) -> tuple[
    list[Arm], Any, str, float | None, frozenset[str], NumericsClaim | TokenFloorClaim | None
]:
    """(arms, the statistics' options, the analysis key, the power requirement, the readout
    arms, matched numerics mode's claim (b) from the stored ``numerics.parquet``) as the run
    had them."""
    if stored.info.get("kind") == "compare":
        tests = TestsSpec.from_canonical(stored.summary["analysis"])
        return byo_arms(), tests.analysis_options(), "compare", tests.max_mde_tv, frozenset(), None
    pf = stored.protocol_file
    if pf is None:
        raise InputError(f"{stored.path}: no protocol.yaml in the run directory")
    protocol = load_protocol(pf)
    if protocol.hash != stored.info.get("protocol_hash"):
        raise InputError(f"{pf}: its hash differs from run.json's: the run directory was edited")
    # a sequential run stored the samples of its last look: re-test them at that look's α
    looks = (stored.summary.get("sequential") or {}).get("looks") or []
    plan = make_plan(
        protocol,
        teeth_only=stored.info.get("kind") == "teeth",
        stage=looks[-1]["stage"] if looks else None,
    )
    arms = list(plan.arms)
    tests = replace(protocol.tests, alpha=looks[-1]["alpha"]) if looks else protocol.tests
    options = tests.analysis_options(whitebox_mode(protocol.models.dtype, arms))
    numerics: NumericsClaim | TokenFloorClaim | None = (
        NumericsClaim(stored.table(NUMERICS), tests.numerics_margin, protocol.tests.alpha,
                      tests.numerics_floor)
        if plan.matched
        else None
    )  # fmt: skip
    samples = stored.table(SAMPLES) if protocol.floor is not None else None
    if protocol.floor is not None and samples is not None:  # issue 31: the floor arm's claim
        f = protocol.floor
        numerics = token_floor_claim(samples, arms, f.margin, tests.alpha, protocol.hash, f.kind)
    return (
        arms, options, protocol.seeds.key, protocol.tests.max_mde_tv, readout_arms(arms),
        numerics,
    )  # fmt: skip
