"""Scale-out (spectest/scaleout.py): shards dealt one at a time to a pool of persistent workers —
processes (two CPU workers stand in for two GPUs) or Ray actors (a local Ray instance with 2
CPUs; skipped when ``ray`` is not installed) — write the same run directory as one process:
equal samples, rounds and histograms tables, provenance names every worker. A pool held by the
caller keeps its workers and their models between runs; a worker killed mid-run (SIGKILL) ends
the run with exit 4 naming it, no final file, and the same run again resumes to the same
tables. Every test here is exact (no statistical false-failure rate)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys

import pandas as pd
import pytest
import torch
from toy_protocol import write_toy
from typer.testing import CliRunner

from spectest.cli import app
from spectest.errors import ExitCode, InfrastructureError
from spectest.files import read_provenance
from spectest.protocol import load_protocol
from spectest.runner import RunOptions, run_protocol
from spectest.scaleout import ProcessPool, RayPool, split
from spectest.store import SHARDS_DIR

HAS_RAY = importlib.util.find_spec("ray") is not None


def test_split_deals_round_robin():
    assert split(["a", "b", "c", "d", "e"], 2) == [("a", "c", "e"), ("b", "d")]
    assert split(["a"], 4) == [("a",)]


def _tables(run_dir):
    return {
        name: pd.read_parquet(run_dir / f"{name}.parquet")
        for name in ("samples", "rounds", "histograms")
    }


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    d = tmp_path_factory.mktemp("single")
    cfg = write_toy(d, seeds={"per_arm": 60}, positions=3)
    res = run_protocol(load_protocol(cfg), out=d / "run")
    return cfg, res


def test_two_worker_processes_equal_one_process(single, tmp_path):
    cfg, one = single
    two = run_protocol(
        load_protocol(cfg), out=tmp_path / "run", options=RunOptions(devices=("cpu", "cpu"))
    )
    a, b = _tables(one.run_dir), _tables(two.run_dir)
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name], check_exact=True)
    # the tooth sizes came from a worker (beside generation), equal to the driver's
    assert two.summary["timings"]["tooth sizes"] == 0.0 < one.summary["timings"]["tooth sizes"]
    sizes = [pd.read_parquet(r.run_dir / "tooth_sizes.parquet") for r in (one, two)]
    pd.testing.assert_frame_equal(*sizes, check_exact=True)
    assert two.verdict.decision == one.verdict.decision
    prov = json.loads((two.run_dir / "manifest.json").read_text())["provenance"]
    assert prov["scaleout"] == "processes" and len(prov["workers"]) == 2
    assert two.summary["timings"]["generate"]
    # each worker's phases (two workers on one device: named host:pid)
    w = two.summary["timings"]["workers"]
    assert len(w) == 8 and all(v >= 0 for v in w.values()), w  # start, load, generate, wall
    loads = [k for k in w if k.endswith(" load")]
    assert len(loads) == 2 and all(w[k.replace(" load", " wall")] >= w[k] for k in loads)


def _worker_loads(run_dir):
    """(pid, models_loaded) of the worker of every shard file of a run directory."""
    out = set()
    for f in sorted((run_dir / SHARDS_DIR).glob("*.samples.parquet")):
        w = read_provenance(f)["worker"]
        out.add((w["pid"], w["models_loaded"]))
    return out


def test_pool_keeps_its_workers_and_models_between_runs(single, tmp_path):
    """One pool, two runs: the second run's shards come from the same two processes, which did
    not load their models again (``models_loaded`` stays 1) and paid no start; both runs equal
    the one-process run."""
    cfg, one = single
    with ProcessPool(["cpu", "cpu"]) as pool:
        first = run_protocol(load_protocol(cfg), out=tmp_path / "a", pool=pool)
        pids = sorted(s.pid for s in pool.slots)
        second = run_protocol(load_protocol(cfg), out=tmp_path / "b", pool=pool)
        assert sorted(s.pid for s in pool.slots) == pids
    assert not pool.slots  # closed by the context manager
    for res in (first, second):  # each shard from a kept worker that loaded once (see the Ray test)
        loads = _worker_loads(res.run_dir)
        assert loads and loads <= {(p, 1) for p in pids}, (loads, pids)
    w1, w2 = first.summary["timings"]["workers"], second.summary["timings"]["workers"]
    starts = [k for k in w2 if k.endswith(" start")]
    assert len(starts) == 2 and all(w1[k] > 0 and w2[k] == 0 for k in starts), (w1, w2)
    a = _tables(one.run_dir)
    for res in (first, second):
        for name, df in _tables(res.run_dir).items():
            pd.testing.assert_frame_equal(a[name], df)


def test_killed_worker_is_exit_4_naming_it_and_the_run_resumes(single, tmp_path):
    """SIGKILL the worker holding a shard when the first shard lands: one
    ``InfrastructureError`` (exit 4) naming that worker, no summary or manifest (nothing
    presented as complete); ``spectest run`` on the same directory resumes the shards written
    and ends with the one-process run's tables and exit code."""
    cfg, one = single
    out = tmp_path / "run"
    pool = ProcessPool(["cpu", "cpu"])
    killed: list[int] = []

    def progress(phase, done, total):
        if phase == "generate" and done == 1 and not killed:
            slot = next(s for s in pool.slots if s.key is not None)  # the other is held
            os.kill(slot.pid, signal.SIGKILL)
            killed.append(slot.pid)

    with pytest.raises(InfrastructureError) as err:
        run_protocol(load_protocol(cfg), out=out, pool=pool, progress=progress)
    assert err.value.exit_code == ExitCode.INFRASTRUCTURE == 4
    msg = str(err.value)
    assert f"pid {killed[0]}" in msg and "was killed by SIGKILL" in msg, msg
    assert "while generating shard" in msg or "while computing the tooth sizes" in msg, msg
    assert "run the same command again to resume" in msg
    assert not pool.slots  # the pool closed its other worker
    assert not (out / "manifest.json").exists() and not (out / "summary.json").exists()
    written = len(list((out / SHARDS_DIR).glob("*.samples.parquet")))
    assert 1 <= written < 10
    args = ["run", "-c", str(cfg), "--out", str(out), "--devices", "cpu,cpu", "--no-progress"]
    r = CliRunner().invoke(app, args, catch_exceptions=False)
    assert r.exit_code == one.verdict.exit_code, r.output
    assert f"{10 - written} generated, {written} resumed" in (out / "summary.json").read_text()
    a, b = _tables(one.run_dir), _tables(out)
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name])


