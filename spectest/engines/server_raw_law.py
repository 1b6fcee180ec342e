"""The law a server should have sampled from, derived from the raw law it reports.

Owns: ``processed_of`` — given the full *raw* law a server reports for one token (vLLM's
``--logprobs-mode raw_logprobs``, ``logprobs: V``) and the request's sampling settings, the
``(p, cdf_lo, list_mass)`` of the emitted token under the *processed* law, computed by
spectest's own pipeline. The http engine uses it when an arm says ``probs_law: raw``
(docs/engines-reported-p.md, "A raw report"; why: docs/internals-engines.md).

Notes
-----
Only the full law can be processed exactly: a shorter raw list is a ``Violation`` (exit 2),
except where the filtered support closes inside the list (``processed_from_list``). The law is
derived in float64 from float32 log-probabilities, so it differs from the server's by rounding
(~1e-7 per entry); min-p with another filter is refused (vLLM's filter order differs).
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
OFF_LIST = -1e30  # the logit of an id outside a top-n list (probability exactly 0 after softmax)


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


def processed_from_list(
    ids: Sequence[int], probs: Sequence[float], vocab: int, params: SamplingParams, where: str
) -> torch.Tensor:
    """The processed law ``[vocab]`` from a raw top-n list (``ids`` with their raw probabilities,
    the n most probable), exact when the filtered support closes inside the list: greedy; top-k
    ≤ n (renormalised over the k largest: no normaliser over the vocabulary needed); top-p at
    temperature 1 without top-k whose nucleus closes inside the list (the list's mass s > top_p:
    the pipeline run on the list at top_p / s, the same cut); min-p alone that cuts a listed
    token. Else ``Violation``: the law outside the list would decide it (docs/numerics.md
    "Top-n lists")."""
    T, k, top_p, min_p = params.temperature, params.top_k, params.top_p, params.min_p
    p = torch.tensor(list(probs), dtype=torch.float64)
    mass, n = float(p.sum()), len(p)
    rel = (p / p.max()) ** (1 / T) if T > 0 and n else p
    if T == 0 or 0 < k <= n:
        at = params
    elif T == 1 and k == 0 and min_p == 0 and top_p < mass * (1 - 1e-12):
        at = SamplingParams(temperature=1.0, top_p=top_p / mass)
    elif min_p > 0 and k == 0 and top_p == 1 and n and float(rel.min()) < min_p:
        at = params
    else:
        raise Violation(
            where,
            f"a processed law that closes inside the top-{n} raw list (greedy; top_k <= {n}; "
            "top_p at temperature 1 reached inside it; min_p cutting a listed token)",
            f"temperature {T:g} top_k {k} top_p {top_p:g} min_p {min_p:g}, list mass {mass:.6f}",
        )
    row = torch.full((vocab,), OFF_LIST, dtype=torch.float64)  # exp underflows to 0: finite
    row[torch.as_tensor(list(ids), dtype=torch.int64)] = torch.log(p)
    return logits_to_probs(row[None, :], SamplingTensors.from_params([at]))[0]


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
    "processed_from_list",
    "processed_law",
    "processed_of",
    "processed_of_reference",
    "settings_of",
]
