"""Exactness of the chain rejection sampler, by enumeration + exact quadrature over its uniforms
(spectest.sampling.exact_law), plus the fast path against the per-row reference and invariants.

No test here is statistical: every law is computed from the implementation exactly.
"""

from __future__ import annotations

import math

import pytest
import torch

from spectest.errors import InputError
from spectest.sampling.exact_law import (
    MarkovChain,
    complete_law,
    marginal,
    plain_law,
    round_law,
    total_variation,
)
from spectest.sampling.laws import ShortlistLaw
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.rejection import (
    PLACEHOLDER_TOKEN_ID,
    rejection_sample,
    rejection_sample_reference,
)
from spectest.sampling.transforms import logits_to_probs

EXACT = get_variant("exact")
TOL = 1e-9


def markov_chain(seed: int, V: int = 5, scale: float = 1.0, noise: float = 0.8) -> MarkovChain:
    """Random context-dependent target logits and a drafter correlated with them."""
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(V, V, generator=g, dtype=torch.float64) * scale
    D = A + torch.randn(V, V, generator=g, dtype=torch.float64) * noise
    return MarkovChain(A, D, start=0)


PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=3),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=0.8, top_k=4, top_p=0.85, min_p=0.1),
    SamplingParams(temperature=0.0),
]


def law_tv(chain: MarkovChain, params: SamplingParams, K: int, onehot: bool, q_mode: str) -> float:
    law = round_law(EXACT, chain.target, chain.draft, params, K, onehot=onehot, q_mode=q_mode)
    assert math.isclose(sum(law.values()), 1.0, abs_tol=1e-12)
    return total_variation(
        complete_law(law, chain.target, params, K + 1), plain_law(chain.target, params, K + 1)
    )


@pytest.mark.parametrize(
    "params", PARAMS, ids=lambda p: f"T{p.temperature}k{p.top_k}p{p.top_p}m{p.min_p}"
)
@pytest.mark.parametrize("onehot", [False, True], ids=["sampled", "onehot"])
def test_first_position_law_is_p(params, onehot):
    """Law of the first emitted token == p_0 to 1e-9, K = 1..3."""
    chain = markov_chain(11)
    p0 = logits_to_probs(chain.target(())[None], SamplingTensors.from_params([params]))[0].tolist()
    for K in (1, 2, 3):
        law = round_law(EXACT, chain.target, chain.draft, params, K, onehot=onehot)
        first = marginal(law, 0)
        assert max(abs(first.get(v, 0.0) - p0[v]) for v in range(5)) < TOL, (K, first, p0)


@pytest.mark.parametrize(
    "params", PARAMS, ids=lambda p: f"T{p.temperature}k{p.top_k}p{p.top_p}m{p.min_p}"
)
@pytest.mark.parametrize(
    ("onehot", "q_mode"),
    [(False, "processed"), (False, "temperature"), (False, "raw"), (True, "processed")],
    ids=["sampled-processed", "sampled-temperature", "sampled-raw", "onehot"],
)
def test_whole_emitted_prefix_has_the_plain_law(params, onehot, q_mode):
    """K = 2 and 3, V = 5, context-dependent p and q (a Markov chain, so per-position targets
    differ): the round's emitted prefix, completed by plain sampling to K + 1 tokens, has exactly
    the plain-sampling law of K + 1 tokens (TV <= 1e-9)."""
    for seed, K in ((11, 2), (12, 3)):
        assert law_tv(markov_chain(seed), params, K, onehot, q_mode) < TOL


def test_exactness_is_not_vacuous():
    """The setting above does discriminate: the round's law is not the plain law truncated, the
    acceptance is neither 0 nor 1, and a perturbed target breaks the equality."""
    chain = markov_chain(11)
    params = PARAMS[1]
    law = round_law(EXACT, chain.target, chain.draft, params, 2, onehot=False)
    lengths = {len(s) for s in law}
    assert lengths == {1, 2, 3}
    wrong = MarkovChain(
        chain.target_logits + 0.05 * torch.eye(5, dtype=torch.float64), chain.draft_logits, 0
    )
    assert (
        total_variation(
            complete_law(law, wrong.target, params, 3), plain_law(wrong.target, params, 3)
        )
        > 1e-3
    )


def test_k0_row_draws_the_bonus_from_position_0():
    chain = markov_chain(13)
    params = PARAMS[2]
    law = round_law(EXACT, chain.target, chain.draft, params, 0, onehot=False)
    p0 = logits_to_probs(chain.target(())[None], SamplingTensors.from_params([params]))[0]
    assert all(len(s) == 1 for s in law)
    assert max(abs(law.get((v,), 0.0) - float(p0[v])) for v in range(5)) < TOL


