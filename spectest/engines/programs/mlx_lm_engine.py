#!/usr/bin/env python3
"""MLX-LM (``mlx-lm`` on ``mlx-cpu``) as an engine program for spectest's ``command`` engine.

Runs under the pinned venv of ``spectest setup mlx`` (stdlib, ``mlx_lm`` and ``_jsonl`` only),
started by ``python -m spectest.setup.mlx run ...``. Seeds, the two ``--sampler`` choices and
the tooth of ``protocols/mlx-misordered.yaml``: docs/internals-engines.md.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _jsonl

ENGINE = "mlx-lm"


def rounds_from_flags(flags: list[bool], k: int, max_tokens: int) -> _jsonl.Rounds:
    """Rounds of ``speculative_generate_step`` from each emitted token's ``from_draft`` flag:
    a round drafts ``min(k, tokens left)``, emits its accepted draft tokens and then one target
    token (none when the accepted tokens already reach ``max_tokens``)."""
    out: list[dict[str, int]] = []
    pos, i = 0, 0
    while i < len(flags):
        drafted = min(k, max_tokens - pos)
        accepted = 0
        while i < len(flags) and flags[i] and accepted < drafted:
            accepted, i = accepted + 1, i + 1
        emitted = accepted
        if i < len(flags) and not flags[i]:
            emitted, i = emitted + 1, i + 1
        out.append({"drafted": drafted, "accepted": accepted, "emitted": emitted})
        pos += emitted
    return out


class MLXRunner:
    """The models and how a job's seeds become sequences. ``mx`` is ``mlx.core``, ``gen`` is
    ``mlx_lm.generate`` and ``su`` is ``mlx_lm.sample_utils`` (tests pass fakes)."""

    def __init__(
        self, mx: Any, gen: Any, su: Any, target: Any, draft: Any, k: int, sampler: str
    ) -> None:
        self.mx, self.gen, self.su = mx, gen, su
        self.target, self.draft, self.k, self.sampler_kind = target, draft, k, sampler

    def sampler(self, s: dict[str, Any]) -> Any:
        T = float(s["temperature"])
        if T <= 0:
            raise _jsonl.JobRefused(f"{ENGINE}: temperature must be > 0 (this program samples)")
        f = _jsonl.filters(s)
        if self.sampler_kind == "mlx":
            return self.su.make_sampler(
                temp=T,
                top_p=float(f.get("top_p", 0.0)),
                min_p=float(f.get("min_p", 0.0)),
                top_k=int(f.get("top_k", 0)),
            )
        if list(s.get("order", [])) != ["temperature", "top_k", "top_p", "min_p"]:
            raise _jsonl.JobRefused(f"{ENGINE}: unsupported filter order {s.get('order')}")
        mx, su = self.mx, self.su

        def sample(logprobs: Any) -> Any:
            x = logprobs * (1.0 / T)
            x = x - mx.logsumexp(x, axis=-1, keepdims=True)
            if "top_k" in f:
                x = su.apply_top_k(x, int(f["top_k"]))
            if "top_p" in f:
                x = su.apply_top_p(x, float(f["top_p"]))
            if "min_p" in f:
                x = su.apply_min_p(x, float(f["min_p"]), 1)
            return mx.random.categorical(x)

        return sample

    def decode(self, job: dict[str, Any]) -> _jsonl.Decoded:
        sampler = self.sampler(job["sampling"])
        T = int(job["max_tokens"])
        prompt = self.mx.array([int(t) for t in job["prompt"]])
        for seed, key in zip(job["seeds"], job["row_keys"], strict=True):
            self.mx.random.seed(int(key))
            if self.draft is None:
                steps = self.gen.generate_step(prompt, self.target, max_tokens=T, sampler=sampler)
                tokens, rounds = [int(t) for t, _ in steps], None
            else:
                steps = self.gen.speculative_generate_step(
                    prompt,
                    self.target,
                    self.draft,
                    num_draft_tokens=self.k,
                    max_tokens=T,
                    sampler=sampler,
                )
                got = [(int(t), bool(d)) for t, _, d in steps]
                tokens = [t for t, _ in got]
                rounds = rounds_from_flags([d for _, d in got], self.k, T)
            yield seed, tokens[:T], rounds


def build(args: argparse.Namespace) -> tuple[MLXRunner, dict[str, Any]]:
    import importlib.metadata as md

    import mlx.core as mx

    gen = importlib.import_module("mlx_lm.generate")  # the package re-exports a function
    su = importlib.import_module("mlx_lm.sample_utils")
    utils = importlib.import_module("mlx_lm.utils")
    target, _ = utils.load_model(Path(args.target))
    draft = utils.load_model(Path(args.draft))[0] if args.draft else None
    hello = {
        "engine": ENGINE,
        "version": md.version("mlx-lm"),
        "mlx": md.version("mlx"),
        "device": str(mx.default_device()),
        "mode": "speculative" if args.draft else "plain",
        "num_draft_tokens": args.num_draft_tokens if args.draft else None,
        "sampler": args.sampler,
        "seeds": "per sequence: mx.random.seed(row key) before each",
        "target": args.target,
        "draft": args.draft,
    }
    runner = MLXRunner(mx, gen, su, target, draft, args.num_draft_tokens, args.sampler)
    return runner, hello


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="HF model directory (safetensors)")
    ap.add_argument("--draft", default=None, help="draft HF directory: speculative decoding")
    ap.add_argument("--num-draft-tokens", type=int, default=3)
    ap.add_argument("--sampler", choices=("spectest", "mlx"), default="spectest")
    return _jsonl.run(ap, build, argv)


if __name__ == "__main__":
    sys.exit(main())
