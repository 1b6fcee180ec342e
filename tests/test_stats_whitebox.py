"""White-box tests: PIT uniformity, directed z, acceptance, support (spectest.stats.whitebox)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from test_stats_sim import (
    markov,
    sample_plain,
    sample_spec,
    sample_spec_rounds,
    samples_frame,
    whitebox_columns,
)

from spectest.errors import InputError
from spectest.stats import pit
from spectest.stats import whitebox as wb


def test_anderson_darling_statistic_equals_scipy_and_pvalue_matches_its_monte_carlo():
    """Statistic: scipy.stats.goodness_of_fit(stats.uniform, u, known_params={'loc': 0,
    'scale': 1}, statistic='ad').statistic. p-value: within 4 MC standard errors + 0.005 of
    scipy's Monte-Carlo p (n_mc_samples = 4000; false-failure rate < 1e-4). Fixed seeds."""
    rng = np.random.default_rng(0)
    for u in (rng.random(60), rng.beta(1.3, 1.0, 60)):
        ours = pit.anderson_darling_uniform(u)
        ref = stats.goodness_of_fit(
            stats.uniform,
            u,
            known_params={"loc": 0, "scale": 1},
            statistic="ad",
            n_mc_samples=4000,
            rng=np.random.default_rng(1),
        )
        assert ours.statistic == pytest.approx(ref.statistic, rel=1e-10)
        se = np.sqrt(max(ref.pvalue * (1 - ref.pvalue), 1e-4) / 4000)
        assert abs(ours.pvalue - ref.pvalue) < 4 * se + 0.005, (ours.pvalue, ref.pvalue)


@pytest.mark.parametrize(("a2", "p"), [(1.933, 0.10), (2.492, 0.05), (3.070, 0.025), (3.857, 0.01)])
def test_adinf_at_the_published_critical_values(a2, p):
    """Asymptotic upper-tail critical values of A² for a fully specified law (Stephens 1974,
    JASA 69, Table 1, case 0): 1.933, 2.492, 3.070, 3.857 at 10 %, 5 %, 2.5 %, 1 %."""
    assert 1.0 - float(pit._adinf(np.array(a2))) == pytest.approx(p, abs=6e-4)


def test_ks_and_cvm_are_the_scipy_calls_and_empty_input_is_nan():
    u = np.random.default_rng(2).random(500)
    ks, cvm, ad = pit.uniformity_tests(u)
    assert ks.pvalue == stats.kstest(u, "uniform").pvalue and ks.test == "ks"
    assert cvm.statistic == pytest.approx(stats.cramervonmises(u, "uniform").statistic)
    assert ad.test == "ad" and ad.n == 500
    assert all(np.isnan(r.pvalue) for r in pit.uniformity_tests(np.array([])))


def test_pit_values_use_the_passed_generator_only():
    lo, p = np.array([0.0, 0.5, 0.9]), np.array([0.5, 0.4, 0.1])
    u = pit.pit_values(lo, p, np.random.default_rng(7))
    v = np.random.default_rng(7).random(3)
    np.testing.assert_array_equal(u, lo + v * p)


def test_directed_z_by_hand():
    hits = np.zeros(400, bool)
    hits[:220] = True
    r = wb.directed_z(hits, np.full(400, 0.5))  # Σ p(1 − p) = 100: the normal test
    assert r.statistic == pytest.approx(2.0)  # (220 − 200)/√(400·¼)
    assert r.pvalue == pytest.approx(2 * stats.norm.sf(2.0))
    assert r.pvalue_greater == pytest.approx(stats.norm.sf(2.0))
    # Σ p(1 − p) = 1 < SMALL_VARIANCE: the exact law, Binomial(4, ½); P(≥ 3) = 5/16
    r = wb.directed_z(np.array([1, 0, 1, 1], bool), np.full(4, 0.5))
    assert r.pvalue == pytest.approx(2 * 5 / 16) and r.pvalue_greater == pytest.approx(5 / 16)
    assert r.statistic == pytest.approx(stats.norm.isf(5 / 16))
    assert (r.observed, r.expected, r.n) == (3.0, 2.0, 4)
    assert np.isnan(wb.directed_z(np.zeros(3, bool), np.zeros(3)).statistic)  # q unknown


def test_support_check_and_column_validation():
    assert wb.support_check(np.array([0.1, 0.0, 0.2])).statistic == 1
    assert wb.support_check(np.array([0.1, 0.0, 0.2])).pvalue == 0.0
    assert wb.support_check(np.array([0.1])).pvalue == 1.0
    bad = pd.DataFrame({"wb_p": [0.5, 1.5], "wb_cdf_lo": [0.0, 0.0]})
    with pytest.raises(InputError, match=r"'wb_p'.*1\.5"):
        wb.validate_whitebox(bad)
    over = pd.DataFrame({"wb_p": [0.5], "wb_cdf_lo": [0.6]})
    with pytest.raises(InputError, match="wb_cdf_lo \\+ wb_p"):
        wb.validate_whitebox(over)


def _wb_frame(m, tok_by_arm):
    extra = {("p", "c", arm): whitebox_columns(m, tok) for arm, tok in tok_by_arm.items()}
    return samples_frame({("p", "c", arm): tok for arm, tok in tok_by_arm.items()}, extra)