def test_full_acceptance_draws_the_bonus_from_index_k():
    """q = p at every position: all K drafted tokens are accepted; the bonus law is p_K."""
    V, K = 4, 2
    g = torch.Generator().manual_seed(5)
    tp = torch.softmax(torch.randn(1, K + 1, V, generator=g, dtype=torch.float64), -1)
    dt = torch.tensor([[1, 3]])
    u = torch.linspace(0.001, 0.999, 999, dtype=torch.float64)
    n = len(u)
    res = rejection_sample(
        tp.expand(n, -1, -1),
        tp[:, :K].expand(n, -1, -1),
        dt.expand(n, -1),
        u[:, None].expand(n, K).contiguous(),
        u,
    )
    assert bool((res.num_accepted == K).all()) and bool((res.emitted[:, :K] == dt).all())
    freq = torch.bincount(res.emitted[:, K], minlength=V).double() / n
    assert torch.allclose(freq, tp[0, K], atol=2e-3)  # a 999-point grid of u: error <= 1/999
    assert not torch.allclose(freq, tp[0, K - 1], atol=2e-3)


def test_fast_path_equals_reference():
    """Random rounds with zeros in p and q, ragged draft_lens, sampled and one-hot drafters."""
    g = torch.Generator().manual_seed(0)
    B, K, V = 600, 3, 6
    for onehot in (False, True):
        tp = torch.rand(B, K + 1, V, generator=g, dtype=torch.float64)
        tp[torch.rand(B, K + 1, V, generator=g) < 0.4] = 0.0
        tp[..., 0] += 1e-3
        tp = tp / tp.sum(-1, keepdim=True)
        dp = torch.rand(B, K, V, generator=g, dtype=torch.float64)
        dp[torch.rand(B, K, V, generator=g) < 0.4] = 0.0
        dp[..., 1] += 1e-3
        dp = dp / dp.sum(-1, keepdim=True)
        dt = torch.randint(0, V, (B, K), generator=g)
        if not onehot:  # draft tokens from q (and a few from outside q's support: q(x) = 0)
            dt = torch.multinomial(dp.reshape(-1, V), 1, generator=g).reshape(B, K)
            dt[:7, 0] = torch.where(dp[:7, 0, 5] == 0, 5, dt[:7, 0])
        ua = torch.rand(B, K, generator=g, dtype=torch.float64)
        uf = torch.rand(B, generator=g, dtype=torch.float64)
        lens = torch.randint(0, K + 1, (B,), generator=g)
        dp_arg = None if onehot else dp
        fast = rejection_sample(tp, dp_arg, dt, ua, uf, draft_lens=lens)
        ref = rejection_sample_reference(tp, dp_arg, dt, ua, uf, draft_lens=lens)
        assert torch.equal(fast.emitted, ref.emitted)
        assert torch.equal(fast.num_emitted, ref.num_emitted)
        assert torch.equal(fast.num_accepted, ref.num_accepted)
        assert torch.equal(fast.telemetry.accepted_mask, ref.telemetry.accepted_mask)
        # invariants: ids in range, inside the target's support, padding after num_emitted
        assert bool((fast.num_emitted >= 1).all()) and bool((fast.num_emitted <= lens + 1).all())
        for b in range(B):
            n = int(fast.num_emitted[b])
            row = fast.emitted[b]
            assert bool((row[n:] == PLACEHOLDER_TOKEN_ID).all())
            for j in range(n):
                assert 0 <= int(row[j]) < V and float(tp[b, j, int(row[j])]) > 0
        # determinism and batch invariance: a permuted batch gives the permuted results
        perm = torch.randperm(B, generator=g)
        again = rejection_sample(
            tp[perm],
            None if onehot else dp[perm],
            dt[perm],
            ua[perm],
            uf[perm],
            draft_lens=lens[perm],
        )
        assert torch.equal(again.emitted, fast.emitted[perm])
        one = rejection_sample(
            tp[3:4], None if onehot else dp[3:4], dt[3:4], ua[3:4], uf[3:4], draft_lens=lens[3:4]
        )
        assert torch.equal(one.emitted[0], fast.emitted[3])


