"""The runner: plan → engines → store → analyze → verdict → reports. The one library function
each CLI command calls.

Owns: the order of operations of a run (resume from completed shards, generate the missing
ones, read everything back, compare every arm with the reference, decide, write the final files
and the manifest last), the translation of prompts into token ids, and the summary that the CLI
prints and ``summary.json`` stores.

Knows nothing about how tokens are sampled (``spectest.engines``), how tests are computed
(``spectest.stats.analyze``), how files are laid out (``spectest.store``), how a decision is
made (``spectest.verdict``) or rendered (``spectest.report``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from spectest import schema
from spectest.errors import ConfigError, InputError
from spectest.protocol import (
    Arm,
    Plan,
    Protocol,
    load_protocol,
    make_plan,
    prompts_jsonl,
    to_raw,
)
from spectest.store import (
    HISTOGRAMS,
    HISTOGRAMS_SCHEMA,
    PROMPTS_FILE,
    ROUNDS,
    SAMPLES,
    TESTS,
    TRIE,
    WHITEBOX,
    RunDir,
    StoredRun,
    load_run,
    make_provenance,
    read_samples_file,
    samples_schema,
)
from spectest.verdict import Comparison, Verdict, decide

ProgressFn = Callable[[str, int, int], None]  # (task label, completed, total)
MAX_FAILING_LISTED = 20


def _no_progress(task: str, done: int, total: int) -> None:
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


# ----------------------------------------------------------------------------- prompts → ids
def prompt_token_ids(protocol: Protocol, vocab_size: int) -> dict[str, list[int]]:
    """Token ids of every prompt. Text prompts use the byte tokenizer (``models.bytetok``,
    BOS first) — the tokenizer of the bundled pair and of any model with ≥ 259 ids; explicit
    ``ids`` are used as given. Every id must be < ``vocab_size``."""
    from spectest.models import bytetok

    out: dict[str, list[int]] = {}
    pfile = protocol.prompts.path
    for pr in protocol.prompts.items:
        if pr.ids is not None:
            ids = list(pr.ids)
        else:
            if vocab_size < bytetok.VOCAB_SIZE:
                raise ConfigError(
                    f"{pfile}: prompt {pr.id!r} is text but the model's vocabulary has only "
                    f"{vocab_size} ids (byte tokenizer needs {bytetok.VOCAB_SIZE}): give 'ids'"
                )
            ids = bytetok.encode(pr.text or "")
        bad = [i for i in ids if i >= vocab_size]
        if bad:
            raise ConfigError(
                f"{pfile}: prompt {pr.id!r}: token id {bad[0]!r} is outside the vocabulary "
                f"(size {vocab_size})"
            )
        out[pr.id] = ids
    return out


# ----------------------------------------------------------------------------- generation
def _rows(protocol: Protocol, arm: Arm) -> list[Any]:
    from spectest.engines.builtin import RowSpec

    return [RowSpec(cid, seed, sp) for cid, sp in protocol.configs for seed in arm.seeds.seeds()]


def _generate_shard(
    protocol: Protocol,
    arm: Arm,
    prompt_id: str,
    prompt_ids: list[int],
    models: tuple[Any, Any],
    run_key: int,
    progress: ProgressFn,
) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """Samples (with white-box columns when enabled) and rounds of one shard: one arm × one
    prompt, all configs × the arm's seeds."""
    from spectest.engines import builtin

    target, draft = models
    rows = _rows(protocol, arm)
    label = f"generate {arm.name} / {prompt_id}"
    drafter = builtin.DrafterSpec(
        onehot=protocol.drafter.kind == "onehot", q_mode=protocol.drafter.q, k=protocol.drafter.k
    )

    def tick(done: int) -> None:
        progress(label, done, len(rows))

    tick(0)

    common: dict[str, Any] = dict(
        num_positions=protocol.positions,
        run_key=run_key,
        prompt_id=prompt_id,
        batch_size=protocol.batch_size,
        progress=tick,
    )
    engine = protocol.engine
    on_hf = (arm.role, engine.reference if arm.role == "reference" else engine.candidate) in (
        ("reference", "hf-generate"),
        ("candidate", "hf-assisted"),
    )
    if on_hf:  # transformers itself (engines/hf.py); teeth always run on the builtin engine
        from spectest.engines import hf

        if arm.role == "reference":
            out = hf.hf_plain_decode(target, prompt_ids, rows, **common)
        else:
            del common["batch_size"]  # assisted generation runs one row at a time
            out = hf.hf_assisted_decode(
                target, draft, prompt_ids, rows, num_assistant_tokens=protocol.drafter.k,
                confidence_threshold=engine.assistant_confidence_threshold, **common,
            )  # fmt: skip
    elif arm.role == "reference":
        out = builtin.plain_decode(target, prompt_ids, rows, **common)
    else:
        from spectest.sampling.mutants import get_variant

        variant = get_variant(arm.variant or "exact")
        out = builtin.speculative_decode(
            target, draft, prompt_ids, rows, drafter=drafter, variant=variant, **common
        )
    samples = builtin.to_samples_frame(out, prompt_id, rows, arm.name)
    if protocol.tests.whitebox and on_hf:
        from spectest.engines.hf_teacher import hf_teacher_force

        # NOTE: p_t (and the processed q_t) with transformers' own warpers: its plain law
        wb = hf_teacher_force(target, prompt_ids, [r.params for r in rows], out.tokens, draft=draft)
        samples = pd.concat([samples, wb], axis=1)
    elif protocol.tests.whitebox:
        from spectest.engines.teacher import teacher_force

        # NOTE: every arm, the reference included, is teacher-forced with the same draft law q, so
        # the white-box tests run on the plain arm as the control on spectest's own p and A_t.
        wb = teacher_force(
            target, prompt_ids, [r.params for r in rows], out.tokens, draft=draft, drafter=drafter
        )
        samples = pd.concat([samples, wb], axis=1)
    rounds = None
    if out.rounds is not None:
        rounds = builtin.to_rounds_frame(out, prompt_id, rows, arm.name)
    return samples, rounds


