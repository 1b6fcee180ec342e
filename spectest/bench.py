"""``spectest bench``: any registered engine beside transformers' ``generate`` on one workload
(``BenchConfig``, ``BenchArm``), timed, with the derived figures and the JSON-lines record.

The why and the details: docs/internals.md "spectest/bench.py".
"""

from __future__ import annotations

import functools
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectest.errors import ConfigError, ModelError
from spectest.models.dtypes import dtype_name

if TYPE_CHECKING:  # torch loads with the first run, not with the CLI that reads the defaults
    from spectest.sampling.params import SamplingParams

ALIASES: dict[str, tuple[str, str]] = {
    "fast-plain": ("fast", "plain"),
    "fast-spec": ("fast", "spec"),
    "builtin-plain": ("builtin", "plain"),
    "builtin-spec": ("builtin", "spec"),
    "hf-generate": ("hf-generate", "plain"),
    "hf-assisted": ("hf-assisted", "spec"),
}
ARMS = tuple(ALIASES)  # the default arms
BASELINE = "hf-generate"  # the engine the ratio is to (transformers' plain generate)
MODES = ("plain", "spec")
DEFAULT_PROMPTS = "english-2"  # the shipped prompt set bench takes its prompt from
DEFAULT_PARAMS = (0.8, 0, 0.95)  # temperature, top_k, top_p
WARMUP_ROWS = 4


@dataclass(frozen=True)
class BenchArm:
    """One arm: its label, the registered engine that runs it, plain or speculative."""

    label: str
    engine: str
    mode: str  # "plain" (role reference, no variant) or "spec" (role candidate)


def parse_arm(label: str) -> BenchArm:
    """A label of ``ALIASES`` or a registered engine ``NAME`` / ``NAME:plain`` / ``NAME:spec``;
    ``ConfigError`` naming the label and what is allowed."""
    from spectest.engines import registry

    if label in ALIASES:
        return BenchArm(label, *ALIASES[label])
    name, _, mode = label.partition(":")
    if name in registry.names() and (mode or "spec") in MODES:
        return BenchArm(label, name, mode or "spec")
    raise ConfigError(
        f"bench: arms must be among {', '.join(ARMS)} or a registered engine NAME[:plain|:spec] "
        f"(engines: {', '.join(registry.names())}), got {label!r}"
    )


@dataclass(frozen=True)
class BenchConfig:
    """One workload, run by every arm."""

    target: str = "realistic:qwen3-0.6b"
    draft: str = "derived:first_layers,layers=4"
    device: str = "cpu"
    dtype: str | None = None  # None: the device's default (``models.dtypes.default_dtype``)
    rows: int = 256
    positions: int = 32
    k: int = 4
    onehot: bool = True
    params: SamplingParams = field(default_factory=lambda: _params(*DEFAULT_PARAMS))
    assisted_rows: int = 4  # rows of an engine that runs one row at a time (max_batch 1)
    arms: tuple[str, ...] = ARMS
    prompts: str = DEFAULT_PROMPTS  # a shipped prompt set; its first prompt is the workload's
    prompt: tuple[int, ...] | None = None  # explicit token ids instead (then ``prompts`` unused)
    peak_tflops: float | None = None  # None: no MFU (e.g. on CPU)
    seed: int = 0
    profile: str | None = None  # a directory: torch profiler trace + top ops of each arm's run
    whitebox: bool = False  # arms whose engine records white-box columns do (as a run does)
    engine_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    baseline: bool = True  # time transformers' plain generate for the ratio if no arm is it
    # timed runs of each arm, in rounds (every arm and the baseline once a round, in order), so
    # their ratios compare runs made side by side; the figures take each arm's median wall
    repeat: int = 1

    def __post_init__(self) -> None:
        dtype_name(self.dtype, self.device, what="--dtype")  # the dtype rule, before any load
        if not self.arms:
            raise ConfigError(f"bench: arms must be among {', '.join(ARMS)}, got none")
        for label in self.arms:
            parse_arm(label)
        for name, v in (
            ("rows", self.rows),
            ("positions", self.positions),
            ("k", self.k),
            ("assisted_rows", self.assisted_rows),
            ("repeat", self.repeat),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"bench: {name} must be an integer >= 1, got {v!r}")
        for name, raw in self.engine_options.items():
            if not isinstance(raw, Mapping):
                raise ConfigError(f"bench: options of engine {name!r} must be a mapping")


