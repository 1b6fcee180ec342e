"""One persistent scale-out worker (``Worker``) and what it is sent (``RunSpec``): protocols,
models and engines kept between shards, arms, stages and runs; ``_serve`` is a worker process's
loop; ``TeethInProcess`` is one such process given one job, a run's tooth sizes beside its
generation. Knows nothing of the pools that deal shards to it (``scaleout``).
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from spectest.engines.base import Models
from spectest.errors import EngineError, InfrastructureError, SpectestError
from spectest.generation import (
    EngineSet,
    RunOptions,
    ShardResult,
    configure_threads,
    generate_shards,
    load_models,
    protocol_tooth_sizes,
)
from spectest.teeth_phase import Declined, cap_memory, grant_headroom


@dataclass(frozen=True)
class RunSpec:
    """What a worker needs to make a run's shards (plain data: sent to processes and actors)."""

    protocol_yaml: str  # the run directory's protocol.yaml (prompt set at PROMPTS_FILE)
    prompts_jsonl: str  # the run directory's prompts file
    protocol_hash: str  # the driver's hash: a worker refuses a protocol that reads otherwise
    options: RunOptions


def split(keys: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """``keys`` dealt round-robin into at most ``n`` non-empty groups (order kept per group)."""
    groups = [tuple(keys[i::n]) for i in range(max(1, n))]
    return [g for g in groups if g]


def local_devices(device: str) -> list[str]:
    """Every visible GPU for a ``cuda`` run (``["cuda:0", "cuda:1", ...]``); one device otherwise
    (an explicit ``cuda:i`` or ``cpu`` is one worker)."""
    if device == "cuda":
        import torch

        n = torch.cuda.device_count()
        if n > 1:
            return [f"cuda:{i}" for i in range(n)]
    return [device]


# -- the worker ------------------------------------------------------------------------------


class Worker:
    """A persistent worker on one device: protocols, models and engines kept between calls.

    ``device``: the worker's device for every run it serves (``None``: the protocol's, as on a
    Ray actor of a CPU run); ``threads``: torch intra-op threads when a run does not set them
    (``None``: ``configure_threads``' default). ``shard`` returns one ``ShardResult`` whose
    provenance carries ``worker`` (host, device, pid) and ``torch_threads``; ``times`` holds the
    worker's cumulative phase wall times (``load``: protocols, models and engines;
    ``generate``: shards), read by the driver after each shard."""

    def __init__(self, device: str | None = None, threads: int | None = None) -> None:
        self.device = device
        self.threads = threads
        self.protocols: dict[str, Any] = {}  # protocol hash → (protocol, plan by teeth_only)
        self.models_key: tuple[Any, ...] | None = None
        self.models: Models | None = None
        self.engines_key: tuple[Any, ...] | None = None
        self.engines: EngineSet | None = None
        self.times = {"load": 0.0, "generate": 0.0}
        self.loads = 0

    def ping(self) -> dict[str, Any]:
        """Host and pid (a Ray actor's identity; also imports what the worker needs)."""
        return {"host": platform.node(), "pid": os.getpid()}

    def _protocol(self, spec: RunSpec) -> tuple[Any, Any]:
        from spectest.plan import make_plan
        from spectest.protocol import load_protocol
        from spectest.store import PROMPTS_FILE

        key = f"{spec.protocol_hash}:{spec.options.teeth_only}"
        if key not in self.protocols:
            with tempfile.TemporaryDirectory(prefix="spectest-worker-") as tmp:
                (Path(tmp) / "protocol.yaml").write_text(spec.protocol_yaml, encoding="utf-8")
                (Path(tmp) / PROMPTS_FILE).write_text(spec.prompts_jsonl, encoding="utf-8")
                protocol = load_protocol(Path(tmp) / "protocol.yaml")
            if protocol.hash != spec.protocol_hash:
                raise EngineError(
                    f"worker on {platform.node()}: protocol reads as {protocol.hash[:12]}, the "
                    f"driver's is {spec.protocol_hash[:12]} (different spectest versions?)"
                )
            if self.device is not None:
                models = replace(protocol.models, device=self.device)
                protocol = replace(protocol, models=models)
            # the last plan covers every shard of every stage (plan.make_plan)
            plan = make_plan(protocol, teeth_only=spec.options.teeth_only)
            self.protocols = {key: (protocol, plan)}  # one run at a time is kept
        return self.protocols[key]

    def _load(self, protocol: Any, need_draft: bool) -> Models:
        """The models, kept while the model spec is the same (``EngineSet``'s ``load``)."""
        m = protocol.models
        key = (m.target, m.draft if need_draft else None, m.dtype, m.device)
        if key != self.models_key or self.models is None:
            self.models, self.models_key = None, None  # free the old before loading the new
            self.models = load_models(protocol, need_draft)
            self.loads += 1
            self.models_key = key
        return self.models

    def _engines(self, spec: RunSpec, protocol: Any, plan: Any) -> EngineSet:
        key = (spec.protocol_hash, spec.options.fast, spec.options.teeth_only)
        if key != self.engines_key or self.engines is None:
            self.close_engines()
            if protocol.models.device.startswith("cuda:"):
                import torch

                # NOTE the current device must be the worker's: CUDA-graph capture and side
                # streams created without a device argument (torch.cuda.graph's) use it
                torch.cuda.set_device(protocol.models.device)
            # every arm of the plan: the pool may deal this worker any shard of the run
            self.engines = EngineSet(
                protocol, plan.arms, plan, fast=spec.options.fast, load=self._load
            )
            self.engines_key = key
        return self.engines

    def shard(self, spec: RunSpec, key: str) -> ShardResult:
        """Generate the shard ``key`` of the run ``spec``."""
        t0 = time.perf_counter()
        protocol, plan = self._protocol(spec)
        threads = configure_threads(protocol.models.device, spec.options.threads or self.threads)
        engines = self._engines(spec, protocol, plan)
        shard = next((s for s in plan.shards if s.key == key), None)
        if shard is None:
            raise EngineError(f"worker on {platform.node()}: no shard {key!r} in the plan")
        t1 = time.perf_counter()
        out: list[ShardResult] = []
        generate_shards(protocol, plan, [shard], engines, out.append)
        self.times["load"] += t1 - t0
        self.times["generate"] += time.perf_counter() - t1
        worker = {
            "host": platform.node(),
            "device": protocol.models.device,
            "pid": os.getpid(),
            "models_loaded": self.loads,  # how many times this worker has loaded models
        }
        r = out[0]
        return replace(r, provenance={**r.provenance, "worker": worker, "torch_threads": threads})

    def tooth_sizes(self, spec: RunSpec) -> Any:
        """The run's tooth sizes (``generation.protocol_tooth_sizes``) from this worker's
        models (target and draft, loaded or kept); counted as ``load``."""
        t0 = time.perf_counter()
        protocol, plan, models = self.teeth_models(spec)
        sizes = protocol_tooth_sizes(protocol, plan.settings.sized_teeth, models)
        self.times["load"] += time.perf_counter() - t0
        return sizes

    def teeth_models(self, spec: RunSpec) -> tuple[Any, Any, Models]:
        """The run's protocol, plan and models for its tooth sizes (loaded or kept), under the
        run's torch thread count."""
        protocol, plan = self._protocol(spec)
        configure_threads(protocol.models.device, spec.options.threads or self.threads)
        return protocol, plan, self._load(protocol, True)

    def job(self, spec: RunSpec, key: str | None) -> tuple[Any, dict[str, float]]:
        """One job of the pool's queue: a shard (``key``), or the tooth sizes (None); with the
        worker's cumulative times after it."""
        out = self.shard(spec, key) if key is not None else self.tooth_sizes(spec)
        return out, dict(self.times)

    def close_engines(self) -> None:
        if self.engines is not None:
            self.engines.close()
        self.engines, self.engines_key = None, None


def _serve(conn: Any, device: str, threads: int | None) -> None:
    """A worker process: answer ``("shard", spec, key)`` messages until ``None`` or EOF; a
    ``("teeth", spec)`` message (``TeethInProcess``) is answered by ``_beside``, then it ends;
    ``("warm",)`` imports ahead (``_warm``) and answers nothing."""
    worker = Worker(device, threads)
    try:
        conn.send(("ready", worker.ping()))
    except OSError:  # BrokenPipeError: the driver stopped this worker before it was ready
        return
    try:
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                break
            if msg is None:
                break
            if msg[0] == "warm":  # TeethInProcess: imports while the run loads its models
                _warm()
                continue
            if msg[0] == "teeth":
                _answer(conn, device, partial(_beside, conn, worker, msg[1]))
                break
            _, spec, key = msg
            _answer(conn, device, partial(_job, worker, spec, key))
    finally:
        worker.close_engines()


def _answer(conn: Any, device: str, job: Callable[[], tuple[Any, ...] | None]) -> None:
    """Send ``job()``'s message (none for None); its error as ``("err", error, traceback)``."""
    try:
        msg = job()
        if msg is not None:
            conn.send(msg)
    except SpectestError as err:
        conn.send(("err", err, traceback.format_exc()))
    except Exception as err:  # carried to the driver as one line
        line = f"worker {device} (pid {os.getpid()}): {type(err).__name__}: {err}"
        conn.send(("err", InfrastructureError(line), traceback.format_exc()))


def _warm() -> None:
    """Import what loading a transformers model imports (most of a small model's load: 3.0–3.6 s
    of it on this project's CPU, 0.04 s after these; results/LOG.md "lead (session 24)")."""
    try:
        import transformers.generation
        import transformers.masking_utils
        import transformers.modeling_layers
        import transformers.modeling_utils  # noqa: F401
    except Exception:
        pass  # the load imports them again and raises, with its message


def _job(worker: Worker, spec: RunSpec, key: str | None) -> tuple[Any, ...]:
    return ("ok", *worker.job(spec, key))


def _beside(conn: Any, worker: Worker, spec: RunSpec) -> tuple[Any, ...] | None:
    """The tooth sizes beside a run (``TeethInProcess``): the models loaded at once, then, once
    granted (``("go", headroom)``; None or EOF: stop), computed within the device memory the
    run leaves (``teeth_phase.cap_memory``), or ``("declined", reason)``. The device's cache
    is emptied before the answer: the run goes on into what this process held."""
    protocol, _, _ = worker.teeth_models(spec)
    try:
        msg = conn.recv()
    except EOFError:
        return None
    if msg is None:
        return None
    device = protocol.models.device
    reason = cap_memory(device, msg[1])
    if reason is not None:
        return ("declined", reason)
    try:
        return ("ok", *worker.job(spec, None))
    finally:
        if device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()


class TeethInProcess:
    """``protocol_tooth_sizes`` in a spawned process while this one generates: the scale-out
    worker's job (``scaleout.worker.Worker.tooth_sizes``) on the run's device, from the run
    directory's protocol and its own copy of the models. Unlike the thread it shares no GIL
    with generation, whose host work the thread's Python slowed by what it computed (P1 on the
    H200: the first arm 4.6 s alone, 14.5 s beside the thread). ``result`` waits for it;
    ``teeth_phase.beside_process`` says when to use it.

    Notes
    -----
    The sizes are the thread's, bit for bit: the same protocol (its hash checked), the same
    models (a deterministic load), the same code at the same shapes, the same torch thread
    count (``RunOptions.threads``, else the same default). The process is a daemon: it ends
    with this one. Spawned, it imports (the runner spawns it before its own load where it may be
    used: ``teeth_phase.spawn_early``); it loads the models when told to (``load``) and computes
    only once granted (``grant``: the run has made its first speculative shard, or waits for the
    result), within the memory the run leaves (``teeth_phase.grant_headroom``, ``cap_memory``).
    Why and measured: docs/internals.md "spectest/teeth_phase.py".
    """

    def __init__(self, protocol: Any, run_dir: Path, options: RunOptions) -> None:
        import multiprocessing

        from spectest.store import PROMPTS_FILE

        texts = [(run_dir / n).read_text(encoding="utf-8") for n in ("protocol.yaml", PROMPTS_FILE)]
        self._spec = RunSpec(texts[0], texts[1], protocol.hash, options)
        ctx = multiprocessing.get_context("spawn")  # CUDA cannot be forked
        self._t0 = time.perf_counter()
        self._conn, child = ctx.Pipe()
        self._device = device = protocol.models.device
        self._declined: str | None = None  # granted: None, or why the run declined
        self._granted = False
        args = (child, device, options.threads)
        self._proc = ctx.Process(target=_serve, args=args, name="spectest-tooth-sizes", daemon=True)
        self._proc.start()
        child.close()
        self._conn.send(("warm",))  # it imports what a load imports while this process loads

    def load(self) -> TeethInProcess:
        """Have the process load the models now (it computes once granted); this process."""
        self._conn.send(("teeth", self._spec))
        return self

    def grant(self) -> None:
        """Let the process compute (once; the runner calls it after its first speculative shard,
        when its caches and graph pools exist): ``("go", headroom)``, or stopped where the
        device's free memory is short already (``teeth_phase.grant_headroom``)."""
        if self._granted:
            return
        self._granted = True
        headroom, self._declined = grant_headroom(self._device)
        if self._declined is not None:
            self._stop(wait=False)
            return
        try:
            self._conn.send(("go", headroom))
        except (BrokenPipeError, OSError):
            pass  # it has ended: ``result`` says how

    def result(self) -> tuple[pd.DataFrame | None, float]:
        """The sizes and the seconds from the start to their arrival (granted first). The
        process's errors raise here; a process that ended without them is an
        ``InfrastructureError``; one that declined, ``teeth_phase.Declined``. The process is told
        to stop, not waited for: it ends on its own."""
        self.grant()
        if self._declined is not None:
            raise Declined(self._declined)
        try:
            msg = self._conn.recv()  # ("ready", ...) once its imports are done
            if msg[0] == "ready":
                msg = self._conn.recv()
        except (EOFError, OSError):
            self.abandon()
            raise InfrastructureError(
                f"the tooth-size process (pid {self._proc.pid}) ended with code "
                f"{self._proc.exitcode} before its result"
            ) from None
        self._stop(wait=False)
        if msg[0] == "err":
            raise msg[1]
        if msg[0] == "declined":
            raise Declined(msg[1])
        return msg[1], time.perf_counter() - self._t0

    def abandon(self, *, wait: bool = True) -> None:
        """Stop the process (its result, if any, is dropped); ``wait``: until it has ended."""
        self._stop(wait=wait)

    def _stop(self, *, wait: bool) -> None:
        try:
            self._conn.send(None)  # the worker's loop ends at None
        except (BrokenPipeError, OSError):
            pass  # it has ended, or was told already
        self._conn.close()
        if wait:
            self._proc.join(5)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(5)
