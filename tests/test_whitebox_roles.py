"""White-box tests by token role (issue 22): the role columns the speculative loop's observer
records (``teacher.role_columns`` against its slow reference, on dense and shortlist laws and
one-hot q), the e-value reuse test and the per-slot acceptance χ², and, on real speculative runs
of a toy LM pair, that the exact sampler's role strata are uniform while each role-confined
mutant is caught by the stratum it lives in.

False-failure rates: the H0 checks use fixed seeds and thresholds of 1e-3 per test (10 tests
per arm and drafter: ≤ 1 % under H0 by the union bound, and deterministic given the seeds); the
mutant checks ask for p ≤ 1e-4 where the measured p is far below (at these seeds).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from spectest import schema
from spectest.engines.base import DecodeRequest
from spectest.engines.builtin import DrafterSpec, RowSpec, speculative_decode
from spectest.engines.teacher import ROLE_CODES, role_columns, role_reference
from spectest.models.toy import ToyLM
from spectest.sampling.laws import DenseLaw, ShortlistLaw, onehot_law
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams
from spectest.stats import whitebox, whitebox_roles


def _random_law(g: torch.Generator, N: int, V: int, zeros: float) -> torch.Tensor:
    w = torch.rand(N, V, generator=g, dtype=torch.float64)
    w = torch.where(torch.rand(N, V, generator=g, dtype=torch.float64) < zeros, 0.0, w)
    w[:, 0] += 1e-3  # never an empty row
    return w / w.sum(-1, keepdim=True)


@pytest.mark.parametrize("q_kind", ["dense", "onehot", "none"])
@pytest.mark.parametrize("shortlist", [False, True], ids=["dense_p", "shortlist_p"])
def test_role_columns_equal_the_slow_reference(q_kind: str, shortlist: bool) -> None:
    """Every role, ratios in (0, 1], 1 and NaN, tokens on and off p's support, ties (equal p
    and q: empty residual → p): ``role_columns`` equals ``role_reference`` to 1e-12 (exact
    booleans)."""
    g = torch.Generator().manual_seed(7)
    N, V = 400, 7
    p = _random_law(g, N, V, zeros=0.3)
    q = _random_law(g, N, V, zeros=0.3)
    q[:5] = p[:5]  # empty residual rows
    x = torch.randint(0, V, (N,), generator=g)
    role = torch.randint(0, 4, (N,), generator=g)
    ratio = torch.rand(N, generator=g, dtype=torch.float64)
    ratio[::7] = 1.0
    ratio = torch.where(role == ROLE_CODES["accepted"], float("nan"), ratio)
    if q_kind == "onehot":
        drafted = torch.randint(0, V, (N,), generator=g)
        q_law = onehot_law(drafted, V)
        q_dense = q_law.dense()
    elif q_kind == "dense":
        q_law, q_dense = DenseLaw(q), q
    else:
        q_law, q_dense = None, None
    if shortlist:
        keep = p > 0
        W = int(keep.sum(-1).max())
        ids = torch.full((N, W), 0, dtype=torch.int64)
        probs = torch.zeros(N, W, dtype=torch.float64)
        for i in range(N):
            k = torch.nonzero(keep[i])[:, 0]
            rest = [v for v in range(V) if v not in k.tolist()][: W - len(k)]
            pad = torch.tensor(rest, dtype=torch.int64)
            row = torch.sort(torch.cat([k, pad]))[0]
            ids[i], probs[i] = row, p[i, row]
        p_law = ShortlistLaw(ids, probs, V)
    else:
        p_law = DenseLaw(p)
    got = role_columns(p_law, q_law, x, role, ratio)
    for i in range(N):
        want = role_reference(
            p[i].tolist(),
            None if q_dense is None else q_dense[i].tolist(),
            int(x[i]),
            schema.ROLES[int(role[i])],
            float(ratio[i]),
        )
        for c in (schema.WB_ROLE_P, schema.WB_ROLE_CDF_LO, schema.WB_ROLE_TAIL):
            g_v, w_v = float(got[c][i]), float(want[c])
            assert (math.isnan(g_v) and math.isnan(w_v)) or abs(g_v - w_v) < 1e-12, (c, i)
        assert bool(got[schema.WB_ROLE_BEYOND][i]) == bool(want[schema.WB_ROLE_BEYOND]), i


def test_reuse_test_is_an_e_value() -> None:
    """None beyond: p = 1/Π(1 + π) (≈ P(none) = Π(1 − π) to second order); one beyond
    multiplies E by its π (here p goes from 0.008 to 0.16); the Monte-Carlo false-alarm rate
    at α = 0.05 stays under α."""
    pi = np.full(100, 0.05)
    r = whitebox_roles.reuse_test(np.zeros(100, dtype=bool), pi)
    assert math.isclose(r.pvalue, 1.0 / np.prod(1.05 * np.ones(100)), rel_tol=1e-12)
    assert r.observed == 0 and math.isclose(r.expected, 5.0)
    b = np.zeros(100, dtype=bool)
    b[0] = True
    one = whitebox_roles.reuse_test(b, pi)
    assert math.isclose(one.pvalue, 1.0 / (1.05**99 * 0.05), rel_tol=1e-12) and one.observed == 1
    rng = np.random.default_rng(3)
    pis = rng.uniform(0, 0.2, size=(4000, 60))
    hits = sum(
        whitebox_roles.reuse_test(rng.random(60) < row, row).pvalue <= 0.05 for row in pis
    )  # binomial(4000, ≤ 0.05): ≤ 240 has probability > 0.999
    assert hits <= 240, hits


def test_acceptance_by_slot_sees_a_late_slot_bug() -> None:
    """Slot 2 accepted always where the overlap is 0.5: the pooled z is diluted, the χ² over
    slots is not; equal rates give a χ² p well away from 0."""
    rows, samples = [], []
    rng = np.random.default_rng(0)
    for seed in range(400):
        acc_n = 0
        while acc_n < 2 and rng.random() < 0.5:
            acc_n += 1
        if acc_n == 2:
            acc_n = 3  # slot 2 (overlap 0.5) always accepted: the bug
        rows.append(("p", "c", "cand", seed, 0, 0, 3, acc_n, acc_n + 1))
        for t in range(4):
            samples.append(("p", "c", "cand", seed, t, 0, 0.5))
    rounds = pd.DataFrame(
        rows,
        columns=[schema.PROMPT_ID, schema.CONFIG_ID, schema.ARM, schema.SEED, "round",
                 schema.POSITION, "drafted", "accepted", "emitted"],
    )  # fmt: skip
    s = pd.DataFrame(
        samples,
        columns=[schema.PROMPT_ID, schema.CONFIG_ID, schema.ARM, schema.SEED, schema.POSITION,
                 schema.TOKEN_ID, schema.WB_OVERLAP],
    )  # fmt: skip
    by_slot = whitebox.acceptance_by_slot(rounds, s, "cand")
    assert by_slot.dof == 3 and by_slot.pvalue < 1e-6
    assert by_slot.observed_rate[2] == 1.0


# ----------------------------------------------------------------------------- real runs
PARAMS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.9, top_k=6)]
N_SEEDS = 300
T_POS = 12


def _role_frame(variant: str, onehot: bool) -> pd.DataFrame:
    target = ToyLM(10, 3, 1.5, seed=4)
    draft = target.perturbed(0.8, seed=5)
    rows = [RowSpec(f"c{i}", s, p) for s in range(N_SEEDS) for i, p in enumerate(PARAMS)]
    out = speculative_decode(
        target,
        draft,
        DecodeRequest(
            [1, 2, 3],
            rows,
            whitebox=True,
            num_positions=T_POS,
            run_key=22,
            prompt_id="p",
            batch_size=len(rows),
        ),
        drafter=DrafterSpec(onehot=onehot, k=3),
        variant=get_variant(variant),
    )
    assert out.whitebox is not None
    return out.whitebox


def _role_pvalues(frame: pd.DataFrame) -> dict[str, float]:
    got = {}
    for r in whitebox_roles.role_pit_tests(frame, np.random.default_rng(1)):
        got[f"role_pit_{r.role}"] = r.uniformity.pvalue
        if r.reuse is not None:
            got[f"reuse_{r.role}"] = r.reuse.pvalue
    return got


@pytest.mark.parametrize("onehot", [False, True], ids=["sampled", "onehot"])
def test_exact_sampler_strata_are_uniform_and_role_mutants_are_caught(onehot: bool) -> None:
    ok = _role_pvalues(_role_frame("exact", onehot))
    assert set(ok) == {
        "role_pit_accepted", "role_pit_recovered", "role_pit_bonus", "reuse_recovered",
        "reuse_bonus",
    }  # fmt: skip
    assert min(ok.values()) > 1e-3, ok
    caught = {
        "bonus_reuse_accept_uniform": "reuse_bonus",
        "reuse_accept_uniform": "reuse_recovered",
        "residual_from_p": "role_pit_recovered",
    }
    for mutant, test in caught.items():
        got = _role_pvalues(_role_frame(mutant, onehot))
        assert got[test] <= 1e-4, (mutant, got)


def test_role_split_is_fixed_and_only_used_with_role_tests() -> None:
    """The role split sums to 1, every share ≥ 0.05, the pooled tests keep 0.70 and AD the
    largest share; an arm without role tests keeps the pooled split of before (identity)."""
    w = whitebox.WHITEBOX_ROLE_WEIGHTS
    assert sum(w.values()) == pytest.approx(1.0) and min(w.values()) >= 0.05
    pooled = sum(v for t, v in w.items() if t in whitebox.WHITEBOX_WEIGHTS)
    assert pooled == pytest.approx(0.70) and max(w, key=w.__getitem__) == "pit_ad"
    assert set(whitebox.ROLE_WEIGHTS) | set(whitebox.WHITEBOX_WEIGHTS) == set(w)
    plain = ["directed_z", "pit_ks", "pit_cvm", "pit_ad", "acceptance"]
    assert whitebox.exact_weights(plain) is whitebox.WHITEBOX_WEIGHTS
    assert whitebox.exact_weights([*plain, "reuse_bonus"]) is w


def test_role_columns_are_checked_like_the_whitebox_columns() -> None:
    """``validate_roles`` refuses a role outside ``schema.ROLES``, a probability outside [0, 1]
    and wb_role_cdf_lo + wb_role_p > 1, naming the column and the value (the same checker as
    ``whitebox.validate_whitebox``); NaN is "not recorded" and passes. Exact, no randomness."""
    from spectest.errors import InputError

    good = pd.DataFrame(  # every role column (``schema.ROLE_COLUMNS``)
        {
            schema.WB_ROLE: ["accepted", None],
            schema.WB_SLOT: [0, -1],
            schema.WB_ROLE_P: [0.25, float("nan")],
            schema.WB_ROLE_CDF_LO: [0.5, float("nan")],
            schema.WB_ROLE_RATIO: [1.0, float("nan")],
            schema.WB_ROLE_BEYOND: [0.0, float("nan")],
            schema.WB_ROLE_TAIL: [0.0, float("nan")],
        }
    )
    assert whitebox_roles.validate_roles(good)
    assert not whitebox_roles.validate_roles(good.drop(columns=[schema.WB_ROLE_TAIL]))
    with pytest.raises(InputError, match=r"'wb_role'.*'nonsense'"):
        whitebox_roles.validate_roles(good.assign(**{schema.WB_ROLE: ["nonsense", None]}))
    with pytest.raises(InputError, match=r"'wb_role_ratio'.*1\.5"):
        whitebox_roles.validate_roles(good.assign(**{schema.WB_ROLE_RATIO: [1.5, 0.0]}))
    with pytest.raises(InputError, match=r"wb_role_cdf_lo \+ wb_role_p must be <= 1, got .*1\.25"):
        whitebox_roles.validate_roles(good.assign(**{schema.WB_ROLE_CDF_LO: [1.0, 0.0]}))
