"""Sequential runs end to end on the analytic toy LM (``seeds.max_per_arm``): a blatant bug stops
at the first look, a correct sampler stops once the requested resolution is reached, a run that
cannot reach it ends inconclusive with the path of the evidence, and resume reuses every stage's
shards. Fixed seeds (the protocol's seed ranges and run key): every outcome is deterministic."""

from __future__ import annotations

from pathlib import Path

import pytest
from toy_protocol import TOY, write_toy

from spectest.errors import ConfigError
from spectest.protocol import load_protocol
from spectest.runner import RunOptions, run_protocol

FAST_TESTS = {"alpha": 0.05, "trie": {"depth": 1, "min_count": 50}, "null_permutations": 50}


def _run(tmp_path: Path, **sections):
    proto = write_toy(tmp_path, **{"teeth": {"null_arm": False}, **sections})
    return run_protocol(load_protocol(proto), out=tmp_path / "run", options=RunOptions(threads=1))


def test_a_protocol_without_max_per_arm_hashes_as_before(tmp_path: Path) -> None:
    p = load_protocol(write_toy(tmp_path))
    assert set(p.canonical()["seeds"]) == {"per_arm", "teeth_per_arm", "start", "key"}
    q = load_protocol(write_toy(tmp_path, "q.yaml", seeds={"per_arm": 200, "max_per_arm": 800}))
    assert q.canonical()["seeds"]["max_per_arm"] == 800 and q.hash != p.hash
    with pytest.raises(ConfigError, match=r"seeds\.max_per_arm"):
        load_protocol(write_toy(tmp_path, "r.yaml", seeds={"per_arm": 200, "max_per_arm": 100}))
    with pytest.raises(ConfigError, match=r"seeds\.spending"):
        load_protocol(
            write_toy(tmp_path, "s.yaml", seeds={"per_arm": 2, "max_per_arm": 4, "spending": "x"})
        )


def test_a_blatant_bug_stops_at_the_first_look(tmp_path: Path) -> None:
    """always_accept (TV ≈ 1 at position 0 here): rejected at the first look, at α/4, with 100
    of the 800 seeds per arm; no later stage is generated."""
    res = _run(
        tmp_path,
        candidate="always_accept",
        seeds={"per_arm": 100, "max_per_arm": 800},
        tests={**FAST_TESTS, "whitebox": False},
    )
    seq = res.summary["sequential"]
    assert [lk["decision"] for lk in seq["looks"]] == ["reject"]
    assert seq["seeds_used_per_arm"] == 100 and seq["stages"] == [100, 200, 400, 800]
    assert seq["looks"][0]["alpha"] == pytest.approx(0.05 / 4)
    assert res.verdict.exit_code == 1 and res.summary["seeds_per_arm"] == 100
    assert not list((tmp_path / "run").rglob("*stage1*"))


def test_a_correct_sampler_stops_once_the_resolution_is_reached(tmp_path: Path) -> None:
    """The exact sampler with max_mde_tv 0.3: the per-cell MDE shrinks as 1/√n while the sample
    doubles, so the run continues until it is ≤ 0.3 and stops resolved before the budget, with
    the equivalent verdict (a false alarm at some look has probability ≤ α = 0.05)."""
    res = _run(
        tmp_path,
        seeds={"per_arm": 100, "max_per_arm": 400},
        tests={**FAST_TESTS, "whitebox": False, "power": {"max_mde_tv": 0.3}},
    )
    seq = res.summary["sequential"]
    decisions = [lk["decision"] for lk in seq["looks"]]
    assert decisions[-1] == "resolved" and set(decisions[:-1]) <= {"continue"}, seq
    assert seq["seeds_used_per_arm"] < 400
    assert seq["looks"][-1]["mde_tv"] <= 0.3
    assert res.verdict.exit_code == 0, res.summary["verdict"]