@pytest.mark.skipif(not HAS_RAY, reason="ray is not installed (pip install 'spectest[ray]')")
def test_ray_actor_pool_between_runs(single, tmp_path):
    """A Ray actor pool held across two runs: the same two actors, their models loaded once,
    both runs equal to the one-process run."""
    import ray

    cfg, one = single
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with RayPool("auto") as pool:
            runs = [run_protocol(load_protocol(cfg), out=tmp_path / n, pool=pool) for n in "ab"]
            pids = sorted(s.pid for s in pool.slots)
    finally:
        ray.shutdown()
    assert len(pids) == 2
    a = _tables(one.run_dir)
    for res in runs:
        # NOTE every shard comes from one of the pool's two actors, each of which loaded its
        # models once; not that both wrote a shard: the actor dealt the tooth sizes first may
        # still be loading when the other has drained the queue (CI, 2026-12-03)
        loads = _worker_loads(res.run_dir)
        assert loads and loads <= {(p, 1) for p in pids}, (loads, pids)
        prov = json.loads((res.run_dir / "manifest.json").read_text())["provenance"]
        assert prov["scaleout"] == "ray"
        for name, df in _tables(res.run_dir).items():
            pd.testing.assert_frame_equal(a[name], df)


@pytest.mark.skipif(not HAS_RAY, reason="ray is not installed (pip install 'spectest[ray]')")
def test_ray_local_cluster_equals_one_process(single, tmp_path):
    import ray

    cfg, one = single
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        res = run_protocol(load_protocol(cfg), out=tmp_path / "run", options=RunOptions(ray="auto"))
    finally:
        ray.shutdown()
    a, b = _tables(one.run_dir), _tables(res.run_dir)
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name])
    prov = json.loads((res.run_dir / "manifest.json").read_text())["provenance"]
    assert prov["scaleout"] == "ray"
    # every shard came from one of the cluster's two actors, none from this process; not
    # necessarily from both: the pool deals the tooth sizes first, and while that actor loads
    # and sizes the other can drain every shard (results/LOG.md "lead (session 9)", "(session 21)")
    pids = {int(key.rsplit(":", 1)[1]) for key in prov["workers"]}
    assert 1 <= len(pids) <= 2 and os.getpid() not in pids


