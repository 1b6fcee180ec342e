"""``spectest bench`` on CPU with a tiny pair: every arm runs on the same workload, the derived
figures are consistent, records are appended as JSON lines, bad options exit 2. No timing
assertions (speed lives in results/bench/ and results/LOG.md)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from spectest.bench import ARMS, BenchConfig, flops_per_token, run_bench, write_records
from spectest.cli import app
from spectest.errors import ConfigError
from spectest.models.zoo import load_model

TINY = "realistic:qwen3-tiny,draft_layers=1,num_hidden_layers=3"
DRAFT = "derived:first_layers,layers=1"


def test_every_arm_runs_and_the_figures_are_consistent(tmp_path):
    cfg = BenchConfig(
        target=TINY, draft=DRAFT, rows=4, positions=4, k=2, assisted_rows=1, peak_tflops=1.0
    )
    res = run_bench(cfg)
    assert [a.arm for a in res.arms] == list(ARMS)
    hf = next(a for a in res.arms if a.arm == "hf-generate")
    for a in res.arms:
        assert a.rows == (1 if a.arm == "hf-assisted" else 4)
        assert a.rows_per_s == pytest.approx(a.rows / a.wall_s)
        assert a.tokens_per_s == pytest.approx(a.rows_per_s * 4)
        assert a.ratio_to_hf_generate == pytest.approx(a.rows_per_s / hf.rows_per_s)
        assert a.mfu == pytest.approx(a.tokens_per_s * res.flops_per_token / 1e12)
        assert (a.mean_accepted is None) == (
            a.arm in ("fast-plain", "builtin-plain", "hf-generate")
        )
        assert (a.slowest_row_rounds is None) == (a.mean_accepted is None)
        if a.slowest_row_rounds is not None:  # 4 positions at K = 2: 2 to 4 rounds
            assert 2 <= a.slowest_row_rounds <= 4, (a.arm, a.slowest_row_rounds)
    path = write_records(res, tmp_path / "b.jsonl")
    write_records(res, path)  # appends
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(recs) == 2 * len(ARMS)
    assert recs[0]["config"]["params"]["top_p"] == 0.95 and recs[0]["flops_per_token"] > 0


def test_whitebox_arms_record_the_columns():
    """``whitebox=True``: spectest's arms record white-box columns of every token (as a run)."""
    arms = ("fast-plain", "fast-spec", "builtin-plain", "builtin-spec")
    cfg = BenchConfig(target=TINY, draft=DRAFT, rows=3, positions=4, k=2, arms=arms, whitebox=True)
    res = run_bench(cfg)
    assert [a.note for a in res.arms] == ["white-box columns: 12 rows"] * 4
    assert res.config["whitebox"] is True


def test_flops_per_token_from_the_config():
    m = load_model("hf-preset:qwen3-tiny")
    cfg = m.model.config  # type: ignore[attr-defined]
    layers = sum(p.numel() for p in m.model.model.layers.parameters())  # type: ignore[attr-defined]
    want = 2 * (layers + cfg.hidden_size + cfg.vocab_size * cfg.hidden_size)  # + final norm
    assert flops_per_token(m) == want


def test_bad_config():
    with pytest.raises(ConfigError, match="arms must be among"):
        BenchConfig(arms=("nope",))
    with pytest.raises(ConfigError, match="rows must be an integer >= 1"):
        BenchConfig(rows=0)
    with pytest.raises(ConfigError, match="repeat must be an integer >= 1"):
        BenchConfig(repeat=0)


def test_repeats_run_in_rounds_with_the_baseline(tmp_path):
    """``repeat=3``: every arm and the baseline (timed only for the ratio) three times; the
    figures take the median wall; the ratio of medians lies between the rounds' least and
    greatest ratio (each round's rows/s over that round's baseline), and the records carry
    them. The rows are the same every round (seeded), so the acceptance is one figure."""
    import statistics

    cfg = BenchConfig(target=TINY, draft=DRAFT, rows=3, positions=4, k=2, repeat=3,
                      arms=("fast-plain", "fast-spec"), peak_tflops=1.0)  # fmt: skip
    res = run_bench(cfg)
    base = res.baseline
    assert base is not None and len(base.wall_s_runs) == 3
    for a in (*res.arms, base):
        assert len(a.wall_s_runs) == 3 and a.wall_s == statistics.median(a.wall_s_runs)
        assert a.rows_per_s == pytest.approx(a.rows / a.wall_s)
        assert a.ratio_to_hf_generate == pytest.approx(a.rows_per_s / base.rows_per_s)
        rounds = [(a.rows / w) / (base.rows / b)
                  for w, b in zip(a.wall_s_runs, base.wall_s_runs, strict=True)]  # fmt: skip
        assert (a.ratio_min, a.ratio_max) == (min(rounds), max(rounds))
        assert a.ratio_min <= a.ratio_to_hf_generate <= a.ratio_max
    assert base.ratio_min == base.ratio_max == 1.0
    recs = [
        json.loads(x) for x in write_records(res, tmp_path / "b.jsonl").read_text().splitlines()
    ]
    assert [len(r["wall_s_runs"]) for r in recs] == [3, 3, 3] and recs[1]["ratio_min"] > 0
    one = run_bench(BenchConfig(target=TINY, draft=DRAFT, rows=3, positions=4, k=2,
                                arms=("fast-spec",), baseline=False))  # fmt: skip
    assert len(one.arms[0].wall_s_runs) == 1 and one.arms[0].ratio_min is None
    assert one.arms[0].mean_accepted == res.arms[1].mean_accepted


