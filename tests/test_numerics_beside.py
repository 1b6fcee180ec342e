"""Issue 32: claim (b)'s matched drift beside generation (``numerics_phase``), in a process of
its own (``scaleout.DriftInProcess``) while the other arms generate — the run's tables and verdict
equal those of the drift computed after generation, bit for bit (CPU: the matched toy run, whose
replay is real, with the process forced on; the matched arm then generates first); the process's
errors are the run's; a process that dies costs the phase, not the run; where it applies.
Exact comparisons on fixed seeds: no false-failure rate.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
from toy_protocol import TOY, write_toy

from spectest import numerics_phase, runner, scaleout
from spectest.engines.base import Models
from spectest.errors import EngineError
from spectest.generation import matched_drift, read_shards
from spectest.models.zoo import load_pair
from spectest.plan import make_plan
from spectest.protocol import MATCHED, load_protocol
from spectest.store import RunDir

TABLES = ("tests", "trie", "whitebox", "sequence", "histograms", "numerics", "samples")


def _matched(tmp_path: Path, name: str, **sections: Any) -> Path:
    """The toy LM in matched numerics mode with simulated bf16-sized numerics: claim (b)
    replays (``matched_drift``) on every machine. Returns the protocol's path."""
    models = {**TOY["models"], "target": TOY["models"]["target"] + ",numerics=0.0065"}  # type: ignore[index,dict-item]
    tests = {**TOY["tests"], "numerics": "matched"}  # type: ignore[dict-item]
    return write_toy(tmp_path / name, models=models, tests=tests, positions=6, **sections)


def _run(path: Path) -> dict[str, Any]:
    runner.run_protocol(load_protocol(path), out=path.parent / "run")
    return json.loads((path.parent / "run" / "summary.json").read_text())


def test_the_drift_beside_generation_equals_the_drift_after_it(tmp_path: Path) -> None:
    after = _run(_matched(tmp_path, "after"))
    started: list[Any] = []
    init = scaleout.DriftInProcess.__init__
    generate, orders = runner.generate_shards, []

    def arms(protocol: Any, plan: Any, shards: Any, *a: Any) -> None:
        orders.append([s.arm for s in shards])
        generate(protocol, plan, shards, *a)

    def spy(self: Any, *a: Any) -> None:
        init(self, *a)
        started.append(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numerics_phase, "beside_drift", lambda models: True)
        mp.setattr(scaleout.DriftInProcess, "__init__", spy)
        mp.setattr(runner, "generate_shards", arms)
        beside = _run(_matched(tmp_path, "beside"))
    assert len(started) == 1
    started[0]._proc.join(60)  # told to stop, not waited for: it ends on its own, cleanly
    assert started[0]._proc.exitcode == 0
    for table in TABLES:
        pd.testing.assert_frame_equal(
            pd.read_parquet(tmp_path / "after" / "run" / f"{table}.parquet"),
            pd.read_parquet(tmp_path / "beside" / "run" / f"{table}.parquet"),
            check_exact=True,
        )
    assert after["verdict"] == beside["verdict"]
    assert after["verdict"]["numerics"]["decision"] == "within"
    assert numerics_phase.BESIDE not in after["timings"]
    assert beside["timings"][numerics_phase.BESIDE] > 0
    (order,) = orders  # the matched arm generated first, the others in the plan's order
    plan = make_plan(load_protocol(tmp_path / "beside" / "toy.yaml"))
    assert order == sorted((s.arm for s in plan.shards), key=lambda a: a != MATCHED)
    assert order[0] == MATCHED and plan.shards[0].arm != MATCHED
    # on CPU the run keeps the drift after generation
    tiny = load_pair("realistic:qwen3-tiny,draft_layers=1", "derived:first_layers,layers=1")
    assert not numerics_phase.beside_drift(Models(*tiny))


