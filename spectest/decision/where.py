"""Where a run's comparisons run (``Comparisons``): in this process when their result is asked
for, with ``--analysis-procs`` processes for the sequence family's permutation statistics, or in
a spawned process of their own beside claim (b)'s replay (``beside_replay`` says when), started
with the run (``prespawn``) so that its imports run beside the load and generation.
The comparisons are ``judge.compare_all``'s, wherever they run. Knows nothing about models,
engines or files. Why and measured: docs/internals.md "spectest/decision/where.py".
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import pandas as pd

from spectest.decision.judge import compare_all
from spectest.plan import Arm, Plan, RunSettings
from spectest.progress import ProgressFn, no_progress

BESIDE = "analyze beside numerics"  # timings: the process's own wall time


def beside_replay(device: str, replays: bool, procs: int | None) -> bool:
    """Whether the comparisons run in a process beside claim (b)'s replay: it ``replays``
    (a matched drift table or a teacher-forced law table) on a CUDA ``device``, and the user
    asked for no ``--analysis-procs`` of their own. On a CPU the replay's forwards use every
    core, which the comparisons would take from it."""
    return replays and device.startswith("cuda") and (procs or 1) == 1


def prespawn(plan: Plan, device: str, procs: int | None) -> ProcessPoolExecutor | None:
    """The comparisons' process, spawned now where they will run beside claim (b)'s replay
    (``beside_replay`` for a plan whose claim (b) replays: matched numerics, or a floor arm with
    a teacher), for ``Comparisons(pool=...)``; None elsewhere. Its interpreter starts and imports
    what the comparisons need (torch, pandas, scipy, statsmodels, the judge: ~5 s on the H200's
    machine, which compiles sources in every process) beside the run's load and generation,
    instead of between generation and the comparisons. The caller shuts it down if unused."""
    floor = plan.protocol.floor
    replays = plan.settings.matched if floor is None else floor.teacher is not None
    if not beside_replay(device, replays, procs):
        return None
    pool = _spawned(1)
    pool.submit(_warm)  # the executor starts its process on the first submit
    return pool


def _spawned(workers: int) -> ProcessPoolExecutor:
    """A pool of ``workers`` spawned processes (this process may hold CUDA, which must not
    fork)."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


def _warm() -> None:
    """Nothing: to run it, the process has imported this module, and with it the judge."""


class Comparisons:
    """``compare_all`` of one stage's tables (``procs``: ``--analysis-procs``), computed when
    ``result`` asks unless ``spawn`` started them in a process of their own first (``pool``'s,
    from ``prespawn``, where given: it is then this object's to close). A context manager:
    leaving it on an error stops the process without waiting for it."""

    def __init__(
        self,
        samples: pd.DataFrame,
        rounds: pd.DataFrame | None,
        arms: Sequence[Arm],
        settings: RunSettings,
        procs: int | None = None,
        pool: ProcessPoolExecutor | None = None,
    ) -> None:
        self._args = (samples, rounds, list(arms), settings)
        self._procs = procs or 1
        self._warm = pool  # a process started with the run, for ``spawn``
        self._pool: ProcessPoolExecutor | None = None
        self._future: Future[tuple[list[tuple[Arm, Any]], float]] | None = None

    def __enter__(self) -> Comparisons:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self._close(kill=kind is not None)

    def spawn(self) -> None:
        """Start the comparisons now, in a spawned process (this one may hold CUDA, which
        must not fork): the one started with the run where there is one."""
        self._pool, self._warm = self._warm or _spawned(1), None
        self._future = self._pool.submit(_timed_comparisons, *self._args)

    def result(self, progress: ProgressFn, timings: dict[str, Any]) -> list[tuple[Arm, Any]]:
        """The comparisons: the process's (waited for; its wall time in ``timings[BESIDE]``),
        or computed here. A process that ended without them is warned about and they are
        computed here: it never costs the run more than the phase; their own errors raise."""
        if self._future is not None:
            future, self._future = self._future, None
            try:
                results, timings[BESIDE] = future.result()
                return results
            except BrokenProcessPool as err:
                warnings.warn(
                    f"the comparisons' process ended without them ({err}); computing them here",
                    RuntimeWarning,
                    stacklevel=2,
                )
            finally:
                self._close(kill=False)
        with contextlib.ExitStack() as stack:
            executor = None
            if self._procs > 1:
                executor = stack.enter_context(_spawned(self._procs))
            return compare_all(*self._args, progress, executor=executor)

    def _close(self, *, kill: bool) -> None:
        """Let the process end (``kill``: now, not after the comparison it holds)."""
        if self._warm is not None:  # started with the run, not used
            self._warm.shutdown(wait=False, cancel_futures=True)
            self._warm = None
        if self._pool is not None:
            procs = list((getattr(self._pool, "_processes", None) or {}).values())
            self._pool.shutdown(wait=False, cancel_futures=True)
            for proc in procs if kill else ():
                if proc.is_alive():
                    proc.kill()
            self._pool = None


def _timed_comparisons(
    samples: pd.DataFrame,
    rounds: pd.DataFrame | None,
    arms: Sequence[Arm],
    settings: RunSettings,
) -> tuple[list[tuple[Arm, Any]], float]:
    """The process's job: ``compare_all`` and its wall time (imports excluded)."""
    t0 = time.perf_counter()
    return compare_all(samples, rounds, arms, settings, no_progress), time.perf_counter() - t0
