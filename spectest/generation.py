"""Generation: a plan's shards from the engines of their arms, on this process (``EngineSet``,
``generate_shards``), and what the driver computes from the loaded models.

The why and the details: docs/internals.md "spectest/generation.py".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from spectest import schema
from spectest.engines.base import (
    ArmJob,
    Engine,
    Models,
    RowSpec,
    check_output,
    rounds_frame,
    samples_frame,
)
from spectest.engines.registry import engine_class
from spectest.errors import ConfigError, EngineError, InputError, ModelError
from spectest.plan import Arm, Plan, Shard
from spectest.progress import ProgressFn, no_progress, shards_label
from spectest.prompts import prompt_token_ids
from spectest.protocol import EngineChoice, Protocol


@dataclass(frozen=True)
class RunOptions:
    """How a run is executed (none of it enters the protocol hash or changes a token).

    ``teeth_only``: the plan of ``spectest teeth`` (no candidate arm). ``fast``: every arm whose
    engine declares a ``fast_variant`` (the built-in engine: ``engines/fast.py``, same tokens
    and law) on that variant. ``threads``: torch intra-op threads (``configure_threads``).
    ``devices``: one worker process per device (empty: every visible GPU of a ``cuda`` run,
    else this process). ``ray``: the shards on Ray actors (``auto``, an address, or
    ``local``). ``analysis_procs``: processes for the sequence family's per-cell permutation
    statistics (None or 1: this process; same results either way). ``reuse``: another run
    directory whose generation this run takes (``spectest.reuse``; same tokens).
    """

    teeth_only: bool = False
    fast: bool = False
    threads: int | None = None
    devices: tuple[str, ...] = ()
    ray: str | None = None
    analysis_procs: int | None = None
    reuse: Path | None = None

    @property
    def kind(self) -> str:
        """The run's kind as stored (``run.json``, ``summary.json``): teeth or run."""
        return "teeth" if self.teeth_only else "run"


@dataclass(frozen=True)
class ShardResult:
    """One generated shard: its key and arm, its samples (with white-box columns when enabled)
    and rounds, ``provenance`` (the engines' as this shard was made, and a worker's own), the
    wall time of generation (``generate_s``, white-box apart) and of white-box columns had
    apart from generation (``whitebox_s``). Plain data: it crosses process and Ray boundaries."""

    key: str
    arm: str
    samples: pd.DataFrame
    rounds: pd.DataFrame | None
    provenance: dict[str, Any]
    generate_s: float = 0.0
    whitebox_s: float = 0.0


def protocol_tooth_sizes(
    protocol: Protocol, teeth: Sequence[tuple[str, str]], models: Models
) -> pd.DataFrame | None:
    """``tooth_size.tooth_sizes`` of a plan's ε arms and mutants (``RunSettings.sized_teeth``:
    (arm, variant)) from ``models`` (target and draft), as a run computes them — in the driver,
    or on a pool worker that holds the models (``scaleout``); None when there is no such
    tooth."""
    from spectest.tooth_size import tooth_sizes

    if not teeth:
        return None
    target, draft = models.target, models.draft
    assert target is not None and draft is not None
    p = protocol
    return tooth_sizes(
        target,
        draft,
        prompt_token_ids(p, target.vocab_size),
        p.configs,
        list(teeth),
        p.drafter,
        p.positions,
        budget=p.teeth.size_budget,
    )