def test_pit_directed_z_calibrated_on_plain_decode_and_pit_catches_a_biased_acceptor():
    """H0: plain decode of a Markov model (V = 8, T = 4, 100 sequences = 400 PIT values per
    replication), wb_* columns from the model. 300 replications: KS, CvM, AD and the directed
    z each reject at α = 0.05 with rate within 3σ (σ = 0.0126). Power: the ε = 1 biased
    acceptor (2000 sequences) is rejected by PIT-KS and the directed z. Fixed seeds;
    false-failure rate ≈ 0.3 % per rate check, < 1e-6 for the power checks."""
    rng = np.random.default_rng(3)
    m = markov(8, rng)
    hits = {"ks": 0, "cvm": 0, "ad": 0, "z": 0}
    for _ in range(300):
        tok = sample_plain(m, 100, 4, rng)
        cols = whitebox_columns(m, tok)
        u = pit.pit_values(cols["wb_cdf_lo"], cols["wb_p"], rng)
        for r in pit.uniformity_tests(u):
            hits[r.test] += r.pvalue <= 0.05
        hits["z"] += wb.directed_z(cols["wb_in_a"], cols["wb_p_a"]).pvalue <= 0.05
    sigma = np.sqrt(0.05 * 0.95 / 300)
    for name, h in hits.items():
        assert abs(h / 300 - 0.05) <= 3 * sigma, (name, h)
    biased = sample_spec(m, 2000, 4, rng, eps=1.0)
    cols = whitebox_columns(m, biased)
    u = pit.pit_values(cols["wb_cdf_lo"], cols["wb_p"], rng)
    assert pit.uniformity_tests(u, tests=("ks",))[0].pvalue < 1e-4
    z = wb.directed_z(cols["wb_in_a"], cols["wb_p_a"])
    assert z.statistic > 0 and z.pvalue_greater < 1e-4


def test_acceptance_is_calibrated_for_exact_rounds_and_rejects_always_accept():
    """Exact K = 3 rounds on a Markov model (80 sequences × 6 tokens): 200 replications of the
    acceptance z at α = 0.05 within 3σ (σ = 0.0154). Always-accept: acceptance rate 1 against
    Σ min(p, q) < 1, rejected. Fixed seed; false-failure rate ≈ 0.3 %."""
    rng = np.random.default_rng(4)
    m = markov(8, rng)
    tok, rounds = sample_spec_rounds(m, 80 * 200, 6, 3, rng)  # replication = seed // 80
    df = _wb_frame(m, {"candidate": tok})
    df["prompt_id"] = (df["seed"] // 80).astype(str)
    rounds = rounds.assign(
        prompt_id=(rounds["seed"] // 80).astype(str), config_id="c", arm="candidate"
    )
    frames, rframes = dict(tuple(df.groupby("prompt_id"))), dict(tuple(rounds.groupby("prompt_id")))
    hits = 0
    for rep, sub in frames.items():
        res = wb.acceptance_test(rframes[rep], sub, "candidate")
        assert res.n_attempted > 0
        hits += res.pvalue <= 0.05
    assert len(frames) == 200
    assert abs(hits / 200 - 0.05) <= 3 * np.sqrt(0.05 * 0.95 / 200), hits
    tok, rounds = sample_spec_rounds(m, 200, 6, 3, rng, always_accept=True)
    df = _wb_frame(m, {"candidate": tok})
    res = wb.acceptance_test(
        rounds.assign(prompt_id="p", config_id="c", arm="candidate"), df, "candidate"
    )
    assert res.observed_rate == 1.0 and res.expected_rate < 0.95 and res.pvalue < 1e-6


def test_whitebox_tests_frame_has_one_row_per_arm_and_test():
    rng = np.random.default_rng(5)
    m = markov(6, rng)
    df = _wb_frame(
        m, {"reference": sample_plain(m, 50, 3, rng), "candidate": sample_plain(m, 50, 3, rng)}
    )
    out = wb.whitebox_tests(df, ["reference", "candidate"], np.random.default_rng(0))
    assert list(out.columns) == wb.WHITEBOX_COLUMNS
    assert set(out["test"]) == {"support", "pit_ks", "pit_cvm", "pit_ad", "directed_z"}
    assert (out.groupby("arm").size() == 5).all()
    df["wb_p_a"] = 0.0  # q unknown → no directed z
    out = wb.whitebox_tests(df, ["candidate"], np.random.default_rng(0))
    assert "directed_z" not in set(out["test"])


def test_not_computed_whitebox_values_skip_the_arm_and_partial_values_are_an_error():
    rng = np.random.default_rng(6)
    m = markov(6, rng)
    df = _wb_frame(
        m, {"reference": sample_plain(m, 40, 3, rng), "candidate": sample_plain(m, 40, 3, rng)}
    )
    cand = df["arm"] == "candidate"
    skipped = df.copy()
    skipped.loc[cand, ["wb_p", "wb_cdf_lo", "wb_p_a"]] = np.nan
    out = wb.whitebox_tests(skipped, ["reference", "candidate"], np.random.default_rng(0))
    assert set(out["arm"]) == {"reference"}
    partial = df.copy()
    partial.loc[partial.index[cand][0], "wb_p"] = np.nan
    with pytest.raises(
        InputError, match="'wb_p' is NaN for some but not all rows of arm 'candidate'"
    ):
        wb.whitebox_tests(partial, ["candidate"], np.random.default_rng(0))
