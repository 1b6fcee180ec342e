"""The runner: plan → engines → store → judge. ``run_protocol`` is the one library function
``spectest run`` / ``spectest teeth`` call; ``analyze_run`` is ``spectest analyze``'s
(``spectest.compare.compare_files`` is ``spectest compare``'s).

Owns: the order of operations of a run (resume from completed shards, generate the missing
ones, read everything back, hand them to ``spectest.judge``), the dispatch of each shard to its
arm's engine (through ``spectest.engines.registry``: no engine is named here), the loading of
the models the engines need, and torch's CPU thread setting. The summary's shape lives in
``spectest.summary``, prompt tokenisation in ``spectest.prompts``.

Knows nothing about how tokens are sampled (``spectest.engines``), how tests are computed or a
decision made (``spectest.judge``), how files are laid out (``spectest.store``) or rendered
(``spectest.report``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from spectest import schema
from spectest.engines.base import (
    ArmJob,
    DrafterSpec,
    Engine,
    Models,
    RowSpec,
    check_output,
    rounds_frame,
    samples_frame,
)
from spectest.errors import ConfigError, EngineError, InputError, ModelError
from spectest.judge import (
    ProgressFn,
    RunResult,
    compare_all,
    finish_run,
    judge,
    no_progress,
    readout_arms,
    summarize,
    whitebox_mode,
)
from spectest.plan import Arm, Plan, Shard, make_plan, stages
from spectest.prompts import prompt_token_ids, prompts_jsonl
from spectest.protocol import EngineChoice, Protocol, load_protocol, to_raw
from spectest.scaleout import local_devices
from spectest.sequential import CONTINUE, Look, decide_look, look_alphas, path_dict
from spectest.shipped import shipped_name
from spectest.store import (
    PROMPTS_FILE,
    ROUNDS,
    SAMPLES,
    TOOTH_SIZES,
    RunDir,
    load_run,
    make_provenance,
)
from spectest.summary import build_summary
from spectest.verdict import power_claim, required_resolution

__all__ = ["RunResult", "analyze_run", "configure_threads", "prompt_token_ids", "run_protocol"]


# ----------------------------------------------------------------------------- generation
def _rows(protocol: Protocol, arm: Arm) -> tuple[RowSpec, ...]:
    return tuple(
        RowSpec(cid, seed, sp) for cid, sp in protocol.configs for seed in arm.seeds.seeds()
    )


def _drafter(protocol: Protocol) -> DrafterSpec:
    d = protocol.drafter
    return DrafterSpec(onehot=d.kind == "onehot", q_mode=d.q, k=d.k)


class _Engines:
    """One engine instance per ``EngineChoice`` of the run, all started before generation, closed
    at the end; the models are loaded once, the draft only when an engine or white-box needs it."""

    def __init__(
        self,
        protocol: Protocol,
        arms: Sequence[Arm],
        plan_arms: Sequence[Arm] = (),
        *,
        fast: bool = False,
    ) -> None:
        from spectest.engines.registry import engine_class

        self.protocol = protocol
        # --fast: every built-in arm (teeth included) on the fast engine, same tokens and law
        # (engines/fast.py); arms of other engines are untouched
        self.classes = {
            a.engine: engine_class("fast" if fast and a.engine.name == "builtin" else a.engine.name)
            for a in arms
        }
        # white-box teacher mode is a property of the whole plan (resumed shards included)
        every = tuple(plan_arms) or tuple(arms)
        self.teacher_mode = whitebox_mode(protocol.models.dtype, every) == "teacher"
        self.hf_teacher = any(a.engine.name.startswith("hf-") for a in every)
        need_draft = protocol.tests.whitebox or any(
            self.classes[a.engine].needs_draft(a.variant) for a in arms
        )
        self.models = Models(*_load_models(protocol, need_draft))
        self.live: dict[EngineChoice, Engine] = {}
        self.teacher_s = 0.0  # wall time of the shared teacher (teacher mode), for the timings
        try:  # start every engine now: a broken one fails before any work
            for choice in self.classes:
                self.get(choice)
        except BaseException:
            self.close()
            raise

    def get(self, choice: EngineChoice) -> Engine:
        if choice not in self.live:
            self.live[choice] = self.classes[choice](choice.options, self.models)
        return self.live[choice]

    def provenance(self) -> dict[str, Any]:
        return {f"{c.name}#{i}": e.provenance() for i, (c, e) in enumerate(self.live.items())}

    def close(self) -> None:
        for e in self.live.values():
            e.close()


def _generate_shard(
    protocol: Protocol,
    arm: Arm,
    prompt_id: str,
    prompt_ids: list[int],
    engines: _Engines,
    run_key: int,
    progress: ProgressFn,
) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """Samples (with white-box columns when enabled) and rounds of one shard: one arm × one
    prompt, all configs × the arm's seeds, generated by the arm's engine."""
    engine = engines.get(arm.engine)
    rows = _rows(protocol, arm)
    label = f"generate {arm.name} / {prompt_id}"
    teacher_mode = engines.teacher_mode

    def tick(done: int) -> None:
        progress(label, done, len(rows))

    tick(0)
    job = ArmJob(
        arm=arm.name,
        role=arm.role,
        variant=arm.variant,
        prompt_id=prompt_id,
        prompt_ids=tuple(prompt_ids),
        rows=rows,
        num_positions=protocol.positions,
        run_key=run_key,
        batch_size=protocol.batch_size,
        drafter=_drafter(protocol),
        # teacher mode: the runner forces every arm with one shared teacher (``_shared_teacher``)
        whitebox=(
            protocol.tests.whitebox
            and engine.whitebox in ("generation", "teacher")
            and not teacher_mode
        ),
        progress=tick,
    )
    out = engine.generate(job)
    target = engines.models.target
    check_output(out, job, None if target is None else target.vocab_size, engine.name)
    if out.rounds is not None and (
        engine.rounds == "none" or out.rounds_tested != (engine.rounds == "tested")
    ):
        raise EngineError(
            f"engine {engine.name}: returned rounds (tested: {out.rounds_tested}) but declares "
            f"rounds = {engine.rounds!r}"
        )
    wb = None
    if job.whitebox:
        if out.whitebox is None:
            raise EngineError(f"engine {engine.name}: white-box columns were asked for, got none")
        wb = out.whitebox
    elif teacher_mode and protocol.tests.whitebox:
        t_teacher = time.perf_counter()
        wb = _shared_teacher(engines, job, out.tokens)
        engines.teacher_s += time.perf_counter() - t_teacher
    # one row per emitted token: a sequence that ended early is a shorter sequence
    samples = samples_frame(out.tokens, prompt_id, rows, arm.name, wb)
    rounds = None
    if out.rounds is not None:
        rounds = rounds_frame(out.rounds, prompt_id, rows, arm.name)
    _check_shard(samples, engine.name, arm.name, prompt_id)
    return samples, rounds


def _check_shard(samples: pd.DataFrame, engine: str, arm: str, prompt_id: str) -> None:
    """The analysis's own check of a samples table, before the shard is written and marked
    complete: a shard it would refuse is never stored (``check_output`` should have refused its
    output already; this is the last line)."""
    from spectest.stats.histograms import validate_samples

    try:
        validate_samples(samples)
    except InputError as err:
        raise EngineError(
            f"engine {engine} (arm {arm}, prompt {prompt_id}): the shard's samples are not "
            f"valid, nothing was written: {err}"
        ) from None


def _shared_teacher(engines: _Engines, job: ArmJob, tokens: Any) -> pd.DataFrame:
    """Teacher mode: the white-box columns of any arm from the run's one teacher — transformers'
    warpers (``hf_teacher_force``) when an hf engine is in the run, else spectest's pipeline
    (``teacher_force``) — so every arm's columns are the same function of its sequences."""
    import torch

    target, draft = engines.models.target, engines.models.draft
    # past a sequence's end (-1) force token 0: the models are causal, so it changes no column
    # of an emitted position, and samples_frame drops the ended positions' rows
    toks = torch.as_tensor(tokens, dtype=torch.int64).clamp(min=0)  # [B, T]
    params = [r.params for r in job.rows]
    if engines.hf_teacher:
        from spectest.engines.hf_teacher import hf_teacher_force

        return hf_teacher_force(target, job.prompt_ids, params, toks, draft=draft)
    from spectest.engines.teacher import teacher_force

    assert target is not None
    return teacher_force(target, job.prompt_ids, params, toks, draft=draft, drafter=job.drafter)


