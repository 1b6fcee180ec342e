"""What an inference server reports about the probabilities of the tokens it emitted: llama.cpp's
``completion_probabilities`` and the OpenAI-compatible ``logprobs`` (vLLM, SGLang).

Owns the request fields that ask for them (``request_fields``) and ``reported_of``: one
``(p, cdf_lo, list_mass)`` per emitted token, or ``left_out``. Knows nothing about sockets, numpy
or statistics. The triple, the list's rank order and which law each server reports:
docs/internals-engines.md "spectest/engines/server_probs.py", docs/engines-reported-p.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from spectest.engines.replies import (
    PROB_SUM_SLACK,
    TOKEN_ID_MAX,
    Int,
    ListOf,
    Num,
    Obj,
    Str,
    Violation,
    check,
)

Reported = tuple[float | None, float | None, float | None]  # (p, cdf_lo, list mass)
NONE: Reported = (None, None, None)
_PROB = Num(0.0, 1.0 + PROB_SUM_SLACK)
_LLAMA_ENTRY = Obj({"id": Int(0, TOKEN_ID_MAX, "an int token id"), "prob": _PROB}, ("id", "prob"))
_LOGPROB = Num(hi=PROB_SUM_SLACK)  # a log-probability (vLLM clamps -inf to -9999)
TOKEN_ID_PREFIX = "token_id:"  # vLLM's return_tokens_as_token_ids spelling of a token
# a raw report's law → the token's Reported: (entries (id, log-probability), token, where)
Derive = Callable[[list[tuple[int, float]], int, str], Reported]


def left_out(list_mass: float) -> Reported:
    """A token whose reported list (of mass ``list_mass``, finite) does not fix its law: no p,
    the mass stated (how ``stats.reported_p.ReportedFamily`` tells it from a token not reported)."""
    return (None, None, float(list_mass))


def request_fields(api: str, n: int) -> dict[str, Any]:
    """The request fields that ask the server for the top ``n`` reported probabilities."""
    if api == "llamacpp":
        return {"n_probs": n, "post_sampling_probs": True}
    return {"logprobs": n, "return_tokens_as_token_ids": True}


def reported_of(
    api: str,
    reply: Mapping[str, Any],
    tokens: Sequence[int],
    n: int,
    derive: Derive | None = None,
) -> list[Reported]:
    """One ``Reported`` per emitted token of a reply whose token ids passed their own check;
    ``Violation`` when the reported probabilities break their schema or disagree with the
    tokens. ``derive`` (OpenAI only): the reported lists are a *raw* law, turned into the
    token's ``Reported`` under the processed law by it (``engines.server_raw_law``)."""
    if api == "llamacpp":
        return _llamacpp(reply, tokens)
    return _openai(reply, tokens, n, derive)


def _llamacpp(reply: Mapping[str, Any], tokens: Sequence[int]) -> list[Reported]:
    T = len(tokens)
    entry = Obj(
        {"id": _LLAMA_ENTRY.fields["id"], "prob": _PROB, "top_probs": ListOf(_LLAMA_ENTRY)},
        ("id", "prob", "top_probs"),
    )
    path = "completion_probabilities"
    check(ListOf(entry, T, T, f"a list of {T} token probabilities (one per token)"),
          reply.get(path), path)  # fmt: skip
    out = []
    for i, (tok, e) in enumerate(zip(tokens, reply[path], strict=True)):
        if e["id"] != tok:
            raise Violation(f"{path}[{i}].id", f"the emitted token {tok}", e["id"])
        if not e["top_probs"]:  # nothing reported (the speculative path)
            out.append(NONE)
            continue
        top = [(int(t["id"]), float(t["prob"])) for t in e["top_probs"]]
        out.append(_from_list(top, tok, float(e["prob"]), f"{path}[{i}]"))
    return out


def _openai(
    reply: Mapping[str, Any], tokens: Sequence[int], n: int, derive: Derive | None
) -> list[Reported]:
    T = len(tokens)
    path = "choices[0].logprobs"
    lp = reply["choices"][0].get("logprobs")
    shape = Obj(
        {
            "token_logprobs": ListOf(_LOGPROB, T, T, f"a list of {T} log-probabilities"),
            "top_logprobs": ListOf(Obj(), T, T, f"a list of {T} top-logprob objects"),
            "tokens": ListOf(Str(100), T, T, f"a list of {T} tokens"),
        },
        ("token_logprobs", "top_logprobs", "tokens"),
    )
    check(shape, lp, path)
    out = []
    for i, tok in enumerate(tokens):
        if _token_id(lp["tokens"][i], f"{path}.tokens[{i}]") != tok:
            raise Violation(f"{path}.tokens[{i}]", f"the emitted token {tok}", lp["tokens"][i])
        where = f"{path}.top_logprobs[{i}]"
        top = []
        for key, v in lp["top_logprobs"][i].items():
            _LOGPROB.check(v, f"{where}.{key}")
            top.append((_token_id(key, where), float(v)))
        if derive is not None:
            out.append(derive(top, tok, where))
            continue
        top = [(t, math.exp(v)) for t, v in top]
        top = sorted(top, key=lambda e: (-e[1], e[0]))[:n]  # the k best: never the token's choice
        if not top:
            out.append(NONE)
            continue
        out.append(_from_list(top, tok, math.exp(float(lp["token_logprobs"][i])), where))
    return out


def _token_id(text: Any, where: str) -> int:
    if not isinstance(text, str) or not text.startswith(TOKEN_ID_PREFIX):
        raise Violation(
            where, f"a token spelt '{TOKEN_ID_PREFIX}N' (return_tokens_as_token_ids)", text
        )
    try:
        return int(text[len(TOKEN_ID_PREFIX) :])
    except ValueError:
        raise Violation(where, f"a token spelt '{TOKEN_ID_PREFIX}N'", text) from None


def _from_list(top: list[tuple[int, float]], tok: int, p_tok: float, where: str) -> Reported:
    """(p, cdf_lo, mass) of ``tok`` from a list in the server's rank order, re-ranked by
    descending probability, ties by id (module Notes)."""
    top = sorted(top, key=lambda e: (-e[1], e[0]))
    mass = min(sum(p for _, p in top), 1.0)
    lo = 0.0
    for tid, p in top:
        if tid == tok:
            return (min(p, 1.0), min(lo, 1.0), mass)
        lo += p
    if p_tok > top[-1][1] + PROB_SUM_SLACK:
        raise Violation(
            where, "a token outside the top list no more probable than its last entry", p_tok
        )
    return (min(p_tok, 1.0), None, min(mass, max(1.0 - p_tok, 0.0)))


__all__ = ["NONE", "Reported", "left_out", "reported_of", "request_fields"]
