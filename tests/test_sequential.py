"""Sequential testing (spectest.sequential): stage plan, spending rule, decisions — and that the
whole procedure keeps its false-alarm rate ≤ α when it is run on H0 data with real looks."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from spectest import sequential as sq
from spectest.errors import ConfigError


def test_stage_sizes_double_and_cap():
    assert sq.stage_sizes(256, 8192) == (256, 512, 1024, 2048, 4096, 8192)
    assert sq.stage_sizes(300, 1000) == (300, 600, 1000)
    assert sq.stage_sizes(256, None) == (256,) == sq.stage_sizes(256, 256)


@pytest.mark.parametrize(
    ("per_arm", "max_per_arm", "match"),
    [(256, 100, "max_per_arm: must be >= per_arm"), (0, 10, "per_arm"), (5, 2.5, "max_per_arm")],
)
def test_stage_sizes_reject_bad_input(per_arm, max_per_arm, match):
    with pytest.raises(ConfigError, match=match):
        sq.stage_sizes(per_arm, max_per_arm)


def test_look_alphas_sum_to_alpha():
    sizes = sq.stage_sizes(256, 8192)
    eq = sq.look_alphas(0.05, sizes)
    assert eq == pytest.approx([0.05 / 6] * 6) and sum(eq) == pytest.approx(0.05)
    pr = sq.look_alphas(0.05, sizes, "proportional")
    assert sum(pr) == pytest.approx(0.05) and pr[0] == pytest.approx(0.05 * 256 / 8192)
    with pytest.raises(ConfigError, match="spending"):
        sq.look_alphas(0.05, sizes, "pocock")
    with pytest.raises(ConfigError, match="increasing"):
        sq.look_alphas(0.05, (512, 256))


def test_decisions():
    sizes, alphas = (256, 512, 1024), (0.01, 0.01, 0.01)
    look = sq.decide_look(0, sizes, alphas, rejected=True, mde_tv=0.3, max_mde_tv=0.1)
    assert look.decision == sq.REJECT and look.per_arm == 256 and look.alpha_spent == 0.01
    look = sq.decide_look(1, sizes, alphas, rejected=False, mde_tv=0.09, max_mde_tv=0.1)
    assert look.decision == sq.RESOLVED and look.alpha_spent == pytest.approx(0.02)
    look = sq.decide_look(1, sizes, alphas, rejected=False, mde_tv=0.2, max_mde_tv=0.1)
    assert look.decision == sq.CONTINUE
    look = sq.decide_look(2, sizes, alphas, rejected=False, mde_tv=0.2, max_mde_tv=0.1)
    assert look.decision == sq.BUDGET
    look = sq.decide_look(1, sizes, alphas, rejected=False, mde_tv=float("nan"), max_mde_tv=0.1)
    assert look.decision == sq.CONTINUE and look.mde_tv is None
    look = sq.decide_look(1, sizes, alphas, rejected=False, mde_tv=0.01, max_mde_tv=None)
    assert look.decision == sq.CONTINUE  # no resolution asked: run to the budget
    with pytest.raises(ConfigError, match="outside"):
        sq.decide_look(3, sizes, alphas, rejected=False, mde_tv=None, max_mde_tv=None)
    path = sq.path_dict([look], sizes, "equal", 0.03)
    assert path["seeds_used_per_arm"] == 512 and path["looks"][0]["decision"] == sq.CONTINUE


def _run_sequential(rng, sizes, alphas, shift):
    """One sequential run of a two-sample z-test on cumulative data (a stand-in for analyze:
    the union bound does not depend on the test): returns the stopping look or None."""
    n_max = sizes[-1]
    a = rng.normal(0.0, 1.0, n_max)
    b = rng.normal(shift, 1.0, n_max)
    for k, n in enumerate(sizes):
        z = (b[:n].mean() - a[:n].mean()) / np.sqrt(2.0 / n)
        p = 2 * stats.norm.sf(abs(z))
        look = sq.decide_look(
            k, sizes, alphas, rejected=p <= alphas[k], mde_tv=None, max_mde_tv=None
        )
        if look.decision == sq.REJECT:
            return k
    return None


def test_overall_false_alarm_rate_is_at_most_alpha():
    """4000 H0 sequential runs with 6 looks (256 … 8192 per arm, equal spending at α = 0.05):
    false-alarm rate ≤ α + 3σ (σ = √(0.05·0.95/4000) = 0.0034). The looks share data, so the
    rate is below α (measured ≈ 0.03). Fixed seed; false-failure ≈ 0.1 %. A naive test at α at
    every look would alarm at ≈ 0.14: checked too, so the test can fail."""
    rng = np.random.default_rng(0)
    sizes = sq.stage_sizes(256, 8192)
    alphas = sq.look_alphas(0.05, sizes)
    hits = sum(_run_sequential(rng, sizes, alphas, 0.0) is not None for _ in range(4000))
    assert hits / 4000 <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 4000)
    naive = sum(
        _run_sequential(rng, sizes, (0.05,) * len(sizes), 0.0) is not None for _ in range(2000)
    )
    assert naive / 2000 > 0.08


def test_a_blatant_shift_stops_at_the_first_look():
    """Shift 0.5 sd at 256 per arm: z ≈ 8, rejected at the first look (fixed seed)."""
    rng = np.random.default_rng(1)
    sizes = sq.stage_sizes(256, 8192)
    assert _run_sequential(rng, sizes, sq.look_alphas(0.05, sizes), 0.5) == 0
