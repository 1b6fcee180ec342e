"""Issue 32: the tooth sizes beside generation, in a process of their own
(``scaleout.TeethInProcess``) or on a thread (``TeethBeside``), on CUDA — the run's tables
equal the sequential run's bit for bit (CPU: the toy protocol with each forced on; ``-m gpu``:
the realistic tiny pair in bfloat16 on the fast engine, whose CUDA-graph captures then run while
the process or thread works); the process's errors reach the run; and what makes the thread's
sharing of the models safe:
``attention.CONFIG_LOCK`` (a forward of an ``HFModel`` on another thread waits for a switched
forward and never sees the switch; a waiting writer goes first; the holder may re-enter).

Exact checks on fixed seeds; the lock tests wait on events with timeouts of seconds for what
takes microseconds, so a pass or failure does not depend on timing.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
import torch
from toy_protocol import write_toy

from spectest import runner, scaleout, teeth_phase
from spectest.engines.base import Models
from spectest.models import attention
from spectest.models.zoo import load_pair
from spectest.plan import make_plan
from spectest.progress import no_progress
from spectest.protocol import load_protocol


def _started(fn: Any) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def test_config_lock_excludes_prefers_writers_and_reenters() -> None:
    lock = attention.ConfigLock()
    order: list[str] = []
    release = threading.Event()

    def write() -> None:
        with lock.exclusive():
            order.append("w")
            release.wait(5)

    def read() -> None:
        with lock.shared():
            order.append("r")

    with lock.shared():
        writer = _started(write)
        deadline = time.monotonic() + 5
        while not lock._waiting and time.monotonic() < deadline:  # the writer is queued
            time.sleep(0.001)
        assert lock._waiting == 1
        reader = _started(read)
        time.sleep(0.05)
        assert order == []  # the writer waits for the reader; the new reader for the writer
    deadline = time.monotonic() + 5
    while not order and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.05)
    assert order == ["w"]  # the writer went first, and the reader waits while it holds
    release.set()
    writer.join(5)
    reader.join(5)
    assert order == ["w", "r"]
    # the holder's own shared and nested exclusive holds go through
    mine = attention.ConfigLock()
    with mine.exclusive(), mine.shared(), mine.exclusive():
        assert mine._depth == 2
    assert mine._writer is None


def test_hf_forward_on_another_thread_waits_for_a_switched_forward() -> None:
    target, _ = load_pair(
        "realistic:qwen3-tiny,draft_layers=1", "derived:first_layers,layers=1", device="cpu"
    )
    ids = torch.tensor([[5, 17, 99, 3, 250, 41]])
    want = target.logits_full(ids)
    config = target.model.config
    impl = config._attn_implementation
    got: dict[str, Any] = {}

    def forward() -> None:
        got["logits"] = target.logits_full(ids)
        got["impl"] = config._attn_implementation

    with attention.packed_attention(config):
        assert config._attn_implementation == attention.IMPLEMENTATION
        t = _started(forward)
        t.join(0.3)
        assert t.is_alive() and not got  # blocked while the switch is on
    t.join(30)
    assert got["impl"] == impl
    assert torch.equal(got["logits"], want)


def _toy_run(tmp_path: Path, name: str) -> dict[str, Any]:
    path = write_toy(tmp_path / name)
    runner.run_protocol(load_protocol(path), out=tmp_path / name / "run")
    return json.loads((tmp_path / name / "run" / "summary.json").read_text())


def test_tooth_sizes_beside_generation_equal_the_sequential_phase(tmp_path: Path) -> None:
    seq = _toy_run(tmp_path, "seq")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(teeth_phase, "beside_generation", lambda models: True)
        beside = _toy_run(tmp_path, "beside")
    _same_tables(tmp_path / "seq" / "run", tmp_path / "beside" / "run")
    assert seq["verdict"] == beside["verdict"]
    assert "tooth sizes beside generation" not in seq["timings"]
    assert beside["timings"]["tooth sizes beside generation"] > 0
    # on CPU the run keeps the phase after generation
    tiny = load_pair("realistic:qwen3-tiny,draft_layers=1", "derived:first_layers,layers=1")
    assert not teeth_phase.beside_generation(Models(*tiny))


def test_tooth_sizes_in_a_process_equal_the_sequential_phase(tmp_path: Path) -> None:
    _toy_run(tmp_path, "seq")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(teeth_phase, "beside_generation", lambda models: True)
        mp.setattr(teeth_phase, "beside_process", lambda models: True)
        started: list[Any] = []
        start = scaleout.TeethInProcess.__init__

        def spy(self: Any, *a: Any) -> None:
            start(self, *a)
            started.append(self)

        mp.setattr(scaleout.TeethInProcess, "__init__", spy)
        proc = _toy_run(tmp_path, "proc")
    assert len(started) == 1
    started[0]._proc.join(60)  # told to stop, not waited for: it ends on its own, cleanly
    assert started[0]._proc.exitcode == 0
    _same_tables(tmp_path / "seq" / "run", tmp_path / "proc" / "run")
    assert proc["timings"]["tooth sizes beside generation"] > 0
    # on CPU (and on a device with less than PROCESS_MIN_FREE free) the thread or the phase after
    tiny = load_pair("realistic:qwen3-tiny,draft_layers=1", "derived:first_layers,layers=1")
    assert not teeth_phase.beside_process(Models(*tiny))


def test_the_process_computes_once_granted_after_a_speculative_shard(tmp_path: Path) -> None:
    """The runner grants the process its memory after writing its first speculative shard (one
    with rounds: the run's caches exist then), once; a process the run declines
    (``grant_headroom``'s reason: too little free beside it) is stopped unused, and the phase
    warns and computes the same table after generation."""
    seq = _toy_run(tmp_path, "seq")
    grants: list[int] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(teeth_phase, "beside_generation", lambda models: True)
        mp.setattr(teeth_phase, "beside_process", lambda models: True)
        shards = tmp_path / "granted" / "run" / "shards"
        grant = scaleout.TeethInProcess.grant

        def spy(self: Any) -> None:
            grants.append(len(list(shards.glob("*.rounds.parquet"))))
            grant(self)

        mp.setattr(scaleout.TeethInProcess, "grant", spy)
        granted = _toy_run(tmp_path, "granted")
        short = "the tooth-size process declined: 1.0 GiB free (test)"
        mp.setattr(scaleout.worker, "grant_headroom", lambda device: (0.0, short))
        with pytest.warns(RuntimeWarning, match=r"declined: 1\.0 GiB free \(test\); computing"):
            declined = _toy_run(tmp_path, "declined")
    assert grants[0] == 1  # after the first speculative shard (rounds written), not before
    for name in ("granted", "declined"):
        _same_tables(tmp_path / "seq" / "run", tmp_path / name / "run")
    assert granted["timings"]["tooth sizes beside generation"] > 0
    assert "tooth sizes beside generation" not in declined["timings"]
    assert seq["verdict"] == granted["verdict"] == declined["verdict"]


def _early(tmp_path: Path, name: str, process: bool) -> tuple[dict[str, Any], list[Any]]:
    """The toy run with the process spawned early (``spawn_early`` forced), the process or
    the thread taken after the load (``process``): its summary and the processes spawned,
    each checked to exist before the load."""
    started: list[Any] = []
    start, load = scaleout.TeethInProcess.__init__, runner.EngineSet.__init__

    def spy(self: Any, *a: Any) -> None:
        start(self, *a)
        started.append(self)

    def loading(self: Any, *a: Any, **k: Any) -> None:
        assert len(started) == 1  # spawned before the load
        load(self, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "spawn_early", lambda protocol, teeth: bool(teeth))
        mp.setattr(teeth_phase, "beside_generation", lambda models: True)
        mp.setattr(teeth_phase, "beside_process", lambda models: process)
        mp.setattr(scaleout.TeethInProcess, "__init__", spy)
        mp.setattr(runner.EngineSet, "__init__", loading)
        return _toy_run(tmp_path, name), started


def test_the_process_spawned_before_the_load_is_the_one_used_or_stopped(tmp_path: Path) -> None:
    """Where it may be used (``spawn_early``; CUDA, forced here) the process is spawned before
    the run loads its models (its imports beside that load) and is the one that computes the
    sizes; where ``start_beside`` takes the thread instead it is stopped, unused. Both runs'
    tables equal the sequential run's."""
    _toy_run(tmp_path, "seq")
    for name, process in (("early", True), ("unused", False)):
        got, started = _early(tmp_path, name, process)
        assert len(started) == 1  # the early one, and no other
        started[0]._proc.join(60)
        assert started[0]._proc.exitcode == 0  # it ended cleanly, used or not
        assert "tooth sizes beside generation" in got["timings"]  # the process's, or the thread's
        _same_tables(tmp_path / "seq" / "run", tmp_path / name / "run")
    # on CPU no process is spawned early
    protocol = load_protocol(write_toy(tmp_path / "cpu"))
    assert not teeth_phase.spawn_early(protocol, make_plan(protocol).settings.sized_teeth)


def test_the_process_may_hold_what_the_run_leaves() -> None:
    """``memory_fraction`` at P1's figures (the run held 68 GiB after its first speculative
    shard, the process its 1.5 GiB of models, the two CUDA contexts ~1 GiB): on an H200
    (139 GiB) the process may hold 46 GiB, above the 35 GiB it used there; on an H100
    (79 GiB) it declines. At the edge a budget of exactly ``MIN_BUDGET`` is granted."""
    gib = teeth_phase.GIB
    run, held = 68 * gib, 1.5 * gib

    def fraction(total: float) -> float | None:
        free = total - run - held - 1 * gib
        headroom = teeth_phase.RUN_GROWTH * run + teeth_phase.DEVICE_SLACK * total
        return teeth_phase.memory_fraction(free, total, held, headroom)

    h200 = fraction(139 * gib)
    assert h200 is not None
    assert h200 * 139 == pytest.approx(1.5 + (139 - 68 - 1.5 - 1) - (0.25 * 68 + 0.05 * 139))
    assert h200 * 139 * gib > 35 * gib
    assert fraction(79 * gib) is None
    total = 100 * gib
    edge = teeth_phase.MIN_BUDGET * total
    assert teeth_phase.memory_fraction(edge + gib, total, 0.0, gib) == teeth_phase.MIN_BUDGET
    assert teeth_phase.memory_fraction(edge + gib - 1, total, 0.0, gib) is None


def test_the_process_is_for_models_that_are_cheap_to_copy() -> None:
    """``beside_process`` weighs the models' tensors, each once (the derived draft shares the
    target's); a model that is not a torch module weighs infinitely (the thread)."""
    target, draft = load_pair(
        "realistic:qwen3-tiny,draft_layers=1", "derived:first_layers,layers=1"
    )
    module = target.model
    own = sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))
    assert teeth_phase.weight_bytes(Models(target, draft)) == own
    assert teeth_phase.weight_bytes(Models(target, None)) == own
    assert teeth_phase.weight_bytes(Models(object(), None)) == float("inf")  # type: ignore[arg-type]