def test_ray_missing_is_one_line_exit_2(tmp_path, monkeypatch):
    """Without Ray (installed or not here: ``sys.modules["ray"] = None`` makes ``import ray``
    raise ImportError, as on a machine without it) ``--ray`` is one line and exit 2."""
    monkeypatch.setitem(sys.modules, "ray", None)
    cfg = write_toy(tmp_path, seeds={"per_arm": 20}, positions=2)
    args = ["run", "-c", str(cfg), "--out", str(tmp_path / "r"), "--ray", "auto", "--no-progress"]
    r = CliRunner().invoke(app, args, catch_exceptions=False)
    assert r.exit_code == 2, r.output
    assert "--ray needs Ray: pip install 'spectest[ray]'" in r.output


@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.device_count() >= 2), reason="needs 2 GPUs"
)
def test_two_gpus_equal_one_gpu(tmp_path):
    """A cuda run spreads over every visible GPU by default; the same run pinned to one GPU."""
    models = {
        "target": "realistic:qwen3-tiny,draft_layers=1,num_hidden_layers=3",
        "draft": "derived:first_layers,layers=1",
        "dtype": "float32",
        "device": "cuda",
    }
    cfg = write_toy(tmp_path, models=models, seeds={"per_arm": 60}, positions=3)
    spread = run_protocol(
        load_protocol(cfg), out=tmp_path / "spread", options=RunOptions(fast=True)
    )
    one = run_protocol(
        load_protocol(cfg), out=tmp_path / "one", options=RunOptions(fast=True, devices=("cuda:0",))
    )
    prov = json.loads((spread.run_dir / "manifest.json").read_text())["provenance"]
    assert len(prov["workers"]) == torch.cuda.device_count()
    for name, engines in prov["workers"].items():  # every worker replayed CUDA graphs
        for e in engines.values():
            assert e.get("cuda_graphs") is True and e.get("graph_error") is None, (name, e)
    for name, df in _tables(one.run_dir).items():
        pd.testing.assert_frame_equal(df, _tables(spread.run_dir)[name])


def test_sequence_permutations_over_processes_equal_serial(single):
    """The sequence family's per-cell permutation statistics on a 2-process pool equal the
    serial ones bit for bit (every family's table, ``check_exact``): the relabelings are drawn
    once in the driver from the seed and each cell is the same function of the same inputs."""
    from concurrent.futures import ProcessPoolExecutor

    from spectest.stats.battery import analyze

    _, one = single
    samples = pd.read_parquet(one.run_dir / "samples.parquet")
    kw = {"reference": "reference", "candidate": "mutant_always_accept", "rng_seed": 7}
    if kw["candidate"] not in set(samples["arm"]):
        kw["candidate"] = sorted(set(samples["arm"]) - {"reference"})[0]
    serial = analyze(samples, **kw)
    with ProcessPoolExecutor(2) as ex:
        spread = analyze(samples, **kw, executor=ex)
    assert serial.families["sequence"].n_tested > 0  # the family ran on several cells
    assert serial.families.keys() == spread.families.keys()
    for name, res in serial.families.items():
        pd.testing.assert_frame_equal(res.table, spread.families[name].table, check_exact=True)
        assert res.rejected == spread.families[name].rejected
    assert serial.rejected == spread.rejected


