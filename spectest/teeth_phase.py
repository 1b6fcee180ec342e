"""The run's tooth-size phase: ``tooth_sizes_phase`` (the sizes from a pool worker, from the
process or thread that computed them beside generation, or computed here after it; the phase's
timings), that thread (``TeethBeside``, ``beside_generation``), when a process takes its place
(``beside_process``: the process is ``scaleout.TeethInProcess``, spawned early where
``spawn_early``), the device memory that process may use (``grant_headroom``, ``cap_memory``) and
``start_beside``, which picks. Knows nothing about shards, tests or verdicts. Why and details:
docs/internals.md "spectest/teeth_phase.py".
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from typing import Protocol as Interface

import pandas as pd

from spectest.engines.base import Models
from spectest.errors import InfrastructureError
from spectest.generation import load_models, protocol_tooth_sizes
from spectest.progress import ProgressFn
from spectest.protocol import Protocol

# a process of its own (it loads its own copy of the models) when the models take at most this
# share of the device's memory and at least this share is free once they are loaded; else the
# thread, which shares them (Qwen3-8B's 16 GB are 11 % of an H200: the thread, as measured)
PROCESS_MAX_MODELS = 0.05
PROCESS_MIN_FREE = 0.5
# the process's device memory (docs/internals.md "spectest/teeth_phase.py"): granted once the run
# has made its first speculative shard, it may hold what is free then less the run's headroom
# (RUN_GROWTH of what the run holds, plus DEVICE_SLACK of the device), capped there; under
# MIN_BUDGET of the device it declines and the sizes are computed after generation
RUN_GROWTH = 0.25
DEVICE_SLACK = 0.05
MIN_BUDGET = 0.05
GIB = 2**30


class Declined(Exception):
    """The process beside generation did not compute the sizes: the device had too little memory
    free beside the run (its one-line reason). The phase computes them after generation."""


class Beside(Interface):
    """What computes the sizes beside generation: ``TeethBeside`` or ``scaleout.TeethInProcess``."""

    def grant(self) -> None: ...

    def result(self) -> tuple[pd.DataFrame | None, float]: ...

    def abandon(self) -> None: ...


def tooth_sizes_phase(
    protocol: Protocol,
    teeth: Sequence[tuple[str, str]],
    models: Models | None,
    timings: dict[str, Any],
    progress: ProgressFn,
    *,
    from_pool: pd.DataFrame | None = None,
    beside: Beside | None = None,
) -> pd.DataFrame | None:
    """The ε arms' and mutants' TV per cell-position (``spectest.tooth_size``) of ``teeth``
    (``RunSettings.sized_teeth``); None when there is no such tooth. From a pool worker
    (``from_pool``), from the process or thread ``beside`` generation (waited for), or computed
    here from ``models`` (loaded when this process has not: a resumed run). Sets
    ``timings["tooth sizes"]`` (seconds here, loading included: beside generation, the wait
    after it) and, beside generation, ``timings["tooth sizes beside generation"]`` (the
    process's or thread's wall time). A process that ended without its result (killed, out of
    memory, or a script that spawns it without a ``__main__`` guard) or declined (``Declined``:
    too little device memory beside the run) is warned about and the sizes are computed here:
    it never costs the run more than the phase."""
    if not teeth:
        return None
    if from_pool is not None:
        timings["tooth sizes"] = 0.0
        return from_pool
    t0 = time.perf_counter()
    progress("tooth sizes", 0, 1)
    sizes: pd.DataFrame | None = None
    if beside is not None:
        try:
            sizes, timings["tooth sizes beside generation"] = beside.result()
        except (InfrastructureError, Declined) as err:
            warnings.warn(f"{err}; computing the tooth sizes here", RuntimeWarning, stacklevel=2)
            beside = None
    if beside is None:
        if models is None or models.target is None or models.draft is None:
            models = load_models(protocol, need_draft=True)
        sizes = protocol_tooth_sizes(protocol, teeth, models)
    progress("tooth sizes", 1, 1)
    timings["tooth sizes"] = time.perf_counter() - t0
    return sizes


def spawn_early(protocol: Protocol, teeth: Sequence[tuple[str, str]]) -> bool:
    """Whether the runner spawns the tooth-size process before it loads its models, so that the
    process's imports run beside that load (``start_beside`` still decides after the load
    whether it is used; an unused one is stopped): where it may be, with sized teeth on CUDA and
    no process-wide switch (``beside_generation``'s conditions known before a load)."""
    from spectest import tooth_size

    return (
        bool(teeth)
        and protocol.models.device.startswith("cuda")
        and not tooth_size.AVOID_CUDNN_SDPA
    )


def start_beside(
    protocol: Protocol,
    teeth: Sequence[tuple[str, str]],
    models: Models,
    process: Callable[[], Beside] | None = None,
) -> Beside | None:
    """What computes ``teeth``'s sizes beside generation, started now: ``process()`` (a process
    of its own: the runner's ``scaleout.TeethInProcess``) where ``beside_process`` says so, else
    a thread sharing ``models``; None where they are computed after generation (no sized tooth,
    or ``beside_generation`` says no)."""
    if not teeth or not beside_generation(models):
        return None
    if process is not None and beside_process(models):
        return process()
    return TeethBeside(protocol, teeth, models)


class TeethBeside:
    """``protocol_tooth_sizes`` on a thread of its own while this process generates: on CUDA the
    phase is host-bound (Python, host float64 round laws) and generation mostly
    device-bound, so most of it hides behind generation. ``result`` waits for it.

    Notes
    -----
    The sizes are the ones the phase computes after generation, bit for bit: the same forwards at
    the same shapes on the same models, the same host arithmetic. What makes sharing the models
    with generation safe: the static model's switched forwards hold ``attention.CONFIG_LOCK``
    exclusively and every ``HFModel`` forward holds it shared (no forward here sees the switch);
    its CUDA-graph captures run in ``thread_local`` mode on a stream of their own (no CUDA call
    here fails or breaks one); nothing here synchronises the device. Why and measured:
    docs/internals.md "spectest/teeth_phase.py".
    """

    def __init__(
        self, protocol: Protocol, teeth: Sequence[tuple[str, str]], models: Models
    ) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="spectest-tooth-sizes")
        self._future = self._pool.submit(_timed_sizes, protocol, list(teeth), models)

    def grant(self) -> None:
        """Nothing: the thread shares the run's memory (``scaleout.TeethInProcess.grant``)."""

    def result(self) -> tuple[pd.DataFrame | None, float]:
        """The sizes and the seconds the thread took (its errors raise here)."""
        try:
            return self._future.result()
        finally:
            self._pool.shutdown(wait=True)

    def abandon(self) -> None:
        """Wait for the thread and drop its result or error (generation failed: the run's error
        is the one to report, once nothing of the run still uses the models or the device)."""
        self._pool.shutdown(wait=True)


