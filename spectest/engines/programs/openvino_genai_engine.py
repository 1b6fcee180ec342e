#!/usr/bin/env python3
"""OpenVINO GenAI as an engine program for spectest's ``command`` engine (``spectest-jsonl/1``).

Runs under the pinned venv of ``spectest setup openvino`` (stdlib, ``openvino_genai`` and
``_jsonl`` only), started by ``python -m spectest.setup.openvino run ...``. What it calls per seed
and the settings that matter for the law: docs/internals-engines.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _jsonl

ENGINE = "openvino-genai"
PROPERTIES = {"INFERENCE_PRECISION_HINT": "f32"}


class OVRunner:
    """One pipeline and how a job's seeds become requests.

    ``pipe`` is an ``openvino_genai.LLMPipeline`` (tests pass a fake with the same two methods:
    ``get_generation_config()`` and ``generate(inputs, config)``); ``to_input`` turns a token
    list into the pipeline's input (``ov.Tensor`` of shape [1, L], int64).
    """

    def __init__(
        self,
        pipe: Any,
        to_input: Callable[[list[int]], Any],
        assistant_tokens: int | None,
        overrides: dict[str, Any] | None = None,
    ) -> None:
        self.pipe, self.to_input, self.assistant_tokens = pipe, to_input, assistant_tokens
        self.overrides = dict(overrides or {})

    def config(self, job: dict[str, Any], rng_seed: int) -> Any:
        s = job["sampling"]
        f = _jsonl.single_filter(s, ENGINE)
        c = self.pipe.get_generation_config()
        c.do_sample = True
        c.temperature = float(s["temperature"])
        c.top_k = int(f.get("top_k", 0))
        c.top_p = float(f.get("top_p", 1.0))
        c.min_p = float(f.get("min_p", 0.0))
        c.max_new_tokens = int(job["max_tokens"])
        c.min_new_tokens = 0
        c.ignore_eos = True
        c.repetition_penalty = 1.0
        c.presence_penalty = 0.0
        c.frequency_penalty = 0.0
        c.num_return_sequences = 1
        c.rng_seed = int(rng_seed)
        if self.assistant_tokens is not None:
            c.num_assistant_tokens = int(self.assistant_tokens)
        for key, value in self.overrides.items():  # a deliberate misconfiguration (--override)
            setattr(c, key, value)
        return c

    def decode(self, job: dict[str, Any]) -> _jsonl.Decoded:
        seeds, keys = job["seeds"], job["row_keys"]
        if len(seeds) != len(keys):
            raise _jsonl.JobRefused("seeds and row_keys differ in length")
        configs = [self.config(job, key) for key in keys]  # a refused job sends no result
        inputs = self.to_input([int(t) for t in job["prompt"]])
        for seed, config in zip(seeds, configs, strict=True):
            res = self.pipe.generate(inputs, config)
            tokens = [int(t) for t in res.tokens[0]][: int(job["max_tokens"])]
            yield seed, tokens, self.rounds(res, len(tokens))

    def rounds(self, res: Any, emitted: int) -> _jsonl.Rounds:
        """The request's speculative totals as one rounds entry (none in plain mode)."""
        if self.assistant_tokens is None:
            return None
        m = getattr(res, "extended_perf_metrics", None)
        if m is None:
            return None
        return [
            {
                "drafted": int(m.get_num_draft_tokens()),
                "accepted": int(m.get_num_accepted_tokens()),
                "emitted": emitted,
            }
        ]


def build(args: argparse.Namespace) -> tuple[OVRunner, dict[str, Any]]:
    """The real pipeline and the hello fields that describe it."""
    import numpy as np
    import openvino as ov
    import openvino_genai as ov_genai

    kw: dict[str, Any] = dict(PROPERTIES)
    scheduler = "default (prefix caching on)"
    if not args.prefix_caching:
        sc = ov_genai.SchedulerConfig()
        sc.enable_prefix_caching = False
        sc.cache_size = 1  # GB of KV cache: ample for tiny models and short prompts
        kw["scheduler_config"] = sc
        scheduler = "enable_prefix_caching=False, cache_size=1"
    if args.draft:
        kw["draft_model"] = ov_genai.draft_model(args.draft, args.device, **PROPERTIES)
    pipe = ov_genai.LLMPipeline(args.target, args.device, **kw)

    def to_input(ids: list[int]) -> Any:
        return ov.Tensor(np.asarray([ids], dtype=np.int64))

    k = args.num_assistant_tokens if args.draft else None
    overrides = _jsonl.parse_overrides(args.override)
    hello = {
        "engine": ENGINE,
        "version": str(ov_genai.get_version()),
        "openvino": str(ov.get_version()),
        "mode": "speculative" if args.draft else "plain",
        "num_assistant_tokens": k,
        "device": args.device,
        "properties": PROPERTIES,
        "scheduler": scheduler,
        "seeds": "per request: rng_seed = spectest's row key",
        "target": args.target,
        "draft": args.draft,
        "overrides": overrides,
    }
    return OVRunner(pipe, to_input, k, overrides), hello


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="OpenVINO IR directory (optimum-cli export)")
    ap.add_argument("--draft", default=None, help="draft IR directory: speculative decoding")
    ap.add_argument("--num-assistant-tokens", type=int, default=3)
    ap.add_argument("--device", default="CPU")
    ap.add_argument(
        "--prefix-caching",
        action="store_true",
        help="keep the pipeline's default scheduler (prefix caching on; crashes speculative)",
    )
    _jsonl.add_override(
        ap, "set a GenerationConfig field after the job's settings (a misconfigured tooth)"
    )
    return _jsonl.run(ap, build, argv)


if __name__ == "__main__":
    sys.exit(main())
