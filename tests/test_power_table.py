"""The power-table benchmark's bookkeeping (``benchmarks/power_table.py``): the pool files dealt
to GPU workers, the analysis jobs dealt to CPU workers, the records cache a killed worker may
cut, and the report's arithmetic (kills per configuration, the doubling ratio, the H0 rates and
the arms that did not finish). Exact checks on hand-made records; the pools and analyses
themselves are exercised by the script's CPU dry run (results/LOG.md)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pt():
    spec = importlib.util.spec_from_file_location("power_table", ROOT / "benchmarks/power_table.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["power_table"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_pool_files_are_dealt_disjoint_complete_and_balanced(pt):
    """Two GPU workers: every (arm, prompt) file exactly once, each worker half of every arm (so
    the expensive speculative arms are shared evenly), in the arms' priority order, the H0
    pools last."""
    arms = list(pt.ARMS)
    shares = [pt.units("bundled", arms, 2, w) for w in range(2)]
    every = [u for s in shares for u in s]
    assert len(every) == len(set(every)) == len(arms) * pt.N_PROMPTS
    for s in shares:
        per_arm = {a: sum(1 for x, _ in s if x == a) for a in arms}
        assert set(per_arm.values()) == {pt.N_PROMPTS // 2}
        assert [a for a, _ in s] == sorted((a for a, _ in s), key=arms.index)
    assert pt.units("bundled", ["exact"], 1, 0) == [("exact", f"p{i}") for i in range(4)]
    # the big H0 pools come last for every worker, shared evenly too
    for w in range(2):
        share = pt.units("bundled", list(pt.ALL_ARMS), 2, w)
        assert [a for a, _ in share[-4:]] == ["h0_reference"] * 2 + ["h0_exact"] * 2
        assert share[:-4] == shares[w]


def test_jobs_are_rep_major_with_h0_spread_evenly(pt):
    """A cut run leaves every arm with about the same replications: rep r of every arm comes
    before rep r + 1 of any, and the 200 H0 replications are dealt 10 per rep."""
    jobs = pt.job_list(20, 200, True)
    assert len(jobs) == len(set(jobs)) == 200 + 14 * 20
    first = jobs[: 10 + 14]
    assert [a for a, _ in first[:10]] == ["H0"] * 10 and {r for _, r in first[10:]} == {0}
    reps = [r for a, r in jobs if a != "H0"]
    assert reps == sorted(reps)
    assert {r for a, r in jobs if a == "H0"} == set(range(200))
    assert pt.job_list(20, 200, False) == [j for j in jobs if j[0] != "H0"]
    assert sorted(pt.job_list(2, 7, True)) == sorted(
        [("H0", i) for i in range(7)] + [(a, r) for r in range(2) for a in pt.ARMS[2:]]
    )


def test_records_survive_a_cut_line_and_duplicates(pt, tmp_path):
    cache = tmp_path / "power_bundled"
    cache.mkdir()
    (cache / "w0.jsonl").write_text(
        json.dumps({"arm": "H0", "rep": 0, "x": 1}) + "\n" + '{"arm": "H0", "rep": 1, "x"'
    )
    (cache / "w1.jsonl").write_text(json.dumps({"arm": "H0", "rep": 0, "x": 2}) + "\n")
    recs = pt.read_records(cache)
    assert recs == [{"arm": "H0", "rep": 0, "x": 1}]
    assert pt.read_records(tmp_path / "absent") == []


def _rec(arm: str, rep: int, **p: float) -> dict:
    base = {"cells": 0.9, "trie": 0.9, "whitebox": 0.9, "sequence": 0.9, "lengths": float("nan")}
    return {"arm": arm, "rep": rep, "wall_s": 1.0, "perms": 200, **base, **p}


def test_report_counts_kills_ratio_h0_rates_and_what_did_not_finish(pt, tmp_path):
    """Two reps per arm (reps asked: 3). eps_biased:0.1 killed by the sequence family twice and
    by χ² once at p 0.03 (dead at α, alive at α/3); greedy_verify killed by everything; H0 with
    one sequence false alarm in 4. Every other arm has no record: listed as not finished."""
    cache = tmp_path / "power_bundled"
    cache.mkdir()
    recs = [
        _rec("eps_biased:0.1", 0, sequence=0.001, cells=0.03),
        _rec("eps_biased:0.1", 1, sequence=0.01),
        _rec("greedy_verify", 0, cells=0.0, trie=0.0, whitebox=0.0, sequence=0.005),
        _rec("greedy_verify", 1, cells=0.0, trie=0.0, whitebox=0.0, sequence=0.005),
        *[_rec("H0", i) for i in range(3)],
        {**_rec("H0", 3, sequence=0.04), "h0_scheme": "disjoint"},
    ]
    (cache / "w0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    md, js = tmp_path / "t.md", tmp_path / "t.json"
    args = argparse.Namespace(
        dir=str(tmp_path), pair="bundled", reps=3, per_arm=256, h0_reps=4, tag="",
        md=str(md), json=str(js),
    )  # fmt: skip
    pt.report(args)
    data = json.loads(js.read_text())
    t = data["totals"]
    assert t["chi2+BH alone"] == 3 and t["sequence alone"] == 4
    assert t["black-box + sequence"] == 4  # 0.001, 0.01 ≤ α/3; greedy 2
    assert data["doubling"]["all mutant arms"]["ratio sequence alone"] == pytest.approx(4 / 3)
    fa = data["false_alarms"]
    assert fa["sequence"]["k"] == 1 and fa["sequence"]["n"] == 4 and fa["cells"]["k"] == 0
    assert fa["config: black-box + sequence"]["k"] == 0  # 0.04 > α/3
    assert "lengths" not in fa  # never active
    assert not data["criterion_met"] and data["h0_reps_done"] == 4
    assert data["h0_schemes"] == {"resampled": 3, "disjoint": 1}
    assert "eps_biased:0.05" in data["missing_arms"]
    assert set(data["short_arms"]) == {"eps_biased:0.1 (2/3)", "greedy_verify (2/3)"}
    text = md.read_text()
    assert "**1.33×**" in text and "NOT MET" in text and "arms without any replication" in text
    assert "pools incomplete: reference" in text and "h0_exact" in text  # no pool on disk
    assert "1 on disjoint seeds of the H0 pools (independent), 3 resampled" in text
