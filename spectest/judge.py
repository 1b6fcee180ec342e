"""Judging: every arm against the reference (``compare_all``, ``summarize``), claim (b) from the
run's tables, and ``finish_run`` (decide, write the final files, the manifest last).

The why and the details: docs/internals.md "spectest/judge.py".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from spectest import schema
from spectest.plan import Arm, Plan, RunSettings
from spectest.progress import ProgressFn
from spectest.stats.options import DEFAULT_LEFT_OUT_MAX
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
from spectest.summary import Header, build_summary, json_safe, tidy_tables
from spectest.verdict import Comparison, Verdict, decide


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


def stable_seed(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(parts).encode()).digest()[:4], "little")


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


def summarize(
    analysis: Any,
    arm: Arm,
    rounds: pd.DataFrame | None = None,
    sizes: pd.DataFrame | None = None,
) -> Comparison:
    """The verdict's view of one analysis (see ``verdict.Comparison``); ``rounds`` (every arm's)
    lets an ε arm say when it cannot bite (``comparison.eps_cannot_bite``); ``sizes`` (the run's
    ``tooth_sizes.parquet``, ``spectest.tooth_size``) gives an ε arm or mutant its size
    (unknown without it)."""
    from spectest.comparison import eps_cannot_bite
    from spectest.sampling.mutants import eps_of
    from spectest.tooth_size import size_of
    from spectest.verdict import summarize_comparison

    eps = eps_of(arm.variant) if arm.role == "eps" else None
    bite = None
    if eps is not None and rounds is not None and len(rounds):
        bite = eps_cannot_bite(eps, rounds[rounds[schema.ARM] == arm.name])
    size = size_of(sizes, arm.name) if arm.is_sized else None
    return summarize_comparison(
        analysis,
        arm=arm.name,
        role=arm.role,
        expect=arm.expect,
        cannot_bite=bite,
        size=size,
        null_engine=arm.null_engine,
    )


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
    (``kind``: run, teeth, compare; ``sizes``: the teeth's sizes, see ``summarize``;
    ``numerics``: matched numerics mode, with claim (b) decided from its table)."""
    comparisons = tuple(summarize(a, arm, rounds, sizes) for arm, a in results)
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


@dataclass(frozen=True)
class NumericsClaim:
    """Matched numerics mode's claim (b) as the judge needs it: the per-token table
    (``spectest.numerics.table``; None or empty: not measured) and the settings that decide it."""

    table: pd.DataFrame | None
    margin: float
    alpha: float
    floor: str = "auto"  # tests.numerics_floor: the table holds the floors it measured

    def result(self) -> Any:
        from spectest.stats.drift import decide_drift, select_floor

        if self.table is None or not len(self.table):
            return None
        kind, table, note = select_floor(self.table, self.floor)
        rng = np.random.default_rng(stable_seed("numerics-drift"))  # the same on re-analysis
        return decide_drift(
            table,
            margin=self.margin,
            alpha=self.alpha,
            rng=rng,
            floor_kind=kind,
            floor_note=note,
        )


@dataclass(frozen=True)
class TokenFloorClaim:
    """Claim (b) from tokens (``stats.token_floor``): the engine's spec-vs-plain
    token-law drift (``reference`` vs ``candidate``) against its floor pair (``floor_a`` vs
    ``floor_b``; ``floor_a`` is ``reference`` itself in a run: resampled jointly), decided at
    ``margin`` (TV per token) and ``alpha``; the bootstrap seeded by ``key``."""

    reference: pd.DataFrame
    candidate: pd.DataFrame
    floor_a: pd.DataFrame
    floor_b: pd.DataFrame
    margin: float
    alpha: float
    key: str
    floor_kind: str = "floor arm"
    table: None = None  # nothing to store beside the samples (``finish_run``)

    def result(self) -> Any:
        from spectest.stats.token_floor import decide_token_floor

        r = decide_token_floor(
            self.reference,
            self.candidate,
            self.floor_a,
            self.floor_b,
            margin=self.margin,
            alpha=self.alpha,
            rng=np.random.default_rng(stable_seed("token-floor", self.key)),
            floor_kind=self.floor_kind,
        )
        return None if r.units == 0 else r