def _load_models(protocol: Protocol, need_draft: bool) -> tuple[Any, Any]:
    from spectest.models.zoo import load_model, load_pair

    m = protocol.models
    if need_draft:
        return load_pair(m.target, m.draft, device=m.device, dtype=m.dtype)
    return load_model(m.target, device=m.device, dtype=m.dtype), None


def configure_threads(device: str, threads: int | None) -> int:
    """Set torch's intra-op threads for a CPU run and return the count in use.

    ``threads`` wins; else an explicit ``OMP_NUM_THREADS`` is respected; else one thread.
    NOTE: measured 2026-11-29 on the 2-core machine under the team's load (~3.5): one 400-row
    shard of the bundled pair took 1.8 s (plain) / 4.7 s (speculative) with 1 thread and 14 s /
    34-42 s with 2 — OpenMP synchronisation over many small ops. Tokens do not depend on it.
    """
    import os

    import torch

    if threads is not None:
        if threads < 1:
            raise ConfigError(f"--threads: expected an integer >= 1, got {threads!r}")
        torch.set_num_threads(threads)
    elif device == "cpu" and not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(1)
    return int(torch.get_num_threads())


def _check_device(protocol: Protocol) -> None:
    """A CUDA protocol on a machine without CUDA is bad input, not a torch traceback."""
    if protocol.models.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                f"{protocol.source}: models.device: 'cuda' requested but torch {torch.__version__} "
                "sees no CUDA device (use --device cpu, or install a CUDA build of torch)"
            )


def _run_key(protocol: Protocol) -> int:
    from spectest.seeding import run_key_from

    return run_key_from(protocol.seeds.key)


# ----------------------------------------------------------------------------- analysis
def _analysis_options(protocol_tests: Any) -> Any:
    from spectest.stats.analyze import AnalysisOptions

    t = protocol_tests
    return AnalysisOptions(
        alpha=t.alpha,
        multiplicity=t.multiplicity,
        min_expected=t.min_expected,
        trie_depth=t.trie.depth,
        trie_min_count=t.trie.min_count,
        whitebox=t.whitebox,
        null_permutations=t.null_permutations,
    )


def _stable_seed(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(parts).encode()).digest()[:4], "little")


def _readout(protocol: Protocol) -> frozenset[str]:
    return (
        frozenset({schema.CANDIDATE}) if protocol.engine.candidate == "hf-assisted" else frozenset()
    )


