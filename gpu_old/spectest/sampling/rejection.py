"""The chain rejection sampler of speculative decoding: a pure function of laws and uniforms.

Owns: one round of speculative sampling (Leviathan, Kalman, Matias 2023, arXiv 2211.17192,
Algorithm 1; Chen et al. 2023, arXiv 2302.01318) given the target's and the drafter's laws, the
drafted tokens and the uniforms; its building blocks (which the mutants recombine); and a slow
per-row reference. Knows nothing about models, caches, where the uniforms come from (see
``seeding``) or how the laws were computed (see ``transforms``).

Vocabulary (as vLLM's ``rejection_sampler.py``)
-----------------------------------------------
- *drafted*: ``x_1..x_K`` proposed by the drafter, ``x_j ~ q_j = q(. | prefix, x_<j)``;
- *accepted*: ``x_j`` is accepted iff ``u_j <= p_j(x_j) / q_j(x_j)`` and all earlier ones were;
- *recovered*: at the first rejection ``j``, a token drawn from ``norm(max(0, p_j - q_j))``; the
  round stops there;
- *bonus*: if all drafted tokens are accepted, a token drawn from ``p_{K+1}`` (index ``K``);
- *emitted*: the accepted prefix followed by the recovered or bonus token (``1..K+1`` tokens).
A one-hot (greedy) drafter has ``q_j = δ(x_j)``: accept iff ``u_j <= p_j(x_j)``, and the residual
is ``p_j`` with ``x_j`` removed — still exact (seed 001).

Every tensor is float64 (the ratio and the residual of nearly equal laws need it; see
``transforms``). The commit signal is ``num_emitted``; ``telemetry`` counts hypothetical
acceptances past the first rejection (FlashInfer's counter) and must never be committed on (seed
001, the ``commit_on_telemetry`` mutant).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spectest.errors import InputError
from spectest.sampling.draw import categorical, categorical_reference

PLACEHOLDER_TOKEN_ID = -1  # pads ``emitted`` after the last emitted token


@dataclass(frozen=True)
class AcceptanceTelemetry:
    """FlashInfer-style telemetry: counts hypothetical acceptances past the first rejection.

    NEVER commit on this: only ``RoundResult.num_emitted`` says how many tokens were emitted.
    """

    accepted_mask: torch.Tensor  # [B, K] bool: u_j <= p_j(x_j)/q_j(x_j) at every drafted position
    num_accepted_any: torch.Tensor  # [B] int64 = accepted_mask.sum(-1)


@dataclass(frozen=True)
class RoundResult:
    """The outcome of one speculative round per row."""

    emitted: torch.Tensor  # [B, K+1] int64, PLACEHOLDER_TOKEN_ID after the last emitted token
    num_emitted: torch.Tensor  # [B] int64 in [1, K+1] (the commit signal)
    num_accepted: torch.Tensor  # [B] int64 accepted-prefix length = num_emitted - 1
    telemetry: AcceptanceTelemetry


# ----------------------------------------------------------------------------- the sampler


def rejection_sample(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    u_accept: torch.Tensor,
    u_final: torch.Tensor,
    *,
    draft_lens: torch.Tensor | None = None,
    check: bool = True,
) -> RoundResult:
    """One round of chain speculative sampling (arXiv 2211.17192, Algorithm 1), vectorised.

    Parameters
    ----------
    target_probs : float64 ``[B, K+1, V]``, the target's law at each drafted position and after.
    draft_probs : float64 ``[B, K, V]`` (the law each draft token was drawn from), or ``None`` for
        a one-hot (greedy) drafter.
    draft_tokens : int64 ``[B, K]`` (entries past ``draft_lens`` are ignored).
    u_accept : float64 ``[B, K]`` and u_final : float64 ``[B]``, uniforms in (0, 1).
    draft_lens : int64 ``[B]`` in ``[0, K]`` (ragged rows); ``None`` = all ``K``.
    check : validate ranges (one host sync).

    Notes
    -----
    The emitted tokens have exactly the law of plain sampling from the target (the theorem of
    arXiv 2211.17192, Appendix A.1). Verified in tests/test_rejection_exact.py by exact
    quadrature over the uniforms (law of the emitted prefix = plain law to 1e-9, K <= 3, V = 5,
    sampled and one-hot drafters, temperature/top-k/top-p) and equal to
    ``rejection_sample_reference`` under the same uniforms.
    """
    lens = check_round_inputs(
        target_probs, draft_probs, draft_tokens, u_accept, u_final, draft_lens, check
    )
    p_x, q_x, in_draft = drafted_probs(target_probs, draft_probs, draft_tokens, lens)  # [B, K] each
    accepted_mask = acceptance_mask(p_x, q_x, u_accept, in_draft)  # [B, K] every position
    num_accepted = accepted_prefix_len(accepted_mask)  # [B] the chain stops at the first rejection
    weights = final_weights(target_probs, draft_probs, draft_tokens, num_accepted, lens)  # [B, V]
    final = categorical(weights, u_final, check=check)  # [B] recovered or bonus token
    return assemble_round(draft_tokens, num_accepted, final, accepted_mask)


# ----------------------------------------------------------------------------- building blocks


def check_round_inputs(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    u_accept: torch.Tensor,
    u_final: torch.Tensor,
    draft_lens: torch.Tensor | None,
    check: bool = True,
) -> torch.Tensor:
    """Assert shapes and dtypes; with ``check``, validate values. Returns ``draft_lens`` ``[B]``."""
    assert target_probs.dim() == 3 and target_probs.dtype == torch.float64, target_probs.dtype
    B, K1, V = (int(s) for s in target_probs.shape)
    K = K1 - 1
    assert K >= 0 and draft_tokens.shape == (B, K) and draft_tokens.dtype == torch.int64
    if draft_probs is not None:
        assert draft_probs.shape == (B, K, V) and draft_probs.dtype == torch.float64
    assert u_accept.shape == (B, K) and u_accept.dtype == torch.float64
    assert u_final.shape == (B,) and u_final.dtype == torch.float64
    if draft_lens is None:
        lens = torch.full((B,), K, dtype=torch.int64, device=target_probs.device)  # [B]
    else:
        assert draft_lens.shape == (B,) and draft_lens.dtype == torch.int64
        lens = draft_lens
    if check:
        in_draft = torch.arange(K, device=lens.device)[None, :] < lens[:, None]  # [B, K]
        bad_tok = in_draft & ((draft_tokens < 0) | (draft_tokens >= V))  # [B, K]
        bad_u = in_draft & ~((u_accept > 0) & (u_accept < 1))  # [B, K]
        checks = [
            ("draft_lens", lens[:, None], (lens < 0) | (lens > K)),
            ("draft_tokens", draft_tokens, bad_tok.any(-1)),
            ("u_accept", u_accept, bad_u.any(-1)),
            ("target_probs", target_probs.flatten(1), (target_probs < 0).flatten(1).any(-1)),
        ]
        if draft_probs is not None:
            checks.append(
                ("draft_probs", draft_probs.flatten(1), (draft_probs < 0).flatten(1).any(-1))
            )
        bad = torch.stack([c[2] for c in checks])  # [n_checks, B]
        if bool(bad.any()):
            i, row = (int(v) for v in torch.nonzero(bad)[0])
            name, values, _ = checks[i]
            col = {"draft_tokens": bad_tok, "u_accept": bad_u}.get(name)
            if col is not None:
                value = values[row, int(torch.nonzero(col[row])[0, 0])].item()
            else:
                value = values[row].min().item()
            raise InputError(
                f"rejection_sample: {name} row {row} out of range (K={K}, V={V}): {value!r}"
            )
    return lens


def drafted_probs(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    lens: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(p_j(x_j), q_j(x_j), in_draft)``, each ``[B, K]``; ``q = 1`` for a one-hot drafter."""
    K = int(draft_tokens.shape[1])
    in_draft = torch.arange(K, device=lens.device)[None, :] < lens[:, None]  # [B, K]
    tok = torch.where(in_draft, draft_tokens, 0)[..., None]  # [B, K, 1] padding read as id 0
    p_x = target_probs[:, :K].gather(-1, tok).squeeze(-1)  # [B, K]
    if draft_probs is None:
        q_x = torch.ones_like(p_x)  # [B, K] q = δ(x): q(x) = 1
    else:
        q_x = draft_probs.gather(-1, tok).squeeze(-1)  # [B, K]
    return p_x, q_x, in_draft


