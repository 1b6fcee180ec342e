"""Teacher-mode white-box tests (``stats.whitebox_two_sample``) under a perturbed teacher.

The simulated engine samples from top-k truncated laws of a Markov model (``test_stats_sim``);
the *teacher* recomputes them from the same logits plus a fixed noise per state of
bf16 size (σ = 0.05 on logits of a Zipf(1.1) law, where the k-th and (k+1)-th logits are ~0.05
apart, so truncation boundaries move: ~1 % of emitted tokens get teacher p = 0, the issue-12
symptom). Checked: the exact one-sample tests reject such a correct engine, the teacher-mode
two-sample tests and the tolerance control keep their false-alarm rate ≤ α over ≥ 200 null
replications, a broken teacher still fails the control, and the two-sample directed z keeps
its power against the ε = 0.05 acceptor. Fixed seeds; a 3σ rate check has a false-failure
rate of ≈ 0.3 % (normal approximation to the binomial); each test states its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from test_stats_sim import Markov, sample_plain, sample_spec, samples_frame, zipf

from spectest import schema as sc
from spectest.stats import AnalysisOptions, analyze
from spectest.stats.pit import pit_values, uniformity_tests
from spectest.stats.whitebox import (
    WHITEBOX_WEIGHTS,
    directed_z,
    weighted_bonferroni,
)
from spectest.stats.whitebox_two_sample import (
    TEACHER_WEIGHTS,
    _pit_statistics,
    cell_permutations,
    pit_tolerance,
    sequence_table,
    support_tolerance,
    teacher_whitebox_tests,
    two_sample_tests,
)

ALPHA = 0.05
V, TOP_K, T = 40, 20, 8
SIGMA = 0.05  # teacher-vs-engine logit noise (bf16-sized)


def _within_or_below(hits: int, n: int, alpha: float = ALPHA) -> bool:
    return hits / n <= alpha + 3 * np.sqrt(alpha * (1 - alpha) / n)


def _topk_softmax(logits: np.ndarray, k: int, temperature: float = 1.0) -> np.ndarray:
    """Row-wise top-k then softmax at ``temperature`` (ties: lowest id first): [..., V]."""
    z = logits / temperature
    order = np.argsort(-z, axis=-1, kind="stable")
    keep = np.zeros(z.shape, dtype=bool)
    np.put_along_axis(keep, order[..., :k], True, axis=-1)
    e = np.where(keep, np.exp(z - z.max(axis=-1, keepdims=True)), 0.0)
    return e / e.sum(axis=-1, keepdims=True)


@dataclass(frozen=True)
class World:
    engine: Markov  # what the tokens are sampled from
    teacher: Markov  # what the teacher-forced columns are computed from


def world(seed: int, sigma: float = SIGMA, teacher_temperature: float = 1.0) -> World:
    """Zipf(1.1) logits per state (random permutation), a draft with logit noise 0.6, top-k 20;
    the teacher adds N(0, σ²) to both logits (fixed per state: a deterministic teacher)."""
    rng = np.random.default_rng(seed)
    base = np.log(zipf(V, 1.1))
    lp = np.stack([base[rng.permutation(V)] for _ in range(V + 1)])  # [V+1, V]
    lq = lp + 0.6 * rng.standard_normal(lp.shape)
    noise_p = sigma * rng.standard_normal(lp.shape)
    noise_q = sigma * rng.standard_normal(lp.shape)
    engine = Markov(_topk_softmax(lp, TOP_K), _topk_softmax(lq, TOP_K))
    teacher = Markov(
        _topk_softmax(lp + noise_p, TOP_K, teacher_temperature),
        _topk_softmax(lq + noise_q, TOP_K, teacher_temperature),
    )
    return World(engine, teacher)


def columns(m: Markov, tokens: np.ndarray) -> dict[str, np.ndarray]:
    """wb_* columns of ``tokens`` [n, T] under ``m`` with ``engines.teacher``'s order key
    (p/q descending; q = 0 → +inf where p > 0, 0 where p = 0; ties by id)."""
    n = tokens.shape[0]
    prev = np.concatenate([np.full((n, 1), m.vocab), tokens[:, :-1]], axis=1)  # [n, T]
    with np.errstate(divide="ignore", invalid="ignore"):
        key = np.where(m.q > 0, m.p / m.q, np.where(m.p > 0, np.inf, 0.0))  # [V+1, V]
    order = np.argsort(-key, axis=1, kind="stable")
    rank = np.argsort(order, axis=1)
    cum = np.cumsum(np.take_along_axis(m.p, order, axis=1), axis=1)
    lo = np.concatenate([np.zeros((m.vocab + 1, 1)), cum[:, :-1]], axis=1)
    in_a = m.q > m.p
    p_a = np.where(in_a, m.p, 0.0).sum(axis=1)
    s, x = prev.ravel(), tokens.ravel()
    return {
        sc.WB_P: m.p[s, x],
        sc.WB_CDF_LO: np.minimum(lo[s, rank[s, x]], 1.0),
        sc.WB_P_A: p_a[s],
        sc.WB_IN_A: in_a[s, x],
        sc.WB_OVERLAP: np.minimum(m.p, m.q).sum(axis=1)[s],
    }


def replicate(
    w: World, n: int, seed: int, eps: float = 0.0, cells: int = 2, ref_mult: int = 1
) -> pd.DataFrame:
    """Samples of ``cells`` cells: reference = plain decode of the engine (``ref_mult · n``
    sequences, ``seeds.reference_per_arm``), candidate = its token-level speculative decode with
    the ε acceptor (``n``); columns from the teacher."""
    rng = np.random.default_rng(seed)
    arms, extra = {}, {}
    for c in range(cells):
        for arm in ("reference", "candidate"):
            if arm == "reference":
                tok = sample_plain(w.engine, n * ref_mult, T, rng)
            else:
                tok = sample_spec(w.engine, n, T, rng, eps)
            arms[(f"p{c}", "c", arm)] = tok
            extra[(f"p{c}", "c", arm)] = columns(w.teacher, tok)
    return samples_frame(arms, extra)


# ------------------------------------------------------------------------------- the pieces
def test_ks_ad_statistics_equal_scipy_and_permutations_keep_cell_sizes() -> None:
    """Slow reference beside the fast path: the cumulative-sum KS and A² equal
    ``scipy.stats.ks_2samp`` / ``anderson_ksamp`` on the observed labelling; every relabeling
    keeps each cell's arm sizes. Deterministic."""
    samples = replicate(world(0), 30, 1)
    tab = sequence_table(samples, "reference", "candidate", np.random.default_rng(2))
    labels = cell_permutations(tab.cell, tab.cand, 50, np.random.default_rng(3))
    for c in np.unique(tab.cell):
        assert (labels[tab.cell == c].sum(axis=0) == tab.cand[tab.cell == c].sum()).all()
    # untied u's (a teacher's p = 0 tokens can tie, where scipy's A² groups tied values)
    tab = replace(tab, u=np.random.default_rng(4).random(tab.u.shape[0]))
    ks, ad = _pit_statistics(tab, labels[:, :1])
    is_c = tab.cand[tab.u_seq]
    want_ks = stats.ks_2samp(tab.u[is_c], tab.u[~is_c]).statistic
    want_ad = stats.anderson_ksamp([tab.u[is_c], tab.u[~is_c]], variant="right")
    assert ks[0] == pytest.approx(want_ks, abs=1e-12)
    # scipy reports the standardised (A² − (k − 1)) / σ_N; undo it with the same σ_N
    n_c, n_r = int(is_c.sum()), int((~is_c).sum())
    assert ad[0] == pytest.approx(want_ad.statistic * np.sqrt(_ad_var(n_c, n_r)) + 1.0, rel=1e-9)