def _compare_all(
    samples: pd.DataFrame,
    rounds: pd.DataFrame | None,
    arms: Sequence[Arm],
    tests: Any,
    key: str,
    progress: ProgressFn,
    readout_rounds: frozenset[str] = frozenset(),
) -> list[tuple[Arm, Any]]:
    """Analyse every non-reference arm against the reference. The rounds of the arms in
    ``readout_rounds`` are stored but not tested: the hf-assisted draft law is transformers'
    business, so acceptance vs Σ min(p, q_processed) measures speed there, not the law."""
    from spectest.stats.analyze import analyze

    options = _analysis_options(tests)
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
            rng_seed=_stable_seed(key, arm.name),
        )
        out.append((arm, analysis))
    progress("analyze", len(comps), len(comps))
    return out


def summarize(analysis: Any, arm: Arm) -> Comparison:
    """The verdict's view of one analysis (see ``verdict.Comparison``)."""
    from spectest.verdict import summarize_comparison

    return summarize_comparison(analysis, arm=arm.name, role=arm.role, expect=arm.expect)


# ------------------------------------------------------------------ summary & final files
def _tidy_tables(results: Sequence[tuple[Arm, Any]]) -> dict[str, pd.DataFrame]:
    """Concatenate each analysis's tidy tables with a ``comparison`` column (the arm name)."""
    tables: dict[str, list[pd.DataFrame]] = {TESTS: [], TRIE: [], WHITEBOX: []}
    for arm, a in results:
        for fname, attr in ((TESTS, "cells"), (TRIE, "trie"), (WHITEBOX, "whitebox")):
            df = getattr(a, attr, None)
            if df is not None and len(df):
                tables[fname].append(df.assign(comparison=arm.name))
    return {k: pd.concat(v, ignore_index=True) for k, v in tables.items() if v}


