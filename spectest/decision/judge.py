"""Judging a run: every arm against its reference (``compare_all``), judged (``judge``), the
final files and reports written (``finish_run``), from data only. The details:
docs/internals.md "spectest/decision/judge.py".
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from spectest import schema
from spectest.decision.claims import (
    ClaimB,
    TeacherForcedClaim,
    TokenFloorClaim,
    stable_seed,
)
from spectest.decision.comparison import Comparison, compare_arm
from spectest.decision.header import Header
from spectest.decision.summary import build_summary, json_safe
from spectest.decision.verdict import Verdict, decide
from spectest.plan import Arm, RunSettings
from spectest.progress import ProgressFn
from spectest.store import (
    HISTOGRAMS,
    HISTOGRAMS_SCHEMA,
    NUMERICS,
    ROUNDS,
    SAMPLES,
    SEQUENCE,
    SUMMARY,
    TEACHER_LAWS,
    TESTS,
    TOOTH_SIZES,
    TRIE,
    WHITEBOX,
    RunDir,
    samples_schema,
)


@dataclass(frozen=True)
class RunResult:
    """What a run / analysis / comparison produced. ``summary`` is what ``summary.json`` holds."""

    run_dir: Path
    verdict: Verdict
    comparisons: tuple[Comparison, ...]
    summary: dict[str, Any]
    shards_generated: int
    shards_resumed: int
    wall_s: float


def compare_all(
    samples: pd.DataFrame,
    rounds: pd.DataFrame | None,
    arms: Sequence[Arm],
    settings: RunSettings,
    progress: ProgressFn,
    executor: Any = None,
) -> list[tuple[Arm, Any]]:
    """Every non-reference arm analysed against its reference (``plan.reference_for``) with
    ``settings.options``, seeded by ``settings.key``; the readout arms' rounds
    (``settings.readout``) are stored, not tested. ``executor``: runs the per-cell permutation
    statistics (``stats.battery.analyze``)."""
    from spectest.plan import REFERENCE_ROLES, reference_for
    from spectest.stats.battery import analyze

    out = []
    readout_rounds = settings.readout
    comps = [a for a in arms if a.role not in REFERENCE_ROLES]
    for i, arm in enumerate(comps):
        progress("analyze", i, len(comps))
        ref = reference_for(list(arms), arm)  # matched numerics mode: the matched arm
        sub = samples[samples[schema.ARM].isin([ref, arm.name])]
        tested = [a for a in (ref, arm.name) if a not in readout_rounds]
        rsub = (
            None
            if rounds is None or arm.name in readout_rounds
            else rounds[rounds[schema.ARM].isin(tested)]
        )
        analysis = analyze(
            sub,
            reference=ref,
            candidate=arm.name,
            options=settings.options,
            rounds=rsub,
            rng_seed=stable_seed(settings.key, arm.name),
            executor=executor,
            # the reported-p family's round slots read readout rounds too
            all_rounds=None if rounds is None else rounds[rounds[schema.ARM].isin([ref, arm.name])],
        )
        out.append((arm, analysis))
    progress("analyze", len(comps), len(comps))
    return out


def judge(
    results: Sequence[tuple[Arm, Any]],
    settings: RunSettings,
    *,
    kind: str = "run",
    rounds: pd.DataFrame | None = None,
    sizes: pd.DataFrame | None = None,
    numerics: ClaimB | None = None,
) -> tuple[tuple[Comparison, ...], Verdict]:
    """Every analysis summarised, and the decision over them at ``settings.max_mde_tv``
    (``kind``: run, teeth, compare; ``rounds``, ``sizes``: see ``comparison.compare_arm``;
    ``numerics``: matched numerics mode, with claim (b) decided from its table)."""
    comparisons = tuple(compare_arm(a, arm, rounds, sizes) for arm, a in results)
    drift = numerics.result() if numerics is not None else None
    floor = isinstance(numerics, (TokenFloorClaim, TeacherForcedClaim))
    return comparisons, decide(
        comparisons,
        max_mde_tv=settings.max_mde_tv,
        kind=kind,
        drift=drift,
        matched=numerics is not None and not floor,
        floor=floor,
    )


def finish_run(
    rd: RunDir,
    *,
    samples: pd.DataFrame,
    rounds: pd.DataFrame | None,
    results: Sequence[tuple[Arm, Any]],
    header: Header,
    provenance: Mapping[str, Any],
    settings: RunSettings,
    junit: Path | None,
    summary_md: Path | None,
    sizes: pd.DataFrame | None = None,
    numerics: ClaimB | None = None,
    extra: Mapping[str, Any] | None = None,
) -> tuple[Verdict, tuple[Comparison, ...], dict[str, Any]]:
    """Decide, write every final file, render reports from what was written, manifest last.
    ``sizes``: the teeth's sizes (``spectest.tooth_size``), stored as ``tooth_sizes.parquet`` so
    that ``spectest analyze`` decides the same without the models. ``extra``: readouts added
    to ``summary.json`` as they are (``spectest compare --floor``'s token drift)."""
    from spectest.report import write_ci_outputs, write_reports

    comparisons, verdict = judge(
        results, settings, kind=header.kind, rounds=rounds, sizes=sizes, numerics=numerics
    )
    summary = build_summary(
        header,
        run_dir=rd.path,
        comparisons=comparisons,
        verdict=verdict,
        details={arm.name: json_safe(a.summary()) for arm, a in results},
    )
    summary.update(json_safe(dict(extra or {})))
    tables = _final_tables(samples, rounds, results, sizes, numerics)
    rd.write_final(tables=tables, summary=summary, texts={}, provenance=provenance, manifest=False)
    write_reports(rd.path, require_complete=False)
    rd.write_manifest(provenance, release=False)
    try:
        # NOTE: after the manifest (a killed run leaves no JUnit file); one that cannot be
        # written takes the completion back (exit 4; a re-run resumes and writes them)
        if junit is not None or summary_md is not None:
            stored = json.loads((rd.path / SUMMARY).read_text(encoding="utf-8"))  # as written
            write_ci_outputs(stored, junit=junit, summary_md=summary_md)
    except BaseException:
        rd.mark_incomplete()
        raise
    finally:
        rd.release()
    return verdict, comparisons, summary


# the analysis tables a run stores, by file: the family each comes from, its schema
ANALYSIS_TABLES = {
    TESTS: ("cells", schema.TESTS_SCHEMA),
    TRIE: ("trie", schema.TRIE_SCHEMA),
    WHITEBOX: ("whitebox", schema.WHITEBOX_TESTS_SCHEMA),
    SEQUENCE: ("sequence", schema.SEQUENCE_SCHEMA),
}


def _final_tables(
    samples: pd.DataFrame,
    rounds: pd.DataFrame | None,
    results: Sequence[tuple[Arm, Any]],
    sizes: pd.DataFrame | None,
    numerics: ClaimB | None,
) -> dict[str, tuple[pd.DataFrame, Any]]:
    """Every final table of a run with its Arrow schema, by file name; an analysis table holds
    every comparison's rows, with a ``comparison`` column (the arm's name)."""
    from spectest.stats.histograms import position_counts

    tables: dict[str, tuple[pd.DataFrame, Any]] = {
        SAMPLES: (samples, samples_schema(samples)),
        HISTOGRAMS: (position_counts(samples), HISTOGRAMS_SCHEMA),
    }
    if rounds is not None and len(rounds):
        tables[ROUNDS] = (rounds, schema.ROUNDS_SCHEMA)
    if sizes is not None:
        tables[TOOTH_SIZES] = (sizes, schema.TOOTH_SIZES_SCHEMA)
    if isinstance(numerics, TeacherForcedClaim) and numerics.table is not None:
        from spectest.stats.teacher_forced import laws_schema

        tables[TEACHER_LAWS] = (numerics.table, laws_schema())
    elif numerics is not None and numerics.table is not None:
        tables[NUMERICS] = (numerics.table, schema.numerics_schema(numerics.table.columns))
    for fname, (family, arrow) in ANALYSIS_TABLES.items():
        frames = ((arm, a.table(family)) for arm, a in results)
        parts = [df.assign(comparison=arm.name) for arm, df in frames if len(df)]
        if parts:
            tables[fname] = (pd.concat(parts, ignore_index=True), arrow)
    return tables