def _timed_sizes(
    protocol: Protocol, teeth: Sequence[tuple[str, str]], models: Models
) -> tuple[pd.DataFrame | None, float]:
    t0 = time.perf_counter()
    sizes = protocol_tooth_sizes(protocol, teeth, models)
    return sizes, time.perf_counter() - t0


def beside_generation(models: Models) -> bool:
    """Whether the tooth sizes run beside generation (``TeethBeside``): the models are on CUDA
    (what the thread's safety was built and measured for; on CPU both phases are host work on
    the same cores, and CPU runs stay as they were) and the tooth-size forwards touch no
    process-wide switch (``AVOID_CUDNN_SDPA`` off)."""
    import torch

    from spectest import tooth_size

    target, draft = models.target, models.draft
    return (
        target is not None
        and draft is not None
        and torch.device(target.device).type == "cuda"
        and not tooth_size.AVOID_CUDNN_SDPA
    )


def beside_process(models: Models) -> bool:
    """Whether the tooth sizes beside generation run in a process of their own
    (``scaleout.TeethInProcess``) rather than on a thread: on CUDA, when the models take at most
    ``PROCESS_MAX_MODELS`` of the device's memory (the process loads a copy of them) and at
    least ``PROCESS_MIN_FREE`` of it is free with them loaded."""
    import torch

    device = torch.device(models.target.device) if models.target is not None else None
    if device is None or device.type != "cuda":
        return False
    free, total = torch.cuda.mem_get_info(device)
    return weight_bytes(models) <= PROCESS_MAX_MODELS * total and free >= PROCESS_MIN_FREE * total


def weight_bytes(models: Models) -> float:
    """The bytes of the models' parameters and buffers, each tensor once (a derived draft shares
    the target's); infinite for a model that is not a torch module (``HFModel.model``)."""
    import torch

    seen: dict[int, int] = {}
    for m in (models.target, models.draft):
        if m is None:
            continue
        module = getattr(m, "model", m)
        if not isinstance(module, torch.nn.Module):
            return float("inf")
        for t in (*module.parameters(), *module.buffers()):
            seen[t.data_ptr()] = max(seen.get(t.data_ptr(), 0), t.numel() * t.element_size())
    return float(sum(seen.values()))


def grant_headroom(device: str) -> tuple[float, str | None]:
    """The run's side of the process's memory, once the run has made its first speculative shard
    (its caches and graph pools exist): the bytes the process must leave free for the run to
    grow into (``RUN_GROWTH`` of what the run's allocator holds, plus ``DEVICE_SLACK`` of the
    device), and the reason the process is not to start, where the memory free now (the
    process's models included, once loaded) leaves it under ``MIN_BUDGET`` of the device; (0,
    None) off CUDA (no device memory shared)."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return 0.0, None
    free, total = torch.cuda.mem_get_info(dev)
    headroom = RUN_GROWTH * torch.cuda.memory_reserved(dev) + DEVICE_SLACK * total
    if memory_fraction(free, total, 0.0, headroom) is None:
        return headroom, _short(free, total, headroom)
    return headroom, None


def cap_memory(device: str, headroom: float) -> str | None:
    """The process's side, once granted: its allocator capped at ``memory_fraction`` of the
    device (``torch.cuda.set_per_process_memory_fraction``: past it the process, not the run,
    runs out of memory), or the reason it declines; None off CUDA."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(dev)
    fraction = memory_fraction(free, total, torch.cuda.memory_reserved(dev), headroom)
    if fraction is None:
        return _short(free, total, headroom)
    # NOTE the cap takes a device with an index ("cuda" alone raises ValueError: seen on the
    # H200, where the process then failed and the run computed the sizes after generation)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return None


def memory_fraction(free: float, total: float, held: float, headroom: float) -> float | None:
    """The share of a device of ``total`` bytes the process may hold: what it ``held`` plus what
    is ``free`` less the run's ``headroom``; None where that adds less than ``MIN_BUDGET`` of
    the device."""
    budget = free - headroom
    if budget < MIN_BUDGET * total:
        return None
    return min(1.0, (held + budget) / total)


def _short(free: float, total: float, headroom: float) -> str:
    return (
        f"the tooth-size process declined: {free / GIB:.1f} GiB of the device free beside the "
        f"run, which keeps {headroom / GIB:.1f} GiB to grow into, leaves under "
        f"{MIN_BUDGET:.0%} of its {total / GIB:.0f} GiB"
    )