def _generate_missing(
    rd: RunDir,
    plan: Plan,
    protocol: Protocol,
    provenance: dict[str, Any],
    progress: ProgressFn,
    timings: dict[str, Any],
    *,
    teeth_only: bool,
    fast: bool,
    threads: int | None,
    workers: Sequence[str],
    ray: str | None,
) -> tuple[int, dict[str, Any], Models | None]:
    """Generate the plan's shards that are not done yet, on this process or spread over
    ``workers`` / Ray (``spectest.scaleout``); (shards generated, provenance, the models this
    process loaded or None). Adds the phase wall times to ``timings``."""
    todo = [s for s in plan.shards if not rd.shard_done(s.key)]
    models: Models | None = None
    if todo and (ray is not None or len(workers) > 1):
        t_gen = time.perf_counter()
        provenance = _generate_spread(
            protocol, rd, todo, provenance, teeth_only=teeth_only, fast=fast, threads=threads,
            workers=workers, ray=ray, progress=progress, timings=timings,
        )  # fmt: skip
        gen = timings["generate"]
        gen["all arms, spread"] = gen.get("all arms, spread", 0.0) + time.perf_counter() - t_gen
    elif todo:
        t_load = time.perf_counter()
        engines = _Engines(protocol, [plan.arm(s.arm) for s in todo], plan.arms, fast=fast)
        models = engines.models
        timings["load"] += time.perf_counter() - t_load
        try:
            target = engines.models.target
            assert target is not None
            prompt_ids = prompt_token_ids(
                protocol, target.vocab_size, (target, engines.models.draft)
            )
            run_key = _run_key(protocol)
            # one "generate" bar over every row of every shard still to do
            arms = [_shard_arm(plan, s) for s in todo]
            sizes = [len(protocol.configs) * len(a.seeds) for a in arms]
            total, base = sum(sizes), 0
            for shard, arm, size in zip(todo, arms, sizes, strict=True):

                def shard_progress(task: str, done: int, n: int, _base: int = base) -> None:
                    progress("generate", _base + done, total)

                t_gen, teacher0 = time.perf_counter(), engines.teacher_s
                samples, rounds = _generate_shard(
                    protocol,
                    arm,
                    shard.prompt_id,
                    prompt_ids[shard.prompt_id],
                    engines,
                    run_key,
                    shard_progress,
                )
                # white-box apart from generation: an engine's own teacher forcing (when it
                # reports it) and the shared teacher of teacher mode; generation-time columns
                # are part of generation
                wb_s = float(getattr(engines.get(arm.engine), "last_whitebox_s", 0))
                wb_s += engines.teacher_s - teacher0
                gen = timings["generate"]
                gen[shard.arm] = gen.get(shard.arm, 0.0) + time.perf_counter() - t_gen - wb_s
                timings["whitebox"] += wb_s
                engine_prov = {**provenance, "engines": engines.provenance()}
                rd.write_shard(shard.key, samples, rounds, engine_prov)
                base += size
            provenance = {**provenance, "engines": engines.provenance()}
        finally:
            engines.close()
        progress("generate", total, total)
    return len(todo), provenance, models