@dataclass(frozen=True)
class ArmResult:
    """One arm's timed run."""

    arm: str
    rows: int
    positions: int
    wall_s: float
    rows_per_s: float
    tokens_per_s: float
    mean_accepted: float | None  # accepted draft tokens per round (arms with rounds)
    mfu: float | None
    ratio_to_hf_generate: float | None  # rows/s over the baseline's rows/s
    note: str = ""
    engine: str = ""
    mode: str = ""
    # rounds of the slowest row (arms with rounds): what a batch of the timed rows loops for, so
    # two speculative timings compare per round when their tails differ (docs/internals.md)
    slowest_row_rounds: int | None = None
    wall_s_runs: tuple[float, ...] = ()  # every timed run's wall, round by round (``repeat``)
    # the ratio's least and greatest over the rounds (each round's rows/s over that round's
    # baseline): its spread across runs made side by side; None without a baseline
    ratio_min: float | None = None
    ratio_max: float | None = None


@dataclass(frozen=True)
class BenchResult:
    config: dict[str, Any]
    flops_per_token: float
    arms: tuple[ArmResult, ...]
    provenance: dict[str, Any]
    baseline: ArmResult | None = None  # timed only for the ratio (no arm was it)


@dataclass(frozen=True)
class _Timed:
    arm: BenchArm
    rows: int
    walls: tuple[float, ...]  # one per round
    mean_accepted: float | None
    whitebox: bool
    note: str
    slowest_row_rounds: int | None = None

    @property
    def wall_s(self) -> float:
        return statistics.median(self.walls)


def flops_per_token(model: Any) -> float:
    """2 × (decoder-layer + final-norm parameters + V × hidden) of an HF model (docs/internals.md);
    for a model without a transformers config (the toy LM), 0."""
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
    from spectest.engines.base import Models
    from spectest.models.zoo import load_pair

    say = log or (lambda s: None)
    t0 = time.perf_counter()
    dtype = dtype_name(cfg.dtype, cfg.device)  # what the models are loaded in, and recorded
    target, draft = load_pair(cfg.target, cfg.draft, device=cfg.device, dtype=dtype, seed=cfg.seed)
    load_s = time.perf_counter() - t0
    say(f"loaded {target.name} + draft in {load_s:.1f} s")
    prompt, prompt_name = bench_prompt(cfg, target.vocab_size)
    say(f"prompt: {prompt_name} ({len(prompt)} tokens)")
    arms = [parse_arm(label) for label in cfg.arms]
    bench = _Bench(cfg, Models(target, draft), say, prompt)
    try:
        only_base, base_note = bench.extra_baseline(arms)
        runs = [(arm, cfg.whitebox) for arm in arms] + [(a, False) for a in only_base]
        timed = bench.rounds(runs)
        prov = _provenance(cfg, target, draft, load_s, bench.provenance(), base_note)
    finally:
        bench.close()
    fpt = flops_per_token(target)
    bases = [t for t in timed if t.arm.engine == BASELINE and t.arm.mode == "plain"]
    base = next((t for t in bases if not t.whitebox), None)  # an arm, else the one timed for it
    results = tuple(_figures(t, cfg, fpt, base) for t in timed[: len(arms)])
    extra = None
    if only_base and base is not None:  # timed only for the ratio
        extra = _figures(base, cfg, fpt, base)
    config = asdict(cfg)
    config["params"] = asdict(cfg.params)
    config["dtype"] = dtype
    config["prompt_used"] = prompt_name
    return BenchResult(config, fpt, results, prov, extra)


def bench_prompt(cfg: BenchConfig, vocab_size: int) -> tuple[tuple[int, ...], str]:
    """The workload's prompt and how it is named: ``cfg.prompt`` (explicit ids), else the first
    prompt of the shipped prompt set ``cfg.prompts`` through the byte tokenizer (a real text:
    a synthetic run of ids 1..8 gave the bundled pair's drafter nothing to agree on, and every
    speculative arm accepted 0.00 tokens per round)."""
    from spectest.models import bytetok
    from spectest.prompts import load_prompt_set, prompt_token_ids

    if cfg.prompt is not None:
        return tuple(cfg.prompt), f"explicit ids ({len(cfg.prompt)})"
    source = f"bench --prompts {cfg.prompts}"
    spec = load_prompt_set(
        f"shipped:{cfg.prompts}", limit=1, base_dir=None, source=source, shipped=cfg.prompts
    )
    pid = spec.items[0].id
    if spec.items[0].text is not None and vocab_size < bytetok.VOCAB_SIZE:
        raise ConfigError(
            f"bench --prompts {cfg.prompts}: prompt {pid!r} is text, but the target has only "
            f"{vocab_size} token ids (the byte tokenizer needs {bytetok.VOCAB_SIZE}): pass "
            "--prompts ids-tiny (a shipped set of token ids)"
        )
    ids = prompt_token_ids(spec, vocab_size)[pid]
    return tuple(ids), f"shipped prompt set {cfg.prompts}, prompt {pid}"


