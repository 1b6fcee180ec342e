"""Throughput of the built-in engines: rows/second of the plain and speculative arms.

Workload: one prompt (8 token ids; English text for the bundled pair), ``--rows`` rows of one
sampled config (temperature 1, top-k 50, top-p 0.95), ``--positions`` tokens, K draft tokens per
round (sampled drafter, exact variant), one batch of all rows. Pairs: the toy LM (V=256, order 2,
scale 2; draft = table noise 0.5), the tiny HF preset (llama-tiny, logit_scale 8; draft = its
first layer), the bundled trained byte-level pair (fp32), and with ``--big`` the random-init
Qwen3-0.6B shapes (bf16 on CUDA; draft = its first 4 layers). Side by side in one run.
Records go to results/bench/engines.json (one record per (pair, arm), appended).

    OMP_NUM_THREADS=1 python benchmarks/bench_engines.py [--device cuda] [--big]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from datetime import date
from pathlib import Path
from typing import Any

import torch

from spectest.engines.base import DecodeRequest
from spectest.engines.builtin import DrafterSpec, RowSpec, plain_decode, speculative_decode
from spectest.models import bytetok
from spectest.models.derive import first_layers
from spectest.models.hf import from_preset
from spectest.models.toy import ToyLM
from spectest.models.zoo import load_pair
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams

SYNTH_PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


def pairs(device: str, big: bool):
    toy = ToyLM(256, 2, 2.0, seed=0, device=device)
    yield "toy:V=256,order=2", toy, toy.perturbed(0.5, seed=1), SYNTH_PROMPT
    tgt, drf = load_pair("bundled:target", "bundled:draft", device=device, dtype="float32", seed=0)
    # NOTE: a text prompt: after control bytes like SYNTH_PROMPT the pair is out of distribution
    # (measured: disjoint top-50 supports, zero acceptance), which would bench nothing useful.
    yield "bundled pair (trained)", tgt, drf, bytetok.encode("The function returns a list of the")
    tiny = from_preset("llama-tiny", seed=0, device=device, dtype=torch.float32, logit_scale=8.0)
    yield "hf-preset:llama-tiny", tiny, first_layers(tiny, 1), SYNTH_PROMPT
    if big:
        q = from_preset("qwen3-0.6b", seed=0, device=device, logit_scale=1.0)
        yield "hf-preset:qwen3-0.6b (bf16)", q, first_layers(q, 4), SYNTH_PROMPT


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _git_sha() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return ""


def _machine(machine: str, device: str, sha: str) -> dict[str, Any]:
    """The fields of a record that say where and on what it ran."""
    return {
        "date": date.today().isoformat(),
        "bench": "engines.builtin",
        "machine": machine,
        "device": device,
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "python": platform.python_version(),
        "git": sha,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--positions", type=int, default=32)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--big", action="store_true")
    ap.add_argument("--machine", default="2-core CPU dev box")
    ap.add_argument("--out", default="results/bench/engines.json")
    args = ap.parse_args()
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.95)
    rows = [RowSpec("c", s, params) for s in range(args.rows)]
    kw = dict(num_positions=args.positions, run_key=1, prompt_id="p", batch_size=args.rows)
    drafter = DrafterSpec(onehot=False, k=args.k)
    exact = get_variant("exact")
    sha = _git_sha()
    records = []
    for name, target, draft, prompt in pairs(args.device, args.big):
        plain_decode(target, DecodeRequest(prompt, rows[:8], **kw))  # warm-up (allocator, kernels)
        for arm in ("plain", "speculative"):
            sync(args.device)
            t0 = time.perf_counter()
            if arm == "plain":
                out = plain_decode(target, DecodeRequest(prompt, rows, **kw))
            else:
                out = speculative_decode(
                    target, draft, DecodeRequest(prompt, rows, **kw), drafter=drafter, variant=exact
                )
            sync(args.device)
            wall = time.perf_counter() - t0
            rec = {
                **_machine(args.machine, args.device, sha),
                "model": name,
                "arm": arm,
                "rows": args.rows,
                "positions": args.positions,
                "k": args.k if arm == "speculative" else None,
                "wall_s": round(wall, 3),
                "rows_per_s": round(args.rows / wall, 2),
                "tokens_per_s": round(args.rows * args.positions / wall, 1),
            }
            if out.rounds is not None:
                rec["mean_accepted"] = round(float(out.rounds["accepted"].mean()), 3)
                rec["rounds_per_row"] = round(len(out.rounds) / args.rows, 2)
            print(json.dumps(rec))
            records.append(rec)
    path = Path(args.out)
    old = json.loads(path.read_text()) if path.exists() else []
    path.write_text(json.dumps(old + records, indent=1) + "\n")


if __name__ == "__main__":
    main()
