"""The SpecVariant catalogue: each mutant's exact TV from plain sampling in a canonical setting
where it is observable, exact designs at TV <= 1e-9, the documented observability rule, the ε
tooth against its closed form, and the catalogue's API.

Canonical setting (every mutant observable, for sampled and one-hot drafters): V = 5, K = 2,
T = 0.8, top_k = 4, top_p = 0.8, a Markov chain whose rows are rotations of fixed profiles, so
per-position targets differ, the drafter over-weights a token the target keeps (0 < p < q), the
draft's argmax chain has no fixed point, and the two filter orders keep 3 vs 4 tokens.
"""

from __future__ import annotations

import math

import pytest
import torch

from spectest.errors import ConfigError
from spectest.sampling.exact_law import (
    MarkovChain,
    complete_law,
    known_accept_breaks,
    marginal,
    plain_law,
    round_law,
    total_variation,
)
from spectest.sampling.mutants import VARIANT_NAMES, get_variant
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.transforms import logits_to_probs

V, K = 5, 2
CANON_PARAMS = SamplingParams(temperature=0.8, top_k=4, top_p=0.8)
EXACT_TOL = 1e-9
MUTANTS = [n for n in VARIANT_NAMES if n not in ("exact", "draft_raw_consistent")]
# A floor for "observable": 0.01 exact TV for every class (the size of shipped bugs in
# docs/bugs.md), except bf16_ratio whose bias is ~2^-9 relative by construction (docs/bugs.md:
# "small bias, needs large N"); it must still be far above the 1e-9 exactness floor.
MARGIN = {name: 0.01 for name in MUTANTS} | {"bf16_ratio": 1e-4}


def canonical_chain() -> MarkovChain:
    T = CANON_PARAMS.temperature
    target_profile = [0.3, 0.25, 0.2, 0.15, 0.1]  # post-temperature probabilities
    draft_profile = [0.5, 0.2, 0.15, 0.1, 0.05]
    A = torch.empty(V, V, dtype=torch.float64)
    D = torch.empty(V, V, dtype=torch.float64)
    for c in range(V):
        for r, off in enumerate((1, 2, 3, 4, 0)):  # after c the target prefers c+1, c+2, ...
            A[c, (c + off) % V] = T * math.log(target_profile[r])
        for r, off in enumerate((2, 4, 1, 3, 0)):  # the drafter prefers c+2 (target keeps it)
            D[c, (c + off) % V] = T * math.log(draft_profile[r])
    return MarkovChain(A, D, start=0)


def exact_tv(
    name: str,
    chain: MarkovChain,
    params: SamplingParams,
    *,
    onehot: bool,
    K: int = K,
    q_mode: str = "processed",
) -> float:
    law = round_law(
        get_variant(name),
        chain.target,
        chain.draft,
        params,
        K,
        onehot=onehot,
        q_mode=q_mode,
        extra_accept_breaks=known_accept_breaks(name),
    )
    assert math.isclose(sum(law.values()), 1.0, abs_tol=1e-12)
    plain = plain_law(chain.target, params, K + 1)
    return total_variation(complete_law(law, chain.target, params, K + 1), plain)


@pytest.mark.parametrize("onehot", [False, True], ids=["sampled", "onehot"])
@pytest.mark.parametrize("name", MUTANTS)
def test_mutant_exact_tv_exceeds_its_margin(name, onehot):
    chain = canonical_chain()
    assert get_variant(name).may_differ(CANON_PARAMS, onehot=onehot, K=K, q_mode="processed")
    assert exact_tv(name, chain, CANON_PARAMS, onehot=onehot) >= MARGIN[name]


@pytest.mark.parametrize("q_mode", ["processed", "temperature", "raw"])
@pytest.mark.parametrize("name", ["exact", "draft_raw_consistent", "eps_biased:0"])
def test_exact_designs_pass(name, q_mode):
    """Exact-but-suspicious designs have the plain law: TV <= 1e-9 (sampled and one-hot)."""
    chain = canonical_chain()
    assert get_variant(name).exact
    for onehot in (False, True):
        assert exact_tv(name, chain, CANON_PARAMS, onehot=onehot, q_mode=q_mode) <= EXACT_TOL


