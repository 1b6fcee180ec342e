"""One side of ``tools/gpu/issue32_numerics_ab.sh`` (issue 32): P1's ``numerics`` and ``tooth
sizes`` phases, as the runner calls them, timed by whatever ``spectest`` is on ``PYTHONPATH`` (this
tree or an old one), on one saved matched arm, and where the numerics time goes.

Prints (each line prefixed by ``--label``): load and matched-arm times; ``numerics cold|warm: S s``
(cold: the first call, CUDA-graph captures included, as in a run; warm: the same call again, each
step device-synchronised and timed — ``step verify|decode|alone|tv|...: S s over N calls`` — with
the replay model's forwards counted by shape ``forwards (B, S): N`` and the host syncs by source
line ``sync FILE:LINE: N``); the micro-benchmarks of one replay model (``micro ...``: a one-row
decode step as ``forward`` runs it, its host issue time, its graph replay alone, its eager forward,
device ops per one-row eager forward, N one-row graphs replayed on N streams at once, the [768,
1] and [768, 5] steps and graph replays, a [768, 5] graph with one-row graphs on a side stream
beside it); ``tooth sizes cold|warm: S s``. Writes ``numerics.parquet``, ``tooth.parquet``
and ``times.json`` under ``--out``. ``--save-arm DIR`` generates the matched arm and saves it;
``--arm DIR`` reads it. About 100 s per side on one H200 at P1.

    PYTHONPATH=TREE python tools/gpu/issue32_numerics_ab.py --label new --save-arm A --out O \
      --set models.device=cuda --set batch_size=768 --set ...
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import pandas as pd
import torch

from spectest.generation import (
    EngineSet,
    generate_shard,
    matched_drift,
    protocol_tooth_sizes,
    run_key,
)
from spectest.numerics import table as numerics
from spectest.plan import make_plan
from spectest.prompts import prompt_token_ids
from spectest.protocol.load import load_protocol

# the steps timed, by their names in numerics.table (old and new trees), and what they are called
STEPS = {
    "_verify_logits": "verify",
    "decode_logits": "decode",  # batch-1 calls: "alone (one row)"
    "_tv": "tv",
    "_flip": "flip",
    "_alone": "floor rows (all)",
    "measure_drift": "measure_drift (all)",
}
TIMES: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
FORWARDS: Counter[tuple[int, int]] = Counter()
LABEL = ""


def say(*a: Any) -> None:
    print(LABEL, *a, flush=True)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(name: str, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*a: Any, **k: Any) -> Any:
        key = label
        if name == "decode_logits" and a[2].shape[0] == 1:
            key = "alone (one row)"
        _sync()
        t0 = time.perf_counter()
        out = fn(*a, **k)
        if hasattr(out, "__next__"):  # a generator (``_alone``): time its consumption
            out = list(out)
        _sync()
        TIMES[key][0] += time.perf_counter() - t0
        TIMES[key][1] += 1
        return out

    return wrapper


def _counting(fn: Callable[..., Any]) -> Callable[..., Any]:
    def forward(self: Any, cache: Any, ids: torch.Tensor) -> Any:
        FORWARDS[(int(ids.shape[0]), int(ids.shape[1]))] += 1
        return fn(self, cache, ids)

    return forward


def _arm(p: Any, plan: Any, engines: Any, a: argparse.Namespace) -> tuple[Any, Any]:
    """The matched arm: generated and saved (``--save-arm``) or read (``--arm``)."""
    if a.arm:
        read = lambda n: pd.read_parquet(f"{a.arm}/{n}.parquet")  # noqa: E731
        return read("samples"), read("rounds")
    matched = plan.arm("matched")
    prompts = prompt_token_ids(p, engines.models.target.vocab_size)
    t0 = time.perf_counter()
    parts = [
        generate_shard(p, matched, pid, ids, engines, run_key(p), lambda n: None)
        for pid, ids in prompts.items()
    ]
    say(f"matched arm, {len(prompts)} prompts: {time.perf_counter() - t0:.1f} s")
    samples = pd.concat([s for s, _ in parts], ignore_index=True)
    rounds = pd.concat([r for _, r in parts if r is not None], ignore_index=True)
    if a.save_arm:
        os.makedirs(a.save_arm, exist_ok=True)
        samples.to_parquet(f"{a.save_arm}/samples.parquet")
        rounds.to_parquet(f"{a.save_arm}/rounds.parquet")
    return samples, rounds


def _step_names() -> dict[str, str]:
    """The steps of this ``numerics.table`` to time (its per-position TVs as one step where it
    has ``_position_tvs``: timing each position would add the syncs it saves)."""
    names = dict(STEPS)
    if hasattr(numerics, "_position_tvs"):
        names = {k: v for k, v in names.items() if k not in ("_tv", "_flip")}
        names["_position_tvs"] = "tv+flip"
    return {k: v for k, v in names.items() if hasattr(numerics, k)}


def _pass(name: str, drift: Callable[[], Any], steps: bool, times: dict[str, Any]) -> Any:
    """One numerics call, timed: its table. Counts the replay model's forwards by shape and the
    host syncs by source line; with ``steps`` each step synchronised and timed too."""
    from spectest.numerics import replay

    TIMES.clear()
    FORWARDS.clear()
    names = _step_names() if steps else {}
    originals = {n: getattr(numerics, n) for n in names}
    for n, fn in originals.items():
        setattr(numerics, n, _timed(n, names[n], fn))
    cls_forward = replay.ReplayStaticModel.forward
    replay.ReplayStaticModel.forward = _counting(cls_forward)  # type: ignore[method-assign]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if torch.cuda.is_available():
                torch.cuda.set_sync_debug_mode("warn")
            _sync()
            t0 = time.perf_counter()
            table = drift()
            _sync()
            times[f"numerics {name}"] = sec = time.perf_counter() - t0
            if torch.cuda.is_available():
                torch.cuda.set_sync_debug_mode(0)
    finally:
        for n, fn in originals.items():
            setattr(numerics, n, fn)
        replay.ReplayStaticModel.forward = cls_forward  # type: ignore[method-assign]
    syncs = Counter(
        f"{os.path.relpath(w.filename)}:{w.lineno}"
        for w in caught
        if "synchroniz" in str(w.message) and "issue32_numerics_ab" not in w.filename
    )
    say(
        f"numerics {name}: {sec:.2f} s ({len(table)} rows{', steps synchronised' if steps else ''})"
    )
    for k, (t, n) in TIMES.items():
        say(f"  step {k}: {t:.2f} s over {n} calls")
    shapes = ", ".join(f"(B={B}, S={S}) {n}" for (B, S), n in sorted(FORWARDS.items()))
    say(f"  forwards: {shapes}")
    say(
        f"  host syncs: {sum(syncs.values())}; "
        + ", ".join(f"{w} {n}" for w, n in syncs.most_common(8))
    )
    times[f"steps {name}"] = {k: v[0] for k, v in TIMES.items()}
    times[f"forwards {name}"] = {f"{B}x{S}": n for (B, S), n in FORWARDS.items()}
    return table


def _numerics(p: Any, samples: Any, rounds: Any, models: Any, times: dict[str, Any], a: Any) -> Any:
    """The numerics phase, pass after pass: this process's tree cold then warm (steps timed),
    or (``--switch``) this tree's old and new paths by their switches. Its table, or None when
    a pass's table differs from the first's."""
    from spectest.numerics import alone

    drift = lambda: matched_drift(p, samples, rounds, models, fast=True)  # noqa: E731
    passes = a.switch.split(",") if a.switch else ["cold", "warm"]
    first = None
    same = True
    for i, name in enumerate(passes):
        if a.switch:  # old: every floor row from its prompt, a host sync per round slot / position
            alone.SHARE_PREFIXES = name.startswith("new")
            numerics.HOST_SYNCS = name.startswith("old")
        table = _pass(
            f"{name} #{i + 1}" if a.switch else name, drift, a.steps or name == "warm", times
        )
        first = table if first is None else first
        ok = bool(table.equals(first))
        same &= ok
        say(f"  table {'identical to the first pass' if ok else 'DIFFERENT from the first pass'}")
    if a.switch:
        alone.SHARE_PREFIXES, numerics.HOST_SYNCS = True, False
    return first if same else None


def _clock(fn: Callable[[], Any], n: int) -> tuple[float, float]:
    """(ms per call wall, ms per call host issue) of ``n`` calls, synchronised at both ends."""
    _sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    _sync()
    return 1e3 * (time.perf_counter() - t0) / n, 1e3 * (t1 - t0) / n


def _kernels(fn: Callable[[], Any]) -> int:
    """Device kernels one call of ``fn`` launches (torch profiler)."""
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        return -1
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        _sync()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def _stepper(m: Any, cache: Any, ids: torch.Tensor, *, graphs: bool = True) -> Callable[[], Any]:
    """One forward of ``ids`` at the cache's current slots, again and again (the slots rolled
    back before each: the same window, hence the same graph)."""
    valid = cache.valid

    def step() -> Any:
        cache.valid = valid
        return m._forward(cache, ids, graphs=graphs and m.cuda_graphs)

    return step


def _graph_of(m: Any, B: int, S: int) -> Any:
    keys = [k for k in m._graphs if k[:2] == (B, S)]
    return m._graphs[keys[-1]].graph if keys else None


def _micro(target: Any, prompt_ids: list[int], rows: int, streams: int) -> dict[str, Any]:
    """Micro-benchmarks of one fresh replay model (built as ``drift_table`` builds it)."""
    from spectest.numerics.replay import replay_model

    out: dict[str, Any] = {}
    m = replay_model(target, fast=True, static=True)
    dev = m.device
    prompt = torch.tensor(prompt_ids, dtype=torch.int64, device=dev)
    one = torch.ones((1, 1), dtype=torch.int64, device=dev)
    cache, _ = m.prefill_shared(prompt, 1)
    step = _stepper(m, cache, one)
    step(), step()  # the graph captured
    say(f"micro: graphs on {m.cuda_graphs}, error {m.graph_error}, graphs {sorted(m._graphs)}")
    out["one-row step ms"], out["one-row step host ms"] = _clock(step, 32)
    g = _graph_of(m, 1, 1)
    if g is not None:
        out["one-row graph replay ms"], _ = _clock(g.replay, 64)
    eager = _stepper(m, cache, one, graphs=False)
    out["one-row eager ms"], out["one-row eager host ms"] = _clock(eager, 8)
    out["one-row eager device ops"] = _kernels(eager)
    side: list[Any] = []
    if g is not None:
        res, side = _concurrent(m, prompt, one, streams)
        out.update(res)
    for S in (1, 5):
        big, _ = m.prefill_shared(prompt[:-1], rows)
        step = _stepper(m, big, torch.ones((rows, S), dtype=torch.int64, device=dev))
        step(), step()
        out[f"[{rows}, {S}] step ms"], out[f"[{rows}, {S}] step host ms"] = _clock(step, 6)
        g = _graph_of(m, rows, S)
        if g is not None:
            out[f"[{rows}, {S}] graph replay ms"], _ = _clock(g.replay, 6)
        del big, step
    if side and _graph_of(m, rows, 5) is not None:
        out.update(_overlap(_graph_of(m, rows, 5), side[0][1], out, rows))
    for k, v in out.items():
        say(f"micro {k}: {v:.3f}" if isinstance(v, float) else f"micro {k}: {v}")
    return out


def _concurrent(m: Any, prompt: torch.Tensor, one: torch.Tensor, n: int) -> tuple[dict, list]:
    """``n`` one-row graphs (``n`` models on the same weights) replayed on ``n`` streams at once:
    what running the floor rows side by side could give, Python per step excluded."""
    from spectest.models.static import StaticHFModel

    dev = m.device
    graphs = []
    for _ in range(n):
        x = StaticHFModel(m.base, max_slots=m.max_slots)
        c, _ = x.prefill_shared(prompt, 1)
        step = _stepper(x, c, one)
        step(), step()
        if _graph_of(x, 1, 1) is not None:
            graphs.append((x, _graph_of(x, 1, 1), torch.cuda.Stream(device=dev)))
    main = torch.cuda.current_stream(dev)

    def at_once() -> None:
        for _, g, st in graphs:
            st.wait_stream(main)
            with torch.cuda.stream(st):
                g.replay()
        for _, _, st in graphs:
            main.wait_stream(st)

    wall, _ = _clock(at_once, 16)
    return {f"{len(graphs)} one-row graphs on {len(graphs)} streams at once ms": wall}, graphs


def _overlap(big: Any, one: Any, out: dict[str, Any], rows: int) -> dict[str, float]:
    """A [rows, 5] verify graph on the main stream with one-row graphs (another model's) on a
    side stream meanwhile, as many as take about as long alone: can the floor hide there?"""
    dev = torch.device("cuda", torch.cuda.current_device())
    main, side = torch.cuda.current_stream(dev), torch.cuda.Stream(device=dev)
    t_big, t_one = out[f"[{rows}, 5] graph replay ms"], out["one-row graph replay ms"]
    k = max(1, round(t_big / max(t_one, 1e-3)))

    def both() -> None:
        side.wait_stream(main)
        with torch.cuda.stream(side):
            for _ in range(k):
                one.replay()
        big.replay()
        main.wait_stream(side)

    wall, _ = _clock(both, 6)
    name = f"verify graph + {k} one-row graphs beside it ms (alone: {t_big + k * t_one:.2f})"
    return {name: wall}


def _tooth(p: Any, plan: Any, models: Any, times: dict[str, Any]) -> Any:
    teeth = list(plan.settings.sized_teeth)
    tables = []
    for label in ("cold", "warm"):
        _sync()
        t0 = time.perf_counter()
        tables.append(protocol_tooth_sizes(p, teeth, models))
        _sync()
        times[f"tooth sizes {label}"] = time.perf_counter() - t0
        say(f"tooth sizes {label}: {times[f'tooth sizes {label}']:.2f} s ({len(tables[-1])} rows)")
    same = bool(tables[1].equals(tables[0]))
    say(f"tooth sizes warm table {'identical to cold' if same else 'DIFFERENT from cold'}")
    return tables[0] if same else None


def main() -> int:
    global LABEL
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="protocols/openinfer-512.yaml")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--label", default="")
    ap.add_argument("--arm", default=None, help="read the matched arm from this directory")
    ap.add_argument("--save-arm", default=None, help="generate the matched arm, save it here")
    ap.add_argument("--out", required=True)
    ap.add_argument("--streams", type=int, default=8, help="micro: one-row graphs at once")
    ap.add_argument("--only", choices=("numerics", "tooth"), default=None)
    ap.add_argument("--switch", default=None, help="passes of this tree's paths: old,new,...")
    ap.add_argument("--steps", action="store_true", help="time each step in every pass")
    ap.add_argument("--no-micro", action="store_true")
    a = ap.parse_args()
    LABEL = f"[{a.label}]" if a.label else ""
    import spectest

    say("spectest from", os.path.dirname(spectest.__file__), "torch", torch.__version__)
    os.makedirs(a.out, exist_ok=True)
    p = load_protocol(a.config, sets=a.set)
    plan = make_plan(p)
    t0 = time.perf_counter()
    engines = EngineSet(p, [plan.arm("matched")], plan, fast=True)
    models: Any = engines.models
    say(f"load {time.perf_counter() - t0:.1f} s")
    samples, rounds = _arm(p, plan, engines, a)
    times: dict[str, Any] = {}
    ok = True
    if a.only != "tooth":
        table = _numerics(p, samples, rounds, models, times, a)
        ok &= table is not None
        if table is not None:
            table.to_parquet(f"{a.out}/numerics.parquet")
        _, ids = next(iter(prompt_token_ids(p, models.target.vocab_size).items()))
        if not a.no_micro:
            times["micro"] = _micro(models.target, ids, p.batch_size, a.streams)
    if a.only != "numerics":
        tooth = _tooth(p, plan, models, times)
        ok &= tooth is not None
        if tooth is not None:
            tooth.to_parquet(f"{a.out}/tooth.parquet")
    with open(f"{a.out}/times.json", "w") as f:
        json.dump(times, f, indent=1)
    engines.close()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