def _ad_var(n1: int, n2: int) -> float:
    """σ_N² of the k-sample A² (Scholz & Stephens 1987, eq. 4), as ``scipy.stats.anderson_ksamp``
    computes it, for k = 2."""
    k, N = 2, n1 + n2
    H = 1.0 / n1 + 1.0 / n2
    hs_cs = np.cumsum(1.0 / np.arange(N - 1, 1, -1))
    h = hs_cs[-1] + 1
    g = np.sum(hs_cs / np.arange(2, N))
    a = (4 * g - 6) * (k - 1) + (10 - 6 * g) * H
    b = (2 * g - 4) * k**2 + 8 * h * k + (2 * g - 14 * h - 4) * H - 8 * h + 4 * g - 6
    c = (6 * h + 2 * g - 2) * k**2 + (4 * h - 4 * g + 6) * k + (2 * h - 6) * H + 4 * h
    d = (2 * h + 6) * k**2 - 4 * h * k
    return float((a * N**3 + b * N**2 + c * N + d) / ((N - 1.0) * (N - 2.0) * (N - 3.0)))


def test_tolerance_bounds() -> None:
    """Deterministic: within tolerance → p = 1; a zero-p share or a PIT deviation far beyond τ
    → p < 1e-6."""
    assert support_tolerance(np.r_[np.ones(990), np.zeros(10)], 0.05).pvalue == 1.0
    assert support_tolerance(np.r_[np.ones(800), np.zeros(200)], 0.05).pvalue < 1e-6
    u = (np.arange(10_000) + 0.5) / 10_000
    assert pit_tolerance(u, 0.05).pvalue == 1.0
    assert pit_tolerance(u**2, 0.05).pvalue < 1e-6


