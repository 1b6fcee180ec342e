"""The optional engine capability "the plain law at these prefixes" for claim (b) teacher-forced.

Owns ``law_table`` (a run's laws, as ``teacher_laws.parquet`` stores them), ``refusal`` (why an
engine choice lacks the capability), ``LawAsker`` and one implementation per engine family (http
llama.cpp, http OpenAI, hf, builtin/fast). A law is sparse: non-zero ids and float64 probs;
``LEFT_OUT`` where a list does not fix it. The claim:
docs/numerics.md "Claim (b) from the plain engine teacher-forced (issue 31)".
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pandas as pd

from spectest.engines import server_raw_law, top_n_law
from spectest.engines.replies import Violation
from spectest.engines.server_probs import TOKEN_ID_PREFIX
from spectest.errors import EngineError

Law = tuple[np.ndarray, np.ndarray]  # (ids int64, probs float64): the non-zero entries
LOCAL = ("builtin", "fast", "hf-generate", "hf-assisted")
# the empty law: a prefix whose top-n list does not fix the law (``stats.teacher_forced``
# leaves it out and counts it)
LEFT_OUT: Law = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64))
VLLM_NEG_INF = -9999.0  # vLLM's JSON spelling of a log-probability of −inf (a filtered token)


def refusal(name: str, options: Any) -> str | None:
    """Why engine ``name`` with ``options`` cannot answer "the plain law at a prefix" (None: it
    can). The http engine's OpenAI API must report a law (``probs`` > 0): the whole
    vocabulary, or a top-n list (processed: read exact or coarsened; raw or tempered: rebuilt
    where the filtered support closes inside it, ``top_n_law.processed_from_list``)."""
    if name in LOCAL:
        return None
    if name == "http":
        if options.api == "llamacpp" or options.probs > 0:
            return None
        return (
            "engine http with api openai reports no law (probs 0): claim (b) teacher-forced "
            "needs the law at each prefix — probs >= the vocabulary with probs_law raw "
            "(vLLM --logprobs-mode raw_logprobs --max-logprobs V), or a top-n list of the "
            "processed law (probs n, --logprobs-mode processed_logprobs), the raw one (probs_law "
            "raw) or the tempered one (SGLang: probs_law tempered)"
        )
    return (
        f"engine {name!r} cannot report its plain law at a prefix (supported: http with api "
        "llamacpp, http with api openai and probs >= the vocabulary, hf-generate, hf-assisted, "
        "builtin, fast)"
    )


def law_table(
    protocol: Any, models: Any, frames: Sequence[pd.DataFrame], n_max: int, progress: Any
) -> pd.DataFrame:
    """The law table (``teacher_forced.LAWS`` columns) of the floor's engine
    (``protocol.floor.engine``, its target: ``models.target``), asked at every prefix of the
    first ``n_max`` sequences per cell of each of ``frames`` (the candidate's and the
    reference's tokens, ``schema.BYO_SCHEMA`` columns)."""
    from spectest.prompts import prompt_token_ids
    from spectest.stats.teacher_forced import LAWS, prefix_key
    from spectest.stats.token_floor import cell_matrices as _cells

    prompts = prompt_token_ids(protocol, models.target.vocab_size, (models.target,))
    params = dict(protocol.configs)
    cells = [_cells(df) for df in frames]
    keys = sorted(set().union(*cells))
    asker = LawAsker(protocol.floor.engine, models, protocol.floor.batch_size)
    rows: list[tuple[Any, ...]] = []
    try:
        for k, (pid, cid) in enumerate(keys):
            progress("teacher-forced laws", k, len(keys))
            X = np.concatenate([c[(pid, cid)][:n_max] for c in cells if (pid, cid) in c])
            for prefix, (ids, p) in asker.laws(prompts[pid], params[cid], X).items():
                rows.append((pid, cid, len(prefix), prefix_key(np.array(prefix)), ids, p))
    finally:
        asker.close()
    progress("teacher-forced laws", len(keys), len(keys))
    table = pd.DataFrame(rows, columns=list(LAWS)).sort_values(list(LAWS[:4]), ignore_index=True)
    table[LAWS[2]] = table[LAWS[2]].astype(np.int32)
    return table


def _sparse(p: np.ndarray) -> Law:
    ids = np.flatnonzero(p > 0)
    return ids.astype(np.int64), p[ids].astype(np.float64)


def _prefixes(tokens: np.ndarray) -> list[tuple[int, ...]]:
    """Every distinct prefix x_{<t} of every row of ``tokens [n, T]`` (−1: no token there)."""
    out = set()
    for row in tokens:
        for t in range(len(row)):
            if row[t] < 0:
                break
            out.add(tuple(int(v) for v in row[:t]))
    return sorted(out)


def _llamacpp_law(e: Any, ids: list[int], params: Any, V: int, t: int) -> Law:
    """llama.cpp: one token with ``n_probs`` = ``law_probs`` (0: V) and ``post_sampling_probs``
    (its processed law, or the top n of it: a list short of 1 when the support is larger)."""
    n = min(int(e.options.law_probs) or V, V)
    body = e.request_body(ids, params, 1, 1)
    body.update({"n_probs": n, "post_sampling_probs": True})
    where = f"{e.where}: the plain law at a prefix of {t} tokens"
    reply = e._post(body, where)
    try:
        top = reply["completion_probabilities"][0]["top_probs"]
        got = [(int(x["id"]), float(x["prob"])) for x in top]
    except (KeyError, IndexError, TypeError, ValueError) as err:
        raise EngineError(
            f"{where}: no law in the reply to n_probs {n} with post_sampling_probs "
            f"({type(err).__name__}: {err})"
        ) from None
    lid = [i for i, _ in got]
    p = np.array([q for _, q in got], dtype=np.float64)
    _check_list(lid, p, n, V, where, len(lid) > n or not bool(((p >= 0) & (p <= 1)).all()))
    order = np.argsort(lid)
    return _sparse_at(np.asarray(lid, dtype=np.int64)[order], p[order])


def _openai_law(e: Any, ids: list[int], params: Any, V: int, t: int) -> Law:
    """An OpenAI-compatible server: one ``max_tokens: 1`` completion with ``logprobs`` = the
    engine's ``probs`` capped at V (the engine's own request fields). ``probs_law`` raw or
    tempered: the reported law (whole, or its top-n list where it fixes the law:
    ``top_n_law.processed_from_list``) processed at the request's settings; processed (and
    tempered without a filter): the reported law or top-n list as it is (``exp`` of the
    log-probabilities; vLLM's −9999 for a filtered token is 0). A raw list whose normaliser's
    bracket straddles the nucleus's cut (``top_n_law.Straddle``): ``LEFT_OUT``, the empty law,
    which ``stats.teacher_forced`` leaves out and counts."""
    where = f"{e.where}: the plain law at a prefix of {t} tokens"
    n = min(int(e.options.law_probs) or int(e.options.probs), V)
    body = e.request_body(ids, params, 1, 1)
    body.update({"logprobs": n, "return_tokens_as_token_ids": True})
    reply = e._post(body, where)
    try:
        top = reply["choices"][0]["logprobs"]["top_logprobs"][0]
        raw = [(_token_id(k), float(v)) for k, v in top.items()]
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as err:
        raise EngineError(
            f"{where}: no law in the reply to logprobs {n} ({type(err).__name__}: {err})"
        ) from None
    kind = e.options.probs_law
    try:
        sp = server_raw_law.settings_of(body) if kind != "processed" else None
        if sp is not None and (kind == "raw" or not top_n_law.unfiltered(sp)):
            if n >= V:
                at = top_n_law.law_settings(sp, kind)
                return _sparse(server_raw_law.processed_law(raw, V, at, where).numpy())
            tid, tp = _top_n(raw, n, V, where)
            try:
                got = top_n_law.processed_from_list(tid.tolist(), tp.tolist(), V, sp, where, kind)
            except top_n_law.Straddle:
                return LEFT_OUT  # the list does not fix the law here: the prefix is left out
            return _sparse(got.numpy())
        if n >= V:  # processed, or tempered without a filter: the law sampled
            row = server_raw_law.full_row(raw, V, where).numpy()
            return _sparse(np.where(row <= VLLM_NEG_INF, 0.0, np.exp(row)))
    except Violation as v:
        raise EngineError(f"{where}: {v}") from None
    return _top_n(raw, n, V, where)


def _top_n(raw: list[tuple[int, float]], n: int, V: int, where: str) -> Law:
    """A processed top-n list as a sparse law short of 1 (``stats.teacher_forced`` coarsens
    it): the n most probable entries (ties by smaller id), so that the list is a function of
    the prefix alone — vLLM adds the token its own draw emitted, which is random. Refused (one
    line): an id twice or outside the vocabulary, fewer than ``n`` entries, a
    log-probability that is NaN or above 0 beyond rounding, or a mass above 1 + 1e-3."""
    ids = [i for i, _ in raw]
    lps = np.array([lp for _, lp in raw], dtype=np.float64)
    p = np.where(lps <= VLLM_NEG_INF, 0.0, np.exp(np.minimum(lps, 0.0)))
    short = len(set(ids)) < n
    _check_list(ids, p, n, V, where, short or bool(np.isnan(lps).any() or (lps > 1e-6).any()))
    top = np.lexsort((np.asarray(ids), -p))[:n]  # vLLM adds the sampled token: dropped
    order = top[np.argsort(np.asarray(ids)[top])]
    return _sparse_at(np.asarray(ids, dtype=np.int64)[order], p[order])


def _check_list(ids: list[int], p: np.ndarray, n: int, V: int, where: str, bad: bool) -> None:
    """Refuse (one line) a reply that is not a top-``n`` list of a law over ``V`` ids: an id
    twice or outside the vocabulary, a mass above 1 + 1e-3, or ``bad`` (the API's own checks:
    llama.cpp's probabilities, OpenAI's log-probabilities and list length)."""
    if bad or len(set(ids)) < len(ids) or any(not 0 <= i < V for i in ids) or p.sum() > 1.001:
        raise EngineError(
            f"{where}: not a top-{n} list of a law over {V} ids ({len(ids)} entries, "
            f"{len(set(ids))} distinct ids, mass {float(np.nansum(p)):.6f})"
        )


def _sparse_at(ids: np.ndarray, p: np.ndarray) -> Law:
    keep = p > 0
    return ids[keep], p[keep]


def _token_id(key: str) -> int:
    if not key.startswith(TOKEN_ID_PREFIX):
        raise ValueError(f"a token spelt {key!r}, not '{TOKEN_ID_PREFIX}N'")
    return int(key[len(TOKEN_ID_PREFIX) :])


def _check_processed(params: Any, where: str) -> None:
    """vLLM's processed logprobs at temperature 0 are the log-softmax of the logits, not the
    greedy point mass it draws from: refused."""
    if float(params.temperature) == 0.0:
        raise EngineError(
            f"{where}: probs_law processed at temperature 0 reports the unfiltered softmax, not "
            "the greedy law the server samples: use probs_law raw for greedy configs"
        )


class LawAsker:
    """One instance of the engine ``choice`` (its models: ``models``), asked per (prompt,
    config) for the laws at every prefix of a block of sequences; ``close`` once. ``rows``: the
    rows per forward of an in-process engine (None: up to 64, ≤ 128 MiB of laws)."""

    def __init__(self, choice: Any, models: Any, rows: int | None = None) -> None:
        from spectest.engines.registry import engine_class

        why = refusal(choice.name, choice.options)
        if why is not None:
            raise EngineError(why)
        self.name = choice.name
        self.models = models
        self.engine = engine_class(choice.name)(choice.options, models)
        self.requests = 0
        self.rows = rows

    def laws(
        self, prompt: Sequence[int], params: Any, tokens: np.ndarray
    ) -> dict[tuple[int, ...], Law]:
        """The law at each distinct prefix of the rows of ``tokens [n, T]``."""
        if self.name == "http":
            return self._http(list(prompt), params, _prefixes(tokens))
        return self._local(list(prompt), params, tokens)

    def _http(
        self, prompt: list[int], params: Any, prefixes: list[tuple[int, ...]]
    ) -> dict[tuple[int, ...], Law]:
        e: Any = self.engine  # an HTTPEngine (``refusal``)
        e._ensure_server()
        V = int(self.models.target.vocab_size)

        one = _llamacpp_law if e.options.api == "llamacpp" else _openai_law
        if e.options.api == "openai" and e.options.probs_law == "processed":
            _check_processed(params, e.where)
        with ThreadPoolExecutor(max_workers=max(1, int(e.options.concurrency))) as pool:
            got = list(pool.map(lambda h: one(e, prompt + list(h), params, V, len(h)), prefixes))
        self.requests += len(prefixes)
        return dict(zip(prefixes, got, strict=True))

    def _local(
        self, prompt: list[int], params: Any, tokens: np.ndarray
    ) -> dict[tuple[int, ...], Law]:
        """Full rows forward once each (distinct rows only; a row with −1 is cut there)."""
        rows = sorted({tuple(int(v) for v in r) for r in tokens})
        out: dict[tuple[int, ...], Law] = {}
        by_len: dict[int, list[tuple[int, ...]]] = {}
        for r in rows:
            n = next((t for t, v in enumerate(r) if v < 0), len(r))
            if n:
                by_len.setdefault(n, []).append(r[:n])
        V = int(self.models.target.vocab_size)
        for n, group in sorted(by_len.items()):
            step = max(1, min(self.rows or 64, (1 << 24) // (n * V)))  # ≤ 128 MiB of laws
            for lo in range(0, len(group), step):
                block = np.array(group[lo : lo + step], dtype=np.int64)
                P = self._forward(prompt, params, block)  # [b, n, V]
                self.requests += len(block)
                for i, r in enumerate(block):
                    for t in range(n):
                        key = tuple(int(v) for v in r[:t])
                        if key not in out:
                            out[key] = _sparse(P[i, t])
        return out

    def _forward(self, prompt: list[int], params: Any, block: np.ndarray) -> np.ndarray:
        """The plain law ``[b, T, V]`` (float64) at each prefix of each row of ``block``."""
        import torch

        target = self.models.target
        toks = torch.as_tensor(block, dtype=torch.int64)
        if self.name.startswith("hf-"):
            from spectest.engines.hf.laws import next_token_logits, processed_probs

            seq = torch.cat([torch.tensor(prompt).expand(len(block), -1), toks], dim=1)
            return processed_probs(next_token_logits(target, seq, len(prompt)), params).numpy()
        from spectest.engines.teacher import _emitted_logits
        from spectest.sampling.params import SamplingTensors
        from spectest.sampling.transforms import logits_to_probs

        dev = target.device
        with torch.inference_mode():
            pt = SamplingTensors.from_params([params] * len(block), device=dev)
            prompt_t = torch.tensor(prompt, dtype=torch.int64, device=dev)
            p = logits_to_probs(_emitted_logits(target, prompt_t, toks.to(dev)), pt)
        return p.cpu().numpy()

    def close(self) -> None:
        self.engine.close()
