"""End to end on the analytic toy LM: ``spectest run`` in a real subprocess (exit 0 for the exact
sampler, 1 for a mutant candidate, 3 for a tooth too weak to bite), the files it leaves, and
resume after an interruption giving exactly the result of an uninterrupted run.

Every run uses fixed seeds (the protocol's seed ranges and run key), so each outcome below is
deterministic; the stated false-failure rates are those of an arbitrary seed choice.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from toy_protocol import write_toy
from typer.testing import CliRunner

from spectest.cli import app
from spectest.errors import InputError
from spectest.files import read_provenance
from spectest.store import HISTOGRAMS, MANIFEST, SAMPLES, TESTS
from spectest.stored import load_run

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "SPECTEST_NO_PROGRESS": "1"}


def spectest(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", "from spectest.cli import main; main()", *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def exact_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The exact sampler at α = 0.01. An arbitrary seed choice gives a non-zero exit with
    probability ≲ 0.01 (candidate) + 0.01 (null) + 0.01/3 (white-box control) ≈ 2.5 %; the
    always-accept and ε = 0.5 teeth are killed with probability ≈ 1 at 200 seeds per arm."""
    d = tmp_path_factory.mktemp("exact")
    proto = write_toy(d)
    res = spectest(
        "run", "--config", proto, "--out", d / "run", "--set", "tests.alpha=0.01",
        "--junit", d / "junit.xml", "--summary-md", d / "summary.md", cwd=d,
    )  # fmt: skip
    return d, res


def test_exact_sampler_exits_0_and_stores_everything(exact_run) -> None:
    d, res = exact_run
    assert res.returncode == 0, res.stdout + res.stderr
    assert "EQUIVALENT (exit 0)" in res.stdout
    run = d / "run"
    stored = load_run(run)
    for name in (
        SAMPLES,
        HISTOGRAMS,
        TESTS,
        "rounds.parquet",
        "tooth_sizes.parquet",
        "summary.json",
        "report.md",
        "report.html",
    ):
        assert name in stored.manifest["files"], name
    samples = stored.table(SAMPLES)
    # 5 arms × 2 prompts × 2 configs × 200 seeds × 4 positions, no duplicate, white-box columns
    assert len(samples) == 5 * 2 * 2 * 200 * 4
    assert not samples.duplicated(["arm", "prompt_id", "config_id", "seed", "position"]).any()
    assert "wb_p" in samples.columns
    seeds = samples.groupby("arm")["seed"].agg(["min", "max"])
    spans = sorted(zip(seeds["min"], seeds["max"], strict=True))
    assert all(a[1] < b[0] for a, b in itertools.pairwise(spans)), spans  # disjoint
    prov = read_provenance(run / SAMPLES)
    assert prov["protocol_hash"] == stored.info["protocol_hash"] and prov["packages"]["torch"]
    assert set(prov["seed_ranges"]) == {
        "reference",
        "candidate",
        "null",
        "eps=0.5",
        "mutant:always_accept",
    }
    # the sequence-level family's decisions (pooled rows) and diagnostics (per cell), every arm
    seq = stored.table("sequence.parquet")
    assert seq is not None and set(seq["comparison"]) == {
        "candidate",
        "null",
        "eps=0.5",
        "mutant:always_accept",
    }
    pooled = seq[(seq["scope"] == "pooled") & (seq["comparison"] == "candidate")]
    assert len(pooled) and not pooled["reject"].any() and pooled["mde"].notna().any()
    s = stored.summary
    assert s["verdict"]["decision"] == "equivalent"
    assert [t["label"] for t in s["teeth"]] == [
        "passed (sound)", "killed (size 0.0875)", "killed (size 1)",
    ]  # fmt: skip
    # the teeth's exact sizes (tooth_sizes.parquet): the claim is the MDE, the weakest killed
    # tooth below it is stated beside it (issue 33: an example of its shape, never the claim)
    assert s["verdict"]["power_claim"] == {
        "tv": s["verdict"]["mde_tv"], "source": "mde", "tooth": "eps=0.5", "exact": True,
        "tooth_tv": s["teeth"][1]["size_tv"],
    }  # fmt: skip
    assert "data:image/png;base64," in (run / "report.html").read_text()
    suite = ET.parse(d / "junit.xml").getroot()
    # 2 configs + 3 teeth + the verdict's scope case
    assert suite.get("tests") == "6" and suite.get("failures") == "0"
    assert "equivalent" in (d / "summary.md").read_text()


