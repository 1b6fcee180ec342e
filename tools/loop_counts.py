"""Host work per decode step of the fast loops, counted on CPU (issue 32): torch ops the loop body
dispatches (on CUDA each is about one kernel launch) and the calls that are a host-device sync on
CUDA (``item``/``bool``/``int``/``float``, ``tolist``, ``nonzero``, boolean indexing, ``cpu``).

P1's shape at toy size: qwen3-tiny (V 2048 > the shortlist's 1024, so the fast pipeline decides
on shortlists as at V 151 936), the openinfer-512 configs, one-hot K 4, white-box recording on,
32 positions. The static model's forward counts as one op (on CUDA one graph replay); the ops
``StaticHFModel._forward`` runs around it (masks, positions, copies) are counted. Prints one
line per arm: ops and syncs per step (plain: per token; speculative: per round), and the top
ops. About 30 s on a 2-core CPU.

    OMP_NUM_THREADS=1 python tools/loop_counts.py [--rows 48] [--top 12]
"""

from __future__ import annotations

import argparse
import collections
import time
import traceback
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from spectest.engines.base import DecodeRequest, DrafterSpec, RowSpec
from spectest.engines.fast import as_fast, plain_decode_fast, speculative_decode_fast
from spectest.models.derive import first_layers
from spectest.models.hf import from_preset
from spectest.models.static import StaticHFModel
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams

CONFIGS = [
    SamplingParams(temperature=0.8, top_p=0.95),
    SamplingParams(temperature=1.0, top_k=50),
    SamplingParams(temperature=0.7, top_k=20, top_p=0.9),
]
SYNC_METHODS = {"__bool__", "item", "tolist", "__int__", "__float__", "__index__", "cpu", "numpy"}
FREE = {"aten.empty.memory_format", "aten.empty_strided.default", "aten.detach.default"}


class _Count(TorchDispatchMode):
    """Counts dispatched non-view ops (``ops``) and the sync-making ones (``syncs``)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.syncs: collections.Counter[str] = collections.Counter()
        self.paused = 0
        self.sites: collections.Counter[str] = collections.Counter()
        self.op_sites: collections.Counter[str] = collections.Counter()
        self.where = False

    def sync(self, name: str) -> None:
        self.syncs[name] += 1
        self.sites[_site()] += 1

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func)
        if not self.paused and not func.is_view and name not in FREE:
            self.ops[name] += 1
            if self.where:
                self.op_sites[_site(function=True)] += 1
            bool_index = name.startswith("aten.index") and any(
                isinstance(a, torch.Tensor) and a.dtype == torch.bool
                for a in _flat(args[1:] if len(args) > 1 else ())
            )
            if name in ("aten._local_scalar_dense.default", "aten.nonzero.default") or bool_index:
                self.sync(name)
        return func(*args, **(kwargs or {}))


class _Methods(TorchFunctionMode):
    """Counts ``tolist`` / ``cpu`` / ``numpy`` (no dispatch on CPU; a D2H copy on CUDA)."""

    def __init__(self, count: _Count) -> None:
        super().__init__()
        self.count = count

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if not self.count.paused and name in ("tolist", "cpu", "numpy"):
            self.count.sync(name)
        return func(*args, **(kwargs or {}))


def _site(function: bool = False) -> str:
    """The innermost spectest frame calling (file:line function, or file:function)."""
    for f in reversed(traceback.extract_stack()[:-3]):
        if "/spectest/" in f.filename:
            at = "" if function else f":{f.lineno}"
            return f"{f.filename.split('/spectest/')[-1]}{at} {f.name}"
    return "?"


def _flat(xs: Any) -> list[Any]:
    out: list[Any] = []
    for x in xs:
        out.extend(_flat(x) if isinstance(x, (list, tuple)) else [x])
    return out


def _one_op(model: StaticHFModel, count: _Count) -> None:
    """The model's ``_eager`` counts as one op (a graph replay on CUDA)."""
    inner = model._eager

    def eager(*a: Any, **k: Any) -> Any:
        count.ops["graph.replay"] += 1
        count.paused += 1
        try:
            return inner(*a, **k)
        finally:
            count.paused -= 1

    model._eager = eager  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=48)
    ap.add_argument("--positions", type=int, default=32)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--where", action="store_true", help="also ops by spectest function")
    a = ap.parse_args()
    torch.manual_seed(0)
    target = from_preset("qwen3-tiny", seed=5, logit_scale=20.0, vocab_size=2048)
    t, d = as_fast(target, static=True), as_fast(first_layers(target, 1), static=True)
    assert isinstance(t, StaticHFModel) and isinstance(d, StaticHFModel)
    rows = [RowSpec(f"c{i % 3}", i, CONFIGS[i % 3]) for i in range(a.rows)]
    drafter = DrafterSpec(onehot=True, k=4)
    T = a.positions
    req = DecodeRequest([1, 2, 3], rows, num_positions=T, whitebox=True, run_key=7, prompt_id="p")
    arms = {
        "plain": lambda: plain_decode_fast(t, req, draft=d, drafter=drafter),
        "speculative": lambda: speculative_decode_fast(
            t, d, req, drafter=drafter, variant=get_variant("exact")
        ),
    }
    for name, fn in arms.items():
        count = _Count()
        count.where = a.where
        _one_op(t, count)
        _one_op(d, count)
        t0 = time.perf_counter()
        with _Methods(count), count:
            out = fn()
        wall = time.perf_counter() - t0
        del t._eager, d._eager  # back to the class's method
        steps = T if out.rounds is None else int(out.rounds["round"].max()) + 1
        ops, syncs = sum(count.ops.values()), sum(count.syncs.values())
        print(
            f"== {name}: {steps} steps, {ops} ops ({ops / steps:.0f}/step, graph replays"
            f" {count.ops['graph.replay']}), {syncs} syncs ({syncs / steps:.1f}/step),"
            f" {wall:.1f} s counted"
        )
        print("   syncs:", dict(count.syncs.most_common()))
        print("   sync sites:", dict(count.sites.most_common(a.top)))
        if a.where:
            print("   ops by function:", dict(count.op_sites.most_common(a.top)))
        print("   top ops:", ", ".join(f"{k} {v}" for k, v in count.ops.most_common(a.top)))


if __name__ == "__main__":
    main()