def test_the_cli_defaults_are_bench_configs_and_load_no_torch():
    """``spectest bench``'s defaults are ``BenchConfig``'s: a run with no option builds the
    default config. Reading them loads no torch (the CLI starts without it)."""
    import inspect
    import subprocess
    import sys
    from pathlib import Path

    from spectest.cli.bench import bench

    opts = {k: p.default for k, p in inspect.signature(bench).parameters.items()}
    cfg = BenchConfig()
    for name in ("target", "draft", "device", "dtype", "rows", "positions", "k", "prompts"):
        assert opts[name] == getattr(cfg, name), name
    assert opts["assisted_rows"] == cfg.assisted_rows and opts["whitebox"] == cfg.whitebox
    assert opts["arms"] == ",".join(cfg.arms) and (opts["drafter"] == "onehot") == cfg.onehot
    assert (opts["temperature"], opts["top_k"], opts["top_p"]) == (
        cfg.params.temperature,
        cfg.params.top_k,
        cfg.params.top_p,
    )
    code = "import sys, spectest.bench, spectest.cli.bench; assert 'torch' not in sys.modules"
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_cli(tmp_path):
    out = tmp_path / "bench.jsonl"
    args = ["bench", "--target", TINY, "--draft", DRAFT, "--rows", "2", "--positions", "3",
            "--arms", "fast-plain,fast-spec,hf-generate", "--out", str(out)]  # fmt: skip
    r = CliRunner().invoke(app, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "fast-spec" in r.output and "× hf-generate" in r.output
    assert len(out.read_text().splitlines()) == 3
    assert "fast arms on CUDA graphs: False" in r.output  # CPU
    prof = tmp_path / "prof"
    args = ["bench", "--target", TINY, "--draft", DRAFT, "--rows", "2", "--positions", "2",
            "--arms", "fast-plain", "--out", str(out), "--profile", str(prof)]  # fmt: skip
    r = CliRunner().invoke(app, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert (prof / "fast-plain.json").is_file()
    args = ["bench", "--target", TINY, "--draft", DRAFT, "--rows", "2", "--positions", "2",
            "--arms", "fast-plain", "--repeat", "2", "--out", str(tmp_path / "r")]  # fmt: skip
    r = CliRunner().invoke(app, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    recs = [json.loads(x) for x in (tmp_path / "r").read_text().splitlines()]
    assert [len(x["wall_s_runs"]) for x in recs] == [2, 2]  # the arm and the baseline
    r = CliRunner().invoke(app, ["bench", "--drafter", "greedy"], catch_exceptions=False)
    assert r.exit_code == 2 and "--drafter must be onehot or sampled" in r.output


def test_any_registered_engine_through_the_registry(tmp_path):
    """A ``command`` engine (the shipped example program) and the built-in engine by name, as
    the registry builds them for a run; the ratio's baseline (transformers' plain generate) is
    timed beside them because no arm is it, and every output passed ``check_output``."""

    from spectest.engines.command import programs_dir

    prog = programs_dir() / "builtin_engine.py"
    command = {"command": ["{python}", str(prog), "--target", TINY, "--draft", DRAFT,
                           "--speculative"]}  # fmt: skip
    cfg = BenchConfig(
        target=TINY, draft=DRAFT, rows=3, positions=3, k=2, onehot=False, peak_tflops=1.0,
        arms=("command", "builtin", "builtin:plain"), engine_options={"command": command},
    )  # fmt: skip
    res = run_bench(cfg)
    assert [(a.arm, a.engine, a.mode) for a in res.arms] == [
        ("command", "command", "spec"), ("builtin", "builtin", "spec"),
        ("builtin:plain", "builtin", "plain"),
    ]  # fmt: skip
    assert res.baseline is not None and res.baseline.engine == "hf-generate"
    for a in (*res.arms, res.baseline):
        assert a.ratio_to_hf_generate == pytest.approx(a.rows_per_s / res.baseline.rows_per_s)
        assert a.mfu == pytest.approx(a.tokens_per_s * res.flops_per_token / 1e12)
    assert res.arms[0].mean_accepted is not None  # the program's rounds (a readout)
    assert res.provenance["engines"]["command"]["hello"]["protocol"] == "spectest-jsonl/1"
    path = write_records(res, tmp_path / "b.jsonl")
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r.get("baseline", False) for r in recs] == [False, False, False, True]
    with pytest.raises(ConfigError, match=r"--engine-options command.command: required"):
        run_bench(BenchConfig(target=TINY, draft=DRAFT, rows=1, positions=1, arms=("command",)))