def _tooth_sizes(
    protocol: Protocol,
    plan: Plan,
    models: Models | None,
    progress: ProgressFn,
    timings: dict[str, Any],
) -> pd.DataFrame | None:
    """The ε arms' and mutants' TV per cell-position (``spectest.tooth_size``), from the run's
    models (loaded here when this process has not: a resumed or spread-out run); None when the
    plan has no such tooth. Adds ``tooth sizes`` (seconds, loading included) to ``timings``."""
    from spectest.tooth_size import tooth_sizes

    teeth = [(a.name, str(a.variant)) for a in plan.arms if a.role in ("eps", "mutant")]
    if not teeth:
        return None
    t0 = time.perf_counter()
    progress("tooth sizes", 0, 1)
    if models is None or models.target is None or models.draft is None:
        models = Models(*_load_models(protocol, need_draft=True))
    target, draft = models.target, models.draft
    assert target is not None and draft is not None
    sizes = tooth_sizes(
        target, draft, prompt_token_ids(protocol, target.vocab_size), protocol.configs, teeth,
        _drafter(protocol), protocol.positions, budget=protocol.teeth.size_budget,
    )  # fmt: skip
    progress("tooth sizes", 1, 1)
    timings["tooth sizes"] = time.perf_counter() - t0
    return sizes