def matched_drift(
    protocol: Protocol,
    samples: pd.DataFrame,
    rounds: pd.DataFrame,
    models: Models | None,
    *,
    fast: bool,
    verify: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """The matched arm's per-token drift and floor table (``numerics.table.drift_table``, its
    floors completed by ``numerics.floors``) from ``models``' target, loaded when absent;
    ``verify``: the verify-schedule logits kept at generation (``EngineSet.verify``)."""
    from spectest.numerics.floors import complete_floors, floor_column
    from spectest.numerics.table import drift_table
    from spectest.protocol import MATCHED

    p = protocol
    if models is None or models.target is None:
        models = load_models(p, need_draft=False)
    target = models.target
    assert target is not None
    prompts = prompt_token_ids(p, target.vocab_size)
    setting = p.tests.numerics_floor  # prefill/dtype alone: no batch-1 decodes
    common: dict[str, Any] = dict(arm=MATCHED, batch_size=p.batch_size, positions=p.positions)
    table = drift_table(
        target,
        samples,
        rounds,
        prompts,
        p.configs,
        K=p.drafter.k,
        fast=fast,
        rows_per_cell=p.tests.numerics_sequences,
        floor_rows_per_cell=0 if setting in ("prefill", "dtype") else None,
        floor_sequences=p.tests.numerics_floor_sequences,
        verify=verify,
        **common,
    )

    def f32() -> Any:  # the dtype floor: the target once more, in float32
        return load_models(replace(p, models=replace(p.models, dtype="float32")), False).target

    def measure(kind: str) -> np.ndarray:
        args = (kind, table, target, samples, prompts, p.configs)
        return floor_column(*args, float32_target=f32, **common)

    return complete_floors(table, setting, measure)


def run_key(protocol: Protocol) -> int:
    """The run key every row key derives from (``seeds.key``)."""
    from spectest.seeding import run_key_from

    return run_key_from(protocol.seeds.key)


def shard_arm(plan: Plan, shard: Shard) -> Arm:
    """The shard's arm, with the shard's seeds when it is one stage of a growing arm."""
    arm = plan.arm(shard.arm)
    return arm if shard.seeds is None else replace(arm, seeds=shard.seeds)


def _class_for(name: str, fast: bool) -> type[Engine]:
    """The engine class of ``name``, or under ``--fast`` the variant it declares."""
    cls = engine_class(name)
    return engine_class(cls.fast_variant) if fast and cls.fast_variant is not None else cls


class EngineSet:
    """One engine instance per ``EngineChoice`` of ``arms``, all started before generation,
    closed at the end; the models are loaded once, the draft only when an engine or white-box
    needs it. ``plan`` (every arm of it, resumed shards' included) gives the white-box mode
    (``Plan.settings``) and decides the shared teacher: they are properties of the whole run.
    ``load`` (protocol, need_draft) → ``Models`` replaces ``load_models`` (a worker that keeps
    its models loaded between runs passes its cache). ``capture``: the matched arm keeps the
    rows claim (b) measures under the verify schedule, by prompt in ``verify`` (where they fit:
    ``numerics.table.capture_fits``), so that claim (b) reads them instead of replaying."""

    def __init__(
        self,
        protocol: Protocol,
        arms: Sequence[Arm],
        plan: Plan,
        *,
        fast: bool = False,
        load: Callable[[Protocol, bool], Models] | None = None,
        capture: bool = False,
    ) -> None:
        self.protocol = protocol
        self.capture = capture and plan.settings.matched and protocol.floor is None
        self.verify: dict[str, tuple[list[tuple[str, int]], Any]] = {}  # prompt → keys, logits
        self.classes = {a.engine: _class_for(a.engine.name, fast) for a in arms}
        every = plan.arms
        self.teacher_mode = plan.settings.options.whitebox_mode == "teacher"
        # the one teacher of teacher mode: transformers' when an arm's engine declares it
        teachers = {engine_class(a.engine.name).teacher for a in every}
        self.teacher = "hf" if "hf" in teachers else "spectest"
        need_draft = protocol.tests.whitebox or any(
            self.classes[a.engine].needs_draft(a.variant) for a in arms
        )
        # ``load``: a persistent worker's cache (``scaleout``), models kept between runs
        self.models = (load or load_models)(protocol, need_draft)
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

    def capture_rows(self, arm: Arm, rows: Sequence[RowSpec]) -> tuple[int, ...]:
        """The rows of a shard of ``arm`` whose verify-schedule logits to keep: claim (b)'s
        measured rows (``numerics.table.measured_rows``) of the matched arm, where they fit."""
        from spectest.numerics.table import capture_fits, measured_rows
        from spectest.protocol import MATCHED

        target = self.models.target
        if not self.capture or arm.name != MATCHED or target is None:
            return ()
        p = self.protocol
        keys = [(r.config_id, r.seed) for r in rows]
        keep = measured_rows(keys, [c for c, _ in p.configs], p.tests.numerics_sequences)
        need = 4.0 * len(keep) * p.positions * target.vocab_size  # float32 at most
        held = sum(4.0 * v.numel() for _, v in self.verify.values())
        return tuple(keep) if capture_fits(target.device, need, held) else ()

    def close(self) -> None:
        for e in self.live.values():
            e.close()


def generate_shards(
    protocol: Protocol,
    plan: Plan,
    shards: Sequence[Shard],
    engines: EngineSet,
    on_shard: Callable[[ShardResult], None],
    progress: ProgressFn = no_progress,
) -> None:
    """Generate ``shards`` in order with ``engines``, handing each to ``on_shard`` as it is
    done; one ``generate`` progress bar over every row of every shard."""
    target = engines.models.target
    assert target is not None
    prompt_ids = prompt_token_ids(protocol, target.vocab_size, (target, engines.models.draft))
    key = run_key(protocol)
    arms = [shard_arm(plan, s) for s in shards]
    sizes = [len(protocol.configs) * len(a.seeds) for a in arms]
    total, base = sum(sizes), 0
    for i, (shard, arm, size) in enumerate(zip(shards, arms, sizes, strict=True)):
        progress(shards_label(arm.name), i, len(shards))

        def tick(done: int, _base: int = base) -> None:
            progress("generate", _base + done, total)

        t_gen, teacher0 = time.perf_counter(), engines.teacher_s
        samples, rounds = generate_shard(
            protocol, arm, shard.prompt_id, prompt_ids[shard.prompt_id], engines, key, tick
        )
        # white-box apart from generation: an engine's own teacher forcing (when it reports
        # it) and the shared teacher of teacher mode; generation-time columns are generation
        wb_s = float(getattr(engines.get(arm.engine), "last_whitebox_s", 0))
        wb_s += engines.teacher_s - teacher0
        gen_s = time.perf_counter() - t_gen - wb_s
        prov = {"engines": engines.provenance()}
        on_shard(ShardResult(shard.key, shard.arm, samples, rounds, prov, gen_s, wb_s))
        base += size
        progress(shards_label(arm.name), i + 1, len(shards))
    progress("generate", total, total)


def generate_shard(
    protocol: Protocol,
    arm: Arm,
    prompt_id: str,
    prompt_ids: list[int],
    engines: EngineSet,
    key: int,
    tick: Callable[[int], None],
) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """Samples (with white-box columns when enabled) and rounds of one shard: one arm × one
    prompt, all configs × the arm's seeds, generated by the arm's engine and checked
    (``check_output``, the declared rounds, ``check_shard``). ``tick``: rows done so far."""
    engine = engines.get(arm.engine)
    rows = tuple(
        RowSpec(cid, seed, sp) for cid, sp in protocol.configs for seed in arm.seeds.seeds()
    )
    floor = protocol.floor if arm.role == "floor" else None  # another shape
    if floor is not None and floor.order == "reversed":
        rows = rows[::-1]
    tick(0)
    job = ArmJob(
        arm=arm.name,
        # the floor and a plain null are the reference engine's plain decode, asked as such
        role="reference" if floor is not None or arm.null_engine is not None else arm.role,
        variant=arm.variant,
        prompt_id=prompt_id,
        prompt_ids=tuple(prompt_ids),
        rows=rows,
        num_positions=protocol.positions,
        run_key=key,
        batch_size=(floor.batch_size if floor else None) or protocol.batch_size,
        drafter=protocol.drafter,
        # teacher mode: every arm is forced by the one shared teacher (``shared_teacher``)
        whitebox=(
            protocol.tests.whitebox
            and engine.whitebox in ("generation", "teacher")
            and not engines.teacher_mode
        ),
        progress=tick,
        capture=engines.capture_rows(arm, rows),
    )
    out = engine.generate(job)
    if job.capture and out.verify is not None:  # claim (b) reads them (``matched_drift``)
        kept = [(rows[i].config_id, rows[i].seed) for i in job.capture]
        engines.verify[prompt_id] = (kept, out.verify)
    wb = _checked_whitebox(protocol, engines, engine, job, out)
    if out.reported is not None:  # the engine's own per-token claims (engines-reported-p.md)
        wb = reported_columns(out.reported, wb)
    # one row per emitted token: a sequence that ended early is a shorter sequence
    samples = samples_frame(out.tokens, prompt_id, rows, arm.name, wb)
    rounds = None if out.rounds is None else rounds_frame(out.rounds, prompt_id, rows, arm.name)
    check_shard(samples, engine.name, arm.name, prompt_id)
    return samples, rounds


def _checked_whitebox(
    protocol: Protocol, engines: EngineSet, engine: Engine, job: ArmJob, out: Any
) -> pd.DataFrame | None:
    """The shard's white-box columns (the engine's, or the shared teacher's in teacher mode),
    after checking the output and its rounds against what the engine declares."""
    target = engines.models.target
    check_output(out, job, None if target is None else target.vocab_size, engine.name)
    if out.rounds is not None and (
        engine.rounds == "none" or out.rounds_tested != (engine.rounds == "tested")
    ):
        raise EngineError(
            f"engine {engine.name}: returned rounds (tested: {out.rounds_tested}) but declares "
            f"rounds = {engine.rounds!r}"
        )
    if job.whitebox:
        if out.whitebox is None:
            raise EngineError(f"engine {engine.name}: white-box columns were asked for, got none")
        return out.whitebox
    if engines.teacher_mode and protocol.tests.whitebox:
        t_teacher = time.perf_counter()
        wb = shared_teacher(engines, job, out.tokens)
        engines.teacher_s += time.perf_counter() - t_teacher
        return wb
    return None


def reported_columns(reported: Any, columns: pd.DataFrame | None) -> pd.DataFrame:
    """``columns`` (one row per row and position, or None) with ``schema.REPORTED_COLUMNS``
    from an engine's ``[B, T, 2 or 3]`` reported (p, cdf_lo[, list mass]) appended."""
    rep = np.asarray(reported, dtype=np.float64).reshape(-1, reported.shape[-1])
    mass = rep[:, 2] if rep.shape[1] == 3 else np.full(len(rep), np.nan)
    cols = pd.DataFrame(
        {schema.REP_P: rep[:, 0], schema.REP_CDF_LO: rep[:, 1], schema.REP_MASS: mass}
    )
    if columns is None:
        return cols
    return pd.concat([columns.reset_index(drop=True), cols], axis=1)


def check_shard(samples: pd.DataFrame, engine: str, arm: str, prompt_id: str) -> None:
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


def shared_teacher(engines: EngineSet, job: ArmJob, tokens: Any) -> pd.DataFrame:
    """Teacher mode: the white-box columns of any arm from the run's one teacher — transformers'
    warpers (``hf_teacher_force``) when an arm's engine declares ``teacher = "hf"``, else
    spectest's pipeline (``teacher_force``) — so every arm's columns are the same function of
    its sequences."""
    import torch

    target, draft = engines.models.target, engines.models.draft
    # past a sequence's end (-1) force token 0: the models are causal, so it changes no column
    # of an emitted position, and samples_frame drops the ended positions' rows
    toks = torch.as_tensor(tokens, dtype=torch.int64).clamp(min=0)  # [B, T]
    params = [r.params for r in job.rows]
    if engines.teacher == "hf":
        from spectest.engines.hf.laws import hf_teacher_force

        return hf_teacher_force(target, job.prompt_ids, params, toks, draft=draft)
    from spectest.engines.teacher import teacher_force

    assert target is not None
    return teacher_force(target, job.prompt_ids, params, toks, draft=draft, drafter=job.drafter)


def load_models(protocol: Protocol, need_draft: bool = True) -> Models:
    """The protocol's target (and draft; None unless ``need_draft``), the one loader of a
    protocol's models (a run, its workers, ``spectest conformance --config`` and
    ``spectest reported-p``): a model that cannot be built or loaded, or a draft whose
    vocabulary differs from the target's, is one ``ModelError`` naming the protocol file and the
    field (``models.target`` / ``models.draft``). Seeds 0 and 1, as ``models.zoo.load_pair``."""
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
        return Models(target, None)
    draft = load("draft", m.draft, seed=1, target=target)  # load_pair's seeds
    try:
        check_same_vocab(target, draft)
    except ModelError as err:
        raise ModelError(f"{protocol.source}: models.draft: {err}") from None
    return Models(target, draft)


def configure_threads(device: str, threads: int | None) -> int:
    """Set torch's intra-op threads for a CPU run and return the count in use: ``threads``
    wins; else an explicit ``OMP_NUM_THREADS`` is respected; else one thread (on a small CPU
    more threads are slower: OpenMP synchronisation over many small ops; results/LOG.md,
    2026-11-29). Tokens do not depend on it."""
    import os

    import torch

    if threads is not None:
        if threads < 1:
            raise ConfigError(f"--threads: expected an integer >= 1, got {threads!r}")
        torch.set_num_threads(threads)
    elif device == "cpu" and not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(1)
    return int(torch.get_num_threads())


def check_device(protocol: Protocol) -> None:
    """A CUDA protocol on a machine without CUDA is bad input, not a torch traceback."""
    if protocol.models.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                f"{protocol.source}: models.device: 'cuda' requested but torch {torch.__version__} "
                "sees no CUDA device (use --device cpu, or install a CUDA build of torch)"
            )


def device_name(device: str) -> str:
    """The device as provenance records it (``cuda:<GPU name>``)."""
    if device == "cuda":
        import torch

        if torch.cuda.is_available():
            return f"cuda:{torch.cuda.get_device_name(0)}"
    return device
