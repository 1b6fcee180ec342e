"""``spectest bench`` on a real prompt set (issue 34.3): by default the first prompt of the shipped
``english-2`` set, named in its output, and the accepted draft tokens per round of its
speculative arms match a ``spectest run`` of the same pair, prompt, sampling config, K and
positions (it was 0.00 on synthetic ids 1..8).

Tolerance: 4 standard errors of the difference of the two means (the run's per-seed means give
the standard error; the bench's rows are independent draws of the same law, so the difference's
is √2 times it). Normal approximation: a two-sided false-failure rate of about 6·10⁻⁵ per
choice of seeds; the seeds are fixed, so the test is deterministic."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

from spectest.bench import BenchConfig, run_bench
from spectest.protocol import load_protocol
from spectest.runner import run_protocol
from spectest.sampling.params import SamplingParams

N, T, K = 240, 8, 4


@pytest.mark.slow  # a run and a bench of 240 rows: 5 min on the busy 2-core machine
def test_bench_acceptance_matches_a_run_of_the_same_pair(tmp_path: Path) -> None:
    body = {
        "version": 1, "name": "bench-vs-run",
        "models": {"target": "bundled:target", "draft": "bundled:draft"},
        "drafter": {"kind": "onehot", "k": K},
        "prompts": {"shipped": "english-2", "limit": 1},
        "configs": {"c": {"temperature": 0.8, "top_p": 0.95}},
        "seeds": {"per_arm": N}, "positions": T,
        "tests": {"whitebox": False, "trie": {"depth": 1, "min_count": 100}},
        "teeth": {"null_arm": False, "epsilons": [], "mutants": []},
    }  # fmt: skip
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(body))
    result = run_protocol(load_protocol(tmp_path / "p.yaml"), out=tmp_path / "run")
    rounds = pd.read_parquet(result.run_dir / "rounds.parquet")
    cand = rounds[rounds["arm"] == "candidate"]
    run_mean = float(cand["accepted"].mean())
    per_seed = cand.groupby("seed")["accepted"].mean()
    tol = 4 * math.sqrt(2) * float(per_seed.std()) / math.sqrt(len(per_seed))

    logs: list[str] = []
    bench = run_bench(
        BenchConfig(
            target="bundled:target", draft="bundled:draft", rows=N, positions=T, k=K,
            params=SamplingParams(0.8, 0, 0.95), arms=("builtin-spec", "fast-spec"),
            baseline=False,
        ),
        log=logs.append,
    )  # fmt: skip
    assert "prompt: shipped prompt set english-2, prompt p0" in " ".join(logs), logs
    assert bench.config["prompt_used"] == "shipped prompt set english-2, prompt p0"
    assert run_mean > 0.2, run_mean  # real text: the drafter agrees often
    for arm in bench.arms:
        assert arm.mean_accepted is not None
        assert abs(arm.mean_accepted - run_mean) <= tol, (arm.arm, arm.mean_accepted, run_mean, tol)


def test_bench_hf_assisted_prints_no_deprecation_warning(tmp_path: Path) -> None:
    """transformers' assistant loop passes min/max_new_tokens and use_cache beside a
    generation_config and then warns that this is deprecated; spectest filters exactly that
    warning while assisted generation runs (a real ``spectest bench`` subprocess: the warning is
    logged once per process, so in-process it could be swallowed by an earlier test)."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "spectest", "bench",
         "--target", "realistic:qwen3-tiny,draft_layers=1,num_hidden_layers=3",
         "--draft", "derived:first_layers,layers=1", "--rows", "2", "--positions", "3",
         "--arms", "hf-assisted", "--no-baseline", "--out", str(tmp_path / "b.jsonl")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "hf-assisted" in r.stdout and "prompt: shipped prompt set english-2" in r.stdout
    assert "deprecated" not in r.stderr, r.stderr


def test_bench_on_a_small_vocabulary_names_the_ids_prompt_set() -> None:
    from spectest.errors import ConfigError

    target, draft = "toy:V=16,order=2,scale=2.0,seed=3", "toy:V=16,order=2,seed=4"
    small = dict(rows=2, positions=2, arms=("builtin-spec",), baseline=False)
    with pytest.raises(ConfigError, match=r"has only 16 token ids .* pass --prompts ids-tiny"):
        run_bench(BenchConfig(target, draft, **small))  # type: ignore[arg-type]
    cfg = BenchConfig(target, draft, prompts="ids-tiny", **small)  # type: ignore[arg-type]
    assert run_bench(cfg).config["prompt_used"] == "shipped prompt set ids-tiny, prompt ids0"
