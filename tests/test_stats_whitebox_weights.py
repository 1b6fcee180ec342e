"""The α split inside the white-box family (``whitebox.weighted_bonferroni``, the weights
``whitebox.WHITEBOX_WEIGHTS`` and ``whitebox_two_sample.TEACHER_WEIGHTS``) and the family's power in
exact and teacher mode against more than one alternative (issue 12's power criterion).

Simulator: ``test_stats_whitebox_two_sample``'s world (top-k 20 Markov engine, V = 40, teacher
logits + N(0, 0.05²) fixed per state). Alternatives (``ALTERNATIVES``), each a token-level
speculative decode (one draft per token) whose acceptance flags feed the acceptance test:

- ``eps``: the ε = 0.05 acceptor (accept with min(1, 1.05·p/q)), the lossy-acceptance class;
- ``temp``: the verifier's target at 0.88 × the temperature (p^(1/0.88) renormalised on the
  top-k support; exact rejection sampling of that wrong law), the wrong-temperature class;
- ``qtemp``: the verifier is told a q at 1.1 × the draft's temperature while the draft token is
  drawn from q (the q_mode / raw_q class of ``sampling.mutants``).

``family_pvalues`` draws one replication and returns every test's p-value; the power tables of
results/LOG.md (2026-11-30 h10) come from ``tools/readouts/whitebox_power.py``, which calls it.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from scipy import stats
from test_stats_sim import (
    Markov,
    draw,
    markov,
    sample_plain,
    sample_spec_rounds,
    samples_frame,
    whitebox_columns,
)
from test_stats_whitebox_two_sample import SIGMA, T, columns, replicate, world

from spectest import schema as sc
from spectest.errors import ConfigError
from spectest.stats import AnalysisOptions, analyze
from spectest.stats.family_whitebox import exact_whitebox_frame
from spectest.stats.pit import pit_values, uniformity_tests
from spectest.stats.whitebox import (
    WHITEBOX_WEIGHTS,
    directed_z,
    weighted_bonferroni,
)
from spectest.stats.whitebox_two_sample import (
    TEACHER_WEIGHTS,
    TWO_SAMPLE_TESTS,
    sequence_table,
    two_sample_tests,
)

ALPHA = 0.05
ALTERNATIVES = {"eps": 0.05, "temp": 0.88, "qtemp": 1.1}  # name → its size (ε or τ)
EXACT_TESTS = ("directed_z", "pit_ks", "pit_cvm", "pit_ad", "acceptance")


def tempered(p: np.ndarray, tau: float) -> np.ndarray:
    """p^(1/τ) renormalised on p's support: [..., V] → [..., V] (the top-k law at τ × the
    temperature: truncation commutes with a temperature)."""
    w = np.where(p > 0, np.power(np.maximum(p, 1e-300), 1.0 / tau), 0.0)
    return w / w.sum(axis=-1, keepdims=True)


def spec_decode(
    m: Markov,
    n: int,
    rng: np.random.Generator,
    *,
    eps: float = 0.0,
    p_verify: np.ndarray | None = None,
    q_told: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Token-level speculative decode of ``m`` (draft x ~ q, one per token): the verifier's
    target is ``p_verify`` (default m.p), it is told ``q_told`` (default m.q) and accepts with
    min(1, (1 + ε)·p/q), residual norm(max(0, p − q)). Returns tokens [n, T], accepted [n, T]."""
    pv = m.p if p_verify is None else p_verify
    qt = m.q if q_told is None else q_told
    out = np.empty((n, T), dtype=np.int64)
    acc = np.empty((n, T), dtype=bool)
    prev = np.full(n, m.vocab)
    rows = np.arange(n)
    for t in range(T):
        p, q = pv[prev], qt[prev]
        x = draw(m.q[prev], rng.random(n))
        ratio = np.where(q[rows, x] > 0, p[rows, x] / np.maximum(q[rows, x], 1e-300), 0.0)
        ok = rng.random(n) < np.minimum(1.0, (1.0 + eps) * ratio)
        resid = np.maximum(p - q, 0.0)
        empty = resid.sum(axis=1) <= 0
        resid[empty] = p[empty]  # NOTE: p == q: rejection has probability 0; any law will do
        y = draw(resid, rng.random(n))
        out[:, t] = np.where(ok, x, y)
        acc[:, t] = ok
        prev = out[:, t]
    return out, acc


