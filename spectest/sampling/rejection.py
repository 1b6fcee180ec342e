"""The chain rejection sampler (arXiv 2211.17192, Algorithm 1; arXiv 2302.01318): one round as a
pure function of laws, drafted tokens and uniforms, its building blocks (which the mutants
recombine) and a slow per-row reference. Knows nothing about models, caches or uniforms' origin.
Why and details: docs/internals.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from spectest.errors import InputError
from spectest.sampling.draw import categorical_reference
from spectest.sampling.laws import Law, as_law, onehot_law
from spectest.schema import PLACEHOLDER_TOKEN_ID


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


SampleFn = Callable[..., RoundResult]  # ``rejection_sample``'s signature (``round_sampler``)


@dataclass(frozen=True)
class RoundInputs:
    """One round's arguments (``rejection_sample``'s), for a sampler written on them."""

    tp: torch.Tensor  # target_probs
    dp: torch.Tensor | None  # draft_probs
    dt: torch.Tensor  # draft_tokens
    ua: torch.Tensor  # u_accept
    uf: torch.Tensor  # u_final
    draft_lens: torch.Tensor | None


R = TypeVar("R", bound=RoundInputs)


def round_sampler(body: Callable[[R], RoundResult], inputs: type[R]) -> SampleFn:
    """A round sampler with ``rejection_sample``'s signature running ``body`` on ``inputs``."""

    def sample(
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor | None,
        draft_tokens: torch.Tensor,
        u_accept: torch.Tensor,
        u_final: torch.Tensor,
        *,
        draft_lens: torch.Tensor | None = None,
    ) -> RoundResult:
        return body(inputs(target_probs, draft_probs, draft_tokens, u_accept, u_final, draft_lens))

    return sample


# ----------------------------------------------------------------------------- the sampler


def rejection_sample(
    target_probs: torch.Tensor | Law,
    draft_probs: torch.Tensor | Law | None,
    draft_tokens: torch.Tensor,
    u_accept: torch.Tensor,
    u_final: torch.Tensor,
    *,
    draft_lens: torch.Tensor | None = None,
    check: bool = True,
    accept_scale: float = 1.0,
) -> RoundResult:
    """One round of chain speculative sampling (arXiv 2211.17192, Algorithm 1), vectorised.

    Parameters
    ----------
    target_probs : the target's law at each drafted position and after: float64 ``[B, K+1, V]``
        or a ``Law`` ``[B, K+1, *]`` (e.g. a ``ShortlistLaw``, never densified).
    draft_probs : the law each draft token was drawn from, float64 ``[B, K, V]`` or a ``Law``
        ``[B, K, *]``; ``None`` for a one-hot (greedy) drafter (q = δ(x)).
    draft_tokens : int64 ``[B, K]`` (entries past ``draft_lens`` are ignored).
    u_accept : float64 ``[B, K]`` and u_final : float64 ``[B]``, uniforms in (0, 1).
    draft_lens : int64 ``[B]`` in ``[0, K]`` (ragged rows); ``None`` = all ``K``.
    check : validate ranges (one host sync).
    accept_scale : accept ``x_j`` iff ``u_j <= accept_scale · p_j(x_j) / q_j(x_j)``; 1 is the
        exact sampler, ``1 + ε`` the ε tooth's biased acceptor (``mutants``: ``eps_biased``, whose
        dense form is ``mutant_rounds.sample_eps``), the residual unchanged.

    Notes
    -----
    The emitted tokens have exactly the law of plain sampling from the target (arXiv 2211.17192,
    Appendix A.1), on dense and shortlist laws alike (tests/test_rejection_exact.py: exact
    quadrature, the reference, the shortlist form).
    """
    p, q = as_law(target_probs), None if draft_probs is None else as_law(draft_probs)
    lens = check_round_inputs(p, q, draft_tokens, u_accept, u_final, draft_lens, check)
    p_x, q_x, in_draft = drafted_probs(p, q, draft_tokens, lens)  # [B, K] each
    accepted_mask = acceptance_mask(p_x, q_x, u_accept, in_draft, accept_scale)  # [B, K]
    num_accepted = accepted_prefix_len(accepted_mask)  # [B] the chain stops at the first rejection
    final_p = final_law(p, q, draft_tokens, num_accepted, lens)  # [B, *] residual or p (bonus)
    final = final_p.draw(u_final, check=check)  # [B] recovered or bonus token
    return assemble_round(draft_tokens, num_accepted, final, accepted_mask)


