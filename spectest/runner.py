"""The runner: plan → engines → store → analyze → verdict → reports. ``run_protocol`` is the one
library function ``spectest run`` / ``spectest teeth`` call; ``analyze_run`` is ``spectest
analyze``'s (``spectest.compare.compare_files`` is ``spectest compare``'s).

Owns: the order of operations of a run (resume from completed shards, generate the missing
ones, read everything back, compare every arm with the reference, decide, write the final files
and the manifest last), the dispatch of an arm to an engine, and torch's CPU thread setting.
The summary's shape lives in ``spectest.summary``, prompt tokenisation in ``spectest.prompts``.

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
from spectest.plan import Arm, Plan, make_plan
from spectest.prompts import prompt_token_ids, prompts_jsonl
from spectest.protocol import Protocol, load_protocol, to_raw
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
    load_run,
    make_provenance,
    samples_schema,
)
from spectest.summary import build_summary, json_safe, tidy_tables
from spectest.verdict import Comparison, Verdict, decide

__all__ = ["RunResult", "analyze_run", "configure_threads", "prompt_token_ids", "run_protocol"]

ProgressFn = Callable[[str, int, int], None]  # (task label, completed, total)


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
    wb_mode = whitebox_mode(protocol)
    # built-in arms record their white-box columns at generation time (exact in every dtype),
    # except in teacher mode, where every arm is teacher-forced by the same teacher
    record = protocol.tests.whitebox and wb_mode == "exact" and not on_hf
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
        out = builtin.plain_decode(
            target, prompt_ids, rows, whitebox=record, draft=draft, drafter=drafter, **common
        )
    else:
        from spectest.sampling.mutants import get_variant

        variant = get_variant(arm.variant or "exact")
        out = builtin.speculative_decode(
            target, draft, prompt_ids, rows, drafter=drafter, variant=variant, whitebox=record,
            **common,
        )  # fmt: skip
    samples = builtin.to_samples_frame(out, prompt_id, rows, arm.name)
    if record:
        # NOTE: every arm, the reference included, records q_t with the same drafter law, so the
        # white-box tests run on the plain arm as the control on spectest's own p and A_t.
        assert out.whitebox is not None
        samples = pd.concat([samples, out.whitebox], axis=1)
    elif protocol.tests.whitebox and (on_hf or wb_mode == "teacher"):
        from spectest.engines.hf_teacher import hf_teacher_force

        # NOTE: p_t (and the processed q_t) with transformers' own warpers: its plain law. In
        # teacher mode the built-in teeth arms are forced by this same teacher too, so that the
        # two-sample tests compare one function of the sequences across arms.
        wb = hf_teacher_force(target, prompt_ids, [r.params for r in rows], out.tokens, draft=draft)
        samples = pd.concat([samples, wb], axis=1)
    rounds = None
    if out.rounds is not None:
        rounds = builtin.to_rounds_frame(out, prompt_id, rows, arm.name)
    return samples, rounds


LOW_PRECISION = ("bfloat16", "bf16", "float16", "fp16")


def whitebox_mode(protocol: Protocol) -> str:
    """'teacher' when some arm's white-box columns come from a teacher whose numerics may differ
    from its engine's (an hf engine in bf16/fp16), else 'exact' (``AnalysisOptions``).

    The built-in engine records its columns at generation time in every dtype; the hf arms are
    teacher-forced by ``hf_teacher_force``, whose full-sequence forward matches incremental
    decoding within float32 rounding but not in bf16/fp16 (issue 12).
    """
    e = protocol.engine
    on_hf = e.reference == "hf-generate" or e.candidate == "hf-assisted"
    return "teacher" if on_hf and protocol.models.dtype in LOW_PRECISION else "exact"


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
def _analysis_options(protocol_tests: Any, whitebox_mode: str = "exact") -> Any:
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
    )


def _stable_seed(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(parts).encode()).digest()[:4], "little")


def _readout(protocol: Protocol) -> frozenset[str]:
    return (
        frozenset({schema.CANDIDATE}) if protocol.engine.candidate == "hf-assisted" else frozenset()
    )


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
    ``readout_rounds`` are stored but not tested: the hf-assisted draft law is transformers'
    business, so acceptance vs Σ min(p, q_processed) measures speed there, not the law."""
    from spectest.stats.analyze import analyze

    options = _analysis_options(tests, whitebox_mode)
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
) -> tuple[Verdict, tuple[Comparison, ...], dict[str, Any]]:
    """Decide, write every final file, render reports from what was written, manifest last."""
    from spectest.report import write_reports
    from spectest.stats.histograms import position_counts

    comparisons = tuple(summarize(a, arm) for arm, a in results)
    verdict = decide(comparisons, max_mde_tv=max_mde_tv)
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
    analysis_schemas = {
        TESTS: schema.TESTS_SCHEMA,
        TRIE: schema.TRIE_SCHEMA,
        WHITEBOX: schema.WHITEBOX_TESTS_SCHEMA,
    }
    for fname, df in tidy_tables(results).items():
        tables[fname] = (df, analysis_schemas[fname])
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
    results = compare_all(
        samples, rounds, plan.arms, protocol.tests, protocol.seeds.key, progress,
        _readout(protocol), whitebox_mode(protocol),
    )  # fmt: skip
    verdict, comparisons, summary = finish_run(
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
        from spectest.compare import byo_arms, byo_tests

        tests = byo_tests(stored.summary["analysis"])
        arms = byo_arms()
        key = "compare"
        max_mde = None
        readout: frozenset[str] = frozenset()
        wb_mode = "exact"
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
        wb_mode = whitebox_mode(protocol)
    results = compare_all(samples, rounds, arms, tests, key, progress, readout, wb_mode)
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
