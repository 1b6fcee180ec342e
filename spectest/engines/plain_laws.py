"""The optional engine capability "the plain law at these prefixes": for a prompt, a config and
token sequences, the processed law the engine's *plain* decode samples from at every prefix of
every sequence — what claim (b) teacher-forced (``stats.teacher_forced``) compares the
candidate's tokens with.

Owns: ``refusal`` (why an engine choice lacks the capability, None when it has it), ``LawAsker``
(one engine instance answering, started once, closed once) and one implementation per engine
family: the http engine's llama.cpp API (one ``n_predict: 1`` request per distinct prefix with
``n_probs`` = the vocabulary and ``post_sampling_probs``, over a thread pool of the engine's
concurrency), the hf engines (the target in its dtype, one forward per sequence, transformers'
own warpers for the config: ``engines.hf.laws``) and spectest's builtin/fast engines
(spectest's pipeline on the target's logits: ``engines.teacher``). A law is sparse: its
non-zero ids and their probabilities (float64). docs/numerics.md ("Claim (b) from the plain
engine teacher-forced").
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from spectest.errors import EngineError

Law = tuple[np.ndarray, np.ndarray]  # (ids int64, probs float64): the non-zero entries
LOCAL = ("builtin", "fast", "hf-generate", "hf-assisted")


def refusal(name: str, options: Any) -> str | None:
    """Why engine ``name`` with ``options`` cannot answer "the plain law at a prefix" (None: it
    can)."""
    if name in LOCAL:
        return None
    if name == "http":
        if options.api == "llamacpp":
            return None
        return (
            "engine http with api openai cannot report its full processed law at a prefix "
            "(top_logprobs is a top-n list, raw or tempered but unfiltered): only api llamacpp"
        )
    return (
        f"engine {name!r} cannot report its plain law at a prefix (supported: http with api "
        "llamacpp, hf-generate, hf-assisted, builtin, fast)"
    )


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


class LawAsker:
    """One instance of the engine ``choice`` (its models: ``models``), asked per (prompt,
    config) for the laws at every prefix of a block of sequences; ``close`` once."""

    def __init__(self, choice: Any, models: Any) -> None:
        from spectest.engines.registry import engine_class

        why = refusal(choice.name, choice.options)
        if why is not None:
            raise EngineError(why)
        self.name = choice.name
        self.models = models
        self.engine = engine_class(choice.name)(choice.options, models)
        self.requests = 0

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

        def one(prefix: tuple[int, ...]) -> Law:
            body = e.request_body(prompt + list(prefix), params, 1, 1)
            body.update({"n_probs": V, "post_sampling_probs": True})
            reply = e._post(body, f"{e.where}: the plain law at a prefix of {len(prefix)} tokens")
            try:
                top = reply["completion_probabilities"][0]["top_probs"]
                p = np.zeros(V)
                for entry in top:
                    p[int(entry["id"])] += float(entry["prob"])
            except (KeyError, IndexError, TypeError, ValueError) as err:
                raise EngineError(
                    f"{e.where}: no full law in the reply to n_probs {V} with "
                    f"post_sampling_probs ({type(err).__name__}: {err})"
                ) from None
            return _sparse(p)

        with ThreadPoolExecutor(max_workers=max(1, int(e.options.concurrency))) as pool:
            got = list(pool.map(one, prefixes))
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
            step = max(1, min(64, (1 << 24) // (n * V)))  # rows per forward: ≤ 128 MiB of laws
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
