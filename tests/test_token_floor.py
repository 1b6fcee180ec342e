"""Claim (b) from tokens alone (issue 31, ``spectest.stats.token_floor``): the margin's
conversion, the resampled U-statistic, the decision and its determinism."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_cli import ZIPF, byo, invoke

from spectest.stats.token_floor import _counts, _side, _u, _ustat, decide_token_floor, margin_sq


def test_squared_l2_is_at_most_twice_tv_squared_with_equality_for_a_two_token_move() -> None:
    rng = np.random.default_rng(0)
    for _ in range(2000):
        V = int(rng.integers(2, 40))
        p, q = rng.dirichlet(np.full(V, 0.3)), rng.dirichlet(np.full(V, 0.3))
        tv = 0.5 * np.abs(p - q).sum()
        assert ((p - q) ** 2).sum() <= margin_sq(tv) * (1 + 1e-12)
    p = np.array([0.5, 0.3, 0.2])
    q = p + np.array([0.01, -0.01, 0.0])  # TV 0.01 moved between two tokens
    assert ((p - q) ** 2).sum() == pytest.approx(margin_sq(0.01), rel=1e-9)


def test_resampled_ustat_leaves_out_pairs_of_copies_of_one_sequence() -> None:
    """Each sequence once: the sample's U-statistic exactly. With duplicates: the brute-force
    mean of the kernel over pairs of distinct ORIGINAL sequences (weighted by multiplicity)."""
    rng = np.random.default_rng(1)
    V, n, m, T = 5, 7, 6, 3
    x, y = rng.integers(0, V + 1, (n, T)), rng.integers(0, V + 1, (m, T))  # V = no token
    u0, _ = _ustat(_counts(x, V), _counts(y, V))
    u1, _ = _u(_side(x, np.arange(n)[None], V), _side(y, np.arange(m)[None], V))
    assert np.allclose(u1[0], u0)
    ix, iy = rng.integers(0, n, (1, n)), rng.integers(0, m, (1, m))
    u2, _ = _u(_side(x, ix, V), _side(y, iy, V))

    def same(a: np.ndarray, ia: np.ndarray, t: int) -> float:
        num = den = 0.0
        for i, j in itertools.product(ia, ia):
            if i != j and a[i, t] < V and a[j, t] < V:
                num, den = num + (a[i, t] == a[j, t]), den + 1
        return num / den

    for t in range(T):
        xs, ys = [x[i, t] for i in ix[0] if x[i, t] < V], [y[i, t] for i in iy[0] if y[i, t] < V]
        cross = np.mean([a == b for a in xs for b in ys])
        assert u2[0, t] == pytest.approx(same(x, ix[0], t) + same(y, iy[0], t) - 2 * cross)


def _frames(rng: np.random.Generator, cand_law: np.ndarray, n: int) -> list[pd.DataFrame]:
    return [byo(rng, law, range(k * n, (k + 1) * n), T=4)
            for k, law in enumerate((ZIPF, cand_law, ZIPF))]  # fmt: skip


@pytest.mark.parametrize(("mix", "decision"), [(0.0, "within"), (0.25, "beyond")])
def test_decision_within_for_one_law_beyond_for_a_shift(mix: float, decision: str) -> None:
    """Reference, candidate and floor B; floor A = the reference (resampled jointly). One law:
    true D = 0 ≤ 2m² (m = 0.05: 5e-3); the shifted candidate: Σ(p − q)² = 0.018 per unit,
    beyond 5e-3. Fixed seeds; the bounds are conservative near D = 0 (module Notes), so the
    first fails with probability < α = 0.05 for an arbitrary seed and the second far less
    (D ≈ 10 bootstrap sd's at 3000 sequences a file)."""
    rng = np.random.default_rng(7)
    other = np.roll(ZIPF, 1) * mix + ZIPF * (1 - mix)
    ref, cand, fb = _frames(rng, other, 3000)
    r = decide_token_floor(
        ref, cand, ref, fb, margin=0.05, alpha=0.05, rng=np.random.default_rng(0), resamples=300
    )
    assert r.decision == decision and r.rejected is (decision == "beyond")
    assert r.lcb < r.statistic < r.ucb and r.units == 8
    assert r.statistic == pytest.approx(r.drift - r.floor)
    again = decide_token_floor(
        ref, cand, ref, fb, margin=0.05, alpha=0.05, rng=np.random.default_rng(0), resamples=300
    )
    assert again == r and decision.replace("beyond", "drift beyond") in r.line


def test_no_shared_unit_or_one_sequence_is_unresolved() -> None:
    rng = np.random.default_rng(2)
    ref, cand, fb = _frames(rng, ZIPF, 1)
    r = decide_token_floor(ref, cand, ref, fb, margin=0.01, alpha=0.05,
                           rng=np.random.default_rng(0), resamples=50)  # fmt: skip
    assert r.decision == "unresolved" and r.units == 0


def _files(tmp_path: Path, mix: float, n: int) -> dict[str, Path]:
    rng = np.random.default_rng(20261202)
    other = np.roll(ZIPF, 1) * mix + ZIPF * (1 - mix)
    files = {}
    for name, law, lo in (("ref", ZIPF, 0), ("cand", other, n), ("b", ZIPF, 2 * n)):
        files[name] = tmp_path / f"{name}.parquet"
        byo(rng, law, range(lo, lo + n)).to_parquet(files[name], index=False)
    return files


def test_cli_compare_decide_floor_decides(tmp_path: Path) -> None:
    """``--decide-floor`` with floor A = the reference file: a candidate at Σ(p − q)² = 0.018
    per unit is beyond 2·0.05² (exit 1, both claims stated); without ``--decide-floor`` the
    readout is printed instead. Fixed seeds; for arbitrary seeds the decision misses with
    probability far below α (D ≈ 5 bootstrap sd's at 800 sequences a file)."""
    f = _files(tmp_path, 0.25, 800)
    base = ["compare", "--reference", f["ref"], "--candidate", f["cand"], "--max-mde-tv", "1",
            "--no-progress", "--floor", f["ref"], f["b"]]  # fmt: skip
    plain = invoke(*base, "--out", tmp_path / "o1")
    r = invoke(*base, "--out", tmp_path / "o2", "--decide-floor", "--floor-margin", "0.05")
    assert "not a verdict" in plain.stdout, plain.output
    assert r.exit_code == 1 and "drift beyond numerics (claim b)" in r.stdout, r.output
    stored = json.loads((tmp_path / "o2" / "summary.json").read_text())
    assert stored["verdict"]["numerics"]["decision"] == "beyond"
    assert "token_drift" not in stored and "(claim b, tokens only)" in r.stdout
    assert "(claim a) — against plain decode" in r.stdout


def test_cli_decide_floor_needs_floor_exit_2(tmp_path: Path) -> None:
    f = _files(tmp_path, 0.0, 50)
    base = ["compare", "--reference", f["ref"], "--candidate", f["cand"], "--no-progress"]
    r = invoke(*base, "--decide-floor")
    assert r.exit_code == 2 and "--decide-floor: needs --floor A B" in r.output
    r = invoke(*base, "--floor", f["ref"], f["b"], "--floor-margin", "0.01")
    assert r.exit_code == 2 and "--floor-margin: only with --decide-floor" in r.output
