"""The law a server should have sampled from, derived from the raw or tempered law it reports.

Owns ``processed_of``: the emitted token's ``(p, cdf_lo, list_mass)`` under the *processed* law,
computed by spectest's own pipeline from a whole law or a top-n list, for an http arm with
``probs_law: raw`` or ``tempered``. When a list fixes the law, and the rounding:
docs/internals-engines.md "spectest/engines/server_raw_law.py"; docs/engines-reported-p.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from spectest.engines.replies import Violation
from spectest.engines.server_probs import Derive, Reported, left_out
from spectest.engines.top_n_law import Straddle, law_settings, processed_from_list, unfiltered
from spectest.errors import ConfigError
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.transforms import logits_to_probs, logits_to_probs_reference

LAWS = ("processed", "raw", "tempered")


def check_option(law: object, api: str, where: str) -> None:
    """The http option ``probs_law``: ``processed`` (the default), or ``raw`` / ``tempered``
    with the OpenAI API (llama.cpp's raw report, ``post_sampling_probs: false``, is a top-n
    list of the untempered softmax: not asked for)."""
    if law not in LAWS or (law != "processed" and api != "openai"):
        raise ConfigError(
            f"{where}: expected processed, or raw / tempered with api openai, got {law!r}"
        )


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


def derive(kind: str, body: Mapping[str, object], vocab: int, n: int) -> Derive | None:
    """How the http engine turns a ``kind`` report of ``n`` entries into the processed law's
    (p, cdf_lo) for a request ``body`` (``processed_of``): None for a processed report, or a
    tempered one without a filter (then the report is the law sampled)."""
    if kind == "processed":
        return None
    sp = settings_of(body)
    if kind == "tempered" and unfiltered(sp):
        return None
    return lambda raw, tok, where: processed_of(raw, tok, vocab, sp, where, kind, n)


def processed_of(
    raw: Sequence[tuple[int, float]],
    tok: int,
    vocab: int,
    params: SamplingParams,
    where: str,
    kind: str = "raw",
    n: int = 0,
) -> Reported:
    """(p, cdf_lo, None) of ``tok`` under the processed law of the reported ``kind`` law
    ``raw`` (``(id, log-probability)``): the full law when it holds every id of
    ``range(vocab)``, else its ``n`` most probable entries (ties by smaller id: vLLM adds the
    sampled token beside them) rebuilt by ``top_n_law.processed_from_list`` where they fix it
    (``Violation`` elsewhere; ``server_probs.left_out`` where only the normaliser's bracket
    leaves the cut open, ``top_n_law.Straddle``); ``cdf_lo`` in the order of ``server_probs``
    (descending p, ties by smaller id); list mass None: the rebuilt law is whole."""
    if len({i for i, _ in raw}) >= vocab or not n:
        return _reported(processed_law(raw, vocab, law_settings(params, kind), where).tolist(), tok)
    top = sorted(raw, key=lambda e: (-e[1], e[0]))[:n]
    ids = [i for i, _ in top]
    if len(set(ids)) < n or any(not 0 <= i < vocab for i in ids):
        raise Violation(where, f"a top-{n} list of ids in range({vocab})", f"{len(top)} entries")
    probs = [math.exp(lp) for _, lp in top]
    try:
        law = processed_from_list(ids, probs, vocab, params, where, kind)
    except Straddle:
        return left_out(min(sum(probs), 1.0))
    return _reported(law.tolist(), tok)


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
    "derive",
    "full_row",
    "processed_from_list",
    "processed_law",
    "processed_of",
    "processed_of_reference",
    "settings_of",
]
