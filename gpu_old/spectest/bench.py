"""``spectest bench``: spectest's engines and transformers' side by side on one workload.

Owns: the benchmark workload (``BenchConfig``: one model pair, one prompt, ``rows`` rows of one
sampling config, ``positions`` tokens, K), the arms (``ARMS``), their timing, the derived figures
(rows/s, tokens/s, mean accepted tokens per round, MFU, ratio to transformers' plain
``generate``) and the JSON-lines record. Knows nothing about statistics or run directories; the
engines are called through their public functions, exactly as the runner calls them.

Arms
----
- ``fast-plain`` / ``fast-spec``: the fast engine (``engines/fast.py``: static cache, CUDA
  graphs on CUDA, fast sampling pipeline);
- ``builtin-plain`` / ``builtin-spec``: the built-in engine (the reference loops);
- ``hf-generate``: transformers' batched ``generate(do_sample=True)`` at the same batch;
- ``hf-assisted``: transformers' assisted generation (batch 1 only: ``assisted_rows`` rows, one
  at a time; its rows/s is per row, so it compares as "gens/s").
Every arm runs once untimed on a few rows first (allocator, kernels, CUDA graphs captured), then
timed on the full workload with a device synchronisation at both ends.

MFU (model FLOPs utilisation) = emitted tokens/s × FLOPs/token ÷ ``peak_tflops``, with
FLOPs/token = 2 × (decoder-layer and final-norm parameters + V × hidden): the target's matmul
work for one token, attention's context term left out (small at these lengths). A speculative arm
counts only emitted tokens, so its MFU is useful work, not work done.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from spectest.errors import ConfigError
from spectest.sampling.params import SamplingParams

ARMS = ("fast-plain", "fast-spec", "builtin-plain", "builtin-spec", "hf-generate", "hf-assisted")
SYNTH_PROMPT = (1, 2, 3, 4, 5, 6, 7, 8)
WARMUP_ROWS = 4


@dataclass(frozen=True)
class BenchConfig:
    """One workload, run by every arm."""

    target: str = "realistic:qwen3-0.6b"
    draft: str = "derived:first_layers,layers=4"
    device: str = "cpu"
    dtype: str | None = None  # None: float32 on CPU, bfloat16 on CUDA
    rows: int = 256
    positions: int = 32
    k: int = 4
    onehot: bool = True
    params: SamplingParams = field(default_factory=lambda: SamplingParams(0.8, 0, 0.95))
    assisted_rows: int = 4
    arms: tuple[str, ...] = ARMS
    prompt: tuple[int, ...] = SYNTH_PROMPT
    peak_tflops: float | None = None  # None: no MFU (e.g. on CPU)
    seed: int = 0
    profile: str | None = None  # a directory: torch profiler trace + top ops of each arm's run
    whitebox: bool = False  # spectest's arms record the white-box columns (as a run does)

    def __post_init__(self) -> None:
        bad = [a for a in self.arms if a not in ARMS]
        if bad or not self.arms:
            raise ConfigError(f"bench: arms must be among {', '.join(ARMS)}, got {self.arms!r}")
        for name in ("rows", "positions", "k", "assisted_rows"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"bench: {name} must be an integer >= 1, got {v!r}")


@dataclass(frozen=True)
class ArmResult:
    """One arm's timed run."""

    arm: str
    rows: int
    positions: int
    wall_s: float
    rows_per_s: float
    tokens_per_s: float
    mean_accepted: float | None  # accepted draft tokens per round (speculative arms)
    mfu: float | None
    ratio_to_hf_generate: float | None  # rows/s over hf-generate's rows/s
    note: str = ""


@dataclass(frozen=True)
class BenchResult:
    config: dict[str, Any]
    flops_per_token: float
    arms: tuple[ArmResult, ...]
    provenance: dict[str, Any]


def flops_per_token(model: Any) -> float:
    """2 × (decoder-layer + final-norm parameters + V × hidden) of an HF model (module docstring);
    for a model without a transformers config (the toy LM), 2 × its parameter count, or 0."""
    hf = getattr(getattr(model, "base", model), "model", None)
    cfg = getattr(hf, "config", None)
    if cfg is None or not hasattr(cfg, "hidden_size"):
        return 0.0
    inner: Any = getattr(hf, "model", hf)
    body = sum(p.numel() for p in inner.layers.parameters()) + sum(
        p.numel() for p in inner.norm.parameters()
    )
    return 2.0 * float(body + int(cfg.vocab_size) * int(cfg.hidden_size))