# ------------------------------------------------------------------------------- calibration
def _one_sample_rejects(samples: pd.DataFrame, arm: str, rng: np.random.Generator) -> bool:
    sub = samples[samples[sc.ARM] == arm]
    p = sub[sc.WB_P].to_numpy()
    u = pit_values(sub[sc.WB_CDF_LO].to_numpy(), p, rng)
    pv = [r.pvalue for r in uniformity_tests(u)]
    pv.append(directed_z(sub[sc.WB_IN_A].to_numpy(bool), sub[sc.WB_P_A].to_numpy()).pvalue)
    return bool((p == 0).any() or min(pv) * len(pv) <= ALPHA)


def null_rates(reps: int, n: int, seed: int, ref_mult: int = 1) -> dict[str, float]:
    """Per-test and per-family rejection rates under H0 with a perturbed teacher (a new world
    per replication), plus the exact one-sample family's rate on the reference arm; the
    reference arm has ``ref_mult · n`` sequences."""
    hits: dict[str, int] = {}
    zero_share = []
    for r in range(reps):
        w = world(seed + r)
        samples = replicate(w, n, 10_000 + seed + r, ref_mult=ref_mult)
        zero_share.append(float((samples[sc.WB_P] == 0).mean()))
        rng = np.random.default_rng(r)
        wb = teacher_whitebox_tests(samples, "reference", "candidate", rng, B=199, tolerance=0.05)
        for row in wb.itertuples():
            hits[row.test] = hits.get(row.test, 0) + int(row.pvalue <= ALPHA)
        # each family as analyze decides it: weighted Bonferroni within the arm's rows
        for fam, arm in (("two_sample", "candidate"), ("control", "reference")):
            rows = wb[wb["arm"] == arm]
            p_adj, _ = weighted_bonferroni(
                rows["test"].tolist(), rows["pvalue"].to_numpy(float), TEACHER_WEIGHTS
            )
            hits[f"family_{fam}"] = hits.get(f"family_{fam}", 0) + int((p_adj <= ALPHA).any())
        # the support test without its margin: the permutation p-value alone
        tab = sequence_table(samples, "reference", "candidate", rng)
        sup = two_sample_tests(tab, 199, rng, support_margin=0.0)[0]
        assert sup.test == "support_2s"
        hits["support_2s_no_margin"] = hits.get("support_2s_no_margin", 0) + int(
            sup.pvalue <= ALPHA
        )
        hits["one_sample_exact_tests"] = hits.get("one_sample_exact_tests", 0) + int(
            _one_sample_rejects(samples, "reference", rng)
        )
    out = {k: v / reps for k, v in hits.items()}
    out["zero_p_share"] = float(np.mean(zero_share))
    return out