def test_budget_spent_without_the_resolution_is_inconclusive_and_resumes(tmp_path: Path) -> None:
    """max_mde_tv 0.01 is out of reach at 200 seeds: both looks continue, the budget ends, exit 3
    with the resolution reached in the path. Re-running resumes every stage's shards."""
    sections = dict(
        seeds={"per_arm": 100, "max_per_arm": 200},
        tests={**FAST_TESTS, "whitebox": False, "power": {"max_mde_tv": 0.01}},
    )
    res = _run(tmp_path, **sections)
    seq = res.summary["sequential"]
    assert [lk["decision"] for lk in seq["looks"]] == ["continue", "budget"]
    assert seq["seeds_used_per_arm"] == 200 and seq["looks"][1]["mde_tv"] > 0.01
    assert res.verdict.exit_code == 3
    assert res.shards_generated == 8  # 2 prompts × 2 arms × 2 stages
    again = _run(tmp_path, **sections)
    assert again.shards_generated == 0 and again.shards_resumed == 8
    assert again.summary["sequential"] == seq
    assert TOY["seeds"] == {"per_arm": 200}  # the helper's protocol is untouched


def test_the_sequence_family_can_be_switched_off_without_moving_old_hashes(tmp_path: Path) -> None:

    on = load_protocol(write_toy(tmp_path))
    off = load_protocol(write_toy(tmp_path, "off.yaml", tests={**FAST_TESTS, "sequence": False}))
    same = load_protocol(write_toy(tmp_path, "on.yaml", tests={**FAST_TESTS, "sequence": True}))
    assert "sequence" not in on.canonical()["tests"]
    assert off.canonical()["tests"]["sequence"] is False
    assert on.tests.sequence and not off.tests.sequence
    assert same.hash == load_protocol(write_toy(tmp_path, "plain.yaml", tests=FAST_TESTS)).hash
    with pytest.raises(ConfigError, match=r"tests\.sequence"):
        load_protocol(write_toy(tmp_path, "bad.yaml", tests={**FAST_TESTS, "sequence": "yes"}))


def _report_texts(run_dir: Path) -> tuple[str, str]:
    from spectest.store import REPORT_HTML, REPORT_MD

    return (run_dir / REPORT_MD).read_text(), (run_dir / REPORT_HTML).read_text()


def test_without_a_protocol_resolution_the_looks_stop_at_the_verdicts_default(
    tmp_path: Path,
) -> None:
    """No ``max_mde_tv`` and no ε arm or mutant: the verdict requires the 0.15 default
    (``verdict.required_resolution``), so the looks must stop "resolved" as soon as the median
    per-cell MDE is ≤ 0.15 — here at 1 600 of 3 200 seeds per arm (MDE 0.29, 0.22, 0.15+,
    0.11 at 200, 400, 800, 1 600; deterministic: fixed seeds) — not run on to the budget. The
    look's requirement is the verdict's, and the reports show the path of the evidence."""
    res = _run(
        tmp_path,
        teeth={"null_arm": False, "epsilons": [], "mutants": []},
        seeds={"per_arm": 200, "max_per_arm": 3200},
        tests={**FAST_TESTS, "whitebox": False},
    )
    seq = res.summary["sequential"]
    looks = seq["looks"]
    assert [lk["decision"] for lk in looks] == ["continue"] * (len(looks) - 1) + ["resolved"]
    assert seq["seeds_used_per_arm"] < 3200 and looks[-1]["mde_tv"] <= 0.15 < looks[-2]["mde_tv"]
    assert {lk["required_mde_tv"] for lk in looks} == {0.15} == {res.verdict.max_mde_tv}
    assert all(lk["requirement"].startswith("default") for lk in looks)
    assert res.verdict.exit_code == 0, res.summary["verdict"]
    md, page = _report_texts(tmp_path / "run")
    assert "## Path of the evidence (sequential looks)" in md
    assert f"**{seq['seeds_used_per_arm']} of 3200 seeds per arm used**" in md
    assert "the resolution asked for was reached" in md and "≤ 0.15" in md
    for lk in looks:
        assert f"| {lk['stage'] + 1} | {lk['per_arm']} | {lk['alpha']:.4g} |" in md
    assert "Path of the evidence" in page and f"{seq['seeds_used_per_arm']} of 3200" in page