def test_draft_raw_consistent_changes_acceptance_not_the_law():
    """The suspicious design is visibly different (another first-draft law) yet exact."""
    chain = canonical_chain()
    prm = SamplingTensors.from_params([CANON_PARAMS])
    logits = chain.draft(())[None]
    raw, _ = get_variant("draft_raw_consistent").draft_law(
        logits, prm, onehot=False, q_mode="processed"
    )
    proc, _ = get_variant("exact").draft_law(logits, prm, onehot=False, q_mode="processed")
    assert float((raw - proc).abs().sum()) > 0.1


def test_eps_tooth_is_monotone_and_matches_the_closed_form():
    """K = 1: the first token of eps_biased has law min(q, (1+ε)p) + P(reject)·res, with
    res = max(0, p - q)/Σ max(0, p - q) (residual unchanged). Exact TV grows with ε."""
    chain = canonical_chain()
    prm = SamplingTensors.from_params([CANON_PARAMS])
    p = logits_to_probs(chain.target(())[None], prm)[0]
    q = logits_to_probs(chain.draft(())[None], prm)[0]
    for eps in (0.05, 0.1, 0.3):
        accept = torch.minimum(q, (1 + eps) * p)
        res = (p - q).clamp(min=0)
        expected = accept + (1 - accept.sum()) * res / res.sum()
        law = round_law(
            get_variant(f"eps_biased:{eps}"),
            chain.target,
            chain.draft,
            CANON_PARAMS,
            1,
            onehot=False,
            extra_accept_breaks=known_accept_breaks(f"eps_biased:{eps}"),
        )
        first = marginal(law, 0)
        assert max(abs(first.get(v, 0.0) - float(expected[v])) for v in range(V)) < 1e-12
    tvs = [
        exact_tv(f"eps_biased:{e}", chain, CANON_PARAMS, onehot=False)
        for e in (0.02, 0.05, 0.1, 0.2)
    ]
    assert 0 < tvs[0] < tvs[1] < tvs[2] < tvs[3]


GREEDY = SamplingParams(temperature=0.0)
ONLY_TOP_K = SamplingParams(temperature=0.8, top_k=3)
PLAIN_T1 = SamplingParams(temperature=1.0)


@pytest.mark.parametrize("params", [GREEDY, ONLY_TOP_K, PLAIN_T1], ids=["T0", "top_k_only", "T1"])
@pytest.mark.parametrize("name", MUTANTS)
def test_may_differ_false_means_identical(name, params):
    """Where the catalogue says a mutant cannot be seen, its exact TV is <= 1e-9 (both drafters,
    K in {1, 2}); the documented observability rule is therefore safe to plan teeth with."""
    chain = canonical_chain()
    v = get_variant(name)
    for onehot in (False, True):
        for k in (1, 2):
            if not v.may_differ(params, onehot=onehot, K=k, q_mode="processed"):
                assert exact_tv(name, chain, params, onehot=onehot, K=k) <= EXACT_TOL, (onehot, k)


def test_observability_rule_as_documented():
    """The rule is not vacuous: at T = 0 only the T-independent classes may differ; top-k alone
    hides the filter swap; T = 1 without filters hides target_unprocessed and a raw q."""
    visible_at_t0 = {"bonus_wrong_row", "always_accept", "target_unprocessed"}
    for name in MUTANTS:
        assert get_variant(name).may_differ(GREEDY, onehot=False, K=2, q_mode="processed") == (
            name in visible_at_t0
        ), name
    swap = get_variant("swapped_filter_order")
    assert not swap.may_differ(ONLY_TOP_K, onehot=False, K=2, q_mode="processed")
    assert not get_variant("target_unprocessed").may_differ(
        PLAIN_T1, onehot=True, K=2, q_mode="raw"
    )
    assert not get_variant("raw_q").may_differ(PLAIN_T1, onehot=False, K=2, q_mode="processed")
    assert not get_variant("commit_on_telemetry").may_differ(
        CANON_PARAMS, onehot=False, K=1, q_mode="raw"
    )


