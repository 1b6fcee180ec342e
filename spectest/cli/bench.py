"""``spectest bench``: any registered engine beside transformers' ``generate`` on one workload."""

from __future__ import annotations

from dataclasses import fields
from typing import Annotated, Any

import typer
from rich.table import Table

from spectest.bench import DEFAULT_PARAMS, BenchConfig
from spectest.cli.common import boundary, console, err_console
from spectest.cli.supervised import (
    DEFAULT_TIMEOUT_S,
    PluginTimeoutOpt,
    bench_plugins,
    supervise_or_continue,
)
from spectest.errors import ConfigError

D: dict[str, Any] = {f.name: f.default for f in fields(BenchConfig)}  # written once: bench.py
D |= {"arms": ",".join(D["arms"]), "drafter": "onehot" if D["onehot"] else "sampled"}
TEMPERATURE, TOP_K, TOP_P = DEFAULT_PARAMS


def parse_engine_options(items: list[str]) -> dict[str, dict[str, Any]]:
    """``["NAME=YAML mapping", ...]`` → ``{NAME: mapping}``; ``ConfigError`` naming the item."""
    import yaml

    out: dict[str, dict[str, Any]] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        try:
            value = yaml.safe_load(raw) if sep else None
        except yaml.YAMLError as err:
            raise ConfigError(f"--engine-options {item!r}: not YAML ({err})") from None
        if not name or not isinstance(value, dict):
            raise ConfigError(
                f"--engine-options {item!r}: expected NAME={{OPTION: VALUE, ...}} "
                "(a YAML mapping, as under a protocol's engines.<arm>)"
            )
        out[name] = value
    return out


# the longer options, one definition each (the command's signature stays one screen)
ArmsOpt = Annotated[
    str,
    typer.Option(
        help="Comma-separated arms: fast-plain, fast-spec, builtin-plain, builtin-spec, "
        "hf-generate, hf-assisted, or any registered engine NAME (speculative) / NAME:plain."
    ),
]
EngineOptionsOpt = Annotated[
    list[str] | None,
    typer.Option(
        help="NAME={OPTION: VALUE, ...}: an engine's options, as under a protocol's "
        "engines.<arm> (repeatable)."
    ),
]
BaselineOpt = Annotated[
    bool,
    typer.Option(
        "--baseline/--no-baseline",
        help="Time transformers' plain generate for the ratio when no arm is it.",
    ),
]
ProfileOpt = Annotated[
    str | None,
    typer.Option(help="Directory for a torch profiler trace and top ops of each arm (extra run)."),
]
WhiteboxOpt = Annotated[
    bool,
    typer.Option(
        "--whitebox/--no-whitebox",
        help="Arms whose engine records white-box columns do, during generation (as a run does).",
    ),
]
TargetOpt = Annotated[str, typer.Option(help="Target model spec (`spectest models`).")]
DraftOpt = Annotated[str, typer.Option(help="Draft model spec.")]
DtypeOpt = Annotated[
    str | None, typer.Option(help="float32 / bfloat16 (default: fp32 CPU, bf16 CUDA).")
]
AssistedRowsOpt = Annotated[
    int, typer.Option(help="Rows for transformers' assisted generation (batch 1 only).")
]
PeakOpt = Annotated[
    float | None, typer.Option(help="Peak TFLOP/s of the device, for MFU (e.g. 800 on H200).")
]
PromptsOpt = Annotated[
    str, typer.Option(help="Shipped prompt set whose first prompt every row continues.")
]
OutOpt = Annotated[str, typer.Option(help="JSON-lines file the records are appended to.")]
RepeatOpt = Annotated[
    int,
    typer.Option(
        help="Timed runs per arm, in rounds (every arm and the baseline once a round): the "
        "figures take the median wall, the ratio shows its least and greatest over the rounds."
    ),
]


