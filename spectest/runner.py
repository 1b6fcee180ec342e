"""The order of a run: ``run_protocol``, which ``spectest run`` and ``spectest teeth`` call.

Owns the sequence: open the run directory (resuming), then per stage generate the missing shards,
the teeth's sizes once, claim (b)'s tables (engine I/O stays here, not in ``judge``), analyse,
look; ``judge.finish_run`` decides and writes. docs/architecture.md "The run path".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from spectest import schema
from spectest.decision.claims import (
    ClaimB,
    NumericsClaim,
    TeacherForcedClaim,
    power_claim,
    required_resolution,
    run_claim_b,
)
from spectest.decision.comparison import compare_arm
from spectest.decision.header import Header, protocol_setup
from spectest.decision.judge import RunResult, finish_run
from spectest.decision.where import Comparisons, beside_replay, prespawn
from spectest.engines.base import Models
from spectest.engines.plain_laws import law_table
from spectest.errors import ConfigError
from spectest.files import make_provenance
from spectest.fingerprint import arm_fingerprints
from spectest.generation import (
    EngineSet,
    RunOptions,
    ShardResult,
    check_device,
    configure_threads,
    device_name,
    generate_shards,
    load_models,
    matched_drift,
)
from spectest.plan import Plan, Shard, make_plan, stages
from spectest.progress import ProgressFn, no_progress
from spectest.protocol import MATCHED, Protocol
from spectest.report import prefetch
from spectest.reuse import open_run_dir
from spectest.scaleout import TeethInProcess, WorkerPool, generate_spread, local_devices, make_pool
from spectest.sequential import CONTINUE, Look, decide_look, look_alphas, path_dict
from spectest.shipped import shipped_name
from spectest.store import FINGERPRINTS_KEY, PROMPTS_FILE, UNFINGERPRINTED, RunDir
from spectest.stored import read_shards
from spectest.teeth_phase import Beside, spawn_early, start_beside, tooth_sizes_phase

__all__ = ["RunOptions", "RunResult", "run_dir_for", "run_protocol"]


def run_protocol(
    protocol: Protocol,
    *,
    out: str | Path | None = None,
    options: RunOptions | None = None,
    progress: ProgressFn | None = None,
    junit: Path | None = None,
    summary_md: Path | None = None,
    pool: WorkerPool | None = None,
) -> RunResult:
    """The ``RunResult`` of a protocol run (``options.teeth_only``: its teeth only) written into
    ``out`` (default ``<output>/<run_id>[-teeth]``), resuming completed shards.

    Notes
    -----
    A spread run (``options.devices``, ``options.ray``) writes the same directory as a
    single-device one. ``pool``: persistent workers left open for the caller; None: a spread
    run makes its own, closed at the end.
    """
    t0 = time.perf_counter()
    options = options or RunOptions()
    if options.analysis_procs is not None and options.analysis_procs < 1:
        raise ConfigError(
            f"--analysis-procs: expected an integer >= 1, got {options.analysis_procs!r}"
        )
    check_device(protocol)
    n_threads = configure_threads(protocol.models.device, options.threads)
    run = _open_run(protocol, options, out, n_threads, progress or no_progress)
    run.pool = pool
    try:
        looked = _run_stages(run)
    except BaseException:
        run.rd.release()  # the shards written are kept; a caller in this process may resume
        raise
    finally:
        if pool is None and run.pool is not None:
            run.pool.close()
        if run.analysis is not None:  # the comparisons' process, whether used or not
            run.analysis.shutdown(wait=False, cancel_futures=True)
    run.timings["total_to_write"] = time.perf_counter() - t0
    verdict, comparisons, summary = _write(run, looked, junit, summary_md)
    resumed = len(looked.plan.shards) - run.generated
    elapsed = time.perf_counter() - t0
    return RunResult(run.rd.path, verdict, comparisons, summary, run.generated, resumed, elapsed)


def _write(
    run: _Run, looked: _Looked, junit: Path | None, summary_md: Path | None
) -> tuple[Any, Any, dict[str, Any]]:
    """``judge.finish_run`` on what the stages left; the summary gains the write's wall time."""
    t_write = time.perf_counter()
    run.progress("write", 0, 1)
    verdict, comparisons, summary = finish_run(
        run.rd,
        samples=looked.samples,
        rounds=looked.rounds,
        results=looked.results,
        header=_header(run, looked),
        provenance=run.provenance,
        settings=looked.plan.settings,
        junit=junit,
        summary_md=summary_md,
        sizes=looked.teeth_sizes,
        numerics=looked.numerics,
    )
    run.progress("write", 1, 1)
    write_s = round(time.perf_counter() - t_write, 3)
    return verdict, comparisons, {**summary, "timings": {**summary["timings"], "write": write_s}}


