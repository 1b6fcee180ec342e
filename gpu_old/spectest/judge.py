"""Judging: every arm against the reference, the decision, and the final files of a run.

Owns: the comparison of every non-reference arm with the reference (``compare_all``: one
``stats.analyze`` per arm, its rounds tested unless the arm's engine reports them as a readout),
the verdict's view of each analysis (``summarize``), and the end of a run (``finish_run``:
decide, write the tables, the summary and the reports, the manifest last). ``spectest run``,
``spectest teeth``, ``spectest compare`` and ``spectest analyze`` all go through here, so a
decision is made one way only.

Knows nothing about engines or models (``spectest.runner`` generates), how tests are computed
(``spectest.stats``), how a decision is made (``spectest.verdict``) or how files are laid out
(``spectest.store``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from spectest import schema
from spectest.plan import Arm
from spectest.store import (
    HISTOGRAMS,
    HISTOGRAMS_SCHEMA,
    ROUNDS,
    SAMPLES,
    SEQUENCE,
    SUMMARY,
    TESTS,
    TOOTH_SIZES,
    TRIE,
    WHITEBOX,
    RunDir,
    samples_schema,
)
from spectest.summary import build_summary, json_safe, tidy_tables
from spectest.verdict import Comparison, Verdict, decide

ProgressFn = Callable[[str, int, int], None]  # (task label, completed, total)


def no_progress(task: str, done: int, total: int) -> None:
    return None


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


def analysis_options(protocol_tests: Any, whitebox_mode: str = "exact") -> Any:
    """A protocol's ``TestsSpec`` as ``stats.analyze.AnalysisOptions`` (``whitebox_mode``: see
    ``whitebox_mode``)."""
    from spectest.stats.analyze import AnalysisOptions

    t = protocol_tests
    return AnalysisOptions(
        whitebox_mode=whitebox_mode,
        alpha=t.alpha,
        multiplicity=t.multiplicity,
        min_expected=t.min_expected,
        trie_depth=t.trie.depth,
        trie_min_count=t.trie.min_count,
        whitebox=t.whitebox,
        null_permutations=t.null_permutations,
        sequence=getattr(t, "sequence", True),
    )


def stable_seed(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(parts).encode()).digest()[:4], "little")


def readout_arms(arms: Sequence[Arm]) -> frozenset[str]:
    """Arms whose engine reports its rounds as a readout (``Engine.rounds == "readout"``)."""
    from spectest.engines.registry import engine_class

    return frozenset(a.name for a in arms if engine_class(a.engine.name).rounds == "readout")


LOW_PRECISION = ("bfloat16", "bf16", "float16", "fp16")


def whitebox_mode(dtype: str, arms: Sequence[Arm]) -> str:
    """'teacher' when some arm's white-box columns come from a teacher whose numerics may differ
    from its engine's — an engine with ``whitebox == "teacher"`` in bf16/fp16, or a token-only
    engine (``whitebox == "tokens"``: command, http) in any dtype — else 'exact'
    (``stats.analyze.AnalysisOptions.whitebox_mode``).

    The built-in engine records its columns at generation time in every dtype (exact); a
    teacher's full-sequence forward matches incremental decoding within float32 rounding but
    not in bf16/fp16 (issue 12). In teacher mode the runner forces every arm with one shared
    teacher, so that the two-sample tests compare one function of the sequences.
    """
    from spectest.engines.registry import engine_class

    kinds = {engine_class(a.engine.name).whitebox for a in arms}
    if "tokens" in kinds or ("teacher" in kinds and dtype in LOW_PRECISION):
        return "teacher"
    return "exact"


def compare_all(
    samples: pd.DataFrame,
    rounds: pd.DataFrame | None,
    arms: Sequence[Arm],
    tests: Any,
    key: str,
    progress: ProgressFn,
    readout_rounds: frozenset[str] = frozenset(),
    whitebox_mode: str = "exact",
) -> list[tuple[Arm, Any]]:
    """Analyse every non-reference arm against the reference. The rounds of the arms in
    ``readout_rounds`` are stored but not tested: e.g. the hf-assisted draft law is
    transformers' business, so acceptance vs Σ min(p, q_processed) measures speed there, not the
    law."""
    from spectest.stats.analyze import analyze

    options = analysis_options(tests, whitebox_mode)
    out = []
    comps = [a for a in arms if a.role != "reference"]
    for i, arm in enumerate(comps):
        progress("analyze", i, len(comps))
        sub = samples[samples[schema.ARM].isin(["reference", arm.name])]
        rsub = (
            None
            if rounds is None or arm.name in readout_rounds
            else rounds[rounds[schema.ARM].isin(["reference", arm.name])]
        )
        analysis = analyze(
            sub,
            reference="reference",
            candidate=arm.name,
            options=options,
            rounds=rsub,
            rng_seed=stable_seed(key, arm.name),
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
    size = size_of(sizes, arm.name) if arm.role in ("eps", "mutant") else None
    return summarize_comparison(
        analysis, arm=arm.name, role=arm.role, expect=arm.expect, cannot_bite=bite, size=size
    )


def judge(
    results: Sequence[tuple[Arm, Any]],
    max_mde_tv: float | None,
    *,
    kind: str = "run",
    rounds: pd.DataFrame | None = None,
    sizes: pd.DataFrame | None = None,
) -> tuple[tuple[Comparison, ...], Verdict]:
    """Every analysis summarised, and the decision over them (``kind``: run, teeth, compare;
    ``sizes``: the teeth's sizes, see ``summarize``)."""
    comparisons = tuple(summarize(a, arm, rounds, sizes) for arm, a in results)
    return comparisons, decide(comparisons, max_mde_tv=max_mde_tv, kind=kind)


def finish_run(
    rd: RunDir,
    *,
    samples: pd.DataFrame,
    rounds: pd.DataFrame | None,
    results: Sequence[tuple[Arm, Any]],
    summary_base: dict[str, Any],
    provenance: Mapping[str, Any],
    max_mde_tv: float | None,
    junit: Path | None,
    summary_md: Path | None,
    sizes: pd.DataFrame | None = None,
) -> tuple[Verdict, tuple[Comparison, ...], dict[str, Any]]:
    """Decide, write every final file, render reports from what was written, manifest last.
    ``sizes``: the teeth's sizes (``spectest.tooth_size``), stored as ``tooth_sizes.parquet`` so
    that ``spectest analyze`` decides the same without the models."""
    from spectest.report import write_ci_outputs, write_reports
    from spectest.stats.histograms import position_counts

    comparisons, verdict = judge(
        results, max_mde_tv, kind=summary_base["kind"], rounds=rounds, sizes=sizes
    )
    summary_base = {
        **summary_base,
        "details": {arm.name: json_safe(a.summary()) for arm, a in results},
    }
    summary = build_summary(
        kind=summary_base["kind"],
        name=summary_base["name"],
        protocol_hash=summary_base.get("protocol_hash"),
        run_dir=rd.path,
        comparisons=comparisons,
        verdict=verdict,
        extra={k: v for k, v in summary_base.items() if k not in ("kind", "name", "protocol_hash")},
    )
    tables: dict[str, tuple[pd.DataFrame, Any]] = {
        SAMPLES: (samples, samples_schema(samples)),
        HISTOGRAMS: (position_counts(samples), HISTOGRAMS_SCHEMA),
    }
    if rounds is not None and len(rounds):
        tables[ROUNDS] = (rounds, schema.ROUNDS_SCHEMA)
    if sizes is not None:
        tables[TOOTH_SIZES] = (sizes, schema.TOOTH_SIZES_SCHEMA)
    analysis_schemas = {
        TESTS: schema.TESTS_SCHEMA,
        TRIE: schema.TRIE_SCHEMA,
        WHITEBOX: schema.WHITEBOX_TESTS_SCHEMA,
        SEQUENCE: schema.SEQUENCE_SCHEMA,
    }
    for fname, df in tidy_tables(results).items():
        tables[fname] = (df, analysis_schemas[fname])
    rd.write_final(tables=tables, summary=summary, texts={}, provenance=provenance, manifest=False)
    write_reports(rd.path, require_complete=False)
    rd.write_manifest(provenance, release=False)
    try:
        # NOTE: the CI outputs only after the manifest: a killed run never leaves a JUnit file.
        # One that cannot be written (disk full) takes the completion back: the process exits 4
        # and no complete summary.json says otherwise (a re-run resumes and writes them).
        if junit is not None or summary_md is not None:
            stored = json.loads((rd.path / SUMMARY).read_text(encoding="utf-8"))  # as written
            write_ci_outputs(stored, junit=junit, summary_md=summary_md)
    except BaseException:
        rd.mark_incomplete()
        raise
    finally:
        rd.release()
    return verdict, comparisons, summary
