"""Re-analysis (``spectest analyze``, ``analyze_run``): every test and the verdict of a completed
run, again, from its stored Parquet; no model loaded, nothing written.

The why and the details: docs/internals.md "spectest/analyze.py".
"""

from __future__ import annotations

import time
from pathlib import Path

from spectest.byo_compare import byo_arms, byo_settings
from spectest.decision.claims import run_claim_b
from spectest.decision.header import Header
from spectest.decision.judge import RunResult, compare_all, judge
from spectest.decision.summary import build_summary
from spectest.errors import InputError
from spectest.plan import Plan, make_plan
from spectest.progress import ProgressFn, no_progress
from spectest.protocol import load_protocol
from spectest.stats.options import AnalysisOptions
from spectest.store import NUMERICS, ROUNDS, SAMPLES, TEACHER_LAWS, TOOTH_SIZES
from spectest.stored import StoredRun, load_run


def analyze_run(run_dir: str | Path, *, progress: ProgressFn | None = None) -> RunResult:
    """Recompute every test and the verdict of a completed run from its stored Parquet."""
    t0 = time.perf_counter()
    stored = load_run(run_dir)
    samples = stored.table(SAMPLES)
    if samples is None:
        raise InputError(f"{stored.path}: no {SAMPLES} in the run directory")
    rounds = stored.table(ROUNDS)
    kind = str(stored.info.get("kind", "run"))
    if kind == "compare":
        arms, settings = (
            byo_arms(),
            byo_settings(AnalysisOptions.from_canonical(stored.summary["analysis"])),
        )
        numerics = None
    else:
        plan = _plan(stored)
        arms, settings = list(plan.arms), plan.settings
        laws = stored.table(TEACHER_LAWS)
        numerics = run_claim_b(plan, samples, stored.table(NUMERICS), laws)
    results = compare_all(samples, rounds, arms, settings, progress or no_progress)
    comparisons, verdict = judge(
        results,
        settings,
        kind=kind,
        rounds=rounds,
        sizes=stored.table(TOOTH_SIZES),
        numerics=numerics,
    )
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


def _plan(stored: StoredRun) -> Plan:
    """The plan of a protocol run as the run had it, from its stored ``protocol.yaml`` (its
    settings: ``Plan.settings``); a sequential run at its last look's stage (and α)."""
    pf = stored.protocol_file
    if pf is None:
        raise InputError(f"{stored.path}: no protocol.yaml in the run directory")
    protocol = load_protocol(pf)
    if protocol.hash != stored.info.get("protocol_hash"):
        raise InputError(f"{pf}: its hash differs from run.json's: the run directory was edited")
    # a sequential run stored the samples of its last look: re-test them at that look's α
    looks = (stored.summary.get("sequential") or {}).get("looks") or []
    return make_plan(
        protocol,
        teeth_only=stored.info.get("kind") == "teeth",
        stage=looks[-1]["stage"] if looks else None,
    )
