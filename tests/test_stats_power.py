"""Power, MDE and seeds-needed (spectest.stats.power), including simulated power of the
ε-biased acceptor against the formula."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import optimize, stats
from test_stats_sim import acceptor_law, perturbed, zipf

from spectest.errors import ConfigError
from spectest.stats import homogeneity as hm
from spectest.stats import power, tables, whitebox


def _chi2_power(lam: float, df: int, alpha: float = 0.05) -> float:
    """Asymptotic power of a level-α χ²(df) test at noncentrality λ (α at λ = 0)."""
    return float(stats.ncx2.sf(stats.chi2.isf(alpha, df), df, lam)) if lam > 0 else alpha


def _noncentrality(p: np.ndarray, o: np.ndarray, n_ref: float, n_cand: float) -> float:
    """λ = (n_ref·n_cand/n)·Σ (p − o)²/m of the two-sample χ² over bins with laws p, o [J]."""
    n = n_ref + n_cand
    m = (n_ref * p + n_cand * o) / n
    use = m > 0
    return float(n_ref * n_cand / n * np.sum((p[use] - o[use]) ** 2 / m[use]))


def test_lambda_star_matches_stats_md_and_the_normal_case():
    assert power.lambda_star(10) == pytest.approx(16.2, abs=0.05)  # docs/statistics.md
    assert power.lambda_star(100) == pytest.approx(40.6, abs=0.05)  # docs/statistics.md
    # χ²₁(λ) is (Z + √λ)²: power Φ(√λ − z) + Φ(−√λ − z), solved independently of ncx2
    z = stats.norm.isf(0.025)
    root = optimize.brentq(lambda r: stats.norm.cdf(r - z) + stats.norm.cdf(-r - z) - 0.8, 0, 10)
    assert power.lambda_star(1) == pytest.approx(root**2, rel=1e-7)
    assert power.lambda_star(1) == pytest.approx((z + stats.norm.ppf(0.8)) ** 2, rel=1e-4)
    assert float(_chi2_power(power.lambda_star(7, 0.01), 7, 0.01)) == pytest.approx(0.8, abs=1e-8)
    with pytest.raises(ConfigError, match="df"):
        power.lambda_star(0)
    with pytest.raises(ConfigError, match="power"):
        power.lambda_star(3, 0.05, 0.01)


def test_mde_tv_and_seeds_for_tv_are_inverse():
    lam = power.lambda_star(10)
    assert float(power.mde_tv(1000, 1000, 10)) == pytest.approx(np.sqrt(lam / 2000))
    # unequal arms use N_eff = 2·n_a·n_b/(n_a + n_b)
    assert float(power.mde_tv(500, 1500, 10)) == pytest.approx(np.sqrt(lam / (2 * 750)))
    out = power.mde_tv(
        np.array([1000, 0, 1000]), np.array([1000, 1000, 1000]), np.array([10, 10, 0])
    )
    assert np.isfinite(out[0]) and np.isnan(out[1]) and np.isnan(out[2])
    n = power.seeds_for_tv(0.05, 10)
    assert float(power.mde_tv(n, n, 10)) <= 0.05 < float(power.mde_tv(n - 1, n - 1, 10))
    with pytest.raises(ConfigError, match="tv"):
        power.seeds_for_tv(0.0, 10)


def test_noncentrality_formula_and_its_tv_bound():
    rng = np.random.default_rng(0)
    p = zipf(20)
    o = perturbed(p, 0.3, rng)
    n = 1000
    delta = np.sum((p - o) ** 2 / (p + o))
    # docs/statistics.md "Power and minimum detectable effect"
    assert _noncentrality(p, o, n, n) == pytest.approx(n * delta)
    tv = 0.5 * np.abs(p - o).sum()
    assert _noncentrality(p, o, 300, 700) >= 2 * (2 * 300 * 700 / 1000) * tv**2


def test_directed_z_mde_matches_stats_md():
    assert power.directed_z_mde(1000 * 32, 0.5) == pytest.approx(0.0078, abs=1e-4)  # ≈ 0.008
    assert np.isnan(power.directed_z_mde(100, 0.0))
    one = power.directed_z_mde(1000, 0.3, two_sided=False)
    assert one < power.directed_z_mde(1000, 0.3)


# ----------------------------------------------------------------------------- simulated power
V, N, REPS = 300, 4000, 240
P = zipf(V, 1.1)
Q = perturbed(P, 0.8, np.random.default_rng(0))  # p(A) ≈ 0.30 for A = {q > p}


def _predicted(o: np.ndarray) -> tuple[float, float, int]:
    """Power predicted by ncx2 with the exact Δ of the binned laws, the binned TV, and df.
    Bins: the pooling rule applied to the expected combined counts N·(p + o)."""
    bins, nb = hm.pool_tokens(np.round(N * (P + o)).astype(np.int64), N, N)
    pb = np.bincount(bins, weights=P, minlength=nb)
    ob = np.bincount(bins, weights=o, minlength=nb)
    lam = _noncentrality(pb, ob, N, N)
    return float(_chi2_power(lam, nb - 1, 0.05)), 0.5 * float(np.abs(pb - ob).sum()), nb - 1


def _empirical(o: np.ndarray, seed: int) -> float:
    """Rejection rate at α = 0.05 of the pooled χ² over REPS replications (one vectorised call:
    replication = stratum; the first N sequences draw from p, the last N from o)."""
    rng = np.random.default_rng(seed)
    tok = np.vstack([rng.choice(V, size=(N, REPS), p=P), rng.choice(V, size=(N, REPS), p=o)])
    seq, stratum = np.nonzero(np.ones_like(tok, dtype=bool))
    t = tables.build_table(stratum, tok[seq, stratum], seq, n_seq=2 * N)
    ref = tables.ref_counts(t, tables.label_matrix(N, N, 0, rng))
    n_ref, n_cand = tables.stratum_arm_sizes(t, ref)
    bins = hm.pool_table(t, n_ref[:, 0], n_cand[:, 0])
    chi = hm.chi2_statistics(t, bins, ref, n_ref, n_cand)[:, 0]
    return float(np.mean(stats.chi2.sf(chi, bins.n_bins - 1) <= 0.05))


@pytest.mark.parametrize("eps", [0.2, 0.3])
def test_pooled_chi2_power_of_the_eps_acceptor_matches_the_prediction(eps):
    """Token-level ε-biased acceptor (one draft, residual unchanged; Zipf(1.1) target over 300
    tokens, q = p·exp(0.8·N(0,1))), N = 4000 per arm, 240 replications, α = 0.05. Tolerance:
    |empirical − predicted| ≤ 3σ + 0.05 (σ binomial; the 0.05 covers the asymptotic ncx2 law
    and data-dependent bins). Predicted ≈ 0.48 (ε = 0.2) and 0.91 (ε = 0.3). Fixed seeds;
    false-failure rate of the 3σ part ≈ 0.3 %."""
    o = acceptor_law(P, Q, eps)
    pred, _, _ = _predicted(o)
    emp = _empirical(o, seed=int(eps * 100))
    assert abs(emp - pred) <= 3 * np.sqrt(pred * (1 - pred) / REPS) + 0.05, (emp, pred)


def test_power_at_the_mde_is_at_least_the_promised_power():
    """At a binned TV ≥ the MDE the pooled test detects with power ≥ 0.8 (the MDE is a
    worst case over the shape of the difference). ε = 0.35 gives binned TV ≥ MDE ≈ 0.073.
    Asserted: empirical ≥ 0.8 − 3σ over 240 replications (false-failure rate < 0.3 %)."""
    o = acceptor_law(P, Q, 0.35)
    _, tv_binned, df = _predicted(o)
    mde = float(power.mde_tv(N, N, df, 0.05))
    assert tv_binned >= mde
    emp = _empirical(o, seed=35)
    assert emp >= 0.8 - 3 * np.sqrt(0.8 * 0.2 / REPS), emp


def test_directed_z_power_of_the_eps_acceptor_matches_the_normal_prediction():
    """Directed z on A = {q > p} for the ε = 0.05 acceptor (TV ≈ 0.015, which the pooled χ²
    detects with power ≈ 0.07 only), N = 4000 tokens, 240 replications: empirical power within
    3σ + 0.03 of Φ((μ − z)/s) + Φ((−μ − z)/s), μ = N(o(A) − p(A))/√(N p_A(1 − p_A)),
    s² = o_A(1 − o_A)/(p_A(1 − p_A)). Fixed seed; false-failure rate ≈ 0.3 %."""
    o = acceptor_law(P, Q, 0.05)
    in_a = Q > P
    pa, oa = P[in_a].sum(), o[in_a].sum()
    mu = N * (oa - pa) / np.sqrt(N * pa * (1 - pa))
    s = np.sqrt(oa * (1 - oa) / (pa * (1 - pa)))
    z = stats.norm.isf(0.025)
    pred = stats.norm.cdf((mu - z) / s) + stats.norm.cdf((-mu - z) / s)
    rng = np.random.default_rng(5)
    hits = 0
    for _ in range(REPS):
        tok = rng.choice(V, size=N, p=o)
        hits += whitebox.directed_z(in_a[tok], np.full(N, pa)).pvalue <= 0.05
    emp = hits / REPS
    assert abs(emp - pred) <= 3 * np.sqrt(pred * (1 - pred) / REPS) + 0.03, (emp, pred)
    # consistent with the MDE: this acceptor's excess o(A) − p(A) ≈ 0.015 is below the MDE
    # (≈ 0.020) and its power is below 0.8; the ε = 0.1 acceptor's is above both
    assert oa - pa < power.directed_z_mde(N, pa) and pred < 0.8
    o2 = acceptor_law(P, Q, 0.1)
    assert o2[in_a].sum() - pa > power.directed_z_mde(N, pa)