def run_dir_for(protocol: Protocol, out: str | Path | None, *, teeth_only: bool = False) -> Path:
    """The run directory: ``out``, else ``<output>/<run_id>[-teeth]``."""
    suffix = "-teeth" if teeth_only else ""
    return Path(out) if out is not None else Path(protocol.output) / (protocol.run_id + suffix)


@dataclass
class _Run:
    """A run in progress: what every stage reads, and what it adds (the provenance, the phase
    wall times, the count of shards generated)."""

    protocol: Protocol
    options: RunOptions
    rd: RunDir
    provenance: dict[str, Any]
    progress: ProgressFn
    workers: list[str]
    pool: WorkerPool | None = None
    teeth_from_pool: pd.DataFrame | None = None  # tooth sizes a pool worker computed
    teeth_beside: Beside | None = None  # the tooth sizes beside generation (process or thread)
    analysis: ProcessPoolExecutor | None = None  # the comparisons' process (``where.prespawn``)
    verify: dict[str, Any] = field(default_factory=dict)  # claim (b)'s rows kept at generation
    timings: dict[str, Any] = field(
        default_factory=lambda: {"load": 0.0, "generate": {}, "whitebox": 0.0}
    )
    generated: int = 0


@dataclass(frozen=True)
class _Looked:
    """What the stages left, the last stage's tables (``sizes``: seeds per arm per stage)."""

    plan: Plan
    samples: pd.DataFrame
    rounds: pd.DataFrame | None
    results: list[tuple[Any, Any]]
    looks: tuple[Look, ...]
    sizes: tuple[int, ...]
    teeth_sizes: pd.DataFrame | None
    numerics: ClaimB | None = None  # claim (b): matched mode / floor arm


def _open_run(
    protocol: Protocol,
    options: RunOptions,
    out: str | Path | None,
    threads: int,
    progress: ProgressFn,
) -> _Run:
    """The run directory (created, or opened to resume: ``reuse.open_run_dir``), its provenance
    and the workers of a spread run."""
    plan = make_plan(protocol, teeth_only=options.teeth_only)
    if options.teeth_only and not any(a.is_tooth for a in plan.arms):
        raise ConfigError(
            f"{protocol.source}: teeth: no teeth configured (null_arm, epsilons, mutants)"
        )
    run_dir = run_dir_for(protocol, out, teeth_only=options.teeth_only)
    info = {
        "kind": options.kind,
        "protocol_hash": protocol.hash,
        "name": protocol.name,
        "arms": [
            {"name": a.name, "role": a.role, "variant": a.variant, "expect": a.expect}
            for a in plan.arms
        ],
        "seed_ranges": plan.seed_ranges,
        "protocol_source": protocol.source,  # a bare --config name may be a shipped one
        "protocol_shipped": shipped_name(protocol.source),
        FINGERPRINTS_KEY: _fingerprints(plan, options.fast),
    }
    rd = open_run_dir(run_dir, info, protocol, plan, options.reuse)  # --reuse: spectest.reuse
    provenance = make_provenance(
        threads=threads,
        protocol_hash=protocol.hash,
        device=device_name(protocol.models.device),
        seed_ranges=plan.seed_ranges,
        kind=options.kind,
    )
    workers = list(options.devices) or local_devices(protocol.models.device)
    return _Run(protocol, options, rd, provenance, progress, workers)