def test_an_error_in_the_tooth_size_process_is_the_runs(tmp_path: Path) -> None:
    """The worker refuses a protocol whose hash is not the driver's: that error, raised in the
    spawned process, is what ``result`` raises; ``abandon`` stops a process that is running."""
    from spectest.errors import EngineError

    path = write_toy(tmp_path / "toy")
    run = tmp_path / "toy" / "run"
    runner.run_protocol(load_protocol(path), out=run)
    other = SimpleNamespace(hash="0" * 64, models=SimpleNamespace(device="cpu"))
    with pytest.raises(EngineError, match="protocol reads as"):
        scaleout.TeethInProcess(other, run, runner.RunOptions()).load().result()
    running = scaleout.TeethInProcess(
        load_protocol(run / "protocol.yaml"), run, runner.RunOptions()
    )
    running.abandon()
    assert not running._proc.is_alive()


def test_a_tooth_size_process_that_dies_costs_the_phase_not_the_run(tmp_path: Path) -> None:
    """A process killed before its result (out of memory, say): the phase warns and computes
    the sizes itself, the same table as without a process."""
    path = write_toy(tmp_path / "toy")
    run = tmp_path / "toy" / "run"
    runner.run_protocol(load_protocol(path), out=run)
    protocol = load_protocol(run / "protocol.yaml")
    teeth = make_plan(protocol).settings.sized_teeth
    want = teeth_phase.tooth_sizes_phase(protocol, teeth, None, {}, no_progress)
    dead = scaleout.TeethInProcess(protocol, run, runner.RunOptions())
    dead._proc.kill()
    dead._proc.join(30)
    timings: dict[str, Any] = {}
    with pytest.warns(RuntimeWarning, match="ended with code -9 before its result"):
        got = teeth_phase.tooth_sizes_phase(
            protocol, teeth, None, timings, no_progress, beside=dead
        )
    assert want is not None and len(want)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert "tooth sizes beside generation" not in timings and timings["tooth sizes"] > 0