class _Bench:
    """The engines of one benchmark (one instance per engine name, shared by its arms, as a run
    shares one per engine choice), their jobs and their timed runs."""

    def __init__(
        self, cfg: BenchConfig, models: Any, say: Callable[[str], None], prompt: tuple[int, ...]
    ) -> None:
        from spectest.engines.base import DrafterSpec, RowSpec

        self.cfg, self.models, self.say, self.prompt = cfg, models, say, prompt
        self.rows = tuple(RowSpec("bench", s, cfg.params) for s in range(cfg.rows))
        self.drafter = DrafterSpec(onehot=cfg.onehot, k=cfg.k)
        self.engines: dict[str, Any] = {}
        self.warmed: set[str] = set()  # arms run once untimed

    def engine(self, name: str) -> Any:
        """The engine registered as ``name``, built once with its ``engine_options``."""
        if name not in self.engines:
            from spectest.engines.registry import engine_class

            cls = engine_class(name)
            raw = dict(self.cfg.engine_options.get(name, {}))
            options = cls.parse_options(raw, f"bench --engine-options {name}", Path.cwd())
            self.engines[name] = cls(options, self.models)
        return self.engines[name]

    def job(self, arm: BenchArm, n: int, whitebox: bool) -> Any:
        from spectest.engines.base import ArmJob

        e = self.engine(arm.engine)
        spec = arm.mode == "spec"
        variant = "exact" if spec and e.uses_variant else None
        batch = min(self.cfg.rows, e.max_batch or self.cfg.rows)
        return ArmJob(
            arm.label,
            "candidate" if spec else "reference",
            variant,
            "bench",
            self.prompt,
            self.rows[:n],
            self.cfg.positions,
            1,
            batch,
            self.drafter,
            whitebox,
        )

    def _records_whitebox(self, arm: BenchArm) -> bool:
        return bool(self.engine(arm.engine).whitebox in ("generation", "teacher"))

    def rows_of(self, arm: BenchArm) -> int:
        """The arm's timed rows: ``assisted_rows`` for an engine that runs one row at a time."""
        return self.cfg.assisted_rows if self.engine(arm.engine).max_batch == 1 else self.cfg.rows

    def warm(self, arm: BenchArm, whitebox: bool) -> None:
        """One untimed run at the timed batch size (CUDA graphs and pools are per batch size;
        a few rows for a one-row-at-a-time engine)."""
        one_at_a_time = self.engine(arm.engine).max_batch == 1
        n = self.rows_of(arm)
        self.engine(arm.engine).generate(
            self.job(arm, min(n, WARMUP_ROWS) if one_at_a_time else n, whitebox)
        )

    def rounds(self, runs: list[tuple[BenchArm, bool]]) -> list[_Timed]:
        """Each ``(arm, whitebox)`` warmed once, then timed ``repeat`` times in rounds (every arm
        once a round, in order), each run's output checked; one ``_Timed`` per arm, in order."""
        from spectest.engines.base import check_output

        cfg = self.cfg
        runs = [(arm, wb and self._records_whitebox(arm)) for arm, wb in runs]
        for arm, wb in runs:
            if arm.label not in self.warmed:
                self.warm(arm, wb)
                self.warmed.add(arm.label)
        walls: list[list[float]] = [[] for _ in runs]
        first: list[Any] = [None] * len(runs)
        for _ in range(cfg.repeat):
            for i, (arm, wb) in enumerate(runs):
                job = self.job(arm, self.rows_of(arm), wb)
                _sync(cfg.device)
                t = time.perf_counter()
                out = self.engine(arm.engine).generate(job)
                _sync(cfg.device)
                walls[i].append(time.perf_counter() - t)
                check_output(out, job, self.models.target.vocab_size, arm.engine)
                first[i] = first[i] if first[i] is not None else (out, job)
        return [
            self._timed(arm, wb, tuple(w), *f)
            for (arm, wb), w, f in zip(runs, walls, first, strict=True)
        ]

    def _timed(
        self, arm: BenchArm, whitebox: bool, walls: tuple[float, ...], out: Any, job: Any
    ) -> _Timed:
        """An arm's figures from its first run's output (the rounds give the same rows)."""
        e = self.engine(arm.engine)
        if self.cfg.profile:  # after the timed runs, so the figures are not profiled ones
            path = Path(self.cfg.profile) / arm.label
            self.say(_profile(functools.partial(e.generate, job), self.cfg.device, path))
        rounds = out.rounds
        acc = None if rounds is None or not len(rounds) else float(rounds["accepted"].mean())
        slowest = None if acc is None else int(rounds.groupby("row").size().max())
        notes = []
        if err := e.provenance().get("graph_error"):
            notes.append(f"CUDA graphs off: {err}")
        if whitebox:
            wb_rows = 0 if out.whitebox is None else len(out.whitebox)
            notes.append(f"white-box columns: {wb_rows} rows")
        t = _Timed(arm, len(job.rows), walls, acc, whitebox, "; ".join(notes), slowest)
        many = f" (median of {len(walls)}: {min(walls):.2f}–{max(walls):.2f})"
        self.say(
            f"{arm.label}: {t.rows} rows in {t.wall_s:.2f} s{many if len(walls) > 1 else ''}"
            + (f", accepted/round {acc:.2f}, slowest row {slowest} rounds" if acc else "")
        )
        return t

    def extra_baseline(self, arms: list[BenchArm]) -> tuple[list[BenchArm], str]:
        """transformers' plain generate without white-box, to be timed beside the arms when no
        arm is it (``cfg.baseline``; warmed here): ``[arm]``, or ``[]`` and why there is none."""
        for arm in arms:
            if arm.engine == BASELINE and arm.mode == "plain":
                if not (self.cfg.whitebox and self._records_whitebox(arm)):
                    return [], ""
        if not self.cfg.baseline:
            return [], "no baseline (off)"
        base = BenchArm(BASELINE, BASELINE, "plain")
        try:
            self.warm(base, False)
        except ModelError as err:  # the toy LM is no transformers model
            return [], f"no baseline: {err}"
        self.warmed.add(base.label)
        return [base], ""

    def provenance(self) -> dict[str, Any]:
        return {name: e.provenance() for name, e in self.engines.items()}

    def close(self) -> None:
        for e in self.engines.values():
            e.close()