def test_analyze_and_teeth_commands_on_the_same_protocol(exact_run) -> None:
    d, _ = exact_run
    r = CliRunner().invoke(
        app, ["analyze", str(d / "run"), "--no-progress"], catch_exceptions=False
    )
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(
        app,
        ["teeth", "--config", str(d / "toy.yaml"), "--out", str(d / "teeth"), "--no-progress"],
        catch_exceptions=False,
    )
    assert r.exit_code == 0 and "SOUND" in r.stdout, r.output
    teeth_samples = load_run(d / "teeth").table(SAMPLES)
    run_samples = load_run(d / "run").table(SAMPLES)
    assert "candidate" not in set(teeth_samples["arm"])
    # the teeth-only plan gives each arm the seeds (hence the samples) of the full plan
    cols = ["arm", "prompt_id", "config_id", "seed", "position", "token_id"]
    pd.testing.assert_frame_equal(
        teeth_samples[cols].reset_index(drop=True),
        run_samples[run_samples["arm"] != "candidate"][cols].reset_index(drop=True),
    )


def test_mutant_candidate_exits_1(tmp_path: Path) -> None:
    """always_accept: acceptance 1 and TV ≈ 1 at position 0 here, rejected with probability ≈ 1."""
    proto = write_toy(tmp_path, teeth={"null_arm": False}, candidate="always_accept")
    res = spectest("run", "--config", proto, "--out", tmp_path / "run", cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "DIFFERENT (exit 1)" in res.stdout
    failing = res.stdout.split("failing (candidate vs reference")[1]
    assert "p1/a@0 " in failing and "p1/b@0 " in failing and "white-box support" in failing, (
        res.stdout
    )
    assert load_run(tmp_path / "run").summary["verdict"]["exit_code"] == 1


def test_tooth_too_weak_exits_3(tmp_path: Path) -> None:
    """ε = 0.01 moves TV by ~0.001, far below the MDE (~0.27) at 200 seeds: it is killed only by
    a false alarm (probability ≲ α = 0.05), so the run is inconclusive."""
    proto = write_toy(tmp_path, teeth={"null_arm": True, "epsilons": [0.01]})
    res = spectest("run", "--config", proto, "--out", tmp_path / "run", cwd=tmp_path)
    assert res.returncode == 3, res.stdout + res.stderr
    assert "INCONCLUSIVE (exit 3)" in res.stdout and "'eps=0.01' was not killed" in res.stdout


def test_resume_after_interruption_is_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupt a run after 3 of its 10 shards, resume it, and compare with an uninterrupted run:
    same samples (none lost, none duplicated), same histograms, same tests."""
    from spectest import generation, runner
    from spectest.protocol import load_protocol

    proto = load_protocol(
        write_toy(
            tmp_path,
            tests={"alpha": 0.05, "trie": {"depth": 1, "min_count": 100}, "null_permutations": 50},
        )
    )
    real = generation.generate_shard
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt  # as a Ctrl-C in the middle of the run
        return real(*args, **kwargs)

    monkeypatch.setattr(generation, "generate_shard", flaky)
    with pytest.raises(KeyboardInterrupt):
        runner.run_protocol(proto, out=tmp_path / "resumed")
    assert not (tmp_path / "resumed" / MANIFEST).exists()
    with pytest.raises(InputError, match="incomplete"):
        load_run(tmp_path / "resumed")
    assert len(list((tmp_path / "resumed" / "shards").glob("*.samples.parquet"))) == 3
    monkeypatch.setattr(generation, "generate_shard", real)

    resumed = runner.run_protocol(proto, out=tmp_path / "resumed")
    assert (resumed.shards_resumed, resumed.shards_generated) == (3, 7)
    whole = runner.run_protocol(proto, out=tmp_path / "whole")
    assert (whole.shards_resumed, whole.shards_generated) == (0, 10)
    for name in (SAMPLES, HISTOGRAMS, TESTS):
        a = pq.read_table(tmp_path / "resumed" / name).to_pandas()
        b = pq.read_table(tmp_path / "whole" / name).to_pandas()
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert resumed.verdict == whole.verdict
    # re-running a complete run regenerates nothing and reproduces the stored result
    again = runner.run_protocol(proto, out=tmp_path / "whole")
    assert (again.shards_resumed, again.shards_generated) == (10, 0)
    assert (
        json.loads((tmp_path / "whole" / "summary.json").read_text())["verdict"]
        == whole.summary["verdict"]
    )


def test_other_protocol_into_same_dir_exits_2(tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"kind": "run", "protocol_hash": "0" * 64}))
    proto = write_toy(tmp_path)
    r = CliRunner().invoke(
        app,
        ["run", "--config", str(proto), "--out", str(d), "--no-progress"],
        catch_exceptions=False,
    )
    assert r.exit_code == 2, r.output
    assert "holds a 'run' run of protocol hash '000000000000'" in r.stderr
