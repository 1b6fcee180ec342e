"""Claim (b)'s matched drift beside generation: whether a run computes it in a process of its own
while its other arms generate (``drift_beside``; the process is ``scaleout.DriftInProcess``), the
generation order that lets it (the matched arm's shards first, ``DriftBeside.first``), its job
sent once those shards are written (``DriftBeside.written``), and the wait for its table
(``drift_phase``: computed here when the process ends without it). Knows nothing about tests or
verdicts. Why and measured: docs/internals.md "spectest/numerics_phase.py".
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any
from typing import Protocol as Interface

import pandas as pd

from spectest.engines.base import Models
from spectest.errors import InfrastructureError
from spectest.plan import Plan, Shard, stages
from spectest.protocol import MATCHED, Protocol
from spectest.teeth_phase import beside_process

BESIDE = "numerics beside generation"  # timings: the process's seconds from its job to the table


class DriftProcess(Interface):
    """What computes the drift beside generation: ``scaleout.DriftInProcess``."""

    def start(self) -> None: ...

    def done(self) -> bool: ...

    def result(self) -> tuple[pd.DataFrame, float]: ...

    def abandon(self) -> None: ...


class DriftBeside:
    """A run's matched drift in ``process`` beside generation. ``keys``: the matched arm's shards
    this run generates; the job is sent when the last of them is written (``written``)."""

    def __init__(self, process: DriftProcess, keys: set[str]) -> None:
        self.process = process
        self._left = set(keys)
        self.started = False

    @staticmethod
    def first(todo: Sequence[Shard]) -> list[Shard]:
        """``todo`` with the matched arm's shards first, the rest in their order: the drift then
        runs while the other arms generate. A shard's tokens do not depend on the order."""
        return sorted(todo, key=lambda s: s.arm != MATCHED)

    def written(self, key: str) -> None:
        """Shard ``key`` is in the run directory; the job goes once every matched one is."""
        self._left.discard(key)
        if not self._left and not self.started:
            self.started = True
            self.process.start()

    def done(self) -> bool:
        """Whether the table would be had without waiting (the job sent and answered)."""
        return self.started and self.process.done()

    def abandon(self) -> None:
        """Stop the process (generation failed, or the table is not asked for)."""
        self.process.abandon()


def drift_beside(
    protocol: Protocol,
    plan: Plan,
    todo: Sequence[Shard],
    models: Models,
    process: Callable[[], DriftProcess],
) -> DriftBeside | None:
    """The matched drift beside generation, its process spawned now (``process()``: the runner's
    ``scaleout.DriftInProcess``), where it applies: the run asks claim (b) in matched mode (no
    floor arm), generates the matched arm's shards now, looks once (a sequential run decides
    claim (b) after its last look), and ``beside_drift`` says yes; else None (the drift is
    computed after generation, as before)."""
    keys = {s.key for s in todo if s.arm == MATCHED}
    if not keys or protocol.floor is not None or not plan.settings.matched:
        return None
    if len(stages(protocol)) > 1 or not beside_drift(models):
        return None
    return DriftBeside(process(), keys)


def beside_drift(models: Models) -> bool:
    """Whether the drift may run in a process of its own: the tooth sizes' rule
    (``teeth_phase.beside_process``: on CUDA, models at most ``PROCESS_MAX_MODELS`` of the
    device's memory, at least ``PROCESS_MIN_FREE`` of it free with them loaded). The process
    loads a copy of the target and replays the matched batches while the other arms generate;
    on CPU both are host work on the same cores, and CPU runs stay as they were."""
    return beside_process(models)


def drift_phase(
    compute: Callable[[], pd.DataFrame],
    timings: dict[str, Any],
    beside: DriftBeside | None = None,
) -> pd.DataFrame:
    """The matched drift table: from the process ``beside`` generation (waited for; its seconds
    from its job to the table in ``timings[BESIDE]``), else ``compute()`` here. A process that
    ended without its table (killed, out of memory) is warned about and the table computed
    here: it never costs the run more than the phase; its errors are the run's."""
    if beside is not None and not beside.started:
        beside.abandon()  # never sent its job (a matched shard failed): nothing to wait for
    elif beside is not None:
        try:
            table, timings[BESIDE] = beside.process.result()
            return table
        except InfrastructureError as err:
            warnings.warn(f"{err}; computing the matched drift here", RuntimeWarning, stacklevel=2)
    return compute()
