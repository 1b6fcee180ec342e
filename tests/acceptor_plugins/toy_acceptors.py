"""Acceptor plug-ins for tests/test_acceptor.py: a correct chain verifier in the FlashInfer 0.2
shape (``accept``), five buggy ones that return well-formed tensors (each a real bug class,
docs/bugs.md / the mutant catalogue), a correct one that draws its own randomness, and malformed
ones that break the contract. Loaded by path
(``acceptor:tests/acceptor_plugins/toy_acceptors.py:NAME``), as a user's file would be."""

from __future__ import annotations

import torch


def _final(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse CDF: ``[B, V]`` non-negative weights, ``[B]`` uniforms → ``[B]`` token ids."""
    cdf = weights.double().cumsum(1)  # [B, V]
    x = (u.double() * cdf[:, -1])[:, None]  # [B, 1]
    return torch.searchsorted(cdf, x, right=True)[:, 0].clamp_max(weights.shape[1] - 1)


def _chain(draft_probs, draft_token_ids, uniforms, target_probs, *, bug: str = "", gen=None):
    B, K = draft_token_ids.shape
    dev = draft_token_ids.device
    rows = torch.arange(B, device=dev)
    x = draft_token_ids[..., None]  # [B, K, 1]
    p = target_probs[:, :K].gather(2, x)[..., 0]  # [B, K] p_j(x_j)
    q = draft_probs.gather(2, x)[..., 0]  # [B, K] q_j(x_j)
    u_acc = uniforms[:, :K] if gen is None else torch.rand(B, K, generator=gen, device=dev)
    ok = (p > 0) & (u_acc * q <= p)  # [B, K] accept iff u <= p / q
    if bug == "always_accept":
        ok = torch.ones_like(ok)
    accepted = ok.long().sum(1)  # [B] telemetry: counts acceptances past a rejection
    emitted = ok.long().cumprod(1).sum(1)  # [B] accepted before the first rejection
    if bug == "commit_on_telemetry":  # seed 001: FlashInfer's counter used as the commit signal
        emitted = accepted
    q_pad = torch.cat([draft_probs, torch.zeros_like(draft_probs[:, :1])], 1)  # [B, K+1, V]
    pj, qj = target_probs[rows, emitted], q_pad[rows, emitted]  # [B, V] each
    w = pj if bug == "residual_from_p" else (pj - qj).clamp_min(0)  # residual max(p - q, 0)
    w = torch.where(w.sum(1, keepdim=True) > 0, w, pj)
    u_fin = uniforms[:, K] if gen is None else torch.rand(B, generator=gen, device=dev)
    if bug == "reuse_accept_uniform":  # the coin that rejected x_j also draws the recovered token
        u_fin = uniforms[rows, emitted]
    if bug == "bonus_reuse_uniform" and K > 0:  # issue 22: the bonus drawn with the last coin
        u_fin = torch.where(emitted == K, uniforms[:, K - 1], u_fin)
    final = _final(w, u_fin)
    pos = torch.arange(K + 1, device=dev)[None, :]  # [1, K+1]
    drafts = torch.cat([draft_token_ids, draft_token_ids[:, :1]], 1)  # [B, K+1]
    out = torch.where(pos < emitted[:, None], drafts, -1)
    out = torch.where(pos == emitted[:, None], final[:, None], out)
    return out, accepted, emitted


def accept(draft_probs, draft_token_ids, uniforms, target_probs):
    """Correct: Leviathan et al. 2023's chain verification."""
    return _chain(draft_probs, draft_token_ids, uniforms, target_probs)


def commit_on_telemetry(draft_probs, draft_token_ids, uniforms, target_probs):
    return _chain(draft_probs, draft_token_ids, uniforms, target_probs, bug="commit_on_telemetry")


def residual_from_p(draft_probs, draft_token_ids, uniforms, target_probs):
    return _chain(draft_probs, draft_token_ids, uniforms, target_probs, bug="residual_from_p")


def reuse_accept_uniform(draft_probs, draft_token_ids, uniforms, target_probs):
    return _chain(draft_probs, draft_token_ids, uniforms, target_probs, bug="reuse_accept_uniform")


def bonus_reuse_uniform(draft_probs, draft_token_ids, uniforms, target_probs):
    """Exact except that a full acceptance's bonus token is drawn with the last acceptance
    uniform (given the acceptance it is U(0, p/q)): only bonus tokens are touched (issue 22)."""
    return _chain(draft_probs, draft_token_ids, uniforms, target_probs, bug="bonus_reuse_uniform")


def always_accept(draft_probs, draft_token_ids, uniforms, target_probs):
    return _chain(draft_probs, draft_token_ids, uniforms, target_probs, bug="always_accept")


def own_randomness(draft_probs, draft_token_ids, uniforms, target_probs, *, generator):
    """Correct, but draws its uniforms from the generator spectest passes."""
    return _chain(draft_probs, draft_token_ids, uniforms, target_probs, gen=generator)


own_randomness.spectest_randomness = "generator"  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- malformed returns
def int32_ids(*args):
    out, acc, emit = accept(*args)
    return out.to(torch.int32), acc, emit


def two_values(*args):
    out, _, emit = accept(*args)
    return out, emit


def emitted_past_k(*args):
    out, acc, emit = accept(*args)
    return out, acc, emit + out.shape[1]


def zero_padding(*args):
    out, acc, emit = accept(*args)
    return out.clamp_min(0), acc, emit


def altered_drafts(draft_probs, draft_token_ids, uniforms, target_probs):
    out, acc, emit = accept(draft_probs, draft_token_ids, uniforms, target_probs)
    V = target_probs.shape[-1]
    out = out.clone()
    out[:, 0] = torch.where(emit > 0, (draft_token_ids[:, 0] + 1) % V, out[:, 0])
    return out, acc, emit


def token_out_of_vocab(draft_probs, draft_token_ids, uniforms, target_probs):
    out, acc, emit = accept(draft_probs, draft_token_ids, uniforms, target_probs)
    out = out.clone()
    out[torch.arange(out.shape[0]), emit] = target_probs.shape[-1]
    return out, acc, emit


def raises(*args):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")