def candidate(
    alt: str, m: Markov, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """The candidate arm under ``alt`` (``ALTERNATIVES`` or "null": the exact sampler)."""
    if alt == "eps":
        return spec_decode(m, n, rng, eps=ALTERNATIVES["eps"])
    if alt == "temp":
        return spec_decode(m, n, rng, p_verify=tempered(m.p, ALTERNATIVES["temp"]))
    if alt == "qtemp":
        return spec_decode(m, n, rng, q_told=tempered(m.q, ALTERNATIVES["qtemp"]))
    assert alt == "null", alt
    return spec_decode(m, n, rng)


def family_pvalues(alt: str, n: int, seed: int, mults: tuple[int, ...], B: int) -> dict[str, float]:
    """One replication: p-values of the exact one-sample tests on the engine's columns
    (``EXACT_TESTS``, the acceptance test token-level; two-sided directed z, plus its one-sided
    ``directed_z_1s``) and of the teacher two-sample tests on the σ-perturbed teacher's columns
    with a reference of m·n plain sequences for each m in ``mults`` (keys ``<test>_m<m>``;
    nested reference arms), all on one candidate arm of ``n`` sequences."""
    w = world(seed, sigma=SIGMA)
    rng = np.random.default_rng(seed)
    cand, acc = candidate(alt, w.engine, n, rng)
    big = n * max(mults)
    ref = np.empty((big, T), dtype=np.int64)
    prev = np.full(big, w.engine.vocab)
    for t in range(T):
        ref[:, t] = draw(w.engine.p[prev], rng.random(big))
        prev = ref[:, t]
    out: dict[str, float] = {}
    c = columns(w.engine, cand)
    dz = directed_z(c[sc.WB_IN_A], c[sc.WB_P_A])
    out["directed_z"], out["directed_z_1s"] = dz.pvalue, dz.pvalue_greater
    u = pit_values(c[sc.WB_CDF_LO], c[sc.WB_P], rng)
    for r in uniformity_tests(u):
        out[f"pit_{r.test}"] = r.pvalue
    o, a = c[sc.WB_OVERLAP], acc.ravel().astype(np.float64)
    z = (a.sum() - o.sum()) / np.sqrt(np.sum(o * (1.0 - o)))  # whitebox.acceptance_test's z
    out["acceptance"] = float(2.0 * stats.norm.sf(abs(z)))
    for m in mults:
        tok = {"reference": ref[: m * n], "candidate": cand}
        arms = {("p", "c", k): v for k, v in tok.items()}
        extra = {("p", "c", k): columns(w.teacher, v) for k, v in tok.items()}
        tab = sequence_table(samples_frame(arms, extra), "reference", "candidate", rng)
        for res in two_sample_tests(tab, B, rng):
            out[f"{res.test}_m{m}"] = res.pvalue
            if res.test == "directed_z_2s":
                out[f"directed_z_2s_1s_m{m}"] = res.pvalue_one_sided
    return out


def family_rejects(
    p: dict[str, float], tests: tuple[str, ...], weights: dict[str, float], suffix: str = ""
) -> bool:
    """The family's decision at ``ALPHA``: weighted Bonferroni over ``tests`` (``weights``; an
    equal split when every weight is 1)."""
    pv = np.array([p[t + suffix] for t in tests])
    p_adj, _ = weighted_bonferroni(tests, pv, weights)
    return bool((p_adj <= ALPHA).any())


# ------------------------------------------------------------------------ the weighted split
def test_weighted_bonferroni_equal_weights_is_bonferroni_and_absent_tests_renormalise() -> None:
    """Deterministic: equal weights give p·k; a missing test's share goes to the others; the
    shipped weights sum to 1 over each mode's family and every test keeps ≥ 0.05 (so a
    permutation p-value at B = 1 999 can reach α_whitebox × w at α_whitebox ≥ 0.01)."""
    tests = ("a", "b", "c", "d")
    p = np.array([0.01, 0.2, 0.5, 0.001])
    p_adj, w = weighted_bonferroni(tests, p, dict.fromkeys(tests, 1.0))
    assert np.allclose(p_adj, np.minimum(1.0, p * 4)) and np.allclose(w, 0.25)
    weights = {"a": 0.5, "b": 0.2, "c": 0.2, "d": 0.1}
    p_adj, w = weighted_bonferroni(("b", "c", "d"), p[1:], weights)  # "a" (no q) absent
    assert np.allclose(w, [0.4, 0.4, 0.2]) and np.allclose(p_adj, [0.5, 1.0, 0.005])
    with pytest.raises(ConfigError, match="'e'"):
        weighted_bonferroni(("a", "e"), np.array([0.1, 0.1]), weights)
    assert sum(WHITEBOX_WEIGHTS.values()) == pytest.approx(1.0)
    assert sum(TEACHER_WEIGHTS[t] for t in TWO_SAMPLE_TESTS) == pytest.approx(1.0)
    for wts, names in ((WHITEBOX_WEIGHTS, EXACT_TESTS), (TEACHER_WEIGHTS, TWO_SAMPLE_TESTS)):
        assert set(names) <= set(wts) and min(wts[t] for t in names) >= 0.05
        assert max(wts, key=lambda t: wts[t] if t in names else 0.0) in names


def test_analyze_p_adj_is_p_over_the_weight_in_both_modes() -> None:
    """One run per mode (fixed seed): every non-support white-box row of an arm has
    p_adj = min(1, p / w) with w that mode's weights renormalised over the arm's tests, and
    ``reject`` = p_adj ≤ α_whitebox. Deterministic given the seed."""
    samples = replicate(world(3, sigma=0.0), 120, 3)
    kw = dict(reference="reference", candidate="candidate", rng_seed=1)
    for mode, weights in (("exact", WHITEBOX_WEIGHTS), ("teacher", TEACHER_WEIGHTS)):
        a = analyze(
            samples, options=AnalysisOptions(null_permutations=20, whitebox_mode=mode), **kw
        )
        wb = a.table("whitebox")[a.table("whitebox")["test"] != "support"]
        assert len(wb)
        for _, rows in wb.groupby("arm"):
            w = np.array([weights[t] for t in rows["test"]])
            w = w / w.sum()
            want = np.minimum(1.0, rows["pvalue"].to_numpy(float) / w)
            assert np.allclose(rows["p_adj"].to_numpy(float), want), (mode, rows)
            assert (rows["reject"] == (rows["p_adj"] <= a.families["whitebox"].alpha)).all()


def test_weighted_exact_family_false_alarms_at_most_alpha() -> None:
    """H0, exact mode: 200 replications (fixed seeds) of a plain reference arm and an exact
    speculative candidate (K = 2 rounds with the rounds table; Markov V = 8, 150 sequences × 6
    tokens each): the white-box family as analyze decides it (``exact_whitebox_frame``: weighted
    Bonferroni, ``WHITEBOX_WEIGHTS``, acceptance included on the candidate) rejects each arm at a
    rate ≤ α + 3σ (σ = 0.0154; false-failure rate ≈ 0.3 % per arm)."""
    rng = np.random.default_rng(12)
    m = markov(8, rng)
    hits = {"reference": 0, "candidate": 0}
    for r in range(200):
        ref = sample_plain(m, 150, 6, rng)
        cand, rounds = sample_spec_rounds(m, 150, 6, 2, rng)
        extra = {("p", "c", "reference"): whitebox_columns(m, ref)}
        extra[("p", "c", "candidate")] = whitebox_columns(m, cand)
        df = samples_frame({("p", "c", "reference"): ref, ("p", "c", "candidate"): cand}, extra)
        rounds = rounds.assign(prompt_id="p", config_id="c", arm="candidate")
        wb = exact_whitebox_frame(
            df, "reference", "candidate", rounds, np.random.default_rng(r), ALPHA
        )
        assert set(wb.loc[wb["arm"] == "candidate", "test"]) == {"support", *EXACT_TESTS}
        for arm in hits:
            hits[arm] += bool(wb.loc[wb["arm"] == arm, "reject"].any())
    print(hits)
    for arm, h in hits.items():
        assert h / 200 <= ALPHA + 3 * np.sqrt(ALPHA * (1 - ALPHA) / 200), (arm, hits)


# ------------------------------------------------------------------------------ power (slow)
RECOMMENDED_REF_MULT = 16  # the reference multiplier at which teacher mode's family is within 10 %
POWER_REPS, POWER_N, POWER_SEED, POWER_B = 200, 500, 1000, 399


def _rate(draws: list[dict[str, float]], key: str) -> float:
    return float(np.mean([d[key] <= ALPHA for d in draws]))


def _sd(p: float, n: int = POWER_REPS) -> float:
    return float(np.sqrt(max(p * (1.0 - p), 0.25 / n) / n))  # floor: p̂ of 0 or 1 has sd > 0


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("SPECTEST_POWER") != "1",
    reason="opt-in (12 min on 2 cores): SPECTEST_POWER=1 python -m pytest -m slow -k within_ten",
)
@pytest.mark.parametrize("alt", ["eps", "temp"])
def test_family_power_weighted_and_teacher_mode_within_ten_percent_slow(alt: str) -> None:
    """200 replications (seeds 1000..1199: not the seeds 100..299 the weights were chosen on),
    500 candidate sequences × 8 tokens, reference 16 × as many (``RECOMMENDED_REF_MULT``),
    σ = 0.05 teacher, B = 399, level α = 0.05 for each family. Asserted, for the ε = 0.05
    acceptor and for the wrong-temperature verifier (τ = 0.88):

    - teacher mode's family (weighted Bonferroni, ``TEACHER_WEIGHTS``) at m = 16 ≥ 0.9 × the
      exact family's power (``WHITEBOX_WEIGHTS``, acceptance included) − 3 sd;
    - the two-sample directed z (one-sided) and PIT-AD at m = 16 ≥ 0.9 × their exact one-sample
      counterparts − 3 sd;
    - the weighted split does not lose to the equal split (weighted ≥ equal − 3 sd, both modes),
      and against the temperature error (which the directed z cannot see) gains ≥ 0.10.

    sd: a binomial sd of each rate over 200 replications, the difference's taken as if the two
    were independent (they share the candidate sequences, so it is smaller). Measured here
    (results/LOG.md, 2026-11-30 h10): ε — exact family 0.685, teacher 0.505 (bound 0.479),
    directed z 0.765 / 0.705, PIT-AD 0.60 / 0.51; temperature — 0.685 / 0.65, PIT-AD 0.72 / 0.705;
    equal split 0.69 / 0.49 (ε) and 0.475 / 0.42 (temperature). False-failure rate: the seeds are
    fixed, so the outcome is too; over fresh seeds each check at its measured effect fails with
    ≲ 0.2 % (3 sd, normal approximation) except the ε family check: teacher mode's family at
    m = 16 is 0.83 of exact on ε pooled over 400 replications (0.91 on seeds 100..299, 0.74 here),
    which puts that check ~1.9 sd above its bound: ≈ 3 % over fresh seeds. Runtime: ~2–4 s per
    replication (the m = 16 permutation statistics over 68 000 tokens), 751 s for both on the
    shared 2-core CPU.
    """
    draws = [
        family_pvalues(alt, POWER_N, POWER_SEED + r, (RECOMMENDED_REF_MULT,), POWER_B)
        for r in range(POWER_REPS)
    ]
    sfx = f"_m{RECOMMENDED_REF_MULT}"
    equal_e, equal_t = dict.fromkeys(EXACT_TESTS, 1.0), dict.fromkeys(TWO_SAMPLE_TESTS, 1.0)
    fam = {
        "exact": np.mean([family_rejects(d, EXACT_TESTS, WHITEBOX_WEIGHTS) for d in draws]),
        "exact_equal": np.mean([family_rejects(d, EXACT_TESTS, equal_e) for d in draws]),
        "teacher": np.mean(
            [family_rejects(d, TWO_SAMPLE_TESTS, TEACHER_WEIGHTS, sfx) for d in draws]
        ),
        "teacher_equal": np.mean(
            [family_rejects(d, TWO_SAMPLE_TESTS, equal_t, sfx) for d in draws]
        ),
    }
    one = {k: _rate(draws, k) for k in ("directed_z_1s", "pit_ad", f"directed_z_2s_1s{sfx}")}
    one[f"pit_ad_2s{sfx}"] = _rate(draws, f"pit_ad_2s{sfx}")
    print(alt, {k: round(float(v), 3) for k, v in {**fam, **one}.items()})

    def at_least(a: float, b: float, factor: float = 1.0, gain: float = 0.0) -> bool:
        return a >= factor * b + gain - 3.0 * float(np.hypot(_sd(a), factor * _sd(b)))

    assert at_least(fam["teacher"], fam["exact"], 0.9), fam
    assert at_least(one[f"directed_z_2s_1s{sfx}"], one["directed_z_1s"], 0.9), one
    assert at_least(one[f"pit_ad_2s{sfx}"], one["pit_ad"], 0.9), one
    gain = 0.10 if alt == "temp" else 0.0
    assert at_least(fam["exact"], fam["exact_equal"], gain=gain), fam
    assert at_least(fam["teacher"], fam["teacher_equal"], gain=gain), fam