@boundary
def bench(
    target: TargetOpt = D["target"],
    draft: DraftOpt = D["draft"],
    device: Annotated[str, typer.Option(help="cpu or cuda[:i].")] = D["device"],
    dtype: DtypeOpt = D["dtype"],
    rows: Annotated[int, typer.Option(help="Rows (generations) per arm, one batch.")] = D["rows"],
    positions: Annotated[int, typer.Option(help="Tokens generated per row.")] = D["positions"],
    k: Annotated[int, typer.Option(help="Draft tokens per round.")] = D["k"],
    drafter: Annotated[str, typer.Option(help="onehot (greedy draft) or sampled.")] = D["drafter"],
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = TEMPERATURE,
    top_k: Annotated[int, typer.Option(help="top-k (0 = off).")] = TOP_K,
    top_p: Annotated[float, typer.Option(help="top-p (1 = off).")] = TOP_P,
    assisted_rows: AssistedRowsOpt = D["assisted_rows"],
    arms: ArmsOpt = D["arms"],
    engine_options: EngineOptionsOpt = None,
    baseline: BaselineOpt = D["baseline"],
    peak_tflops: PeakOpt = D["peak_tflops"],
    profile: ProfileOpt = D["profile"],
    whitebox: WhiteboxOpt = D["whitebox"],
    prompts: PromptsOpt = D["prompts"],
    repeat: RepeatOpt = D["repeat"],
    out: OutOpt = "results/bench/bench.jsonl",
    plugin_timeout: PluginTimeoutOpt = DEFAULT_TIMEOUT_S,
) -> None:
    """Rows/s, tokens/s, acceptance, MFU and the ratio to transformers' plain generate, per arm
    (any registered engine)."""
    options = parse_engine_options(engine_options or [])
    supervise_or_continue(bench_plugins(arms, options), plugin_timeout, verdict=False)
    from spectest.bench import run_bench, write_records
    from spectest.sampling.params import SamplingParams

    if drafter not in ("onehot", "sampled"):
        raise ConfigError(f"--drafter must be onehot or sampled, got {drafter!r}")
    cfg = BenchConfig(
        target=target,
        draft=draft,
        device=device,
        dtype=dtype,
        rows=rows,
        positions=positions,
        k=k,
        onehot=drafter == "onehot",
        params=SamplingParams(temperature, top_k, top_p),
        assisted_rows=assisted_rows,
        arms=tuple(a.strip() for a in arms.split(",") if a.strip()),
        peak_tflops=peak_tflops,
        profile=profile,
        whitebox=whitebox,
        engine_options=options,
        baseline=baseline,
        prompts=prompts,
        repeat=repeat,
    )
    result = run_bench(cfg, log=lambda s: err_console().print(s, markup=False))
    show(result, device)
    path = write_records(result, out)
    console().print(
        f"FLOPs/token {result.flops_per_token / 1e9:.3g} G; records appended to {path}",
        markup=False,
    )


def _ratio(a: Any) -> str:
    """The ratio to the baseline; with repeats, its least and greatest over the rounds too."""
    if a.ratio_to_hf_generate is None:
        return ""
    spread = f" ({a.ratio_min:.2f}–{a.ratio_max:.2f})" if len(a.wall_s_runs) > 1 else ""
    return f"{a.ratio_to_hf_generate:.2f}{spread}"


def show(result: Any, device: str) -> None:
    """The arms' figures as a table (the separately timed baseline last), their notes, and
    whether each engine that can ran on CUDA graphs."""
    table = Table(
        title=f"spectest bench: {result.provenance['target_name']} on {device}; "
        f"prompt: {result.config.get('prompt_used', '?')}"
    )
    for col in ("arm", "rows", "wall s", "rows/s", "tokens/s", "acc/round", "MFU", "× hf-generate"):
        table.add_column(col, justify="left" if col == "arm" else "right")
    base = [] if result.baseline is None else [result.baseline]
    for a in [*result.arms, *base]:
        table.add_row(
            a.arm + (" (baseline)" if a is result.baseline else ""),
            str(a.rows),
            f"{a.wall_s:.2f}",
            f"{a.rows_per_s:.1f}",
            f"{a.tokens_per_s:.0f}",
            "" if a.mean_accepted is None else f"{a.mean_accepted:.2f}",
            "" if a.mfu is None else f"{100 * a.mfu:.1f}%",
            _ratio(a),
        )
    con = console()
    con.print(table)
    for a in result.arms:
        if a.note:
            con.print(f"{a.arm}: {a.note}", markup=False)
    prov = result.provenance
    if prov["baseline_note"]:
        con.print(prov["baseline_note"], markup=False)
    for name, engine_prov in prov["engines"].items():
        if "cuda_graphs" in engine_prov:
            con.print(f"{name} arms on CUDA graphs: {engine_prov['cuda_graphs']}", markup=False)