def _shard_arm(plan: Plan, shard: Shard) -> Arm:
    """The shard's arm, with the shard's seeds when it is one stage of a growing arm."""
    arm = plan.arm(shard.arm)
    return arm if shard.seeds is None else replace(arm, seeds=shard.seeds)


def _load_models(protocol: Protocol, need_draft: bool) -> tuple[Any, Any]:
    """The protocol's target (and draft): a model that cannot be built or loaded, or a draft
    whose vocabulary differs from the target's, is one ``ModelError`` naming the protocol file
    and the field (``models.target`` / ``models.draft``)."""
    from spectest.models.derive import check_same_vocab
    from spectest.models.zoo import load_model

    m = protocol.models

    def load(field: str, spec: str, **kw: Any) -> Any:
        try:
            return load_model(spec, device=m.device, dtype=m.dtype, **kw)
        except (ModelError, ConfigError) as err:
            raise type(err)(f"{protocol.source}: models.{field}: {err}") from None

    target = load("target", m.target, seed=0)
    if not need_draft:
        return target, None
    draft = load("draft", m.draft, seed=1, target=target)  # load_pair's seeds
    try:
        check_same_vocab(target, draft)
    except ModelError as err:
        raise ModelError(f"{protocol.source}: models.draft: {err}") from None
    return target, draft


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
    fast: bool = False,
    devices: Sequence[str] | None = None,
    ray: str | None = None,
) -> RunResult:
    """Run a protocol (or its teeth only) into a run directory, resuming completed shards.
    ``threads``: torch intra-op threads for generation (see ``configure_threads``); ``fast``:
    the built-in arms on the fast engine (``engines/fast.py``). ``devices``: one worker process
    per device (default: every visible GPU of a ``cuda`` run, else this process); ``ray``: the
    shards as Ray tasks (``auto``, an address, or ``local``). Both write the same run directory
    as a single-device run (``spectest.scaleout``).

    The summary's ``timings`` holds the wall time of each phase in seconds: ``load`` (models),
    ``generate`` per arm (including white-box columns recorded at generation time),
    ``whitebox`` (teacher forcing apart from generation: teacher mode, or an engine that reports
    it), ``analyze`` and ``total_to_write``
    (everything before the final files); the write phase itself is in the returned summary only
    (``summary.json`` is sealed by the manifest before it ends)."""
    t0 = time.perf_counter()
    timings: dict[str, Any] = {"load": 0.0, "generate": {}, "whitebox": 0.0}
    progress = progress or no_progress
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
        # which protocol file this run used (a bare --config name may resolve to a shipped one)
        "protocol_source": protocol.source,
        "protocol_shipped": shipped_name(protocol.source),
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
    workers = list(devices) if devices else local_devices(protocol.models.device)
    # sequential protocols (seeds.max_per_arm) grow the reference and candidate arms stage by
    # stage, looking after each at that look's α (spectest.sequential); otherwise one stage
    sizes = stages(protocol)[: 1 if teeth_only else None]
    alphas = look_alphas(protocol.tests.alpha, sizes, protocol.seeds.spending)
    looks: list[Look] = []
    generated = 0
    teeth_sizes: pd.DataFrame | None = None
    for stage in range(len(sizes)):
        plan = make_plan(protocol, candidate=not teeth_only, stage=stage)
        n_new, provenance, models = _generate_missing(
            rd, plan, protocol, provenance, progress, timings, teeth_only=teeth_only, fast=fast,
            threads=threads, workers=workers, ray=ray,
        )  # fmt: skip
        generated += n_new
        if stage == 0:  # the teeth are the same at every stage: their sizes once
            teeth_sizes = _tooth_sizes(protocol, plan, models, progress, timings)
        del models
        samples, rounds = _read_shards(rd, plan)
        tests = protocol.tests if len(sizes) == 1 else replace(protocol.tests, alpha=alphas[stage])
        t_an = time.perf_counter()
        results = compare_all(
            samples, rounds, plan.arms, tests, protocol.seeds.key, progress,
            readout_arms(plan.arms), whitebox_mode(protocol.models.dtype, plan.arms),
        )  # fmt: skip
        timings["analyze"] = timings.get("analyze", 0.0) + time.perf_counter() - t_an
        if len(sizes) == 1:
            break
        # the stop rule asks the verdict's question: does the power claim (the MDE, or the
        # weakest killed tooth's size) meet the requirement (the protocol's, or 0.15)?
        comps = tuple(summarize(a, arm, rounds, teeth_sizes) for arm, a in results)
        cand = next(c for c in comps if c.role == "candidate")
        required, requirement = required_resolution(protocol.tests.max_mde_tv, kind=kind)
        claim = power_claim(comps)
        looks.append(
            decide_look(
                stage, sizes, alphas, rejected=bool(cand.rejected), mde_tv=cand.mde_tv,
                max_mde_tv=required, requirement=requirement, claim_tv=claim.tv,
                claim_source=claim.where(),
            )
        )  # fmt: skip
        progress(f"look {stage}: {looks[-1].decision}", stage + 1, len(sizes))
        if looks[-1].decision != CONTINUE:
            break
    todo_n, resumed = generated, len(plan.shards) - generated
    sequential = path_dict(looks, sizes, protocol.seeds.spending, protocol.tests.alpha)
    timings["total_to_write"] = time.perf_counter() - t0
    t_write = time.perf_counter()
    verdict, comparisons, summary = finish_run(
        rd,
        samples=samples,
        rounds=rounds,
        results=results,
        summary_base={
            "kind": kind,
            "name": protocol.name,
            "protocol_hash": protocol.hash,
            "notes": [f"shards: {todo_n} generated, {resumed} resumed from {rd.path}"]
            if resumed
            else [],
            "analysis": _analysis_dict(protocol.tests),
            "models": vars(protocol.models).copy(),
            "drafter": vars(protocol.drafter).copy(),
            "engines": protocol.engines_canonical(),
            "candidate": protocol.candidate,
            "positions": protocol.positions,
            "seeds_per_arm": sizes[len(looks) - 1] if looks else protocol.seeds.per_arm,
            "prompt_set": protocol.prompts.file,
            "timings": _rounded(timings),
            **({"sequential": sequential} if looks else {}),
        },
        provenance=provenance,
        max_mde_tv=protocol.tests.max_mde_tv,
        junit=junit,
        summary_md=summary_md,
        sizes=teeth_sizes,
    )
    summary = {
        **summary,
        "timings": {**summary["timings"], "write": _r(time.perf_counter() - t_write)},
    }
    return RunResult(
        rd.path, verdict, comparisons, summary, todo_n, resumed, time.perf_counter() - t0
    )


