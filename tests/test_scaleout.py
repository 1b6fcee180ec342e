"""Scale-out (spectest/scaleout.py): shards spread over worker processes (two CPU workers stand in
for two GPUs) or Ray tasks (a local Ray instance with 2 CPUs; skipped when ``ray`` is not
installed) write the same run directory as one process: equal samples, rounds and histograms,
and provenance names every worker."""

from __future__ import annotations

import importlib.util
import json
import sys

import pandas as pd
import pytest
import torch
from toy_protocol import write_toy
from typer.testing import CliRunner

from spectest.cli import app
from spectest.protocol import load_protocol
from spectest.runner import RunOptions, run_protocol
from spectest.scaleout import split

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
        pd.testing.assert_frame_equal(a[name], b[name])
    assert two.verdict.decision == one.verdict.decision
    prov = json.loads((two.run_dir / "manifest.json").read_text())["provenance"]
    assert prov["scaleout"] == "processes" and len(prov["workers"]) == 2
    assert two.summary["timings"]["generate"]
    # each worker's phases (two workers on one device: named host:pid)
    w = two.summary["timings"]["workers"]
    assert len(w) == 8 and all(v >= 0 for v in w.values()), w
    loads = [k for k in w if k.endswith(" load")]
    assert len(loads) == 2 and all(w[k.replace(" load", " wall")] >= w[k] for k in loads)


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
    assert prov["scaleout"] == "ray" and len(prov["workers"]) == 2


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
