"""Which law transformers' assisted generation really uses as q, and what acceptance it implies.

Owns: ``probe_draft_law`` (one assisted run, each round's drafted positions re-scored by teacher
forcing the draft: the law of ``teacher.Q_LAWS`` closest to the q transformers used,
``DraftLawProbe``) and ``expected_acceptance`` (per emitted position, the acceptance probability
of a draft slot there under each drafter of ``ACCEPTANCE_MODELS``). Used by the hunt's readout
(tools/hunt/hunt_readout.py) and tests/test_engine_hf.py; the findings per release:
docs/engines-hf.md "Teacher forcing".

Knows nothing about engines, files or statistics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from spectest.engines.hf.decode import generate_assisted
from spectest.engines.hf.laws import Q_LAWS, draft_law, forced_probs, next_token_logits
from spectest.errors import ConfigError, InputError
from spectest.sampling.params import SamplingParams

ACCEPTANCE_MODELS = ("processed", "processed_twice", "greedy_raw_q")


def expected_acceptance(
    target: Any,
    draft: Any,
    prompt: Sequence[int],
    params: SamplingParams,
    tokens: torch.Tensor,
    chunk: int = 256,
) -> dict[str, torch.Tensor]:
    """Per emitted position, the acceptance probability of a draft slot there under each drafter.

    ``processed``: Σ min(p, q) with q the processed draft law (the q the draft *should* use);
    ``processed_twice``: Σ min(p, q) with the warpers applied twice (5.x's assistant);
    ``greedy_raw_q``: min(1, p(x*) / q_raw(x*)), x* the argmax of the draft logits and q_raw their
    plain softmax (4.44: greedy token, q = raw softmax). Each is a function of the prefix only,
    so it is the conditional mean of the accept indicator of a slot verified there (the
    martingale behind ``stats.whitebox.acceptance_test``).

    Parameters
    ----------
    tokens : int64 ``[B, T]`` emitted tokens (one config: ``params``).

    Returns
    -------
    dict ``ACCEPTANCE_MODELS`` → float64 ``[B, T]``.
    """
    if tokens.dim() != 2 or tokens.dtype != torch.int64:
        raise InputError(
            f"expected_acceptance: tokens must be int64 [B, T], got {tokens.dtype} "
            f"{tuple(tokens.shape)}"
        )
    B = int(tokens.shape[0])
    L = len(prompt)
    prompt_t = torch.tensor([int(t) for t in prompt], dtype=torch.int64)  # [L]
    out: dict[str, list[torch.Tensor]] = {m: [] for m in ACCEPTANCE_MODELS}
    for lo in range(0, B, chunk):
        toks = tokens[lo : lo + chunk]  # [b, T]
        seqs = torch.cat([prompt_t.expand(toks.shape[0], L), toks], dim=1)  # [b, L + T]
        p = forced_probs(target, seqs, L, params)  # [b, T, V]
        d_logits = next_token_logits(draft, seqs, L)  # [b, T, V]
        for law in ("processed", "processed_twice"):
            q = draft_law(d_logits, params, law)  # [b, T, V]
            out[law].append(torch.minimum(p, q).sum(-1))  # [b, T]
        x_star = d_logits.argmax(-1, keepdim=True)  # [b, T, 1]
        q_raw = draft_law(d_logits, params, "raw").gather(-1, x_star)[..., 0]  # [b, T]
        p_star = p.gather(-1, x_star)[..., 0]  # [b, T]
        out["greedy_raw_q"].append(torch.clamp(p_star / q_raw, max=1.0))
    return {m: torch.cat(v, dim=0) for m, v in out.items()}


@dataclass(frozen=True)
class DraftLawProbe:
    """Which law transformers' assisted generation used as q, measured on one run.

    ``max_abs_diff[law]``: max over drafted positions and tokens of |q_engine − q_law| (q_engine =
    softmax of the draft scores transformers returned); ``q_law``: the law with the smallest
    difference (``"unknown"`` when none is below ``tol``); ``argmax_fraction``: share of drafted
    tokens that are the argmax of the draft logits (1.0 for a greedy drafter; for a sampled one
    it is below 1 unless the law is degenerate); ``n_positions``: drafted positions compared.
    """

    q_law: str
    max_abs_diff: dict[str, float]
    argmax_fraction: float
    n_positions: int


def probe_draft_law(
    target: Any,
    draft: Any,
    prompt_ids: torch.Tensor,
    params: SamplingParams,
    num_tokens: int,
    num_assistant_tokens: int,
    seeds: Sequence[int],
    tol: float = 1e-4,
) -> DraftLawProbe:
    """Run assisted generation and compare the q it used with ``Q_LAWS`` by teacher forcing.

    Each round's drafted positions are re-scored by teacher forcing the draft along
    ``prompt + emitted prefix + drafted tokens`` (the prefixes the assistant saw).
    """
    assert prompt_ids.dim() == 1, prompt_ids.shape
    diffs = {law: 0.0 for law in Q_LAWS}
    n = 0
    n_argmax = 0
    L = int(prompt_ids.shape[0])
    for seed in seeds:
        tokens, rec = generate_assisted(
            target,
            draft,
            prompt_ids,
            params,
            num_tokens,
            num_assistant_tokens,
            int(seed),
            keep_scores=True,
        )
        for pos, drafted, q_scores, _ in rec.scores:
            d = int(drafted.shape[0])
            if d == 0 or q_scores is None:
                continue
            seq = torch.cat([prompt_ids, tokens[:pos], drafted])[None, :]  # [1, L + pos + d]
            logits = next_token_logits(draft, seq, L + pos)  # [1, d, V]
            q_engine = torch.softmax(q_scores.double(), dim=-1)  # [d, V]
            for law in Q_LAWS:
                q_law = draft_law(logits, params, law)[0]  # [d, V]
                diffs[law] = max(diffs[law], float((q_engine - q_law).abs().max()))
            n_argmax += int((logits[0].argmax(-1) == drafted).sum())
            n += d
    if n == 0:
        raise ConfigError("probe_draft_law: no drafted positions (num_tokens too small?)")
    best = min(Q_LAWS, key=lambda law: diffs[law])
    return DraftLawProbe(best if diffs[best] < tol else "unknown", diffs, n_argmax / n, n)
