#!/usr/bin/env python3
"""A correct engine program for spectest's ``command`` engine (``spectest-jsonl/1``).

It answers every job with spectest's own built-in loops: plain, or (``--speculative``) exact
speculative sampling with the target/draft pair; ``topp_before_temperature.py`` beside it is the
same program with one bug. Its use in a protocol: docs/real-engines.md; the protocol:
docs/engines-command.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

PROTOCOL = "spectest-jsonl/1"
Decode = Callable[[dict[str, Any], Any, Any], list[dict[str, Any]]]


def correct_decode(job: dict[str, Any], target: Any, draft: Any, whitebox: bool = False) -> Any:
    """One result per seed with spectest's built-in plain or exact speculative loop; with
    ``whitebox``, also each row's p of every token (the law it was sampled from)."""
    from spectest.engines import builtin
    from spectest.engines.base import RowSpec
    from spectest.sampling.mutants import get_variant
    from spectest.sampling.params import SamplingParams

    s = job["sampling"]
    params = SamplingParams(s["temperature"], s["top_k"], s["top_p"], s["min_p"])
    rows = [RowSpec(job["config_id"], seed, params) for seed in job["seeds"]]
    req = job_request(job, rows, whitebox=whitebox)
    if draft is None:
        out = builtin.plain_decode(target, req)
    else:
        exact = get_variant("exact")
        out = builtin.speculative_decode(target, draft, req, drafter=drafter(job), variant=exact)
    results = []
    for i, seed in enumerate(job["seeds"]):
        res: dict[str, Any] = {"type": "result", "id": job["id"], "seed": seed}
        res["tokens"] = [int(t) for t in out.tokens[i].tolist()]
        if out.rounds is not None:
            r = out.rounds[out.rounds["row"] == i]
            res["rounds"] = [
                {"drafted": int(a), "accepted": int(b), "emitted": int(c)}
                for a, b, c in zip(r["drafted"], r["accepted"], r["emitted"], strict=True)
            ]
        results.append(res)
    if not whitebox:
        return results
    T = out.tokens.shape[1]
    assert out.whitebox is not None
    wb_p = out.whitebox["wb_p"].to_numpy().reshape(-1, T)  # [B, T]
    return results, [[float(v) for v in wb_p[i]] for i in range(len(results))]


def job_request(job: dict[str, Any], rows: list, whitebox: bool = False) -> Any:
    """The job's ``DecodeRequest`` for ``rows``."""
    from spectest.engines.base import DecodeRequest

    keys = job["prompt"], rows, job["max_tokens"], job["run_key"], job["prompt_id"]
    return DecodeRequest(*keys, whitebox=whitebox)


def drafter(job: dict[str, Any]) -> Any:
    """The job's ``DrafterSpec``."""
    from spectest.engines.base import DrafterSpec

    d = job["drafter"]
    return DrafterSpec(onehot=d["kind"] == "onehot", q_mode=d["q"], k=d["k"])


def arguments(doc: str | None, required: bool = False) -> argparse.ArgumentParser:
    """``--target``, ``--draft`` (required, else the bundled pair) and ``--speculative``."""
    ap = argparse.ArgumentParser(description=doc)
    for name in ("target", "draft"):
        how: dict[str, Any] = {"required": True} if required else {"default": f"bundled:{name}"}
        ap.add_argument(f"--{name}", **how)
    ap.add_argument("--speculative", action="store_true")
    return ap


def load(args: argparse.Namespace) -> tuple[Any, Any]:
    """The target and (``--speculative``) the draft, on one thread."""
    import torch

    from spectest.models.zoo import load_model, load_pair

    torch.set_num_threads(1)
    if args.speculative:
        return load_pair(args.target, args.draft)
    return load_model(args.target), None


def answer(decode: Callable[[dict[str, Any]], list[dict[str, Any]]], hello: dict) -> None:
    """The line protocol: ``hello``, then answer every job line until stdin closes."""
    print(json.dumps({"type": "hello", "protocol": PROTOCOL, **hello}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        try:
            results = decode(job)
        except Exception as err:  # report, do not crash: spectest prints the message
            print(json.dumps({"type": "error", "id": job.get("id"), "message": str(err)}))
        else:
            for res in results:
                print(json.dumps(res))
        sys.stdout.flush()


def serve(decode: Decode, name: str, argv: list[str] | None = None) -> None:
    """The line protocol with the bundled pair (or ``--target``/``--draft``) and ``decode``."""
    args = arguments(__doc__).parse_args(argv)
    target, draft = load(args)
    mode = "speculative" if args.speculative else "plain"
    answer(lambda job: decode(job, target, draft), {"engine": name, "version": mode})


if __name__ == "__main__":
    serve(correct_decode, "spectest-builtin-example")
