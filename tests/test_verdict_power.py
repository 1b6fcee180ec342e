"""Issue 19, list 1: the resolution requirement always applies. Each situation the issue found
EQUIVALENT (exit 0) for a wrong sampler or for nothing tested, replayed with its exact input on
the shipped CI protocol (``spectest run`` in-process, Typer's CliRunner, so the bundled pair
loads once): none may end exit 0. A killed gross tooth (always_accept, exact size 0.97 per
cell-position here) shows power only against bugs that large, so it no longer waives the
requirement. Deterministic: fixed seeds, fixed run key."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from spectest.cli import app
from spectest.store import TOOTH_SIZES
from spectest.stored import load_run

ROOT = Path(__file__).resolve().parents[1]
CI = str(ROOT / "protocols" / "ci.yaml")
runner = CliRunner()


def run(tmp_path: Path, *args: str) -> tuple[int, str, dict]:
    out = tmp_path / "run"
    r = runner.invoke(
        app, ["run", "--config", CI, *args, "--out", str(out), "--no-progress"],
        catch_exceptions=False,
    )  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    return r.exit_code, r.output, summary


@pytest.mark.parametrize("seeds", ["2", "5", "10"])
def test_low_seeds_are_inconclusive(tmp_path: Path, seeds: str) -> None:
    """`spectest run --config protocols/ci.yaml --seeds 2` (also 5, 10): 0 of 4 cell-positions
    tested, so the MDE is unknown; the killed always_accept tooth has exact size 0.969 > 0.15
    (or was not killed at all): exit 3, never "a per-cell TV of ? or more"."""
    code, out, s = run(tmp_path, "--seeds", seeds)
    assert code == 3, out
    assert "EQUIVALENT" not in out and "TV of ?" not in out
    v = s["verdict"]
    assert v["exit_code"] == 3 and v["scope"]["cells_tested"] == 0
    assert "no resolution required" not in out
    assert v["scope"]["required_mde_tv"] == 0.15


def test_low_seeds_with_a_wrong_candidate(tmp_path: Path) -> None:
    """`--seeds 5 --set candidate=residual_from_p`: 0 cells tested, never exit 0. Since the
    white-box tests by token role (issue 22) the recovered-token PIT sees this bug even at 5
    seeds (exit 1, a valid rejection); without it, exit 3 (nothing testable at the power asked)."""
    code, out, s = run(tmp_path, "--seeds", "5", "--set", "candidate=residual_from_p")
    assert code in (1, 3), out
    assert s["verdict"]["scope"]["cells_tested"] == 0
    if code == 1:
        assert "role_pit_recovered" in out, out


@pytest.mark.parametrize("candidate", ["swapped_filter_order", "reuse_accept_uniform"])
def test_twenty_seeds_with_a_wrong_candidate(tmp_path: Path, candidate: str) -> None:
    """`--seeds 20` with swapped_filter_order / reuse_accept_uniform: MDE 0.586 per cell; the
    gross tooth's size (0.969) claims no better: not exit 0 (3: the power claim is 0.586)."""
    code, out, s = run(tmp_path, "--seeds", "20", "--set", f"candidate={candidate}")
    assert code != 0, out
    v = s["verdict"]
    if code == 3:
        assert v["power_claim"]["source"] == "mde" and v["power_claim"]["tv"] > 0.5
        assert "worse than the required 0.15" in v["headline"]
    else:
        assert code == 1, out


def test_one_position_with_a_wrong_candidate(tmp_path: Path) -> None:
    """`--seeds 20 --positions 1` with residual_from_p: the tooth's size is then position 0's
    only (0.856 here): still far above 0.15 → not exit 0."""
    code, out, s = run(
        tmp_path, "--seeds", "20", "--positions", "1", "--set", "candidate=residual_from_p"
    )
    assert code in (1, 3), out
    sizes = pd.read_parquet(tmp_path / "run" / TOOTH_SIZES)
    assert sizes["position"].tolist() == [0]
    tooth = next(t for t in s["teeth"] if t["arm"] == "mutant:always_accept")
    assert tooth["size_tv"] == pytest.approx(float(sizes["tv"].iloc[0])) and tooth["size_tv"] > 0.5


@pytest.mark.parametrize("candidate", ["exact", "residual_from_p"])
def test_whitebox_sequence_and_trie_off_at_twenty_seeds(tmp_path: Path, candidate: str) -> None:
    """White-box, sequence and trie off at 20 seeds: only the per-cell χ² runs, at MDE ≈ 0.59;
    the killed gross tooth no longer waives the requirement."""
    code, out, s = run(
        tmp_path, "--seeds", "20", "--set", "tests.whitebox=false",
        "--set", "tests.sequence=false", "--set", "tests.trie.depth=0",
        "--set", f"candidate={candidate}",
    )  # fmt: skip
    assert code == 3, out
    assert s["verdict"]["power_claim"]["tv"] > 0.15


def test_a_tiny_alpha_with_a_wrong_candidate(tmp_path: Path) -> None:
    """`--set tests.alpha=1.0e-12 --set candidate=residual_from_p` (the protocol's seeds): at
    α 1e-12 the MDE is far above 0.15, so "no difference" is not a claim: exit 3 (or 1 if the
    bug is seen even so)."""
    code, out, s = run(
        tmp_path, "--set", "tests.alpha=1.0e-12", "--set", "candidate=residual_from_p"
    )
    assert code in (1, 3), out
    if code == 3:
        assert s["verdict"]["power_claim"]["tv"] > 0.15


