"""``spectest compare --floor A B``: the token-only drift readout (issue 21, claim (b) for
black-box users, ``spectest.stats.token_floor.token_drift``)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_cli import ZIPF, byo, invoke

from spectest.stats.token_floor import _counts, _ustat, pair_distance, token_drift


def test_ustat_by_hand_and_unbiased_exactly() -> None:
    """By hand on fixed counts, and E[U] = Σ_v (p − q)² exactly over every outcome of n = 2,
    m = 3 draws (enumerated with their probabilities)."""
    cx, cy = np.array([[3.0, 1.0, 0.0]]), np.array([[1.0, 1.0, 2.0]])
    u, ok = _ustat(cx, cy)
    want = (3 * 2) / (4 * 3) + (2 * 1) / (4 * 3) - 2 * (3 * 1 + 1 * 1) / 16
    assert ok.tolist() == [True] and u[0] == pytest.approx(want)
    p, q = np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.5, 0.3])
    mean = 0.0
    for xs in itertools.product(range(3), repeat=2):
        for ys in itertools.product(range(3), repeat=3):
            w = np.prod(p[list(xs)]) * np.prod(q[list(ys)])
            ux, _ = _ustat(np.bincount(xs, minlength=3)[None] * 1.0,
                           np.bincount(ys, minlength=3)[None] * 1.0)  # fmt: skip
            mean += w * ux[0]
    assert mean == pytest.approx(((p - q) ** 2).sum(), abs=1e-12)


def test_counts_drop_missing_tokens() -> None:
    codes = np.array([[0, 2], [1, 2], [0, 1]])  # V = 2: code 2 = no token there
    c = _counts(codes, 2)
    assert c.tolist() == [[2.0, 1.0], [0.0, 1.0]]
    _, ok = _ustat(c, c)
    assert ok.tolist() == [True, False]  # position 1 holds one token only


def test_distance_is_zero_in_expectation_and_bootstrap_is_seeded() -> None:
    rng = np.random.default_rng(3)
    a, b = byo(rng, ZIPF, range(300)), byo(rng, ZIPF, range(300, 600))
    d1, boot1, units, seqs = pair_distance(a, b, np.random.default_rng(5), 50)
    d2, boot2, _, _ = pair_distance(a, b, np.random.default_rng(5), 50)
    assert units == 6 and seqs == 1200 and d1 == d2 and (boot1 == boot2).all()
    assert abs(d1) < 0.01  # se of a unit's U at n = 300: ~0.003; 6 units pooled


@pytest.mark.parametrize(("shifted", "shown"), [(True, True), (False, False)])
def test_readout_shows_an_excess_only_beyond_the_floor(shifted: bool, shown: bool) -> None:
    """Floor pair: two draws of one law. Candidate: a law at Σ(p − q)² = 0.0129 from the
    reference's (``shown``) or the same law. Fixed seeds; for arbitrary seeds the second case
    fails with probability ≤ α = 0.05 (the bounds are conservative near D = 0, module Notes)
    and the first far less (D ≈ 6 bootstrap sd's at 600 sequences a file)."""
    rng = np.random.default_rng(11)
    other = np.roll(ZIPF, 1) * 0.3 + ZIPF * 0.7 if shifted else ZIPF
    ref, cand = byo(rng, ZIPF, range(600)), byo(rng, other, range(600))
    fa, fb = byo(rng, ZIPF, range(600)), byo(rng, ZIPF, range(600, 1200))
    r = token_drift(ref, cand, fa, fb, alpha=0.05, rng=np.random.default_rng(0), resamples=400)
    assert r.lcb < r.statistic < r.ucb and r.excess_shown is shown
    assert r.statistic == pytest.approx(r.drift - r.floor)
    assert "not a verdict" in r.line and r.to_dict()["excess_shown"] is shown


def test_cli_compare_floor_prints_and_stores_the_readout(tmp_path: Path) -> None:
    """The verdict (exit code) is the comparison's own, with or without --floor."""
    rng = np.random.default_rng(20261201)
    files = {}
    for name, lo in (("ref", 0), ("cand", 400), ("a", 800), ("b", 1200)):
        files[name] = tmp_path / f"{name}.parquet"
        byo(rng, ZIPF, range(lo, lo + 400)).to_parquet(files[name], index=False)
    base = ["compare", "--reference", files["ref"], "--candidate", files["cand"], "--alpha",
            "0.01", "--max-mde-tv", "0.2", "--no-progress"]  # fmt: skip
    plain = invoke(*base, "--out", tmp_path / "o1")
    r = invoke(*base, "--out", tmp_path / "o2", "--floor", files["a"], files["b"])
    assert r.exit_code == plain.exit_code == 0, r.output
    assert "token-law drift (readout, claim b, tokens only)" in r.stdout
    stored = json.loads((tmp_path / "o2" / "summary.json").read_text())
    assert stored["token_drift"]["units"] == 6 and stored["token_drift"]["floor_units"] == 6
    assert "token_drift" not in json.loads((tmp_path / "o1" / "summary.json").read_text())


def test_cli_compare_floor_bad_pair_exit_2(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    ref, cand, a, b = (tmp_path / f"{n}.csv" for n in ("ref", "cand", "a", "b"))
    for f in (ref, cand, a):
        byo(rng, ZIPF, range(50)).to_csv(f, index=False)
    df = byo(rng, ZIPF, range(50))
    pd.DataFrame(df[df["prompt_id"] == "p0"]).to_csv(b, index=False)
    r = invoke("compare", "--reference", ref, "--candidate", cand, "--floor", a, b,
               "--out", tmp_path / "o", "--no-progress")  # fmt: skip
    assert r.exit_code == 2, r.output
    assert "is not in the other --floor file" in r.output and "a.csv" in r.output
