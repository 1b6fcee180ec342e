"""The ε tooth's round on shortlist laws: ``rejection_sample(accept_scale=1 + ε)`` is the dense
mutant ``mutant_rounds.sample_eps(ε)`` (its reference) token for token, on dense and shortlist
laws alike, so ``eps_biased`` runs its rounds on the fast pipeline's shortlist
(``round_on_shortlist``) with the tokens it had on dense laws; in the fast loop its tokens, rounds
and white-box probabilities are those of the dense round. Exact comparisons on seeded inputs:
false-failure rate 0 on CPU.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from test_rejection_exact import _shortlist_laws

from spectest.engines.base import DecodeRequest, DrafterSpec, RowSpec
from spectest.engines.fast import speculative_decode_fast
from spectest.models.derive import first_layers
from spectest.models.hf import from_preset
from spectest.sampling import mutant_rounds as mr
from spectest.sampling.laws import ShortlistLaw
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams
from spectest.sampling.rejection import rejection_sample


@pytest.mark.parametrize("eps", [0.1, 0.5, -0.5, 3.0])
@pytest.mark.parametrize("onehot", [False, True], ids=["sampled", "onehot"])
def test_the_scaled_chain_sampler_is_the_eps_mutant(eps: float, onehot: bool) -> None:
    """Dense and shortlist laws on 8 of 40 tokens, drafts off q's support (q(x) = 0 < p(x):
    always accepted) and with p(x) = 0 (never), rows with q = p: emitted tokens, counts and the
    accepted mask equal the mutant's; not vacuous (the biased acceptor accepts rows the exact
    one rejects, or the other way for ε < 0)."""
    g = torch.Generator().manual_seed(int(100 * eps) + onehot)
    B, K, V, W = 800, 3, 40, 8
    p_ids, p_probs, tp = _shortlist_laws(g, B, K + 1, V, W)
    q_ids, q_probs, dp = _shortlist_laws(g, B, K, V, W)
    q_ids[:50], q_probs[:50], dp[:50] = p_ids[:50, :K], p_probs[:50, :K], tp[:50, :K]  # q = p
    if onehot:
        dt = torch.randint(0, V, (B, K), generator=g)
    else:
        dt = torch.multinomial(dp.reshape(-1, V), 1, generator=g).reshape(B, K)
        dt[50:90, 0] = torch.randint(0, V, (40,), generator=g)  # q(x) = 0 for most of these
    dt[90:130, -1] = p_ids[90:130, K - 1, 0]  # p(x) = 0 there
    p_probs[90:130, K - 1, 0] = 0.0
    tp[90:130, K - 1] = torch.zeros(40, V, dtype=torch.float64).scatter_(
        -1, p_ids[90:130, K - 1], p_probs[90:130, K - 1]
    )
    ua = torch.rand(B, K, generator=g, dtype=torch.float64)
    uf = torch.rand(B, generator=g, dtype=torch.float64)
    q_dense = None if onehot else dp
    want = mr.sample_eps(eps)(tp, q_dense, dt, ua, uf)
    p, q = ShortlistLaw(p_ids, p_probs, V), ShortlistLaw(q_ids, q_probs, V)
    for args in ((tp, q_dense), (p, None if onehot else q)):
        got = rejection_sample(*args, dt, ua, uf, accept_scale=1.0 + eps)
        assert torch.equal(got.emitted, want.emitted)
        assert torch.equal(got.num_emitted, want.num_emitted)
        assert torch.equal(got.telemetry.accepted_mask, want.telemetry.accepted_mask)
    exact = rejection_sample(tp, q_dense, dt, ua, uf)
    assert not torch.equal(exact.num_accepted, want.num_accepted)  # the bias shows


def test_the_eps_tooth_runs_on_the_shortlist_with_the_dense_rounds_tokens() -> None:
    """The fast loop (CPU, the realistic tiny pair with a logit scale, both drafters): the ε arm
    with its round on shortlist laws gives the tokens, rounds and white-box p of the same arm
    forced onto dense laws, and differs from the exact arm (so the shortlist's round is the ε
    one: without its scale this fails); the exact variant keeps a scale of 1."""
    plain = get_variant("exact")
    assert plain.accept_scale == 1.0
    eps = get_variant("eps_biased:0.5")
    assert eps.round_on_shortlist and eps.accept_scale == 1.5
    dense = dataclasses.replace(eps, round_on_shortlist=False)
    # V above the shortlist's width and every row filtered: the shortlist decides the rounds
    target = from_preset("qwen3-tiny", seed=3, logit_scale=12.0, num_hidden_layers=2,
                         vocab_size=4096)  # fmt: skip
    draft = first_layers(target, 1)
    params = [
        SamplingParams(temperature=0.8, top_p=0.95),
        SamplingParams(temperature=1.0, top_k=50),
    ]
    rows = [RowSpec(f"c{i}", s, p) for i, p in enumerate(params) for s in range(24)]
    req = DecodeRequest([1, 2, 3], rows, 12, 7, "p0", batch_size=16, whitebox=True)
    for onehot in (True, False):
        drafter = DrafterSpec(onehot=onehot, k=3, q_mode="processed")
        short = speculative_decode_fast(target, draft, req, drafter=drafter, variant=eps)
        full = speculative_decode_fast(target, draft, req, drafter=drafter, variant=dense)
        np.testing.assert_array_equal(short.tokens, full.tokens)
        assert short.rounds is not None and short.rounds.equals(full.rounds)
        assert short.whitebox is not None and full.whitebox is not None
        np.testing.assert_array_equal(short.whitebox["wb_p"], full.whitebox["wb_p"])
        np.testing.assert_allclose(
            short.whitebox["wb_cdf_lo"], full.whitebox["wb_cdf_lo"], rtol=0, atol=1e-12
        )
        exact = speculative_decode_fast(target, draft, req, drafter=drafter, variant=plain)
        assert not np.array_equal(exact.tokens, short.tokens)