def test_a_gross_killed_tooth_does_not_waive_the_looks_requirement(tmp_path: Path) -> None:
    """Issue 19: an always_accept tooth (killed; its exact size on this toy is TV 1 per
    cell-position) shows power only against bugs that gross, so the looks ask for the verdict's
    0.15 like a run without teeth: the MDE (≈ 0.3 at 200 seeds) never gets there, the budget is
    spent, and the verdict is inconclusive (it used to be "no resolution required", exit 0)."""
    res = _run(
        tmp_path,
        teeth={"null_arm": False, "epsilons": [], "mutants": ["always_accept"]},
        seeds={"per_arm": 100, "max_per_arm": 200},
        tests={**FAST_TESTS, "whitebox": False},
    )
    looks = res.summary["sequential"]["looks"]
    assert [lk["decision"] for lk in looks] == ["continue", "budget"]
    assert {lk["required_mde_tv"] for lk in looks} == {0.15} == {res.verdict.max_mde_tv}
    assert all(lk["claim_tv"] == lk["mde_tv"] > 0.15 for lk in looks)
    assert res.verdict.exit_code == 3, res.summary["verdict"]
    assert res.summary["teeth"][0]["label"] == "killed (size 1)"
    md, _ = _report_texts(tmp_path / "run")
    assert "the seed budget was spent" in md and "≤ 0.15 (default)" in md
    assert "no resolution required" not in md


def test_a_killed_tooth_of_small_size_does_not_resolve_a_look(tmp_path: Path) -> None:
    """An ε = 0.5 tooth of exact size 0.0875 per cell-position (tooth_sizes.parquet), killed
    at the second look while the MDE is still ≈ 0.2: it used to resolve that look (claim 0.0875
    ≤ 0.15, exit 0). Issue 33: a killed tooth shows bugs of its own shape only, so the looks ask
    the MDE like the verdict does — each look's claim is its MDE, a look resolves only where
    the MDE meets 0.15, and the tooth is stated beside the claim ("bugs like ...")."""
    res = _run(
        tmp_path,
        teeth={"null_arm": False, "epsilons": [0.5], "mutants": []},
        seeds={"per_arm": 200, "max_per_arm": 800},
        tests={**FAST_TESTS, "whitebox": False},
    )
    looks = res.summary["sequential"]["looks"]
    assert looks[1]["mde_tv"] > 0.15 and looks[1]["decision"] != "resolved", looks
    for lk in looks:
        assert lk["claim_tv"] == lk["mde_tv"]
        assert (lk["decision"] == "resolved") == (lk["mde_tv"] <= 0.15), looks
    assert any("bugs like the killed tooth eps=0.5" in lk["claim"] for lk in looks), looks
    v = res.summary["verdict"]
    assert v["power_claim"]["source"] == "mde"
    assert res.verdict.exit_code == (0 if v["power_claim"]["tv"] <= 0.15 else 3), v


def test_the_console_prints_the_path_of_the_evidence(tmp_path: Path) -> None:
    """``spectest run`` on a sequential protocol: a blatant bug, stopped at the first look; the
    console says so with the seeds used and the looks, next to the verdict (exit 1)."""
    from typer.testing import CliRunner

    from spectest.cli import app

    proto = write_toy(
        tmp_path,
        candidate="always_accept",
        teeth={"null_arm": False},
        seeds={"per_arm": 100, "max_per_arm": 400},
        tests={**FAST_TESTS, "whitebox": False},
    )
    r = CliRunner().invoke(
        app, ["run", "--config", str(proto), "--out", str(tmp_path / "run"), "--no-progress"]
    )
    text = " ".join(r.stdout.split())
    assert r.exit_code == 1, r.output
    assert "Stopped after look 1 of 3 because the candidate was rejected" in text, text
    assert "100 of 400 seeds per arm used" in text and "looks: 100 → reject (MDE" in text