def _fingerprints(plan: Plan, fast: bool) -> dict[str, dict[str, str]]:
    """What each arm runs, hashed (``spectest.fingerprint``), for resumes; under ``--fast`` an arm
    on its engine's fast variant adds it and the kernel switches (``engine-variant:NAME``,
    ``engine-kernels:NAME``: they change its tokens, so a resume across them regenerates it)."""
    from spectest.engines.command import expand
    from spectest.engines.registry import BUILTIN, engine_class
    from spectest.models.decode_attention import settings

    def declared(name: str, attr: str = "version") -> str | None:  # an engine's version / variant
        try:
            v = getattr(engine_class(name), attr, None)
        except Exception:  # an engine that cannot be imported here: its run says so later
            return None
        return v if isinstance(v, str) and v else None

    fps = arm_fingerprints(plan.arms, declared, expand=expand, builtin=BUILTIN)
    for arm in plan.arms if fast else ():
        if (variant := declared(name := arm.engine.name, "fast_variant")) is not None:
            more = {"variant": variant, "kernels": settings()}  # a new dict: arms share the memo's
            fps[arm.name] = fps[arm.name] | {f"engine-{k}:{name}": v for k, v in more.items()}
    return fps


def _run_stages(run: _Run) -> _Looked:
    """Generate, read back and analyse each stage. Sequential protocols (``seeds.max_per_arm``)
    grow the reference and candidate arms stage by stage, looking after each at that look's α
    (``spectest.sequential``) and stopping at the first decision; otherwise one stage."""
    p = run.protocol
    sizes = stages(p)[: 1 if run.options.teeth_only else None]
    alphas = look_alphas(p.tests.alpha, sizes, p.seeds.spending)
    looks: list[Look] = []
    teeth_sizes: pd.DataFrame | None = None
    numerics: ClaimB | None = None
    for stage in range(len(sizes)):
        plan = make_plan(p, teeth_only=run.options.teeth_only, stage=stage)
        if len(sizes) == 1:  # the comparisons' process, its imports beside the load (where)
            run.analysis = prespawn(plan, p.models.device, run.options.analysis_procs)
        models = _generate_missing(run, plan, teeth=stage == 0)
        if stage == 0:  # the teeth are the same at every stage: their sizes once
            prefetch()  # the report's imports on a thread while the rest waits on the device
            teeth_sizes = _tooth_sizes(run, plan, models)
        samples, rounds = read_shards(run.rd, plan)
        procs = run.options.analysis_procs
        with Comparisons(samples, rounds, plan.arms, plan.settings, procs, run.analysis) as comps:
            if len(sizes) == 1:  # a sequential run's claim (b): after its last look (below)
                numerics = _numerics(run, plan, samples, rounds, models, comps)
            del models
            results = _analyze(run, comps)
        if len(sizes) == 1:
            break
        looks.append(_look(run, stage, sizes, alphas, results, rounds, teeth_sizes))
        run.progress(f"look {stage}: {looks[-1].decision}", stage + 1, len(sizes))
        if looks[-1].decision != CONTINUE:
            break
    if len(sizes) > 1:
        numerics = _numerics(run, plan, samples, rounds, None)
    return _Looked(plan, samples, rounds, results, tuple(looks), sizes, teeth_sizes, numerics)


def _analyze(run: _Run, comps: Comparisons) -> list[tuple[Any, Any]]:
    """Every arm of the stage's plan against the reference (``judge.compare_all`` at the plan's
    settings; a sequential plan's: its look's α), computed here or waited for from the process
    beside claim (b)'s replay (``decision.where``), timed."""
    t_an = time.perf_counter()
    results = comps.result(run.progress, run.timings)
    run.timings["analyze"] = run.timings.get("analyze", 0.0) + time.perf_counter() - t_an
    return results


def _look(
    run: _Run,
    stage: int,
    sizes: Sequence[int],
    alphas: Sequence[float],
    results: list[tuple[Any, Any]],
    rounds: pd.DataFrame | None,
    teeth_sizes: pd.DataFrame | None,
) -> Look:
    """The stop rule asks the verdict's question: does the power claim (the MDE, or the
    weakest killed tooth's size) meet the requirement (the protocol's, or 0.15)?"""
    comps = tuple(compare_arm(a, arm, rounds, teeth_sizes) for arm, a in results)
    cand = next(c for c in comps if c.role == "candidate")
    need, requirement = required_resolution(run.protocol.tests.max_mde_tv, kind=run.options.kind)
    claim = power_claim(comps)
    return decide_look(
        stage,
        sizes,
        alphas,
        rejected=bool(cand.rejected),
        mde_tv=cand.mde_tv,
        max_mde_tv=need,
        requirement=requirement,
        claim_tv=claim.tv,
        claim_source=claim.where(),
    )