def _figures(t: _Timed, cfg: BenchConfig, fpt: float, base: _Timed | None) -> ArmResult:
    rate = t.rows / t.wall_s
    tps = rate * cfg.positions
    mfu = tps * fpt / (cfg.peak_tflops * 1e12) if cfg.peak_tflops and fpt else None
    ratio = None if base is None else rate / (base.rows / base.wall_s)
    rounds = [] if base is None else [
        (t.rows / w) / (base.rows / b) for w, b in zip(t.walls, base.walls, strict=True)
    ]  # fmt: skip
    return ArmResult(
        t.arm.label,
        t.rows,
        cfg.positions,
        t.wall_s,
        rate,
        tps,
        t.mean_accepted,
        mfu,
        ratio,
        t.note,
        t.arm.engine,
        t.arm.mode,
        t.slowest_row_rounds,
        t.walls,
        min(rounds) if rounds else None,
        max(rounds) if rounds else None,
    )


def _provenance(
    cfg: BenchConfig, target: Any, draft: Any, load_s: float, engines: dict[str, Any], note: str
) -> dict[str, Any]:
    import torch

    from spectest.engines.hf.pinning import transformers_version

    graphs = [p for p in engines.values() if "cuda_graphs" in p]
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": cfg.device,
        "device_name": torch.cuda.get_device_name(cfg.device)
        if cfg.device.startswith("cuda")
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": transformers_version(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "git": _git_sha(),
        "load_s": round(load_s, 3),
        # whether an engine's arms ran on CUDA graphs (the fast engine; False on CPU or after a
        # failed capture)
        "cuda_graphs": any(bool(p["cuda_graphs"]) for p in graphs),
        "graph_error": next((p.get("graph_error") for p in graphs if p.get("graph_error")), None),
        "target_name": target.name,
        "draft_name": draft.name,
        "engines": engines,
        "baseline_note": note,
    }


def write_records(result: BenchResult, path: str | Path) -> Path:
    """Append one JSON line per arm (config, provenance and the arm's figures) to ``path``; the
    separately timed baseline too (``"baseline": true``)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    extra = [] if result.baseline is None else [(result.baseline, True)]
    with p.open("a", encoding="utf-8") as fh:
        for arm, is_base in [*((a, False) for a in result.arms), *extra]:
            rec = {
                "bench": "spectest.bench",
                **result.provenance,
                "config": result.config,
                "flops_per_token": result.flops_per_token,
                **asdict(arm),
                **({"baseline": True} if is_base else {}),
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


def _params(temperature: float, top_k: int, top_p: float) -> SamplingParams:
    from spectest.sampling.params import SamplingParams

    return SamplingParams(temperature, top_k, top_p)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _git_sha() -> str:
    from spectest.files import git_sha

    return git_sha() or ""