# ----------------------------------------------------------------------------- building blocks


def check_round_inputs(
    target_probs: torch.Tensor | Law,
    draft_probs: torch.Tensor | Law | None,
    draft_tokens: torch.Tensor,
    u_accept: torch.Tensor,
    u_final: torch.Tensor,
    draft_lens: torch.Tensor | None,
    check: bool = True,
) -> torch.Tensor:
    """Assert shapes and dtypes; with ``check``, validate values. Returns ``draft_lens`` ``[B]``."""
    p, q = as_law(target_probs), None if draft_probs is None else as_law(draft_probs)
    assert p.probs.dim() == 3 and p.probs.dtype == torch.float64, p.probs.dtype
    B, K1, V = int(p.probs.shape[0]), int(p.probs.shape[1]), p.vocab_size
    K = K1 - 1
    assert K >= 0 and draft_tokens.shape == (B, K) and draft_tokens.dtype == torch.int64
    if q is not None:
        assert q.probs.shape[:2] == (B, K) and q.probs.dtype == torch.float64
        assert q.vocab_size == V, (q.vocab_size, V)
    assert u_accept.shape == (B, K) and u_accept.dtype == torch.float64
    assert u_final.shape == (B,) and u_final.dtype == torch.float64
    if draft_lens is None:
        lens = torch.full((B,), K, dtype=torch.int64, device=p.probs.device)  # [B]
    else:
        assert draft_lens.shape == (B,) and draft_lens.dtype == torch.int64
        lens = draft_lens
    if check:
        _check_round_values(p, q, draft_tokens, u_accept, lens)
    return lens


def _check_round_values(
    p: Law, q: Law | None, draft_tokens: torch.Tensor, u_accept: torch.Tensor, lens: torch.Tensor
) -> None:
    """``InputError`` naming the first bad input, its row and value (one host sync)."""
    K, V = int(draft_tokens.shape[1]), p.vocab_size
    in_draft = torch.arange(K, device=lens.device)[None, :] < lens[:, None]  # [B, K]
    bad_tok = in_draft & ((draft_tokens < 0) | (draft_tokens >= V))  # [B, K]
    bad_u = in_draft & ~((u_accept > 0) & (u_accept < 1))  # [B, K]
    checks = [
        ("draft_lens", lens[:, None], (lens < 0) | (lens > K)),
        ("draft_tokens", draft_tokens, bad_tok.any(-1)),
        ("u_accept", u_accept, bad_u.any(-1)),
        ("target_probs", p.probs.flatten(1), (p.probs < 0).flatten(1).any(-1)),
    ]
    if q is not None:
        checks.append(("draft_probs", q.probs.flatten(1), (q.probs < 0).flatten(1).any(-1)))
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