def build_summary(
    *,
    kind: str,
    name: str,
    protocol_hash: str | None,
    run_dir: Path,
    comparisons: Sequence[Comparison],
    verdict: Verdict,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """``summary.json``: everything the CLI, the reports and the JUnit file print."""
    cand = verdict.candidate
    teeth = [c for c in comparisons if c.is_tooth]
    tooth_v = {t.arm: t for t in verdict.teeth}
    config_ids: list[str] = []
    for c in comparisons:
        for cs in c.by_config:
            if cs.config_id not in config_ids:
                config_ids.append(cs.config_id)
    configs = []
    for cid in config_ids:
        main = cand or (teeth[0] if teeth else None)
        row: dict[str, Any] = {"config_id": cid}
        stats = next((cs for cs in main.by_config if cs.config_id == cid), None) if main else None
        if stats is not None:
            row.update(
                cells_tested=stats.cells_tested,
                cells_untestable=stats.cells_untestable,
                rejections=stats.rejections if cand is not None else None,
                max_tv_excess=stats.max_tv_excess if cand is not None else None,
                max_tv_where=stats.max_tv_where if cand is not None else None,
                mde_tv=stats.mde_tv,
            )
        # rejections of each tooth in this config's cells and trie nodes (white-box tests are
        # run-level: the teeth table has the verdicts)
        parts = []
        for t in teeth:
            ts = next((cs for cs in t.by_config if cs.config_id == cid), None)
            if ts is not None:
                parts.append(f"{t.arm.removeprefix('mutant:')} {ts.rejections}")
        row["teeth"] = ", ".join(parts)
        configs.append(row)
    return {
        "kind": kind,
        "name": name,
        "protocol_hash": protocol_hash,
        "run_dir": str(run_dir),
        "has_candidate": cand is not None,
        "verdict": verdict.to_dict(),
        "configs": configs,
        "teeth": [
            {
                "arm": c.arm,
                "role": c.role,
                "expect": c.expect,
                "rejected": c.rejected,
                "rejections": c.rejections,
                "label": tooth_v[c.arm].label,
                "sound": tooth_v[c.arm].sound,
            }
            for c in teeth
        ],
        "comparisons": [_comparison_dict(c) for c in comparisons],
        **dict(extra),
    }


def _comparison_dict(c: Comparison) -> dict[str, Any]:
    return {
        "arm": c.arm,
        "role": c.role,
        "expect": c.expect,
        "rejected": c.rejected,
        "cells_tested": c.cells_tested,
        "rejections": c.rejections,
        "min_qvalue": c.min_qvalue,
        "mde_tv": c.mde_tv,
        "failing": list(c.failing[:MAX_FAILING_LISTED]),
        "by_config": [vars(cs).copy() for cs in c.by_config],
    }


def _finish(
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
) -> tuple[Verdict, tuple[Comparison, ...], dict[str, Any]]:
    """Decide, write every final file, render reports from what was written, manifest last."""
    from spectest.report import write_reports
    from spectest.stats.histograms import position_counts

    comparisons = tuple(summarize(a, arm) for arm, a in results)
    verdict = decide(comparisons, max_mde_tv=max_mde_tv)
    summary_base = {
        **summary_base,
        "details": {arm.name: _json_safe(a.summary()) for arm, a in results},
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
    for fname, df in _tidy_tables(results).items():
        tables[fname] = (df, None)
    rd.write_final(tables=tables, summary=summary, texts={}, provenance=provenance, manifest=False)
    write_reports(rd.path, junit=junit, summary_md=summary_md, require_complete=False)
    rd.write_manifest(provenance)
    return verdict, comparisons, summary


# ----------------------------------------------------------------------------- entry points
def run_protocol(
    protocol: Protocol,
    *,
    out: str | Path | None = None,
    teeth_only: bool = False,
    progress: ProgressFn | None = None,
    junit: Path | None = None,
    summary_md: Path | None = None,
    threads: int | None = None,
) -> RunResult:
    """Run a protocol (or its teeth only) into a run directory, resuming completed shards.
    ``threads``: torch intra-op threads for generation (see ``configure_threads``)."""
    t0 = time.perf_counter()
    progress = progress or _no_progress
    _check_device(protocol)
    n_threads = configure_threads(protocol.models.device, threads)
    plan: Plan = make_plan(protocol, candidate=not teeth_only)
    if teeth_only and not any(a.is_tooth for a in plan.arms):
        raise ConfigError(
            f"{protocol.source}: teeth: no teeth configured (null_arm, epsilons, mutants)"
        )
    kind = "teeth" if teeth_only else "run"
    run_dir = (
        Path(out)
        if out is not None
        else Path(protocol.output) / (protocol.run_id + ("-teeth" if teeth_only else ""))
    )
    info = {
        "kind": kind,
        "protocol_hash": protocol.hash,
        "name": protocol.name,
        "arms": [
            {"name": a.name, "role": a.role, "variant": a.variant, "expect": a.expect}
            for a in plan.arms
        ],
        "seed_ranges": plan.seed_ranges,
    }
    rd = RunDir.open(
        run_dir,
        info,
        protocol_yaml=yaml.safe_dump(
            to_raw(protocol, prompts_file=PROMPTS_FILE), sort_keys=False, allow_unicode=True
        ),
        prompts=prompts_jsonl(protocol),
    )
    provenance = make_provenance(
        threads=n_threads,
        protocol_hash=protocol.hash,
        device=_device_name(protocol.models.device),
        seed_ranges=plan.seed_ranges,
        kind=kind,
    )
    todo = [s for s in plan.shards if not rd.shard_done(s.key)]
    resumed = len(plan.shards) - len(todo)
    if todo:
        need_draft = protocol.tests.whitebox or any(
            plan.arm(s.arm).role != "reference" for s in todo
        )
        models = _load_models(protocol, need_draft)
        prompt_ids = prompt_token_ids(protocol, models[0].vocab_size)
        run_key = _run_key(protocol)
        # one "generate" bar over every row of every shard still to do
        sizes = [len(protocol.configs) * len(plan.arm(s.arm).seeds) for s in todo]
        total, base = sum(sizes), 0
        for shard, size in zip(todo, sizes, strict=True):

            def shard_progress(task: str, done: int, n: int, _base: int = base) -> None:
                progress("generate", _base + done, total)

            samples, rounds = _generate_shard(
                protocol,
                plan.arm(shard.arm),
                shard.prompt_id,
                prompt_ids[shard.prompt_id],
                models,
                run_key,
                shard_progress,
            )
            rd.write_shard(shard.key, samples, rounds, provenance)
            base += size
        progress("generate", total, total)
    samples, rounds = _read_shards(rd, plan)
    results = _compare_all(
        samples, rounds, plan.arms, protocol.tests, protocol.seeds.key, progress, _readout(protocol)
    )
    verdict, comparisons, summary = _finish(
        rd,
        samples=samples,
        rounds=rounds,
        results=results,
        summary_base={
            "kind": kind,
            "name": protocol.name,
            "protocol_hash": protocol.hash,
            "notes": [f"shards: {len(todo)} generated, {resumed} resumed from {rd.path}"]
            if resumed
            else [],
            "analysis": _analysis_dict(protocol.tests),
            "models": vars(protocol.models).copy(),
            "drafter": vars(protocol.drafter).copy(),
            "engine": vars(protocol.engine).copy(),
            "candidate": protocol.candidate,
            "positions": protocol.positions,
            "seeds_per_arm": protocol.seeds.per_arm,
            "prompt_set": protocol.prompts.file,
        },
        provenance=provenance,
        max_mde_tv=protocol.tests.max_mde_tv,
        junit=junit,
        summary_md=summary_md,
    )
    return RunResult(
        rd.path, verdict, comparisons, summary, len(todo), resumed, time.perf_counter() - t0
    )


def _json_safe(obj: Any) -> Any:
    """NaN / inf → None, numpy scalars → Python, recursively (summary.json is strict JSON)."""
    import math

    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _device_name(device: str) -> str:
    if device == "cuda":
        import torch

        if torch.cuda.is_available():
            return f"cuda:{torch.cuda.get_device_name(0)}"
    return device


def _analysis_dict(t: Any) -> dict[str, Any]:
    return {
        "alpha": t.alpha,
        "multiplicity": t.multiplicity,
        "min_expected": t.min_expected,
        "trie": vars(t.trie).copy(),
        "whitebox": t.whitebox,
        "null_permutations": t.null_permutations,
        "max_mde_tv": t.max_mde_tv,
    }


def _read_shards(rd: RunDir, plan: Plan) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """Every shard's samples and rounds in plan order (arm, prompt), each sorted by (config in
    protocol order, seed, position): the same bytes whatever order shards were generated in."""
    order = {cid: i for i, (cid, _) in enumerate(plan.protocol.configs)}
    s_parts, r_parts = [], []
    for shard in plan.shards:
        s, r = rd.read_shard(shard.key)
        s_parts.append(s)
        if r is not None:
            r_parts.append(r)
    samples = pd.concat(s_parts, ignore_index=True)
    arm_rank = {a.name: i for i, a in enumerate(plan.arms)}
    prompt_rank = {p.id: i for i, p in enumerate(plan.protocol.prompts.items)}

    def ordered(df: pd.DataFrame, extra: Sequence[str]) -> pd.DataFrame:
        key = pd.DataFrame(
            {
                "_a": df[schema.ARM].map(arm_rank),
                "_p": df[schema.PROMPT_ID].map(prompt_rank),
                "_c": df[schema.CONFIG_ID].map(order),
                "_s": df[schema.SEED],
                **{f"_{i}": df[c] for i, c in enumerate(extra)},
            }
        )
        idx = key.sort_values(list(key.columns), kind="stable").index
        return df.loc[idx].reset_index(drop=True)

    samples = ordered(samples, [schema.POSITION])
    rounds = ordered(pd.concat(r_parts, ignore_index=True), ["round"]) if r_parts else None
    return samples, rounds


def analyze_run(run_dir: str | Path, *, progress: ProgressFn | None = None) -> RunResult:
    """Recompute every test and the verdict of a completed run from its stored Parquet (no model).
    The run directory is not modified; the result's summary is printed, not stored."""
    t0 = time.perf_counter()
    progress = progress or _no_progress
    stored = load_run(run_dir)
    samples = stored.table(SAMPLES)
    if samples is None:
        raise InputError(f"{stored.path}: no {SAMPLES} in the run directory")
    rounds = stored.table(ROUNDS)
    if stored.info.get("kind") == "compare":
        tests = _compare_tests(stored.summary["analysis"])
        arms = _compare_arms()
        key = "compare"
        max_mde = None
        readout: frozenset[str] = frozenset()
    else:
        pf = stored.protocol_file
        if pf is None:
            raise InputError(f"{stored.path}: no protocol.yaml in the run directory")
        protocol = load_protocol(pf)
        if protocol.hash != stored.info.get("protocol_hash"):
            raise InputError(
                f"{pf}: its hash differs from run.json's: the run directory was edited"
            )
        plan = make_plan(protocol, candidate=stored.info.get("kind") != "teeth")
        arms = list(plan.arms)
        tests, key, max_mde = protocol.tests, protocol.seeds.key, protocol.tests.max_mde_tv
        readout = _readout(protocol)
    results = _compare_all(samples, rounds, arms, tests, key, progress, readout)
    comparisons = tuple(summarize(a, arm) for arm, a in results)
    verdict = decide(comparisons, max_mde_tv=max_mde)
    base = stored.summary
    summary = build_summary(
        kind=str(base.get("kind")),
        name=str(base.get("name")),
        protocol_hash=base.get("protocol_hash"),
        run_dir=stored.path,
        comparisons=comparisons,
        verdict=verdict,
        extra={
            "notes": [
                "re-analysed from stored samples; stored decision was "
                f"{base['verdict']['decision']!r}"
            ],
            "analysis": base.get("analysis"),
        },
    )
    return RunResult(stored.path, verdict, comparisons, summary, 0, 0, time.perf_counter() - t0)


# ------------------------------------------------------------------ bring your own samples
def _compare_arms() -> list[Arm]:
    from spectest.protocol import SeedRange

    return [
        Arm("reference", "reference", None, SeedRange(0, 0), "reference"),
        Arm("candidate", "candidate", None, SeedRange(0, 0), "subject"),
    ]


def _compare_tests(d: Mapping[str, Any]) -> Any:
    from spectest.protocol import TestsSpec, TrieSpec

    return TestsSpec(
        alpha=d["alpha"],
        multiplicity=d["multiplicity"],
        min_expected=d["min_expected"],
        trie=TrieSpec(**d["trie"]),
        whitebox=False,
        null_permutations=d["null_permutations"],
        max_mde_tv=None,
    )


def compare_files(
    reference: str | Path,
    candidate: str | Path,
    *,
    alpha: float = 0.05,
    multiplicity: str = "bh",
    out: str | Path | None = None,
    progress: ProgressFn | None = None,
) -> RunResult:
    """Black-box tests on two bring-your-own samples files; results stored like a run's."""
    t0 = time.perf_counter()
    progress = progress or _no_progress
    from spectest.protocol import MULTIPLICITY_METHODS

    if not (0.0 < alpha < 1.0):
        raise ConfigError(f"--alpha: expected a number in (0, 1), got {alpha!r}")
    if multiplicity not in MULTIPLICITY_METHODS:
        raise ConfigError(
            f"--multiplicity: expected one of {', '.join(MULTIPLICITY_METHODS)}, "
            f"got {multiplicity!r}"
        )
    ref = read_samples_file(reference)
    cand = read_samples_file(candidate)
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
    samples = pd.concat(
        [ref.assign(**{schema.ARM: "reference"}), cand.assign(**{schema.ARM: "candidate"})],
        ignore_index=True,
    )
    samples = samples[[f.name for f in schema.SAMPLES_SCHEMA]]
    digest = hashlib.sha256()
    for df in (ref, cand):
        digest.update(
            pd.util.hash_pandas_object(df[[f.name for f in schema.BYO_SCHEMA]], index=False)
            .to_numpy()
            .tobytes()
        )
    analysis_d = {
        "alpha": alpha,
        "multiplicity": multiplicity,
        "min_expected": 5.0,
        "trie": {"depth": 2, "min_count": 200},
        "whitebox": False,
        "null_permutations": 200,
        "max_mde_tv": None,
    }
    digest.update(repr(sorted(analysis_d.items())).encode())
    h = digest.hexdigest()
    run_dir = Path(out) if out is not None else Path("results") / f"compare-{h[:10]}"
    rd = RunDir.open(
        run_dir,
        {
            "kind": "compare",
            "protocol_hash": h,
            "name": "compare",
            "reference": str(reference),
            "candidate": str(candidate),
        },
    )
    provenance = make_provenance(protocol_hash=h, device="n/a", seed_ranges={}, kind="compare")
    tests = _compare_tests(analysis_d)
    results = _compare_all(samples, None, _compare_arms(), tests, "compare", progress)
    verdict, comparisons, summary = _finish(
        rd,
        samples=samples,
        rounds=None,
        results=results,
        summary_base={
            "kind": "compare",
            "name": f"{Path(reference).name} vs {Path(candidate).name}",
            "protocol_hash": h,
            "analysis": analysis_d,
            "notes": [],
        },
        provenance=provenance,
        max_mde_tv=None,
        junit=None,
        summary_md=None,
    )
    return RunResult(rd.path, verdict, comparisons, summary, 0, 0, time.perf_counter() - t0)


def open_stored(run_dir: str | Path) -> StoredRun:
    """A completed run, for notebooks and reports."""
    return load_run(run_dir)