def test_null_false_alarms_at_most_alpha_under_bf16_sized_teacher_noise() -> None:
    """200 null replications (2 cells × 100 sequences × 8 tokens per arm; fixed seeds): every
    teacher-mode test and both families reject at a rate ≤ α + 3σ (false-failure rate ≈ 0.3 %
    per check), while the exact one-sample family on the same reference arm rejects in most
    replications (the issue-12 symptom it replaces)."""
    rates = null_rates(200, 100, 0)
    print(rates)
    for test in ("support_2s", "support_2s_no_margin", "pit_ks_2s", "pit_ad_2s", "directed_z_2s"):
        assert _within_or_below(round(rates[test] * 200), 200), (test, rates)
    assert _within_or_below(round(rates["family_two_sample"] * 200), 200), rates
    assert _within_or_below(round(rates["family_control"] * 200), 200), rates
    assert rates["zero_p_share"] > 0.002  # boundaries really moved
    assert rates["one_sample_exact_tests"] > 0.5


@pytest.mark.parametrize("broken", ["temperature", "misaligned"])
def test_broken_teacher_fails_the_control(broken: str) -> None:
    """A teacher at the wrong temperature (0.5 instead of 1.0), or one whose laws belong to
    another prefix (a misaligned position): the tolerance control rejects in all of 20
    replications of 2 cells × 400 sequences × 8 tokens (fixed seeds). NOTE: milder errors
    (temperature 0.7) move the grid PIT by ~0.05, inside τ = 0.05 plus the Azuma slack: the
    control bounds the teacher's distance, it does not detect every teacher bug."""
    for r in range(20):
        w = world(r, teacher_temperature=0.5 if broken == "temperature" else 1.0)
        if broken == "misaligned":
            w = World(w.engine, Markov(np.roll(w.teacher.p, 1, axis=0), w.teacher.q))
        samples = replicate(w, 400, r)
        wb = teacher_whitebox_tests(
            samples, "reference", "candidate", np.random.default_rng(r), B=19, tolerance=0.05
        )
        ctl = wb[wb["arm"] == "reference"]
        assert (ctl["pvalue"] * len(ctl) <= ALPHA).any(), ctl


def test_analyze_teacher_mode_passes_a_correct_engine_exact_mode_does_not() -> None:
    """One perturbed-teacher run (fixed seed): exact mode reports a failed control and a support
    violation, teacher mode neither, and the candidate's two-sample rows are present."""
    samples = replicate(world(7), 150, 7)
    kw = dict(reference="reference", candidate="candidate", rng_seed=1)
    exact = analyze(samples, options=AnalysisOptions(null_permutations=50), **kw)
    assert exact.whitebox_control_failed and exact.support_violation
    opts = AnalysisOptions(null_permutations=50, whitebox_mode="teacher")
    teach = analyze(samples, options=opts, **kw)
    assert teach.options.whitebox_mode == "teacher"
    assert not teach.whitebox_control_failed and not teach.support_violation
    assert not teach.families["whitebox"].rejected
    wb = teach.table("whitebox")
    tests = set(wb.loc[wb["arm"] == "candidate", "test"])
    assert tests == {"support_2s", "pit_ks_2s", "pit_ad_2s", "directed_z_2s"}
    assert np.isfinite(teach.families["whitebox"].resolution)
    # equal arms: the sizing advice (MDE × √(1.0625/2) with a 16 × reference)
    (note,) = [n for n in teach.notes if "reference_per_arm" in n]
    assert "reference 1 x the candidate; seeds.reference_per_arm = 16 x" in note, note