def test_get_variant_names_and_errors():
    for name in VARIANT_NAMES:
        v = get_variant(name)
        assert v.name.split(":")[0] == name and v.description and (v.exact or v.mirrors)
    assert get_variant("eps_biased").name == "eps_biased:0.1"
    assert get_variant(" eps_biased:0.25 ").name == "eps_biased:0.25"
    with pytest.raises(ConfigError, match=r"unknown variant 'nope'; valid: exact, eps_biased, "):
        get_variant("nope")
    with pytest.raises(ConfigError, match="ε must be a number"):
        get_variant("eps_biased:abc")
    with pytest.raises(ConfigError, match=r"ε must be finite and > -1, got -1.0"):
        get_variant("eps_biased:-1")
    with pytest.raises(ConfigError, match="'always_accept' takes no argument"):
        get_variant("always_accept:3")
    with pytest.raises(ConfigError, match="q_mode must be one of"):
        get_variant("exact").draft_law(
            torch.zeros(1, 3), SamplingTensors.from_params([PLAIN_T1]), onehot=False, q_mode="bf16"
        )


def test_hook_shapes():
    g = torch.Generator().manual_seed(0)
    B = 3
    prm = SamplingTensors.from_params([CANON_PARAMS] * B)
    for name in VARIANT_NAMES:
        v = get_variant(name)
        assert v.verify_probs(torch.randn(B, K + 1, V, generator=g), prm).shape == (B, K + 1, V)
        assert v.verify_probs(torch.randn(B, V, generator=g), prm).dtype == torch.float64
        for onehot in (False, True):
            sample_probs, q = v.draft_law(
                torch.randn(B, V, generator=g), prm, onehot=onehot, q_mode="processed"
            )
            assert sample_probs.shape == (B, V) and sample_probs.dtype == torch.float64
            assert q is None or (q.shape == (B, V) and q.dtype == torch.float64)
            if onehot and name not in ("raw_q", "onehot_softmax_q"):
                assert q is None and bool(((sample_probs == 0) | (sample_probs == 1)).all())


def test_capability_flags_name_the_exact_hooks():
    """The flags a decode loop reads instead of comparing function objects say exactly which
    hooks are the exact sampler's, for every catalogue variant (and ε = 0, the exact chain under
    another name); ``fast_variant`` swaps precisely the hooks they name for the fast pipeline's,
    so the fast pipeline runs shortlist rounds for exactly the exact chain and, since session 24,
    the ε tooth's chain at ``accept_scale`` 1 + ε (its dense mutant's equal:
    tests/test_mutants_eps.py)."""
    from spectest.sampling.rejection import rejection_sample
    from spectest.sampling.shortlist import _draft_fast, _verify_fast, fast_variant

    exact = get_variant("exact")
    assert exact.exact_verify and exact.truthful_draft and exact.round_on_shortlist
    seen = set()
    for name in [*VARIANT_NAMES, "eps_biased:0"]:
        v = get_variant(name)
        assert v.exact_verify == (v.verify_fn is exact.verify_fn), name
        assert v.truthful_draft == (v.draft_fn is exact.draft_fn), name
        chain = v.exact_verify and v.truthful_draft and v.sample_fn is rejection_sample
        scaled = v.exact_verify and v.truthful_draft and v.accept_scale != 1.0  # the ε tooth
        assert v.round_on_shortlist == (chain or scaled), name
        assert (v.accept_scale != 1.0) == (name.startswith("eps_biased") and name != "eps_biased:0")
        f = fast_variant(v)
        assert (f.verify_fn is _verify_fast) == v.exact_verify, name
        assert (f.draft_fn is _draft_fast) == v.truthful_draft, name
        assert (f.exact_verify, f.truthful_draft, f.round_on_shortlist) == (
            v.exact_verify,
            v.truthful_draft,
            v.round_on_shortlist,
        )
        seen.add((v.exact_verify, v.truthful_draft, v.round_on_shortlist))
    assert len(seen) >= 3  # the catalogue exercises each flag off
    assert get_variant("eps_biased:0").round_on_shortlist  # ε = 0 is the exact chain itself
    eps = get_variant("eps_biased:0.1")
    assert (
        eps.round_on_shortlist and eps.accept_scale == 1.1 and eps.sample_fn is not rejection_sample
    )