def _same_tables(a: Path, b: Path) -> None:
    for table in ("tooth_sizes", "samples", "histograms"):
        pd.testing.assert_frame_equal(
            pd.read_parquet(a / f"{table}.parquet"),
            pd.read_parquet(b / f"{table}.parquet"),
            check_exact=True,
        )


@pytest.mark.gpu
def test_fast_run_on_cuda_with_tooth_sizes_beside_generation(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    models = {
        "target": "realistic:qwen3-tiny,draft_layers=1,logit_scale=20.0",
        "draft": "derived:first_layers,layers=1",
        "dtype": "bfloat16",
        "device": "cuda",
    }
    runs: dict[str, Any] = {}
    for name, beside, process in (
        ("seq", False, False),
        ("thread", True, False),
        ("proc", True, True),  # granted and capped (teeth_phase.cap_memory)
        ("short", True, True),  # the process finds too little free for it and declines
    ):
        path = write_toy(tmp_path / name, models=models, positions=6)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(teeth_phase, "beside_generation", lambda models, on=beside: on)
            mp.setattr(teeth_phase, "beside_process", lambda models, on=process: on)
            declines: Any = contextlib.nullcontext()
            if name == "short":  # a headroom of a petabyte: the process's own check declines
                mp.setattr(scaleout.worker, "grant_headroom", lambda device: (1e15, None))
                declines = pytest.warns(RuntimeWarning, match="the tooth-size process declined")
            options = runner.RunOptions(fast=True)
            with declines:
                run = load_protocol(path)
                runner.run_protocol(run, out=tmp_path / name / "run", options=options)
        runs[name] = json.loads((tmp_path / name / "run" / "summary.json").read_text())
    for name in ("thread", "proc", "short"):
        _same_tables(tmp_path / "seq" / "run", tmp_path / name / "run")
        assert ("tooth sizes beside generation" in runs[name]["timings"]) == (name != "short")
        assert runs["seq"]["verdict"] == runs[name]["verdict"]
    # a device with room (PROCESS_MIN_FREE of its memory free) takes the process
    tiny = load_pair(models["target"], models["draft"], device="cuda", dtype="bfloat16")
    assert teeth_phase.beside_process(Models(*tiny))


def test_the_process_imports_ahead_of_its_load(tmp_path: Path) -> None:
    """``TeethInProcess`` sends ``("warm",)`` at its spawn: in a fresh interpreter ``_warm``
    imports what a transformers model's load imports (none of it imported before), and the
    worker answers nothing to it, so the process's first answer is its job's (the other tests
    of the process read exactly that)."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom spectest.scaleout import worker\n"
        "print('transformers.modeling_utils' in sys.modules)\nworker._warm()\n"
        "print('transformers.modeling_utils' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["False", "True"], (r.stdout, r.stderr)