def test_analysis_procs_below_one_is_exit_2(single, tmp_path):
    cfg, _ = single
    args = ["run", "-c", str(cfg), "--out", str(tmp_path / "r"), "--analysis-procs", "0"]
    r = CliRunner().invoke(app, [*args, "--no-progress"], catch_exceptions=False)
    assert r.exit_code == 2 and "--analysis-procs: expected an integer >= 1, got 0" in r.output


def test_a_sequential_run_keeps_one_pool_over_its_stages(tmp_path):
    """Two stages (100 then 200 seeds per arm; the resolution asked is out of reach, so both are
    generated) on two worker processes: every shard of both stages comes from the same two
    processes, each of which loaded its models once, and the tables equal the one-process
    run's."""
    sections = {
        "teeth": {"null_arm": False},
        "seeds": {"per_arm": 100, "max_per_arm": 200},
        "tests": {
            "alpha": 0.05, "trie": {"depth": 1, "min_count": 50}, "null_permutations": 50,
            "whitebox": False, "power": {"max_mde_tv": 0.01},
        },
    }  # fmt: skip
    cfg = write_toy(tmp_path, **sections)
    one = run_protocol(load_protocol(cfg), out=tmp_path / "one")
    two = run_protocol(
        load_protocol(cfg), out=tmp_path / "two", options=RunOptions(devices=("cpu", "cpu"))
    )
    assert [lk["decision"] for lk in two.summary["sequential"]["looks"]] == ["continue", "budget"]
    assert list((tmp_path / "two" / SHARDS_DIR).glob("*stage1*"))
    loads = _worker_loads(two.run_dir)
    assert len(loads) == 2 and {n for _, n in loads} == {1}, loads
    for name, df in _tables(one.run_dir).items():
        pd.testing.assert_frame_equal(df, _tables(two.run_dir)[name], check_exact=True)


def _spawned_children(pid):
    """The pids of ``pid``'s multiprocessing-spawned children (its pool's workers)."""
    try:
        kids = open(f"/proc/{pid}/task/{pid}/children").read().split()
    except OSError:
        return []
    out = []
    for k in kids:
        try:
            cmd = open(f"/proc/{k}/cmdline", "rb").read()
        except OSError:
            continue
        if b"spawn_main" in cmd:
            out.append(int(k))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_cli_run_with_a_killed_worker_exits_4_naming_it(single, tmp_path):
    """``spectest run --devices cpu,cpu`` as a real process; SIGKILL one of its workers as soon
    as the first shard is on disk (9 shards still to go): exit 4, one line naming the worker's
    pid, no manifest."""
    import subprocess
    import time

    cfg, _ = single
    out = tmp_path / "run"
    args = [sys.executable, "-m", "spectest", "run", "-c", str(cfg), "--out", str(out)]
    proc = subprocess.Popen(
        [*args, "--devices", "cpu,cpu", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    victim = None
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        workers = _spawned_children(proc.pid)
        if len(workers) == 2 and list((out / SHARDS_DIR).glob("*.samples.parquet")):
            victim = workers[1]
            os.kill(victim, signal.SIGKILL)
            break
        time.sleep(0.02)
    stdout, stderr = proc.communicate(timeout=300)
    assert victim is not None, (stdout, stderr)
    assert proc.returncode == 4, (stdout, stderr)
    assert f"pid {victim}" in stderr and "was killed by SIGKILL" in stderr, stderr
    assert not (out / "manifest.json").exists()