def _generate_missing(run: _Run, plan: Plan, teeth: bool = False) -> Models | None:
    """Generate the plan's shards that are not done yet, on this process or spread over the
    workers / Ray; the models this process loaded, or None. Adds the phase wall times.
    ``teeth``: a spread run also has one worker compute the tooth sizes."""
    todo = [s for s in plan.shards if not run.rd.shard_done(s.key)]
    if not todo:
        return None
    run.generated += len(todo)
    if run.pool is not None or run.options.ray is not None or len(run.workers) > 1:
        _generate_spread(run, plan, todo, teeth)
        return None
    t_load = time.perf_counter()
    run.progress("load models", 0, 1)
    one = len(stages(run.protocol)) == 1  # a sequential run's claim (b) loads and replays
    arms, fast = [plan.arm(s.arm) for s in todo], run.options.fast
    load = lambda: EngineSet(run.protocol, arms, plan, fast=fast, capture=one)  # noqa: E731
    engines = _load_with_teeth(run, plan.settings.sized_teeth if teeth else (), load)
    run.verify = engines.verify
    run.progress("load models", 1, 1)
    run.timings["load"] += time.perf_counter() - t_load

    def write(r: ShardResult) -> None:
        run.timings["generate"][r.arm] = run.timings["generate"].get(r.arm, 0.0) + r.generate_s
        run.timings["whitebox"] += r.whitebox_s
        run.rd.write_shard(r.key, r.samples, r.rounds, {**run.provenance, **r.provenance})
        if r.rounds is not None and run.teeth_beside is not None:  # a speculative shard
            run.teeth_beside.grant()  # the run's caches and graph pools exist now

    try:
        generate_shards(run.protocol, plan, todo, engines, write, run.progress)
        run.provenance = {**run.provenance, "engines": engines.provenance()}
    except BaseException:
        if run.teeth_beside is not None:  # the run's error once the thread is done
            run.teeth_beside.abandon()
        raise
    finally:
        engines.close()
    return engines.models


def _load_with_teeth(
    run: _Run, sized: Sequence[tuple[str, str]], load: Callable[[], EngineSet]
) -> EngineSet:
    """``load()``, and the tooth sizes of ``sized`` started beside generation where they apply
    (stage 0: a process or thread, ``teeth_phase.start_beside``). A process that may be used is
    spawned before the load (``spawn_early``: its imports beside it), stopped if unused."""
    spawn = lambda: TeethInProcess(run.protocol, run.rd.path, run.options)  # noqa: E731
    early = spawn() if spawn_early(run.protocol, sized) else None
    try:
        engines = load()
        if sized:
            process = lambda: (early or spawn()).load()  # noqa: E731
            run.teeth_beside = start_beside(run.protocol, sized, engines.models, process)
    finally:
        if early is not None and run.teeth_beside is not early:
            early.abandon(wait=False)  # unused, or the load failed
    return engines


def _generate_spread(run: _Run, plan: Plan, todo: Sequence[Shard], teeth: bool) -> None:
    """``todo`` on the run's pool of workers (``scaleout.generate_spread``; made on first use),
    each shard written as it lands; the provenance gains each worker's engines and device,
    ``timings["workers"]`` each worker's phase times (summed over stages)."""
    t_gen = time.perf_counter()
    files = tuple(
        (run.rd.path / name).read_text(encoding="utf-8") for name in ("protocol.yaml", PROMPTS_FILE)
    )
    base = run.provenance
    worker_times = run.timings.setdefault("workers", {})

    def write(r: ShardResult) -> None:
        run.rd.write_shard(r.key, r.samples, r.rounds, {**base, **r.provenance})

    keys = [s.key for s in todo]
    if run.pool is None:
        run.pool = make_pool(run.options, run.workers)
    # stage 0 (the teeth are generated then): one worker also computes the tooth sizes, first
    # in the queue, so the driver neither loads the models nor waits for them after generation
    teeth = teeth and bool(plan.settings.sized_teeth)
    extra, times, sizes = generate_spread(
        run.protocol,
        (files[0], files[1]),
        keys,
        run.options,
        run.pool,
        write,
        run.progress,
        tooth_sizes=teeth,
    )
    if sizes is not None:
        run.teeth_from_pool = sizes
    for k, v in times.items():
        worker_times[k] = worker_times.get(k, 0.0) + v
    run.provenance = {**base, **extra}
    gen = run.timings["generate"]
    gen["all arms, spread"] = gen.get("all arms, spread", 0.0) + time.perf_counter() - t_gen


