"""A real loopback HTTP server answering OpenAI-compatible ``/v1/completions`` from a real torch
model (a spectest zoo model), for the tests of what spectest reads from a server's reported law.

Per request: the model's next-token logits after the prompt and the tokens so far (float64),
the processed law at the request's ``temperature`` / ``top_k`` (−1 off) / ``top_p`` / ``min_p``
by spectest's pipeline, the token drawn from it with ``numpy`` seeded by the request's ``seed``
(or, with ``bug="untempered-top-p"``, from top-p on the untempered law with the temperature
after: the misordered sampler of docs/engines-reported-p.md). ``logprobs: n`` reports, as the
servers do, the top n (ties by smaller id) plus the sampled token, keys ``token_id:N``, of:
``raw`` (vLLM ``raw_logprobs``: log-softmax of the logits), ``tempered`` (SGLang
``return_logprob``: log-softmax of logits / T, T = 0 read as 1) or ``processed`` (vLLM
``processed_logprobs``; a filtered token −9999). It runs on a thread of the test's process
(torch loaded once); ``requests`` counts the POSTs.
"""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer
from typing import Any

import numpy as np
import torch
from fake_completion_server import Handler as JsonHandler

from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.transforms import logits_to_probs

MODES = ("raw", "tempered", "processed")


class ModelServer:
    """``ModelServer(model, mode)``: serving at ``url`` until ``close``."""

    def __init__(self, model: Any, mode: str, bug: str = "") -> None:
        assert mode in MODES, mode
        self.model, self.mode, self.bug = model, mode, bug
        self.V = int(model.vocab_size)
        self.requests = 0
        self._lock = threading.Lock()
        self._memo: dict[tuple[int, ...], torch.Tensor] = {}
        server = self

        class Handler(JsonHandler):  # the fake server's quiet JSON ``_send``
            def do_GET(self) -> None:
                self._send(200 if self.path == "/health" else 404, {"status": "ok"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self._send(200, server.reply(body))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def logits(self, ids: list[int]) -> torch.Tensor:
        """The model's next-token logits ``[V]`` (float64) after ``ids``."""
        key = tuple(ids)
        with self._lock:
            if key not in self._memo:
                with torch.inference_mode():
                    out = self.model.logits_full(torch.tensor([ids], dtype=torch.int64))
                self._memo[key] = out[0, -1].to(torch.float64).cpu()
            return self._memo[key]

    def reported(self, logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
        """The log-probabilities ``[V]`` this server's mode reports."""
        if self.mode == "raw":
            return torch.log_softmax(logits, -1)
        if self.mode == "tempered":
            return torch.log_softmax(logits / (sp.temperature or 1.0), -1)
        p = _law(logits, sp)
        return torch.where(p > 0, torch.log(p), torch.full_like(p, -9999.0))

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        self.requests += 1
        k = int(body.get("top_k", -1))
        sp = SamplingParams(
            float(body["temperature"]), max(k, 0), float(body["top_p"]), float(body["min_p"])
        )
        rng = np.random.default_rng(int(body["seed"]))
        ids, toks, tops, lps = list(body["prompt"]), [], [], []
        n = int(body.get("logprobs") or 0)
        for _ in range(int(body["max_tokens"])):
            logits = self.logits(ids)
            p = _law(logits, sp) if self.bug != "untempered-top-p" else _misordered(logits, sp)
            tok = int(rng.choice(self.V, p=(p / p.sum()).numpy()))
            lp = self.reported(logits, sp)
            order = sorted(range(self.V), key=lambda v: (-float(lp[v]), v))[:n]
            tops.append({f"token_id:{v}": float(lp[v]) for v in [*order, tok]})
            lps.append(float(lp[tok]))
            toks.append(tok)
            ids.append(tok)
        choice: dict[str, Any] = {"token_ids": toks, "text": "", "index": 0}
        if n:
            choice["logprobs"] = {
                "tokens": [f"token_id:{t}" for t in toks],
                "token_logprobs": lps,
                "top_logprobs": tops,
                "text_offset": [0] * len(toks),
            }
        return {"choices": [choice]}

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _law(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    return logits_to_probs(logits[None, :], SamplingTensors.from_params([sp]))[0]


def _misordered(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """Top-p (and top-k) on the untempered law, the temperature applied to the survivors."""
    keep = _law(logits, SamplingParams(1.0, sp.top_k, sp.top_p, sp.min_p)) > 0
    return _law(
        torch.where(keep, logits, torch.full_like(logits, -1e30)), SamplingParams(sp.temperature)
    )