@dataclass(frozen=True)
class TeacherForcedClaim:
    """Claim (b) teacher-forced (``stats.teacher_forced``): the candidate's tokens against the
    plain engine's own law at their prefixes (``table``, ``teacher_forced.LAWS`` columns; None
    until the engine has answered: ``runner``), the reference's as the control; at most
    ``sequences`` per cell, decided at ``margin`` and ``alpha``, the bootstrap seeded by ``key``;
    "unresolved" with more than ``left_out_max`` of the candidate's tokens left out."""

    reference: pd.DataFrame
    candidate: pd.DataFrame
    sequences: int
    margin: float
    alpha: float
    key: str
    table: pd.DataFrame | None = None
    kind: str = ""  # the floor's words (``FloorSpec.kind``); "" keeps the statistic's own
    left_out_max: float = DEFAULT_LEFT_OUT_MAX  # tests.left_out_max

    def result(self) -> Any:
        from spectest.stats.teacher_forced import decide_teacher_forced

        if self.table is None:
            return None
        r = decide_teacher_forced(
            self.candidate,
            self.table,
            margin=self.margin,
            alpha=self.alpha,
            rng=np.random.default_rng(stable_seed("teacher-forced", self.key)),
            n_max=self.sequences,
            reference=self.reference,
            left_out_max=self.left_out_max,
        )
        if r.units == 0:
            return None
        return replace(r, floor_kind=self.kind) if self.kind else r


ClaimB = NumericsClaim | TokenFloorClaim | TeacherForcedClaim


def _frames(samples: pd.DataFrame, arms: Sequence[Arm], *roles: str) -> list[pd.DataFrame] | None:
    """The samples (``schema.BYO_SCHEMA`` columns) of the arm of each role; None when a role
    has no arm."""
    names: dict[str, str] = {a.role: a.name for a in arms}
    if any(r not in names for r in roles):
        return None
    cols = [c.name for c in schema.BYO_SCHEMA]
    return [
        samples.loc[samples[schema.ARM] == names[r], cols].reset_index(drop=True) for r in roles
    ]


def run_claim_b(
    plan: Plan,
    samples: pd.DataFrame,
    numerics: pd.DataFrame | None,
    laws: pd.DataFrame | None = None,
) -> ClaimB | None:
    """A protocol run's claim (b), decided at the run's α (not a look's): from its floor arm's
    tokens when the protocol names one (teacher-forced: from the plain laws ``laws``; None: not
    asked yet; else reference vs candidate against reference vs floor, the reference resampled
    jointly), else matched numerics mode's from the per-token table ``numerics`` (None: not
    measured yet), else None. None too without the arms the claim needs."""
    f, alpha, key = plan.protocol.floor, plan.settings.run_alpha, plan.protocol.hash
    if f is None:  # matched numerics mode's claim, or none
        if not plan.settings.matched:
            return None
        o = plan.settings.options
        return NumericsClaim(numerics, o.numerics_margin, alpha, o.numerics_floor)
    roles = ("reference", "candidate") + (() if f.teacher is not None else ("floor",))
    got = _frames(samples, plan.arms, *roles)
    if got is None:
        return None
    if f.teacher is not None:
        bound = plan.settings.options.left_out_max
        return TeacherForcedClaim(
            got[0], got[1], f.teacher, f.margin, alpha, key, laws, f.kind, bound
        )
    ref, cand, floor = got
    return TokenFloorClaim(ref, cand, ref, floor, f.margin, alpha, key, f.kind)


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


# the analysis tables of ``tidy_tables`` and their schemas
ANALYSIS_SCHEMAS = {
    TESTS: schema.TESTS_SCHEMA,
    TRIE: schema.TRIE_SCHEMA,
    WHITEBOX: schema.WHITEBOX_TESTS_SCHEMA,
    SEQUENCE: schema.SEQUENCE_SCHEMA,
}


def _final_tables(
    samples: pd.DataFrame,
    rounds: pd.DataFrame | None,
    results: Sequence[tuple[Arm, Any]],
    sizes: pd.DataFrame | None,
    numerics: ClaimB | None,
) -> dict[str, tuple[pd.DataFrame, Any]]:
    """Every final table of a run with its Arrow schema, by file name."""
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
    for fname, df in tidy_tables(results).items():
        tables[fname] = (df, ANALYSIS_SCHEMAS[fname])
    return tables