def _tooth_sizes(run: _Run, plan: Plan, models: Models | None) -> pd.DataFrame | None:
    """``teeth_phase.tooth_sizes_phase`` with the run's models, timings, pool and thread."""
    beside, run.teeth_beside = run.teeth_beside, None
    teeth = plan.settings.sized_teeth
    return tooth_sizes_phase(
        run.protocol, teeth, models, run.timings, run.progress,
        from_pool=run.teeth_from_pool, beside=beside,
    )  # fmt: skip


def _numerics(
    run: _Run,
    plan: Plan,
    samples: pd.DataFrame,
    rounds: pd.DataFrame | None,
    models: Models | None,
    comps: Comparisons | None = None,
) -> ClaimB | None:
    """Claim (b)'s inputs: ``claims.run_claim_b``'s claim with its table (the plain engine's
    laws: ``plain_laws.law_table``; matched: the drift table), timed as ``numerics``; ``comps``
    are spawned beside a replay where ``decision.where.beside_replay`` says so."""
    claim = run_claim_b(plan, samples, None)
    matched = rounds is not None and bool((rounds[schema.ARM] == MATCHED).any())
    replays = isinstance(claim, TeacherForcedClaim) or (
        isinstance(claim, NumericsClaim) and matched
    )
    procs = run.options.analysis_procs
    if comps is not None and beside_replay(run.protocol.models.device, replays, procs):
        comps.spawn()
    t0 = time.perf_counter()
    if isinstance(claim, TeacherForcedClaim):  # the engine's I/O is here, not in the judge
        if models is None or models.target is None:
            models = load_models(run.protocol, need_draft=False)
        frames = (claim.candidate, claim.reference)
        table = law_table(run.protocol, models, frames, claim.sequences, run.progress)
    elif isinstance(claim, NumericsClaim) and matched:
        run.progress("numerics drift", 0, 1)
        table = matched_drift(
            run.protocol, samples, rounds, models, fast=run.options.fast, verify=run.verify
        )
        run.verify.clear()
        run.progress("numerics drift", 1, 1)
    else:  # none, or a floor arm's claim from its tokens
        return claim
    run.timings["numerics"] = time.perf_counter() - t0
    return replace(claim, table=table)


def _header(run: _Run, looked: _Looked) -> Header:
    """What the run's summary is about: the protocol, its setup, the shards resumed."""
    p = run.protocol
    resumed = len(looked.plan.shards) - run.generated
    notes = (f"shards: {run.generated} generated, {resumed} resumed from {run.rd.path}",)
    fps = run.rd.info.get(FINGERPRINTS_KEY) or {}
    unfp = tuple(
        f"provenance: arm {arm!r} runs {fp[UNFINGERPRINTED]}: it cannot be fingerprinted, so a "
        "resume cannot tell whether it changed"
        for arm, fp in fps.items()
        if UNFINGERPRINTED in fp
    )
    looks = list(looked.looks)
    sequential = path_dict(looks, looked.sizes, p.seeds.spending, p.tests.alpha) if looks else None
    setup = protocol_setup(
        p,
        seeds_per_arm=looked.sizes[len(looked.looks) - 1] if looked.looks else p.seeds.per_arm,
        timings=_rounded(run.timings),
        sequential=sequential,
    )
    setup["fingerprints"] = fps
    return Header(
        run.options.kind,
        p.name,
        p.hash,
        p.tests.canonical(),
        (*run.rd.notes, *(notes if resumed else ()), *unfp),
        setup,
    )


def _rounded(timings: dict[str, Any]) -> dict[str, Any]:
    """Phase wall times in seconds, 3 decimals (``generate`` is a mapping arm → seconds)."""
    rd = lambda x: round(float(x), 3)  # noqa: E731
    return {
        k: {a: rd(s) for a, s in v.items()} if isinstance(v, dict) else rd(v)
        for k, v in timings.items()
    }
