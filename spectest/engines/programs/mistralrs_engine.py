#!/usr/bin/env python3
"""mistral.rs (the ``mistralrs`` package) as an engine program for spectest's ``command`` engine.

Runs under the pinned venv of ``spectest setup mistralrs`` (stdlib, ``mistralrs`` and ``_jsonl``
only), started by ``python -m spectest.setup.mistralrs run ...``. Text in, text out; seeds are
**not honoured** (its hello line says so). The tokenizer and the burn-in: docs/internals-engines.md.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _jsonl

ENGINE = "mistral.rs"
WORD = re.compile(r"t(\d+)")
BURN_MOD = 61
SEEDS_NOTE = (
    "ignored: mistral.rs on CPU has no per-request seed and refuses an engine seed; one "
    "process-wide RNG with a fixed start (arms offset by a burn-in of 1 + row_keys[0] % 61 "
    "tokens): rows are not reproducible from their seeds"
)


def prompt_text(ids: list[int]) -> str:
    return " ".join(f"t{int(i)}" for i in ids)


def parse_text(text: str, vocab: int) -> list[int]:
    out = []
    for w in text.split():
        m = WORD.fullmatch(w)
        if m is None or int(m.group(1)) >= vocab:
            raise _jsonl.JobRefused(f"{ENGINE} returned a word that is no token: {w!r}")
        out.append(int(m.group(1)))
    return out


class MistralRunner:
    """One ``mistralrs.Runner`` and how a job becomes requests.

    ``runner`` needs ``send_completion_request(request)``; ``make_request(**fields)`` builds the
    request (``mistralrs.CompletionRequest``; tests pass fakes of both).
    """

    def __init__(
        self, runner: Any, make_request: Any, vocab: int, overrides: dict[str, Any] | None = None
    ) -> None:
        self.runner, self.make_request, self.vocab = runner, make_request, vocab
        self.overrides = dict(overrides or {})
        self.burned: int | None = None

    def request(self, job: dict[str, Any], max_tokens: int, temperature: float, f: dict) -> Any:
        return self.make_request(
            prompt=prompt_text(job["prompt"]),
            model="spectest",
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=float(f.get("top_p", 1.0)),
            top_k=int(f["top_k"]) if "top_k" in f else None,
            min_p=float(f["min_p"]) if "min_p" in f else None,
            **self.overrides,
        )

    def decode(self, job: dict[str, Any]) -> _jsonl.Decoded:
        s = job["sampling"]
        f = _jsonl.single_filter(s, ENGINE)
        T = int(job["max_tokens"])
        if self.burned is None:  # offset this process's stream from another arm's
            self.burned = 1 + int(job["row_keys"][0]) % BURN_MOD
            self.runner.send_completion_request(self.request(job, self.burned, 1.0, {}))
        for seed in job["seeds"]:
            res = self.runner.send_completion_request(
                self.request(job, T, float(s["temperature"]), f)
            )
            # 0.5.0 generates max_tokens + 1 tokens; the first max_tokens are the sequence
            tokens = parse_text(res.choices[0].text, self.vocab)[:T]
            if len(tokens) < T:
                raise _jsonl.JobRefused(
                    f"{ENGINE} returned {len(tokens)} of {T} tokens "
                    f"(finish reason {res.choices[0].finish_reason!r})"
                )
            yield seed, tokens, None


def build(args: argparse.Namespace) -> tuple[MistralRunner, dict[str, Any]]:
    import importlib.metadata as md
    import json
    import os

    os.environ.setdefault("RUST_LOG", "error")  # its INFO lines would bury an error's stderr tail
    import mistralrs as mr

    def which(path: str) -> Any:
        return mr.Which.Plain(model_id=path, arch=mr.Architecture.Llama, dtype=mr.ModelDType.F32)

    kw: dict[str, Any] = {}
    if args.draft:
        kw = {"which_draft": which(args.draft), "speculative_gamma": args.gamma}
    runner = mr.Runner(which=which(args.target), max_seqs=16, **kw)
    overrides = _jsonl.parse_overrides(args.override)
    vocab = int(json.loads((Path(args.target) / "config.json").read_text())["vocab_size"])
    hello = {
        "engine": ENGINE,
        "version": md.version("mistralrs"),
        "mode": "speculative" if args.draft else "plain",
        "speculative_gamma": args.gamma if args.draft else None,
        "dtype": "f32",
        "seeds": "ignored",
        "seeds_note": SEEDS_NOTE,
        "reproducible": False,
        "target": args.target,
        "draft": args.draft,
        "overrides": overrides,
    }
    return MistralRunner(runner, mr.CompletionRequest, vocab, overrides), hello


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="exported model directory")
    ap.add_argument("--draft", default=None, help="exported draft directory: speculative")
    ap.add_argument("--gamma", type=int, default=3, help="speculative_gamma (draft tokens)")
    _jsonl.add_override(
        ap, "set a CompletionRequest field on every request (a misconfigured tooth)"
    )
    return _jsonl.run(ap, build, argv)


if __name__ == "__main__":
    sys.exit(main())