# ------------------------------------------------------------------------------- power
def power_rates(reps: int, n: int, eps: float, seed: int, sigma: float) -> dict[str, float]:
    """Rejection rates at level α of the directed z and the PIT tests against the ε acceptor:
    one-sample on exact columns (the generation-time numbers), two-sample on exact columns,
    two-sample on the σ-perturbed teacher's columns."""
    hits: dict[str, int] = {}
    for r in range(reps):
        w = world(seed + r, sigma=sigma)
        rng = np.random.default_rng(seed + r)
        tok = {}
        for arm in ("reference", "candidate"):
            tok[arm] = (
                sample_plain(w.engine, n, T, rng)
                if arm == "reference"
                else sample_spec(w.engine, n, T, rng, eps)
            )
        for label, m in (("exact", w.engine), ("teacher", w.teacher)):
            arms = {("p", "c", a): t for a, t in tok.items()}
            extra = {("p", "c", a): columns(m, t) for a, t in tok.items()}
            samples = samples_frame(arms, extra)
            tab = sequence_table(samples, "reference", "candidate", rng)
            for res in two_sample_tests(tab, 199, rng):
                key = f"{res.test}_{label}"
                p = res.pvalue_one_sided if res.test == "directed_z_2s" else res.pvalue
                hits[key] = hits.get(key, 0) + int(p <= ALPHA)
            if label == "exact":
                c = samples[samples[sc.ARM] == "candidate"]
                dz = directed_z(c[sc.WB_IN_A].to_numpy(bool), c[sc.WB_P_A].to_numpy())
                hits["directed_z_1s_exact"] = hits.get("directed_z_1s_exact", 0) + int(
                    dz.pvalue_greater <= ALPHA
                )
                u = pit_values(c[sc.WB_CDF_LO].to_numpy(), c[sc.WB_P].to_numpy(), rng)
                ks = uniformity_tests(u, tests=("ks",))[0]
                hits["pit_ks_1s_exact"] = hits.get("pit_ks_1s_exact", 0) + int(ks.pvalue <= ALPHA)
    return {k: v / reps for k, v in hits.items()}


@pytest.mark.slow
def test_power_against_eps_acceptor_slow() -> None:
    """ε = 0.05, 500 sequences × 8 tokens per arm, 200 replications (fixed seeds): the
    two-sample directed z's power with the σ = 0.05 teacher is within 0.10 of its power with
    exact columns (the bf16 noise costs no power). Its power against the exact one-sample
    directed z (which loses the √2 of estimating the reference's offset) is printed for
    results/LOG.md, not asserted. False-failure rate: the two powers are estimated from the
    same sequences (paired), so their difference has sd ≲ 0.03; a 0.10 margin is > 3σ."""
    rates = power_rates(200, 500, 0.05, 100, SIGMA)
    print(rates)
    assert abs(rates["directed_z_2s_teacher"] - rates["directed_z_2s_exact"]) <= 0.10, rates
    assert abs(rates["pit_ks_2s_teacher"] - rates["pit_ks_2s_exact"]) <= 0.10, rates


# --------------------------------------------------------------------- reference multiplier
REF_MULTS = (1, 2, 4, 8)
# h8's recommendation (the directed z within 10 % at 4); analyze.REFERENCE_MULTIPLIER now
# advises 16 (the white-box family within 10 %: tests/test_stats_whitebox_weights.py, LOG h10)
RECOMMENDED_REF_MULT = 4