def _shortlist_laws(
    g: torch.Generator, B: int, R: int, V: int, W: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``R`` laws per row on ``W`` random ascending ids of ``V``, zeros among them:
    ``(ids [B, R, W], probs [B, R, W], dense [B, R, V])``."""
    ids = torch.rand(B, R, V, generator=g).argsort(-1)[..., :W].sort(-1).values  # [B, R, W]
    probs = torch.rand(B, R, W, generator=g, dtype=torch.float64)
    probs[torch.rand(B, R, W, generator=g) < 0.3] = 0.0
    probs[..., 0] += 1e-3
    probs = probs / probs.sum(-1, keepdim=True)
    dense = torch.zeros(B, R, V, dtype=torch.float64).scatter_(-1, ids, probs)
    return ids, probs, dense


_CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    ],
)


@pytest.mark.parametrize("device", ["cpu", _CUDA])
@pytest.mark.parametrize("K", [0, 1, 3])
@pytest.mark.parametrize("onehot", [False, True], ids=["sampled", "onehot"])
def test_shortlist_round_equals_dense_round(K, onehot, device):
    """``rejection_sample`` on shortlist laws == ``rejection_sample`` on the densified laws, token
    for token (emitted, counts, telemetry) under the same uniforms (exact): random laws on 8 of 40
    tokens, drafts from q plus drafts off q's shortlist (q(x) = 0) and with p(x) = 0, rows with
    q = p (empty residual → p), ragged draft_lens, K = 0. On CUDA too (every input on the device;
    a parallel-scan rounding event could flip a draw with probability ~1e-16 per draw, so the
    exact assertion's false-failure rate is ~1e-13 for these 800 rows)."""
    g = torch.Generator().manual_seed(10 + K)
    B, V, W = 800, 40, 8
    p_ids, p_probs, tp = _shortlist_laws(g, B, K + 1, V, W)
    q_ids, q_probs, dp = _shortlist_laws(g, B, K, V, W)
    q_ids[:50], q_probs[:50], dp[:50] = p_ids[:50, :K], p_probs[:50, :K], tp[:50, :K]  # q = p
    if onehot or K == 0:
        dt = torch.randint(0, V, (B, K), generator=g)
    else:
        dt = torch.multinomial(dp.reshape(-1, V), 1, generator=g).reshape(B, K)
        dt[50:90, 0] = torch.randint(0, V, (40,), generator=g)  # q(x) = 0 for most of these
    if K:
        dt[90:130, -1] = p_ids[90:130, K - 1, 0]  # p(x) may be 0 (zeros on the shortlist)
        p_probs[90:130, K - 1, 0] = 0.0
        tp[90:130, K - 1] = torch.zeros(40, V, dtype=torch.float64).scatter_(
            -1, p_ids[90:130, K - 1], p_probs[90:130, K - 1]
        )
    ua = torch.rand(B, K, generator=g, dtype=torch.float64)
    uf = torch.rand(B, generator=g, dtype=torch.float64)
    lens = torch.randint(0, K + 1, (B,), generator=g)
    p_ids, p_probs, tp, q_ids, q_probs, dp, dt, ua, uf, lens = (
        t.to(device) for t in (p_ids, p_probs, tp, q_ids, q_probs, dp, dt, ua, uf, lens)
    )
    for draft_lens in (None, lens):
        want = rejection_sample(tp, None if onehot else dp, dt, ua, uf, draft_lens=draft_lens)
        p, q = ShortlistLaw(p_ids, p_probs, V), ShortlistLaw(q_ids, q_probs, V)
        got = rejection_sample(p, None if onehot else q, dt, ua, uf, draft_lens=draft_lens)
        assert torch.equal(got.emitted, want.emitted)
        assert torch.equal(got.num_emitted, want.num_emitted)
        assert torch.equal(got.num_accepted, want.num_accepted)
        assert torch.equal(got.telemetry.accepted_mask, want.telemetry.accepted_mask)
    if K:  # not vacuous: rejections, acceptances and bonus rows all occur
        n = want.num_accepted
        assert bool((n == 0).any()) and bool((n > 0).any()) and bool((n == lens).any())


def test_shortlist_round_rejects_bad_inputs():
    g = torch.Generator().manual_seed(0)
    p_ids, p_probs, _ = _shortlist_laws(g, 2, 2, 10, 4)
    dt, uf = torch.zeros(2, 1, dtype=torch.int64), torch.full((2,), 0.5, dtype=torch.float64)
    p = ShortlistLaw(p_ids, p_probs, 10)
    with pytest.raises(InputError, match=r"u_accept row 0 out of range \(K=1, V=10\): 0\.0"):
        rejection_sample(p, None, dt, torch.zeros(2, 1, dtype=torch.float64), uf)
    bad = ShortlistLaw(p_ids, -p_probs, 10)
    with pytest.raises(InputError, match=r"target_probs row 0 out of range"):
        rejection_sample(bad, None, dt, torch.full((2, 1), 0.5, dtype=torch.float64), uf)


def test_telemetry_counts_past_the_first_rejection():
    """p/q ratios (1, 0.2, 1) with u = 0.5: position 0 accepted, 1 rejected, 2 hypothetically
    accepted. num_accepted = 1 (commit signal 2 tokens); telemetry says 2 acceptances."""
    V = 3
    tp = torch.tensor(
        [[[0.5, 0.5, 0.0], [0.1, 0.9, 0.0], [0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]], dtype=torch.float64
    )
    dp = torch.tensor([[[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.5, 0.5, 0.0]]], dtype=torch.float64)
    dt = torch.tensor([[0, 0, 1]])
    res = rejection_sample(
        tp,
        dp,
        dt,
        torch.full((1, 3), 0.5, dtype=torch.float64),
        torch.tensor([0.3], dtype=torch.float64),
    )
    assert res.telemetry.accepted_mask.tolist() == [[True, False, True]]
    assert res.telemetry.num_accepted_any.tolist() == [2]
    assert res.num_accepted.tolist() == [1] and res.num_emitted.tolist() == [2]
    assert res.emitted.tolist() == [
        [0, 1, PLACEHOLDER_TOKEN_ID, PLACEHOLDER_TOKEN_ID]
    ]  # residual = δ(1)
    assert V == tp.shape[-1]


def test_q_zero_and_p_zero_edge_cases():
    """q(x) = 0 < p(x): ratio +inf → accepted. p(x) = 0: never accepted, even with q(x) = 0."""
    tp = torch.tensor([[[0.5, 0.5], [0.5, 0.5]]], dtype=torch.float64)
    dp = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64)
    res = rejection_sample(
        tp,
        dp,
        torch.tensor([[1]]),
        torch.full((1, 1), 0.999, dtype=torch.float64),
        torch.tensor([0.2], dtype=torch.float64),
    )
    assert res.num_accepted.tolist() == [1]
    tp0 = torch.tensor([[[1.0, 0.0], [0.5, 0.5]]], dtype=torch.float64)
    res = rejection_sample(
        tp0,
        dp,
        torch.tensor([[1]]),
        torch.full((1, 1), 1e-300, dtype=torch.float64),
        torch.tensor([0.9], dtype=torch.float64),
    )
    assert res.num_accepted.tolist() == [0] and res.emitted[0, 0].item() == 0


def test_empty_residual_falls_back_to_p():
    """A q that does not sum to 1 (q = 2p): rejection happens, max(0, p - q) = 0 → draw from p."""
    p = torch.tensor([0.25, 0.75], dtype=torch.float64)
    tp = torch.stack([p, p])[None]
    dp = (2 * p)[None, None]
    res = rejection_sample(
        tp,
        dp,
        torch.tensor([[1]]),
        torch.full((1, 1), 0.9, dtype=torch.float64),
        torch.tensor([0.1], dtype=torch.float64),
    )
    assert res.num_accepted.tolist() == [0] and res.emitted[0, 0].item() == 0
    res = rejection_sample(
        tp,
        dp,
        torch.tensor([[1]]),
        torch.full((1, 1), 0.9, dtype=torch.float64),
        torch.tensor([0.5], dtype=torch.float64),
    )
    assert res.emitted[0, 0].item() == 1


def test_bad_inputs_raise():
    tp = torch.full((2, 3, 4), 0.25, dtype=torch.float64)
    dt = torch.zeros(2, 2, dtype=torch.int64)
    ua = torch.full((2, 2), 0.5, dtype=torch.float64)
    uf = torch.full((2,), 0.5, dtype=torch.float64)
    with pytest.raises(InputError, match=r"draft_tokens row 1 out of range \(K=2, V=4\): 4"):
        rejection_sample(tp, None, torch.tensor([[0, 1], [2, 4]]), ua, uf)
    with pytest.raises(InputError, match=r"draft_lens row 0 out of range .*: 3"):
        rejection_sample(tp, None, dt, ua, uf, draft_lens=torch.tensor([3, 0]))
    with pytest.raises(InputError, match=r"u_accept row 0 out of range .*: 0\.0"):
        rejection_sample(
            tp, None, dt, torch.tensor([[0.0, 0.5], [0.5, 0.5]], dtype=torch.float64), uf
        )
    # padding past draft_lens is ignored (an out-of-range id or u there is fine)
    res = rejection_sample(
        tp,
        None,
        torch.tensor([[0, -1], [0, 9]]),
        torch.tensor([[0.5, 0.0], [0.5, 7.0]], dtype=torch.float64),
        uf,
        draft_lens=torch.tensor([1, 1]),
    )
    assert res.emitted.shape == (2, 3)