def acceptance_mask(
    p_x: torch.Tensor, q_x: torch.Tensor, u_accept: torch.Tensor, in_draft: torch.Tensor
) -> torch.Tensor:
    """``[B, K]`` bool: ``u_j <= p_j(x_j) / q_j(x_j)`` at each drafted position (even past a stop).

    NOTE ``p = 0`` is never accepted, whatever ``u`` (a coin of 0 with ``<=`` emitted p = 0 tokens:
    SGLang #35771, vllm-ascend #13730); ``u > 0`` makes this redundant, the guard makes it explicit.
    NOTE ``q(x) = 0 < p(x)``: IEEE gives ratio +inf → accept. A drafted token with q(x) = 0 means
    the drafter did not sample from the q it reported (a foreign or buggy drafter); no value of the
    ratio makes that round exact, and accepting keeps the target's support. Raising instead would
    abort a whole statistical run on one row; the law's deviation is what the statistics test.
    """
    # [B, K]: +inf where q = 0 < p; NaN where p = q = 0 (NaN comparisons are False)
    ratio = p_x / q_x
    return in_draft & (p_x > 0) & (u_accept <= ratio)


def accepted_prefix_len(accepted_mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` int64: the number of leading accepted positions (the chain stops at a rejection)."""
    return accepted_mask.to(torch.int64).cumprod(-1).sum(-1)


def final_weights(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    num_accepted: torch.Tensor,
    lens: torch.Tensor,
) -> torch.Tensor:
    """``[B, V]`` unnormalised law of the final token: the residual ``max(0, p_j - q_j)`` at the
    first rejection ``j = num_accepted`` (recovered), or ``p`` at index ``lens`` (bonus).

    NOTE empty residual: a rejection at ``x`` means ``p(x)/q(x) < u < 1``, so ``q(x) > p(x)`` and,
    both laws summing to 1, ``sum max(0, p - q) = sum max(0, q - p) >= q(x) - p(x) > 0`` in exact
    arithmetic. It can still be 0 in floating point (p and q equal up to rounding), or with a
    drafter whose q does not sum to 1; then the row falls back to ``p`` — the law the residual
    would have when p ≈ q, and never a token outside the target's support.
    """
    B, K1, V = (int(s) for s in target_probs.shape)
    K = K1 - 1
    rows = torch.arange(B, device=target_probs.device)  # [B]
    p_stop = target_probs[rows, num_accepted]  # [B, V] target at the stop (index lens = bonus)
    if K == 0:
        return p_stop
    j = num_accepted.clamp(max=K - 1)  # [B] the rejected position (clamped for bonus rows)
    if draft_probs is None:
        x = draft_tokens[rows, j].clamp(0, V - 1)  # [B]
        q_stop = torch.zeros_like(p_stop).scatter_(-1, x[:, None], 1.0)  # [B, V] δ(x)
    else:
        q_stop = draft_probs[rows, j]  # [B, V]
    residual = (p_stop - q_stop).clamp(min=0.0)  # [B, V]
    empty = ~(residual.sum(-1) > 0)  # [B]
    residual = torch.where(empty[:, None], p_stop, residual)
    rejected = num_accepted < lens  # [B]
    return torch.where(rejected[:, None], residual, p_stop)


def assemble_round(
    draft_tokens: torch.Tensor,
    num_accepted: torch.Tensor,
    final_token: torch.Tensor,
    accepted_mask: torch.Tensor,
) -> RoundResult:
    """Emitted = the first ``num_accepted`` drafted tokens, then ``final_token``, then padding."""
    B, K = (int(s) for s in draft_tokens.shape)
    pos = torch.arange(K + 1, device=draft_tokens.device)[None, :]  # [1, K+1]
    pad = torch.full((B, 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=draft_tokens.device)
    emitted = torch.cat([draft_tokens, pad], dim=1)  # [B, K+1]
    n = num_accepted[:, None]  # [B, 1]
    emitted = torch.where(pos < n, emitted, PLACEHOLDER_TOKEN_ID)
    emitted = torch.where(pos == n, final_token[:, None], emitted)
    telemetry = AcceptanceTelemetry(accepted_mask, accepted_mask.sum(-1))
    return RoundResult(emitted, num_accepted + 1, num_accepted, telemetry)


# ----------------------------------------------------------------------------- on candidates


def rejection_sample_candidates(
    p_ids: torch.Tensor,
    p_probs: torch.Tensor,
    q_ids: torch.Tensor | None,
    q_probs: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    u_accept: torch.Tensor,
    u_final: torch.Tensor,
    *,
    draft_lens: torch.Tensor | None = None,
    check: bool = True,
) -> RoundResult:
    """``rejection_sample`` with both laws given on candidate tokens, never densified.

    Parameters
    ----------
    p_ids, p_probs : int64 / float64 ``[B, K+1, W]``: row ``j`` of the target law is ``p_probs``
        at the (ascending, distinct) token ids ``p_ids``, zero elsewhere.
    q_ids, q_probs : ``[B, K, Wq]`` the drafter's laws the same way, or both ``None`` (one-hot).
    draft_tokens, u_accept, u_final, draft_lens : as ``rejection_sample``.
    check : validate uniforms, lengths and probabilities (one host sync over ``[B, K+1, W]``).

    Notes
    -----
    The round of ``rejection_sample`` on the dense laws (``zeros(V).scatter_(ids, probs)``): the
    same building blocks (``acceptance_mask``, ``accepted_prefix_len``, ``assemble_round``) on
    ``p(x)``, ``q(x)`` looked up at the drafted tokens (a token off a law's candidates has
    probability 0 there, as in the dense row); the final token's weights are built for the ONE
    row each sequence draws from (first rejection or bonus) on the target's candidates only —
    ``max(0, p - q)`` is 0 wherever ``p`` is, so the residual lives on ``p``'s candidates, and
    its values there are the dense residual's (the same subtraction of the same numbers); the
    empty-residual test ``sum > 0`` holds for the same rows in any summation order. The draw is
    ``categorical`` on those weights in id order: the dense draw's tokens (``CandidateLaw.draw``'s
    NOTE). Tested token-for-token (emitted, counts, telemetry) equal to ``rejection_sample`` on
    the densified laws on random inputs, one-hot drafts, p = 0 drafts, ragged rows and K = 0
    (tests/test_rejection_exact.py); the exact law itself is ``rejection_sample``'s.
    """
    assert p_ids.dim() == 3 and p_ids.shape == p_probs.shape, (p_ids.shape, p_probs.shape)
    assert p_probs.dtype == torch.float64 and p_ids.dtype == torch.int64
    B, K1, _W = (int(s) for s in p_ids.shape)
    K = K1 - 1
    assert K >= 0 and draft_tokens.shape == (B, K) and draft_tokens.dtype == torch.int64
    assert (q_ids is None) == (q_probs is None)
    if q_ids is not None and q_probs is not None:
        assert q_ids.shape[:2] == (B, K) and q_ids.shape == q_probs.shape
        assert q_probs.dtype == torch.float64
    assert u_accept.shape == (B, K) and u_final.shape == (B,)
    dev = p_ids.device
    lens = torch.full((B,), K, dtype=torch.int64, device=dev) if draft_lens is None else draft_lens
    in_draft = torch.arange(K, device=dev)[None, :] < lens[:, None]  # [B, K]
    if check:
        bad = torch.stack(
            [
                ((lens < 0) | (lens > K)).any(),
                (in_draft & ~((u_accept > 0) & (u_accept < 1))).any(),
                (p_probs < 0).any(),
                (q_probs < 0).any()
                if q_probs is not None
                else torch.zeros((), dtype=torch.bool, device=dev),
            ]
        )
        if bool(bad.any()):
            name = ["draft_lens", "u_accept", "p_probs", "q_probs"][int(torch.nonzero(bad)[0, 0])]
            raise InputError(f"rejection_sample_candidates: {name} out of range (K={K})")
    tok = torch.where(in_draft, draft_tokens, 0)  # [B, K] padding read as id 0, as the dense path
    p_x = probs_at(p_ids[:, :K], p_probs[:, :K], tok[..., None]).squeeze(-1)  # [B, K]
    if q_ids is None or q_probs is None:
        q_x = torch.ones_like(p_x)  # [B, K] q = δ(x): q(x) = 1
    else:
        q_x = probs_at(q_ids, q_probs, tok[..., None]).squeeze(-1)  # [B, K]
    accepted_mask = acceptance_mask(p_x, q_x, u_accept, in_draft)  # [B, K]
    num_accepted = accepted_prefix_len(accepted_mask)  # [B]
    rows = torch.arange(B, device=dev)  # [B]
    ids = p_ids[rows, num_accepted]  # [B, W] the target's candidates at the stop
    p_stop = p_probs[rows, num_accepted]  # [B, W]
    weights = p_stop
    if K > 0:
        j = num_accepted.clamp(max=K - 1)  # [B] the rejected position (clamped for bonus rows)
        if q_ids is None or q_probs is None:
            x = draft_tokens[rows, j]  # [B]
            q_stop = (ids == x[:, None]).to(torch.float64)  # [B, W] δ(x) at the candidates
        else:
            q_stop = probs_at(q_ids[rows, j], q_probs[rows, j], ids)  # [B, W]
        residual = (p_stop - q_stop).clamp(min=0.0)  # [B, W]
        empty = ~(residual.sum(-1) > 0)  # [B] (final_weights' NOTE: falls back to p)
        residual = torch.where(empty[:, None], p_stop, residual)
        rejected = num_accepted < lens  # [B]
        weights = torch.where(rejected[:, None], residual, p_stop)  # [B, W]
    pick = categorical(weights, u_final, check=check)  # [B] index into the candidates
    final = ids.gather(-1, pick[:, None]).squeeze(-1)  # [B] recovered or bonus token
    return assemble_round(draft_tokens, num_accepted, final, accepted_mask)


def probs_at(ids: torch.Tensor, probs: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """A candidate law's probabilities at token ids ``tok`` (0 where ``tok`` is not among
    ``ids``: the law is 0 off its candidates): ``ids``, ``probs`` ``[..., W]`` (ids ascending),
    ``tok`` ``[..., J]`` → ``[..., J]`` float64, by a batched ``searchsorted`` + equality check."""
    W = int(ids.shape[-1])
    pos = torch.searchsorted(ids.contiguous(), tok.contiguous()).clamp(max=W - 1)  # [..., J]
    hit = ids.gather(-1, pos) == tok  # [..., J]
    return torch.where(hit, probs.gather(-1, pos), 0.0)


# ----------------------------------------------------------------------------- reference


def rejection_sample_reference(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    u_accept: torch.Tensor,
    u_final: torch.Tensor,
    *,
    draft_lens: torch.Tensor | None = None,
) -> RoundResult:
    """Slow, obviously-correct per-row Python loop of Algorithm 1 (same uniforms, same result)."""
    B, K1, V = (int(s) for s in target_probs.shape)
    K = K1 - 1
    P = target_probs.tolist()
    Q = draft_probs.tolist() if draft_probs is not None else None
    X, UA, UF = draft_tokens.tolist(), u_accept.tolist(), u_final.tolist()
    lens = draft_lens.tolist() if draft_lens is not None else [K] * B
    emitted, n_acc, mask = [], [], []
    for b in range(B):
        out: list[int] = []
        row_mask = []
        for j in range(K):
            if j >= lens[b]:
                row_mask.append(False)
                continue
            x = X[b][j]
            p, q = P[b][j][x], (Q[b][j][x] if Q is not None else 1.0)
            row_mask.append(p > 0 and (q == 0 or UA[b][j] <= p / q))
        n = 0
        while n < lens[b] and row_mask[n]:
            out.append(X[b][n])
            n += 1
        if n == lens[b]:  # all accepted: bonus from the target after the last drafted token
            weights = P[b][n]
        else:  # first rejection at n: recovered token from the residual
            q_row = Q[b][n] if Q is not None else [1.0 if v == X[b][n] else 0.0 for v in range(V)]
            weights = [max(0.0, P[b][n][v] - q_row[v]) for v in range(V)]
            if not sum(weights) > 0:
                weights = P[b][n]
        out.append(categorical_reference(weights, UF[b]))
        emitted.append(out + [PLACEHOLDER_TOKEN_ID] * (K + 1 - len(out)))
        n_acc.append(n)
        mask.append(row_mask)
    dev = target_probs.device
    acc_mask = torch.tensor(mask, dtype=torch.bool, device=dev).reshape(B, K)
    num_accepted = torch.tensor(n_acc, dtype=torch.int64, device=dev)
    return RoundResult(
        torch.tensor(emitted, dtype=torch.int64, device=dev).reshape(B, K + 1),
        num_accepted + 1,
        num_accepted,
        AcceptanceTelemetry(acc_mask, acc_mask.sum(-1)),
    )
