"""``spectest run --fast``: the built-in arms (teeth included) on the fast engine write the same
samples as the built-in engine (a tiny HF pair, so the static cache is exercised), the summary
and the console carry per-phase wall times, provenance names the fast engine."""

from __future__ import annotations

import json

import pandas as pd
from toy_protocol import write_toy
from typer.testing import CliRunner

from spectest.cli import app

TINY = {
    "target": "realistic:qwen3-tiny,draft_layers=1,num_hidden_layers=3",
    "draft": "derived:first_layers,layers=1",
}


def test_fast_run_writes_the_same_samples_with_timings(tmp_path):
    cfg = write_toy(
        tmp_path, models=TINY, seeds={"per_arm": 40}, positions=3,
        teeth={"null_arm": True, "epsilons": [0.5], "mutants": []},
        tests={"alpha": 0.05, "trie": {"depth": 1, "min_count": 20}, "null_permutations": 20},
    )  # fmt: skip
    runs = {}
    for fast in (False, True):
        out = tmp_path / f"run-{fast}"
        args = ["run", "-c", str(cfg), "--out", str(out), "--no-progress"]
        r = CliRunner().invoke(app, args + (["--fast"] if fast else []), catch_exceptions=False)
        assert r.exit_code in (0, 1, 3), r.output
        assert "timings (s): load" in r.output and "generate [reference" in r.output
        runs[fast] = out
    a = pd.read_parquet(runs[False] / "samples.parquet")
    b = pd.read_parquet(runs[True] / "samples.parquet")
    pd.testing.assert_frame_equal(a, b)
    summary = json.loads((runs[True] / "summary.json").read_text())
    t = summary["timings"]
    assert set(t["generate"]) == {"reference", "candidate", "null", "eps=0.5"}
    assert t["load"] >= 0 and t["analyze"] >= 0 and t["whitebox"] >= 0
    engines = json.loads((runs[True] / "manifest.json").read_text())["provenance"]["engines"]
    assert engines and all(e["name"] == "fast" for e in engines.values()), engines