def run_bench(cfg: BenchConfig, *, log: Callable[[str], None] | None = None) -> BenchResult:
    """Load the pair once, run every arm of ``cfg`` (warm-up, then timed), derive the figures."""
    from spectest.engines import builtin, fast, hf
    from spectest.engines.builtin import DrafterSpec, RowSpec
    from spectest.models.zoo import load_pair
    from spectest.sampling.mutants import get_variant

    say = log or (lambda s: None)
    t0 = time.perf_counter()
    target, draft = load_pair(
        cfg.target, cfg.draft, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed
    )
    load_s = time.perf_counter() - t0
    say(f"loaded {target.name} + draft in {load_s:.1f} s")
    fast_t = fast.as_fast(target)
    fast_d = fast.as_fast(draft)
    rows = [RowSpec("bench", s, cfg.params) for s in range(cfg.rows)]
    drafter = DrafterSpec(onehot=cfg.onehot, k=cfg.k)
    exact = get_variant("exact")
    prompt = list(cfg.prompt)
    kw: dict[str, Any] = dict(num_positions=cfg.positions, run_key=1, prompt_id="bench")

    # white-box columns as a run records them: the plain arm runs the draft along its tokens
    wb: dict[str, Any] = dict(whitebox=cfg.whitebox)
    wb_plain = dict(wb, drafter=drafter) if cfg.whitebox else wb

    def call(arm: str, part: Sequence[Any]) -> Any:
        if arm == "fast-plain":
            return fast.plain_decode_fast(
                fast_t, prompt, part, batch_size=cfg.rows,
                **(dict(wb_plain, draft=fast_d) if cfg.whitebox else wb), **kw,
            )  # fmt: skip
        if arm == "fast-spec":
            return fast.speculative_decode_fast(
                fast_t, fast_d, prompt, part, drafter=drafter, variant=exact,
                batch_size=cfg.rows, **wb, **kw,
            )  # fmt: skip
        if arm == "builtin-plain":
            return builtin.plain_decode(
                target, prompt, part, batch_size=cfg.rows,
                **(dict(wb_plain, draft=draft) if cfg.whitebox else wb), **kw,
            )  # fmt: skip
        if arm == "builtin-spec":
            return builtin.speculative_decode(
                target, draft, prompt, part, drafter=drafter, variant=exact,
                batch_size=cfg.rows, **wb, **kw,
            )  # fmt: skip
        if arm == "hf-generate":
            return hf.hf_plain_decode(target, prompt, part, batch_size=cfg.rows, **kw)
        return hf.hf_assisted_decode(target, draft, prompt, part, num_assistant_tokens=cfg.k, **kw)

    fpt = flops_per_token(target)
    timed: list[tuple[str, int, float, float | None, str]] = []
    for arm in cfg.arms:
        n = cfg.assisted_rows if arm == "hf-assisted" else cfg.rows
        # warm-up at the timed batch size (CUDA graphs and pools are per batch size)
        call(arm, rows[: min(n, WARMUP_ROWS)] if arm == "hf-assisted" else rows[:n])
        _sync(cfg.device)
        t = time.perf_counter()
        out = call(arm, rows[:n])
        _sync(cfg.device)
        wall = time.perf_counter() - t
        if cfg.profile:  # after the timed run, so the figures are not profiled ones
            rerun = functools.partial(call, arm, rows[:n])
            say(_profile(rerun, cfg.device, Path(cfg.profile) / arm))
        acc = None if out.rounds is None else float(out.rounds["accepted"].mean())
        note = ""
        graph_error = getattr(fast_t, "graph_error", None)
        if arm.startswith("fast") and graph_error:
            note = f"CUDA graphs off: {graph_error}"
        if cfg.whitebox and arm.split("-")[0] in ("fast", "builtin"):
            wb_rows = 0 if out.whitebox is None else len(out.whitebox)
            note = "; ".join(x for x in (note, f"white-box columns: {wb_rows} rows") if x)
        timed.append((arm, n, wall, acc, note))
        say(f"{arm}: {n} rows in {wall:.2f} s" + (f", accepted/round {acc:.2f}" if acc else ""))
    hf_rate = next((n / w for a, n, w, _, _ in timed if a == "hf-generate"), None)
    results = []
    for arm, n, wall, acc, note in timed:
        rate = n / wall
        tps = rate * cfg.positions
        mfu = None
        if cfg.peak_tflops and fpt:
            mfu = tps * fpt / (cfg.peak_tflops * 1e12)
        results.append(
            ArmResult(
                arm,
                n,
                cfg.positions,
                wall,
                rate,
                tps,
                acc,
                mfu,
                None if hf_rate is None else rate / hf_rate,
                note,
            )
        )
    config = asdict(cfg)
    config["params"] = asdict(cfg.params)
    prov = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": cfg.device,
        "device_name": torch.cuda.get_device_name(cfg.device)
        if cfg.device.startswith("cuda")
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": hf.transformers_version(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "git": _git_sha(),
        "load_s": round(load_s, 3),
        # whether the fast arms ran on CUDA graphs (False on CPU, or after a failed capture)
        "cuda_graphs": bool(getattr(fast_t, "cuda_graphs", False)),
        "graph_error": getattr(fast_t, "graph_error", None),
        "target_name": target.name,
        "draft_name": draft.name,
    }
    return BenchResult(config, fpt, tuple(results), prov)


def write_records(result: BenchResult, path: str | Path) -> Path:
    """Append one JSON line per arm (config, provenance and the arm's figures) to ``path``."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("a", encoding="utf-8") as fh:
        for arm in result.arms:
            rec = {
                "bench": "spectest.bench",
                **result.provenance,
                "config": result.config,
                "flops_per_token": result.flops_per_token,
                **asdict(arm),
            }
            fh.write(json.dumps(rec) + "\n")
    return p


def _profile(fn: Callable[[], Any], device: str, path: Path) -> str:
    """Run ``fn`` under torch's profiler; write a Chrome trace to ``path``.json and return the
    top operators by device (or CPU) time as text."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=acts) as prof:
        fn()
        _sync(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path) + ".json")
    key = "cuda_time_total" if device.startswith("cuda") else "cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=15)
    return f"profile of {path.name} ({path}.json):\n{table}"


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _git_sha() -> str:
    from spectest.store import git_sha

    return git_sha() or ""
