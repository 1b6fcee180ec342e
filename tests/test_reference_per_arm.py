"""``seeds.reference_per_arm``: a larger plain reference arm, shared by every comparison.

Checked: a protocol without the field hashes as before (and the shipped v1 hashes stay pinned in
tests/test_engine_seam.py); the field changes the hash, is validated with the file and field
named, and is set from the CLI by ``--set seeds.reference_per_arm=...``; the plan gives the
reference its size and every other arm its own, disjoint ranges; a run on the toy LM stores
unequal arms and its analysis (every family) passes a correct sampler and kills the teeth; the
sizing helpers of ``stats.power``. Deterministic (fixed seeds: the protocol's key).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from toy_protocol import write_toy

from spectest import schema
from spectest.errors import ConfigError
from spectest.plan import make_plan
from spectest.protocol import load_protocol
from spectest.runner import RunOptions, run_protocol
from spectest.stats import power


def test_absent_field_keeps_the_hash_and_set_field_changes_it(tmp_path: Path) -> None:
    p = load_protocol(write_toy(tmp_path))
    assert "reference_per_arm" not in p.canonical()["seeds"]
    assert p.seeds.reference == p.seeds.per_arm == 200
    q = load_protocol(
        write_toy(tmp_path, "q.yaml", seeds={"per_arm": 200, "reference_per_arm": 800})
    )
    assert q.seeds.reference == 800 and q.hash != p.hash
    assert q.canonical()["seeds"]["reference_per_arm"] == 800
    r = load_protocol(write_toy(tmp_path), sets=["seeds.reference_per_arm=800"])
    assert r.hash == q.hash
    with pytest.raises(ConfigError, match=r"toy\.yaml: seeds\.reference_per_arm: .*got 1"):
        load_protocol(write_toy(tmp_path), sets=["seeds.reference_per_arm=1"])
    with pytest.raises(ConfigError, match=r"seeds\.reference_per_arm: 800 cannot be combined"):
        load_protocol(
            write_toy(
                tmp_path,
                "s.yaml",
                seeds={"per_arm": 100, "max_per_arm": 400, "reference_per_arm": 800},
            )
        )


def test_plan_sizes_and_disjoint_ranges(tmp_path: Path) -> None:
    p = load_protocol(
        write_toy(tmp_path, seeds={"per_arm": 100, "teeth_per_arm": 50, "reference_per_arm": 400})
    )
    arms = {a.name: a for a in make_plan(p).arms}
    sizes = {n: a.seeds.stop - a.seeds.start for n, a in arms.items()}
    assert sizes == {
        "reference": 400, "candidate": 100, "null": 50, "eps=0.5": 50, "mutant:always_accept": 50
    }  # fmt: skip
    teeth_only = {a.name: a.seeds for a in make_plan(p, teeth_only=True).arms}
    assert all(teeth_only[n] == arms[n].seeds for n in teeth_only)


def test_run_with_a_larger_reference(tmp_path: Path) -> None:
    """Toy protocol, 100 candidate / 400 reference seeds: stored arm sizes are unequal, the
    exact candidate is not rejected (a false alarm has probability ≤ α = 0.05 for this fixed
    seed), the teeth are killed and the null passes; the testability counts the candidate."""
    proto = write_toy(
        tmp_path,
        seeds={"per_arm": 100, "reference_per_arm": 400},
        tests={"alpha": 0.05, "trie": {"depth": 1, "min_count": 50}, "null_permutations": 50},
    )
    res = run_protocol(load_protocol(proto), out=tmp_path / "run", options=RunOptions(threads=1))
    s = pd.read_parquet(tmp_path / "run" / "samples.parquet")
    rows = s.groupby(schema.ARM).size() / (2 * 2 * 4)  # prompts × configs × positions
    assert rows["reference"] == 400 and rows["candidate"] == 100 and rows["null"] == 100
    assert not res.verdict.candidate.rejected, res.summary["verdict"]
    teeth = {t.arm: t for t in res.verdict.teeth}
    assert all(t.sound for t in teeth.values()), teeth
    cand = res.summary["details"]["candidate"]
    assert cand["seeds_per_arm_observed"] == pytest.approx(100)


def test_cli_set_reaches_the_plan(tmp_path: Path) -> None:
    """``spectest run --set seeds.reference_per_arm=...`` through a real subprocess."""
    proto = write_toy(tmp_path, seeds={"per_arm": 40}, teeth={"null_arm": False})
    out = tmp_path / "run"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "spectest",
            "run",
            "--config",
            str(proto),
            "--out",
            str(out),
            "--set",
            "seeds.reference_per_arm=120",
            "--set",
            "tests.whitebox=false",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode in (0, 3), r.stdout + r.stderr
    s = pd.read_parquet(out / "samples.parquet")
    assert (s.groupby(schema.ARM).size() / 16).to_dict()["reference"] == 120


def test_sizing_helpers() -> None:
    assert power.reference_multiplier_for(1.10) == 5
    assert power.reference_multiplier_for(1.12) == 4
    one = power.directed_z_mde(8000, 0.4)
    assert power.directed_z_2s_mde(8000, 0.4, 1) == pytest.approx(one * 2**0.5)
    assert power.directed_z_2s_mde(8000, 0.4, 4) == pytest.approx(one * 1.25**0.5)
    with pytest.raises(ConfigError, match="mde_ratio must be > 1"):
        power.reference_multiplier_for(1.0)


def test_token_only_engine_in_teacher_mode_with_a_larger_reference(tmp_path: Path) -> None:
    """protocols/command-example.yaml (an external program over spectest-jsonl/1, bundled pair,
    float32) with white-box on, 100 seeds and a 4 × reference: a token-only engine is
    teacher-forced by the runner in teacher mode whatever the dtype; the reference's control
    passes, the candidate's and the null's two-sample tests do not reject, always_accept's do.
    Fixed seeds (the protocol's key); false-failure rate ≤ α = 0.05 per comparison. 100 seeds
    resolve per-cell TV 0.28 (the gross tooth claims less), so the test states its requirement
    (0.3) instead of the 0.15 default: it is about teacher mode, not power."""
    from spectest.plan import whitebox_mode

    proto = load_protocol(
        "protocols/command-example.yaml",
        overrides={"seeds.per_arm": 100},
        sets=["seeds.reference_per_arm=400", "tests.whitebox=true", "tests.power.max_mde_tv=0.3"],
    )
    assert whitebox_mode("float32", make_plan(proto).arms) == "teacher"
    res = run_protocol(proto, out=tmp_path / "run")
    wb = pd.read_parquet(tmp_path / "run" / "whitebox.parquet")
    assert set(wb.loc[wb["arm"] == "reference", "test"]) == {"support_tol", "pit_tol"}
    for arm, d in res.summary["details"].items():
        assert d["whitebox_mode"] == "teacher" and not d["whitebox_control_failed"], arm
        # the sizing note advises analyze.REFERENCE_MULTIPLIER = 16 x, above this run's 4 x
        assert any("reference 4 x the candidate; seeds.reference_per_arm = 16 x" in n
                   for n in d["notes"]), d["notes"]  # fmt: skip
    two = wb[wb["test"].str.endswith("_2s")].set_index(["arm", "test"])["pvalue"]
    assert (two["mutant:always_accept"] < 0.01).all()
    assert res.verdict.exit_code == 0, res.summary["verdict"]


def test_lengths_family_with_a_4x_reference() -> None:
    """The sequence-length family with unequal arms: both arms stop with probability 0.15 after
    each position (T = 8), 150 candidate and 600 reference sequences, 600 H0 replications at
    α = 0.05: the rejection rate lies within 3σ (±0.027) of α (false-failure rate ≈ 0.003;
    fixed seed)."""
    import numpy as np
    from test_stats_lengths import frame

    from spectest.stats.histograms import encode_samples
    from spectest.stats.lengths import adjust, is_active, length_tests

    rng = np.random.default_rng(20261201)
    T, n, reps = 8, 150, 600
    rejected = 0
    for _ in range(reps):
        parts = []
        for arm, k, seed0 in (("reference", 4 * n, 0), ("candidate", n, 4 * n)):
            ln = np.minimum(rng.geometric(0.15, size=k), T)
            parts.append(frame(rng, arm, k, T, lengths=ln, seed0=seed0))
        enc = encode_samples(pd.concat(parts, ignore_index=True), ("reference", "candidate"))
        df = length_tests(enc)
        assert is_active(df) and int(df["n_ref"].iloc[0]) == 4 * n
        rejected += int(adjust(df, 0.05)["reject"].iloc[0])
    rate = rejected / reps
    print(f"\nlengths family, 4x reference: H0 rejection rate {rate:.4f}")
    assert abs(rate - 0.05) < 3 * np.sqrt(0.05 * 0.95 / reps), rate
