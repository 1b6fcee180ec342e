"""Issue 32: the run's comparisons in a process of their own beside claim (b)'s replay
(``decision.where``) — the run's tables and verdict equal those of the comparisons computed
after the replay, bit for bit (CPU: the matched toy run, whose replay is real, with the process
forced on); the process's errors are the run's; a process that dies costs the phase, not the
run; leaving on an error stops it. Exact comparisons on fixed seeds: no false-failure rate.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from toy_protocol import TOY, write_toy

from spectest import runner
from spectest.decision import where
from spectest.errors import InputError
from spectest.plan import make_plan
from spectest.progress import no_progress
from spectest.protocol import load_protocol

TABLES = ("tests", "trie", "whitebox", "sequence", "histograms", "numerics", "samples")


def _matched(tmp_path: Path, name: str) -> Path:
    """The toy LM in matched numerics mode with simulated bf16-sized numerics: claim (b)
    replays (``matched_drift``) on every machine."""
    models = {**TOY["models"], "target": TOY["models"]["target"] + ",numerics=0.0065"}  # type: ignore[index]
    tests = {**TOY["tests"], "numerics": "matched"}  # type: ignore[dict-item]
    path = write_toy(tmp_path / name, models=models, tests=tests, positions=6)
    runner.run_protocol(load_protocol(path), out=tmp_path / name / "run")
    return tmp_path / name / "run"


def _summary(run: Path) -> dict[str, Any]:
    return json.loads((run / "summary.json").read_text())


def test_comparisons_beside_the_replay_equal_those_after_it(tmp_path: Path) -> None:
    after = _matched(tmp_path, "after")
    spawned: list[where.Comparisons] = []
    spawn = where.Comparisons.spawn

    def spy(self: where.Comparisons) -> None:
        spawn(self)
        spawned.append(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "beside_replay", lambda device, replays, procs: replays)
        mp.setattr(where.Comparisons, "spawn", spy)
        beside = _matched(tmp_path, "beside")
    assert len(spawned) == 1
    for table in TABLES:
        pd.testing.assert_frame_equal(
            pd.read_parquet(after / f"{table}.parquet"),
            pd.read_parquet(beside / f"{table}.parquet"),
            check_exact=True,
        )
    a, b = _summary(after), _summary(beside)
    assert a["verdict"] == b["verdict"] and a["verdict"]["numerics"]["decision"] == "within"
    assert where.BESIDE not in a["timings"] and b["timings"][where.BESIDE] > 0


def test_the_process_is_for_a_replay_on_cuda_without_analysis_procs() -> None:
    assert where.beside_replay("cuda", True, None)
    assert where.beside_replay("cuda:1", True, 1)
    assert not where.beside_replay("cuda", False, None)  # nothing to hide behind
    assert not where.beside_replay("cpu", True, None)  # the replay takes every core
    assert not where.beside_replay("cuda", True, 4)  # the user's processes


def _inputs(run: Path) -> tuple[Any, ...]:
    plan = make_plan(load_protocol(run / "protocol.yaml"))
    samples = pd.read_parquet(run / "samples.parquet")
    rounds = pd.read_parquet(run / "rounds.parquet")
    return samples, rounds, plan.arms, plan.settings


def test_a_comparisons_process_that_dies_costs_the_phase_not_the_run(tmp_path: Path) -> None:
    run = _matched(tmp_path, "toy")
    args = _inputs(run)
    want = where.Comparisons(*args).result(no_progress, {})
    dead = where.Comparisons(*args)
    dead.spawn()
    assert dead._pool is not None
    while not dead._pool._processes:  # the executor starts its process on submit
        time.sleep(0.01)
    for proc in dead._pool._processes.values():
        proc.kill()
    timings: dict[str, Any] = {}
    with pytest.warns(RuntimeWarning, match="ended without them"):
        got = dead.result(no_progress, timings)
    assert where.BESIDE not in timings
    assert [a.name for a, _ in got] == [a.name for a, _ in want]
    for (_, g), (_, w) in zip(got, want, strict=True):
        assert g.summary() == w.summary()


def test_the_process_errors_are_the_runs_and_an_error_stops_it(tmp_path: Path) -> None:
    run = _matched(tmp_path, "toy")
    samples, rounds, arms, settings = _inputs(run)
    broken = samples.drop(columns=["token_id"])  # what compare_all cannot read
    with pytest.raises(InputError, match="missing column 'token_id'"):
        where.Comparisons(broken, rounds, arms, settings).result(no_progress, {})
    raised = where.Comparisons(broken, rounds, arms, settings)
    raised.spawn()
    with pytest.raises(InputError, match="missing column 'token_id'"):
        raised.result(no_progress, {})
    with pytest.raises(RuntimeError, match="the run's"):
        with where.Comparisons(samples, rounds, arms, settings) as comps:
            comps.spawn()
            assert comps._pool is not None
            pool = comps._pool
            while not pool._processes:
                time.sleep(0.01)
            procs = list(pool._processes.values())
            raise RuntimeError("the run's error")
    for proc in procs:  # polled, not joined once: the pool's own thread joins it too, and the
        # thread that loses that race sees no status for a moment (ECHILD reads as alive)
        deadline = time.monotonic() + 30
        while proc.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not proc.is_alive()


def test_the_process_started_with_the_run_computes_the_comparisons(tmp_path: Path) -> None:
    after = _matched(tmp_path, "after")
    started: list[Any] = []
    used: list[Any] = []
    prespawn, spawn = where.prespawn, where.Comparisons.spawn

    def spy_prespawn(*args: Any) -> Any:
        started.append(prespawn(*args))
        return started[-1]

    def spy_spawn(self: where.Comparisons) -> None:
        spawn(self)
        used.append(self._pool)

    with pytest.MonkeyPatch.context() as mp:
        for module in (runner, where):  # as on CUDA, here
            mp.setattr(module, "beside_replay", lambda device, replays, procs: replays)
        mp.setattr(runner, "prespawn", spy_prespawn)
        mp.setattr(where.Comparisons, "spawn", spy_spawn)
        beside = _matched(tmp_path, "beside")
    assert len(started) == 1 and started[0] is not None
    assert used == started  # the comparisons ran in the process started with the run
    assert started[0]._shutdown_thread  # and it was shut down
    for table in TABLES:
        pd.testing.assert_frame_equal(
            pd.read_parquet(after / f"{table}.parquet"),
            pd.read_parquet(beside / f"{table}.parquet"),
            check_exact=True,
        )
    assert _summary(after)["verdict"] == _summary(beside)["verdict"]


def test_the_process_is_started_only_where_the_comparisons_go_beside_a_replay(
    tmp_path: Path,
) -> None:
    run = _matched(tmp_path, "toy")
    matched = make_plan(load_protocol(run / "protocol.yaml"))
    exact = make_plan(load_protocol(write_toy(tmp_path / "exact")))
    assert matched.settings.matched and not exact.settings.matched
    assert where.prespawn(matched, "cpu", None) is None  # the replay takes every core
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(where, "beside_replay", lambda device, replays, procs: replays)
        assert where.prespawn(exact, "cpu", None) is None  # no replay to hide behind
        pool = where.prespawn(matched, "cpu", None)
    assert pool is not None
    with where.Comparisons(*_inputs(run), pool=pool):  # never spawned: closed unused
        pass
    assert pool._shutdown_thread


def test_an_error_before_the_comparisons_stops_the_process_started_with_the_run(
    tmp_path: Path,
) -> None:
    models = {**TOY["models"], "target": TOY["models"]["target"] + ",numerics=0.0065"}  # type: ignore[index]
    tests = {**TOY["tests"], "numerics": "matched"}  # type: ignore[dict-item]
    path = write_toy(tmp_path / "toy", models=models, tests=tests, positions=6)
    started: list[Any] = []

    def spy_prespawn(*args: Any) -> Any:
        started.append(where.prespawn(*args))
        return started[-1]

    def fail(*args: Any, **kwargs: Any) -> None:
        pool = started[0]
        while not pool._processes:  # started: the warm-up submitted
            time.sleep(0.01)
        started.extend(pool._processes.values())
        raise RuntimeError("the run's error")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(where, "beside_replay", lambda device, replays, procs: replays)
        mp.setattr(runner, "prespawn", spy_prespawn)
        mp.setattr(runner, "_generate_missing", fail)
        with pytest.raises(RuntimeError, match="the run's error"):
            runner.run_protocol(load_protocol(path), out=tmp_path / "toy" / "run")
    assert started[0]._shutdown_thread
    for proc in started[1:]:  # the worker leaves once the warm-up is done and the pool shut
        deadline = time.monotonic() + 60
        while proc.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not proc.is_alive()
