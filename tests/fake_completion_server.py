"""A small real HTTP server on 127.0.0.1 speaking llama.cpp's ``/completion`` and the OpenAI
``/v1/completions`` shapes, for the http engine's tests of its own checks. Its "model" is a
seeded hash: tokens are a pure function of (prompt, seed, position), unless told to misbehave.

Usage: python tests/fake_completion_server.py --port N [--ignore-seed] [--drop PARAM]
       [--fail-first N] [--die-after N] [--delay SECONDS] [--tag TEXT] [--probs MODE]

Asked for probabilities (llama.cpp ``n_probs``, OpenAI ``logprobs``), it reports the fixed law
``LAW`` (p_v ∝ 16 − v) for every token, in each server's shape: ``--probs spec-empty`` leaves odd
positions unreported as llama.cpp's speculative path does (prob 1.0, empty top list);
``--probs bad-id`` names another token than the one emitted; ``--probs cut`` reports (OpenAI)
the law ``CUT`` (``LAW`` on ids 0–7 renormalised, the rest −9999: vLLM's spelling of a filtered
token's −inf); ``--probs dup`` repeats (llama.cpp) the first entry of each top list.
``--log FILE`` appends each POST's path and JSON body to FILE, one line each.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ARGS = argparse.Namespace()
LAW = [(16 - v) / 136 for v in range(16)]  # the reported law: descending in id
CUT = [(16 - v) / 100 if v < 8 else 0.0 for v in range(16)]  # --probs cut: 8 ids filtered


def llamacpp_probs(toks: list[int], n: int) -> list[dict[str, object]]:
    top = [{"id": v, "token": f"t{v}", "bytes": [], "prob": LAW[v]} for v in range(min(n, 16))]
    top += top[:1] if ARGS.probs == "dup" else []
    out: list[dict[str, object]] = []
    for i, t in enumerate(toks):
        if ARGS.probs == "spec-empty" and i % 2:
            out.append({"id": t, "token": "", "bytes": [], "prob": 1.0, "top_probs": []})
            continue
        tid = (t + 1) % 16 if ARGS.probs == "bad-id" else t
        out.append({"id": tid, "token": "", "bytes": [], "prob": LAW[t], "top_probs": top})
    return out


def openai_logprobs(toks: list[int], n: int) -> dict[str, object]:
    import math

    def lp(v: int) -> float:
        return (
            (math.log(CUT[v]) if CUT[v] else -9999.0) if ARGS.probs == "cut" else math.log(LAW[v])
        )

    tops = []
    for t in toks:
        d = {f"token_id:{v}": lp(v) for v in range(min(n, 16))}
        d[f"token_id:{t}"] = lp(t)  # vLLM adds the sampled token beside the top n
        tops.append(d)
    return {
        "tokens": [f"token_id:{t}" for t in toks],
        "token_logprobs": [lp(t) for t in toks],
        "top_logprobs": tops,
        "text_offset": [0] * len(toks),
    }


COUNT = {"n": 0}


def tokens(prompt: list[int], seed: int, n: int) -> list[int]:
    h = hashlib.sha256(json.dumps([prompt, seed]).encode()).digest()
    return [h[i % 32] % 16 for i in range(n)]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a: object) -> None:
        return

    def _send(self, code: int, obj: object) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, {"status": "ok"})
        elif self.path == "/props":
            self._send(200, {"build_info": "fake-1"})
        else:
            self._send(404, {})

    def do_POST(self) -> None:
        COUNT["n"] += 1
        time.sleep(ARGS.delay)
        if ARGS.die_after and COUNT["n"] > ARGS.die_after:
            print("fake server: simulated crash", file=sys.stderr, flush=True)
            os._exit(9)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if ARGS.log:
            with open(ARGS.log, "a") as f:
                f.write(json.dumps([self.path, body]) + "\n")
        if COUNT["n"] <= ARGS.fail_first:
            self._send(503, {"error": "loading"})
            return
        if body.get("top_k", 0) > 1000:
            self._send(400, {"error": "top_k too large"})
            return
        seed = random.randrange(1 << 30) if ARGS.ignore_seed else body["seed"]
        n = body.get("n_predict", body.get("max_tokens"))
        toks = tokens(body["prompt"], seed, n)
        if self.path == "/completion":
            settings = {k: body[k] for k in ("temperature", "top_k", "top_p", "min_p", "seed")}
            settings["samplers"] = body.get("samplers", [])
            if ARGS.drop:
                settings[ARGS.drop] = {"temperature": 1.0, "top_p": 1.0}.get(ARGS.drop, 0)
            reply = {
                "tokens": toks,
                "generation_settings": settings,
                "timings": {"draft_n": 6, "draft_n_accepted": 4},
            }
            if body.get("n_probs"):
                reply["completion_probabilities"] = llamacpp_probs(toks, body["n_probs"])
            self._send(200, reply)
        else:
            choice: dict[str, object] = {"token_ids": toks, "text": ""}
            if body.get("logprobs"):
                choice["logprobs"] = openai_logprobs(toks, body["logprobs"])
            self._send(200, {"choices": [choice]})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ignore-seed", action="store_true")
    ap.add_argument("--drop", default="")
    ap.add_argument("--fail-first", type=int, default=0)
    ap.add_argument("--die-after", type=int, default=0)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument(
        "--probs", default="exact", choices=["exact", "spec-empty", "bad-id", "cut", "dup"]
    )
    ap.add_argument("--log", default="")
    ap.add_argument("--tag", default="")  # ignored: lets a test find this process by its argv
    ap.parse_args(namespace=ARGS)
    print(f"fake server on 127.0.0.1:{ARGS.port}", flush=True)
    ThreadingHTTPServer(("127.0.0.1", ARGS.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