def power_by_ref_mult(
    reps: int, n: int, eps: float, seed: int, sigma: float, mults: tuple[int, ...] = REF_MULTS
) -> dict[str, float]:
    """Power at level α against the ε acceptor of the teacher two-sample tests (σ-perturbed
    teacher) with a reference arm of ``m · n`` sequences, for each m in ``mults``, beside the
    exact one-sample tests on the same candidate sequences. Per replication one world, one
    candidate arm (n sequences) and one reference arm of ``max(REF_MULTS) · n`` sequences whose
    first ``m · n`` serve multiplier m (nested, as a run's growing reference seeds). ``mults``
    must be a prefix of ``REF_MULTS``: the random draws are then the sweep's, so each m's rates
    equal the full sweep's."""
    assert mults == REF_MULTS[: len(mults)], mults
    hits: dict[str, int] = {}

    def hit(key: str, rejected: bool) -> None:
        hits[key] = hits.get(key, 0) + int(rejected)

    for r in range(reps):
        w = world(seed + r, sigma=sigma)
        rng = np.random.default_rng(seed + r)
        cand = sample_spec(w.engine, n, T, rng, eps)
        ref = sample_plain(w.engine, n * max(REF_MULTS), T, rng)
        c = columns(w.engine, cand)
        dz = directed_z(c[sc.WB_IN_A], c[sc.WB_P_A])
        hit("directed_z_1s_exact", dz.pvalue_greater <= ALPHA)
        u = pit_values(c[sc.WB_CDF_LO], c[sc.WB_P], rng)
        pit = uniformity_tests(u)  # ks, cvm, ad
        hit("pit_ks_1s_exact", pit[0].pvalue <= ALPHA)
        # the family as a run decides it (analyze): weighted Bonferroni over the exact mode's
        # four tests (no rounds here), two-sided p-values (support is a hard failure, never hit
        # by an ε acceptor)
        names = ["pit_ks", "pit_cvm", "pit_ad", "directed_z"]
        fam = np.array([*(r.pvalue for r in pit), dz.pvalue])
        hit(
            "family_1s_exact",
            bool((weighted_bonferroni(names, fam, WHITEBOX_WEIGHTS)[0] <= ALPHA).any()),
        )
        for m in mults:
            tok = {"reference": ref[: m * n], "candidate": cand}
            arms = {("p", "c", a): t for a, t in tok.items()}
            extra = {("p", "c", a): columns(w.teacher, t) for a, t in tok.items()}
            tab = sequence_table(samples_frame(arms, extra), "reference", "candidate", rng)
            two = two_sample_tests(tab, 199, rng)
            for res in two:
                p = res.pvalue_one_sided if res.test == "directed_z_2s" else res.pvalue
                hit(f"{res.test}_m{m}", p <= ALPHA)
            # teacher mode's family as analyze decides it: weighted Bonferroni (TEACHER_WEIGHTS)
            p_adj, _ = weighted_bonferroni(
                [r.test for r in two], np.array([r.pvalue for r in two]), TEACHER_WEIGHTS
            )
            hit(f"family_2s_m{m}", bool((p_adj <= ALPHA).any()))
    return {k: v / reps for k, v in hits.items()}


def _check_ref_mult_power(rates: dict[str, float]) -> None:
    m = RECOMMENDED_REF_MULT
    assert rates["directed_z_1s_exact"] - rates[f"directed_z_2s_m{m}"] <= 0.10, rates
    assert rates[f"directed_z_2s_m{m}"] > rates["directed_z_2s_m1"], rates