@pytest.mark.parametrize("candidate", ["exact", "residual_from_p"])
def test_a_temperature_of_1e_300(tmp_path: Path, candidate: str) -> None:
    """`--set configs.t0.8-k20-p0.95.temperature=1.0e-300`: the law is one token (the argmax),
    so no cell-position is testable (one bin) and residual_from_p equals the exact sampler
    there; the gross tooth's exact size is 1: exit 3 for both, never "equivalent"."""
    code, out, s = run(
        tmp_path, "--seeds", "50", "--set", "configs.t0.8-k20-p0.95.temperature=1.0e-300",
        "--set", f"candidate={candidate}",
    )  # fmt: skip
    assert code == 3, out
    v = s["verdict"]
    assert v["scope"]["cells_tested"] == 0
    assert v["power_claim"] == {
        "tv": None, "source": "none", "tooth": "mutant:always_accept", "exact": True,
        "tooth_tv": 1.0,
    }  # fmt: skip


def test_one_killed_tooth_does_not_lend_its_size_to_another_bug(tmp_path: Path) -> None:
    """Issue 33, item 3: at 20 seeds the killed residual_from_p (size 0.126) made
    reuse_accept_uniform — a bug of another shape, DIFFERENT at the protocol's 800 seeds — exit
    0 ("... as the killed tooth mutant:residual_from_p shows") while the per-cell MDE was 0.586.
    The claim is the MDE now; the tooth is stated as what it shows: bugs of its own shape."""
    code, out, s = run(
        tmp_path, "--seeds", "20", "--set", "teeth.mutants=[residual_from_p]",
        "--set", "candidate=reuse_accept_uniform",
    )  # fmt: skip
    assert code != 0, out
    v = s["verdict"]
    assert v["exit_code"] == code and "EQUIVALENT" not in out
    if code == 3:
        assert v["power_claim"]["source"] == "mde" and v["power_claim"]["tv"] > 0.5
        killed = [t for t in s["teeth"] if t["label"].startswith("killed")]
        if any(t["arm"] == v["power_claim"]["tooth"] for t in killed):
            assert "shows only bugs of its own shape" in " ".join(v["reasons"])


def test_a_requirement_of_one_with_nothing_tested_is_no_power_claim(tmp_path: Path) -> None:
    """Issue 33, item 3: `tests.power.max_mde_tv: 1.0` at 5 seeds (0 cell-positions tested; the
    gross tooth, size 0.969, killed by the white-box family) was exit 0 "as documented". With
    no cell-position tested there is no power claim: exit 3, whatever the requirement."""
    code, out, s = run(tmp_path, "--seeds", "5", "--set", "tests.power.max_mde_tv=1.0")
    assert code == 3, out
    v = s["verdict"]
    assert v["scope"]["cells_tested"] == 0 and v["power_claim"]["tv"] is None
    assert "EQUIVALENT" not in out


def test_the_stored_sizes_decide_analyze_the_same_way(tmp_path: Path) -> None:
    """The sizes live in the run directory (tooth_sizes.parquet, in the manifest), so `spectest
    analyze` (no models) recomputes the same verdict and the same teeth labels; every renderer
    (console, summary.json, report.md / report.html, JUnit, --summary-md) shows the size next to
    "killed"."""
    junit, md = tmp_path / "j.xml", tmp_path / "s.md"
    code, out, s = run(tmp_path, "--seeds", "20", "--junit", str(junit), "--summary-md", str(md))
    assert code == 3
    label = "killed (size 0.969)"
    assert label in out and s["teeth"][1]["label"] == label
    assert (
        s["teeth"][1]["size_tv"] == pytest.approx(0.9689, abs=1e-4) and s["teeth"][1]["size_exact"]
    )
    for f in (tmp_path / "run" / "report.md", tmp_path / "run" / "report.html", junit, md):
        assert label in f.read_text(), f
    assert 'name="size_tv"' in junit.read_text()
    claim = s["verdict"]["power_claim"]["tv"]
    assert f'name="power_claim_tv" value="{claim}"' in junit.read_text()
    stored = load_run(tmp_path / "run")
    assert TOOTH_SIZES in stored.manifest["files"]
    r = runner.invoke(app, ["analyze", str(tmp_path / "run")], catch_exceptions=False)
    assert r.exit_code == 3, r.output
    head = s["verdict"]["headline"]
    assert head in r.output and "killed (size 0.969)" in r.output


def test_a_tooth_killed_by_the_support_check_says_why_it_claims_nothing(tmp_path: Path) -> None:
    """Issue 34, item 1: swapped_filter_order is killed by the support check alone (it emits
    tokens of target probability 0), so its size (≈ 0.02) claims nothing; the console, report.md,
    report.html and JUnit printed "killed (size 0.0261)" beside a headline claiming more, and
    only summary.json's ``support_violation`` said why. The label says it where it is printed."""
    junit = tmp_path / "j.xml"
    _, out, s = run(
        tmp_path, "--seeds", "200", "--set", "teeth.mutants=[swapped_filter_order]",
        "--junit", str(junit),
    )  # fmt: skip
    tooth = next(t for t in s["teeth"] if t["arm"] == "mutant:swapped_filter_order")
    assert tooth["label"].startswith("killed (size "), tooth
    why = "by the support check only: a token of target probability 0, so it claims no power"
    assert why in tooth["label"]
    assert s["verdict"]["power_claim"]["tooth"] != "mutant:swapped_filter_order"
    flat = " ".join(out.replace("│", " ").split())  # the console table wraps the label
    assert why in flat, out
    for f in (tmp_path / "run" / "report.md", tmp_path / "run" / "report.html", junit):
        assert why in f.read_text(), f