def _generate_spread(
    protocol: Protocol,
    rd: RunDir,
    todo: Sequence[Any],
    provenance: dict[str, Any],
    *,
    teeth_only: bool,
    fast: bool,
    threads: int | None,
    workers: Sequence[str],
    ray: str | None,
    progress: ProgressFn,
    timings: dict[str, Any],
) -> dict[str, Any]:
    """Generate ``todo`` on several workers (``spectest.scaleout``); the driver writes every
    shard as it comes back. Returns the provenance with each worker's engines and device, and
    adds each worker's phase times to ``timings["workers"]`` ("<worker> load" / "generate" /
    "wall" / "driver_wait"; a worker is its device, or host:pid on Ray)."""
    from spectest import scaleout

    n = scaleout.ray_workers(ray, protocol.models.device) if ray is not None else len(workers)
    groups = scaleout.split([s.key for s in todo], n)
    yaml_text = (rd.path / "protocol.yaml").read_text(encoding="utf-8")
    prompts_text = (rd.path / PROMPTS_FILE).read_text(encoding="utf-8")
    tasks = [
        scaleout.ShardTask(
            yaml_text,
            prompts_text,
            protocol.hash,
            teeth_only,
            g,
            protocol.models.device if ray is not None else workers[i],
            fast,
            threads,
        )
        for i, g in enumerate(groups)
    ]
    done: list[str] = []
    worker_prov: dict[str, Any] = {}
    worker_times = timings.setdefault("workers", {})
    by_device = ray is None and len(set(workers)) == len(workers)

    def on_shard(shard: scaleout.ShardResult) -> None:
        key, samples, rounds, prov = shard
        rd.write_shard(key, samples, rounds, {**provenance, **prov})
        w = prov["worker"]
        worker_prov[f"{w['host']}:{w['device']}:{w['pid']}"] = prov["engines"]
        who = w["device"] if by_device else f"{w['host']}:{w['pid']}"
        for phase, sec in (w.get("timings") or {}).items():  # "cuda:1 load": 6.2, ...
            worker_times[f"{who} {phase}"] = sec
        done.append(key)
        progress("generate", len(done), len(todo))

    progress("generate", 0, len(todo))
    (scaleout.run_ray if ray is not None else scaleout.run_local)(tasks, on_shard)
    return {**provenance, "workers": worker_prov, "scaleout": "ray" if ray else "processes"}