@pytest.mark.slow
def test_power_by_reference_multiplier_slow() -> None:
    """ε = 0.05, 500 candidate sequences × 8 tokens, 200 replications (fixed seeds), σ = 0.05
    teacher: with a reference arm of m = 4 × the candidate's sequences the two-sample directed
    z's power is within 0.10 of the exact one-sample directed z's (the z-test variance factor
    is 1 + 1/m: 2 at m = 1, 1.25 at m = 4), and above its power at m = 1. m = 1, 2, 4 here,
    with the sweep's draws (the same rates); the sweep's m = 8, whose statistics cost half of
    it, is opt-in below. False-failure rate: deterministic at these seeds (gap 0.79 − 0.75 =
    0.04, results/LOG.md h65); over fresh draws it is not small: both powers are estimated on
    the same candidate sequences (sd of the difference ≲ 0.03), the expected gap is ~0.08 (the
    variance factor 1.25 at a one-sided power of 0.79), and another draw of these seeds (the
    reference arm drawn at 4 × instead of 8 ×) gave 0.79 − 0.69 = 0.10, at the margin."""
    rates = power_by_ref_mult(200, 500, 0.05, 100, SIGMA, mults=REF_MULTS[:3])
    print(rates)
    _check_ref_mult_power(rates)


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("SPECTEST_POWER") != "1",
    reason="opt-in (156 CPU s, 14 min at load 8): SPECTEST_POWER=1 pytest -m slow -k mult_sweep",
)
def test_power_by_ref_mult_sweep_slow() -> None:
    """The sweep of ``test_power_by_reference_multiplier_slow`` over m = 1, 2, 4, 8 (nested
    reference arms of 8 × 500 sequences; its checks, the same seeds): the powers it prints are
    results/LOG.md's (h65, session 9)."""
    rates = power_by_ref_mult(200, 500, 0.05, 100, SIGMA)
    print(rates)
    _check_ref_mult_power(rates)


@pytest.mark.slow
def test_null_false_alarms_with_a_larger_reference_slow() -> None:
    """H0, reference arm 4 × the candidate's sequences (``RECOMMENDED_REF_MULT``), 200 null
    replications of 2 cells × 100 candidate sequences × 8 tokens, bf16-sized teacher noise
    (fixed seeds): every teacher-mode test and both families (two-sample, control) reject at a
    rate ≤ α + 3σ (false-failure rate ≈ 0.3 % per check); the permutation tests relabel whole
    sequences within cells keeping the unequal sizes, so they stay exact."""
    rates = null_rates(200, 100, 0, ref_mult=RECOMMENDED_REF_MULT)
    print(rates)
    for test in ("support_2s", "support_2s_no_margin", "pit_ks_2s", "pit_ad_2s", "directed_z_2s"):
        assert _within_or_below(round(rates[test] * 200), 200), (test, rates)
    assert _within_or_below(round(rates["family_two_sample"] * 200), 200), rates
    assert _within_or_below(round(rates["family_control"] * 200), 200), rates


# --------------------------------------------- beside a floor arm: teacher mode sees numerics
def test_teacher_mode_rejection_of_numerics_alone_is_not_exact() -> None:
    """Teacher mode compares the two arms' tokens through one teacher: a two-sample test of the
    arms' laws, which differ when only the engines' numerics do. A correct sampler (plain decode)
    on logits moved by σ = 0.3 against the reference's engine is rejected here — and the
    rejection must not count as exact (``FamilyResult.exact_rejected``): beside a floor arm it is
    numerics for claim (b) to size, as a black-box rejection is. Exact mode's one-sample tests
    on each arm's own law stay exact. Deterministic (fixed seeds); the rejection is checked, so
    this cannot pass with an untested family."""
    w = world(11)
    moved = world(11, sigma=0.3).teacher  # the candidate's engine: the same logits + σ = 0.3
    rng = np.random.default_rng(5)
    tok = {
        "reference": sample_plain(w.engine, 1500, T, rng),
        "candidate": sample_plain(moved, 1500, T, rng),
    }
    arms = {("p", "c", a): t for a, t in tok.items()}
    extra = {("p", "c", a): columns(w.engine, t) for a, t in tok.items()}  # one teacher
    opts = AnalysisOptions(null_permutations=50, whitebox_mode="teacher")
    res = analyze(
        samples_frame(arms, extra),
        reference="reference",
        candidate="candidate",
        rng_seed=1,
        options=opts,
    )
    fam = res.families["whitebox"]
    assert fam.rejected and not fam.exact_rejected