def test_where_the_drift_goes_beside(tmp_path: Path) -> None:
    """Only a run that generates its matched shards now, asks claim (b) in matched mode and
    looks once; the matched shards first, the others in their order."""
    protocol = load_protocol(_matched(tmp_path, "toy"))
    plan = make_plan(protocol)
    spawned: list[int] = []

    def process() -> Any:
        spawned.append(1)
        return SimpleNamespace(start=lambda: spawned.append(2))

    def beside(p: Any, todo: Any) -> Any:
        return numerics_phase.drift_beside(p, make_plan(p), todo, Models(None, None), process)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(numerics_phase, "beside_drift", lambda models: True)
        got = beside(protocol, plan.shards)
        assert got is not None and spawned == [1]
        order = [s.arm for s in got.first(plan.shards)]
        assert order[:2] == [MATCHED, MATCHED] and order[2:] == [
            s.arm for s in plan.shards if s.arm != MATCHED
        ]
        matched = [s.key for s in plan.shards if s.arm == MATCHED]
        got.written(matched[0])
        got.written("reference__p0")
        assert spawned == [1] and not got.started
        got.written(matched[1])  # the last matched shard: the job goes
        assert spawned == [1, 2] and got.started
        others = [s for s in plan.shards if s.arm != MATCHED]
        assert beside(protocol, others) is None  # resumed matched shards: the drift after
        seq = load_protocol(_matched(tmp_path, "seq", seeds={"per_arm": 200, "max_per_arm": 400}))
        assert beside(seq, make_plan(seq).shards) is None  # a sequential run's is after
        plain = load_protocol(write_toy(tmp_path / "plain"))
        assert beside(plain, make_plan(plain).shards) is None  # no matched arm
    assert spawned == [1, 2]
    assert beside(protocol, plan.shards) is None  # beside_drift says no (CPU models)


def _finished(tmp_path: Path) -> tuple[Any, Path, pd.DataFrame]:
    """A finished matched run: its protocol, directory and the drift computed here."""
    path = _matched(tmp_path, "toy")
    _run(path)
    run = path.parent / "run"
    protocol = load_protocol(run / "protocol.yaml")
    samples, rounds = read_shards(RunDir(run, {}), make_plan(protocol))
    assert rounds is not None
    return protocol, run, matched_drift(protocol, samples, rounds, None, fast=False)


def test_the_drift_process_answers_when_done_and_its_errors_are_the_runs(tmp_path: Path) -> None:
    protocol, run, want = _finished(tmp_path)
    proc = scaleout.DriftInProcess(protocol, run, runner.RunOptions())
    assert not proc.done()  # no job yet
    proc.start()
    deadline = time.monotonic() + 120
    while not proc.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    table, seconds = proc.result()
    pd.testing.assert_frame_equal(table, want, check_exact=True)
    assert seconds > 0
    proc._proc.join(60)
    assert proc._proc.exitcode == 0
    other = SimpleNamespace(hash="0" * 64, models=SimpleNamespace(device="cpu"))
    refused = scaleout.DriftInProcess(other, run, runner.RunOptions())
    refused.start()
    with pytest.raises(EngineError, match="protocol reads as"):
        refused.result()


def test_a_drift_process_that_dies_costs_the_phase_not_the_run(tmp_path: Path) -> None:
    protocol, run, want = _finished(tmp_path)
    dead = scaleout.DriftInProcess(protocol, run, runner.RunOptions())
    beside = numerics_phase.DriftBeside(dead, {"matched__p0"})
    beside.written("matched__p0")
    dead._proc.kill()
    dead._proc.join(30)
    timings: dict[str, Any] = {}
    here = lambda: want  # noqa: E731
    with pytest.warns(RuntimeWarning, match="ended with code -9 before its result"):
        got = numerics_phase.drift_phase(here, timings, beside)
    assert got is want and numerics_phase.BESIDE not in timings
    idle = scaleout.DriftInProcess(protocol, run, runner.RunOptions())
    never = numerics_phase.DriftBeside(idle, {"matched__p0"})  # its job never sent
    assert numerics_phase.drift_phase(here, timings, never) is want
    assert not idle._proc.is_alive()


@pytest.mark.gpu
def test_fast_matched_run_on_cuda_with_the_drift_beside_generation(tmp_path: Path) -> None:
    """The realistic tiny pair in bfloat16 on the fast engine: the process's replay (its own
    static model and CUDA graphs) gives the table the run computes after generation."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    models = {
        "target": "realistic:qwen3-tiny,draft_layers=1,logit_scale=20.0",
        "draft": "derived:first_layers,layers=1",
        "dtype": "bfloat16",
        "device": "cuda",
    }
    tests = {**TOY["tests"], "numerics": "matched"}  # type: ignore[dict-item]
    runs = {}
    for name, on in (("after", False), ("beside", True)):
        path = write_toy(tmp_path / name, models=models, tests=tests, positions=6)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(numerics_phase, "beside_drift", lambda models, on=on: on)
            options = runner.RunOptions(fast=True)
            runner.run_protocol(load_protocol(path), out=tmp_path / name / "run", options=options)
        runs[name] = json.loads((tmp_path / name / "run" / "summary.json").read_text())
    for table in TABLES:
        pd.testing.assert_frame_equal(
            pd.read_parquet(tmp_path / "after" / "run" / f"{table}.parquet"),
            pd.read_parquet(tmp_path / "beside" / "run" / f"{table}.parquet"),
            check_exact=True,
        )
    assert runs["after"]["verdict"] == runs["beside"]["verdict"]
    assert numerics_phase.BESIDE in runs["beside"]["timings"]