def _r(x: float) -> float:
    return round(float(x), 3)


def _rounded(timings: dict[str, Any]) -> dict[str, Any]:
    """Phase wall times in seconds, 3 decimals (``generate`` is a mapping arm → seconds)."""
    return {
        k: {a: _r(s) for a, s in v.items()} if isinstance(v, dict) else _r(v)
        for k, v in timings.items()
    }


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
    progress = progress or no_progress
    stored = load_run(run_dir)
    samples = stored.table(SAMPLES)
    if samples is None:
        raise InputError(f"{stored.path}: no {SAMPLES} in the run directory")
    rounds = stored.table(ROUNDS)
    base_summary = stored.summary
    if stored.info.get("kind") == "compare":
        from spectest.compare import byo_arms, byo_tests

        tests = byo_tests(stored.summary["analysis"])
        arms = byo_arms()
        key = "compare"
        max_mde = stored.summary["analysis"].get("max_mde_tv")
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
        # a sequential run stored the samples of its last look: re-test them at that look's α
        looks = (base_summary.get("sequential") or {}).get("looks") or []
        plan = make_plan(
            protocol,
            candidate=stored.info.get("kind") != "teeth",
            stage=looks[-1]["stage"] if looks else None,
        )
        arms = list(plan.arms)
        tests, key, max_mde = protocol.tests, protocol.seeds.key, protocol.tests.max_mde_tv
        if looks:
            tests = replace(tests, alpha=looks[-1]["alpha"])
        readout = readout_arms(arms)
        wb_mode = whitebox_mode(protocol.models.dtype, arms)
    results = compare_all(samples, rounds, arms, tests, key, progress, readout, wb_mode)
    comparisons, verdict = judge(
        results, max_mde, kind=str(stored.info.get("kind", "run")), rounds=rounds,
        sizes=stored.table(TOOTH_SIZES),
    )  # fmt: skip
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