def drafted_probs(
    target_probs: torch.Tensor | Law,
    draft_probs: torch.Tensor | Law | None,
    draft_tokens: torch.Tensor,
    lens: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(p_j(x_j), q_j(x_j), in_draft)``, each ``[B, K]``; ``q = 1`` for a one-hot drafter."""
    K = int(draft_tokens.shape[1])
    in_draft = torch.arange(K, device=lens.device)[None, :] < lens[:, None]  # [B, K]
    tok = torch.where(in_draft, draft_tokens, 0)[..., None]  # [B, K, 1] padding read as id 0
    p_x = as_law(target_probs).slots(0, K).prob_of(tok).squeeze(-1)  # [B, K]
    if draft_probs is None:
        q_x = torch.ones_like(p_x)  # [B, K] q = δ(x): q(x) = 1
    else:
        q_x = as_law(draft_probs).prob_of(tok).squeeze(-1)  # [B, K]
    return p_x, q_x, in_draft


def acceptance_mask(
    p_x: torch.Tensor,
    q_x: torch.Tensor,
    u_accept: torch.Tensor,
    in_draft: torch.Tensor,
    scale: float = 1.0,
) -> torch.Tensor:
    """``[B, K]`` bool: ``u_j <= p_j(x_j) / q_j(x_j)`` (times ``scale`` unless 1) at each drafted
    position (even past a stop); ``p = 0`` is never accepted, ``q(x) = 0 < p(x)`` always is
    (docs/internals.md "spectest/sampling/rejection.py")."""
    # [B, K]: +inf where q = 0 < p; NaN where p = q = 0 (NaN comparisons are False)
    ratio = p_x / q_x if scale == 1.0 else scale * (p_x / q_x)
    return in_draft & (p_x > 0) & (u_accept <= ratio)


def accepted_prefix_len(accepted_mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` int64: the number of leading accepted positions (the chain stops at a rejection)."""
    return accepted_mask.to(torch.int64).cumprod(-1).sum(-1)


def final_law(
    target_probs: torch.Tensor | Law,
    draft_probs: torch.Tensor | Law | None,
    draft_tokens: torch.Tensor,
    num_accepted: torch.Tensor,
    lens: torch.Tensor,
) -> Law:
    """``[B, *]`` unnormalised law of the final token: the residual ``max(0, p_j - q_j)`` at the
    first rejection ``j = num_accepted`` (recovered), or ``p`` at index ``lens`` (bonus); an
    empty residual falls back to ``p`` (docs/internals.md "spectest/sampling/rejection.py").
    """
    p = as_law(target_probs)
    B, K = (int(s) for s in draft_tokens.shape)
    p_stop = p.pick(num_accepted)  # [B, *] target at the stop (index lens = bonus)
    if K == 0:
        return p_stop
    rows = torch.arange(B, device=draft_tokens.device)  # [B]
    j = num_accepted.clamp(max=K - 1)  # [B] the rejected position (clamped for bonus rows)
    if draft_probs is None:
        x = draft_tokens[rows, j].clamp(0, p.vocab_size - 1)  # [B]
        q_stop: Law = onehot_law(x, p.vocab_size)  # [B, 1] δ(x)
    else:
        q_stop = as_law(draft_probs).pick(j)  # [B, *]
    return p_stop.residual_with(q_stop, where=num_accepted < lens)  # rejected rows: residual


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


# ----------------------------------------------------------------------------- reference


def _reference_round(r: RoundInputs) -> RoundResult:
    """Slow, obviously-correct per-row Python loop of Algorithm 1 (same uniforms, same result)."""
    B, K1, V = (int(s) for s in r.tp.shape)
    K = K1 - 1
    P = r.tp.tolist()
    Q = r.dp.tolist() if r.dp is not None else None
    X, UA, UF = r.dt.tolist(), r.ua.tolist(), r.uf.tolist()
    lens = r.draft_lens.tolist() if r.draft_lens is not None else [K] * B
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
    dev = r.tp.device
    acc_mask = torch.tensor(mask, dtype=torch.bool, device=dev).reshape(B, K)
    num_accepted = torch.tensor(n_acc, dtype=torch.int64, device=dev)
    return RoundResult(
        torch.tensor(emitted, dtype=torch.int64, device=dev).reshape(B, K + 1),
        num_accepted + 1,
        num_accepted,
        AcceptanceTelemetry(acc_mask, acc_mask.sum(-1)),
    )


rejection_sample_reference = round_sampler(_reference_round, RoundInputs)
