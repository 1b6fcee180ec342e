"""Issue 32, P2's speculative arm: the shortlist's selection (``torch.topk`` over ``[N, 151 936]``,
~36 % of the arm's CUDA time) against the block selection (``sampling.selection``), timed and
checked for equality on P2's shapes. Under 90 s on one H200 (not measured yet: the peaky rows
first, then the realistic pair's unless ``--budget`` s have passed).

Logits: ``realistic`` (one forward of realistic:qwen3-0.6b in bf16 on random tokens, the last 5
positions of each row: the verify call's ``[rows·5, V]``, float32 = bf16 × 20 as the model returns
them) and ``peaky`` (bf16 ``N(0, 0.5²)`` × 20, the same dtype path), each as float32 (the bench's
pair: ``logit_scale`` 20 keeps float32) and as the raw bf16 (what a native path carrying the scale
would select on: × 20 is exact on bf16, so the order and the ties are the same).

Prints the rows' shape (ties at the W-th value, the nucleus, the block path's margin), then one
line per (source, dtype, rows, variant): median of 20 warm CUDA-event timings (ms);
``same_ids`` (``torch.equal`` with the old selection's ids), ``canonical`` (equal to a stable
descending sort's first W ids: ties to the lowest ids), ``bad`` (rows the blocks did not decide,
taken by topk). Variants: ``old`` (``topk_ids``), ``blocks L=.. F=..`` (block maxima over L tokens,
F·W blocks; the time includes the block-maxima read), ``blockmax`` (that read alone: on the
shortlist path it replaces the ``aminmax`` read, timed as ``aminmax``), ``topk k=128`` (a smaller
first width: the time of the selection alone). Then ``shortlist_probs`` end to end (t 0.8, top-p
0.95; and t 0.8, top-k 50), old vs new: median ms, ids / probs / draws bit-equal.

    PYTHONPATH=. python tools/gpu/selection_bench.py            # from the repository root
    PYTHONPATH=. python tools/gpu/selection_bench.py --no-realistic --rows 1024
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from spectest.sampling import selection
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.shortlist import shortlist_probs

V_QWEN, W = 151_936, 1024


def timed(fn: Callable[[], object], reps: int = 20) -> float:
    """Median ms of ``reps`` warm calls, each between two CUDA events (wall clock on CPU)."""
    fn()
    if not torch.cuda.is_available():  # the CPU smoke run
        walls = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            walls.append(1e3 * (time.perf_counter() - t))
        return statistics.median(walls)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def realistic_bf16(m: object, rows: int, seed: int = 0) -> torch.Tensor:
    """``[rows·5, V]`` bf16 logits of the model ``m`` (realistic:qwen3-0.6b, before its × 20) on
    random tokens."""
    dev = next(m.model.parameters()).device  # type: ignore[attr-defined]
    g = torch.Generator(device=dev).manual_seed(seed)
    out = []
    for lo in range(0, rows, 256):  # chunks: the [256, 16, V] logits, not [rows, 16, V]
        ids = torch.randint(0, V_QWEN, (min(256, rows - lo), 16), device=dev, generator=g)
        with torch.inference_mode():
            logits = m.model(input_ids=ids, use_cache=False).logits  # type: ignore[attr-defined]
        out.append(logits[:, -5:].reshape(-1, logits.shape[-1]).clone())  # [b·5, V] bf16
    return torch.cat(out)  # [rows·5, V]


def canonical(x: torch.Tensor) -> torch.Tensor:
    """A stable descending sort's first W ids, ascending (in row chunks: the sort's memory)."""
    parts = [
        torch.sort(c, dim=-1, descending=True, stable=True).indices[:, :W].sort(-1).values
        for c in x.split(512)
    ]
    return torch.cat(parts)


def stats_line(name: str, x: torch.Tensor) -> None:
    """The rows' shape: tokens tied at the W-th value, rows with a tie across the boundary, the
    t 0.8 / top-p 0.95 nucleus, and how far the default block path is from undecided."""
    v = torch.topk(x, W + 1, dim=-1).values  # [N, W + 1] descending
    ties = (x == v[:, W - 1 : W]).sum(-1)  # [N]
    nuc = torch.cat(
        [
            (torch.softmax(c.double() / 0.8, -1).sort(-1, descending=True).values.cumsum(-1) < 0.95)
            .sum(-1)
            .add(1)
            for c in x.split(512)
        ]
    )  # [N]
    nb = selection.BLOCKS_PER_TOKEN * W
    thr = torch.topk(selection.block_max(x)[1], nb, dim=-1).values[:, -1:]  # [N, 1]
    margin = (x > thr).sum(-1) - W  # [N]
    print(
        f"{name:<28} N={int(x.shape[0]):<5} stats: tied at the W-th median "
        f"{int(ties.median())} max {int(ties.max())}; rows tied across it "
        f"{int((v[:, W - 1] == v[:, W]).sum())}; nucleus median {int(nuc.median())} max "
        f"{int(nuc.max())}; count(x > thr) - W min {int(margin.min())} median "
        f"{int(margin.median())}",
        flush=True,
    )


def selection_lines(name: str, x: torch.Tensor) -> None:
    """One line per variant of the selection on ``x`` ``[N, V]``."""
    N = int(x.shape[0])
    head = f"{name:<28} N={N:<5}"
    old = selection.topk_ids(x, W)
    canon = canonical(x)
    block = selection.BLOCK, selection.BLOCKS_PER_TOKEN
    print(f"{head} aminmax          {timed(lambda: torch.aminmax(x, dim=-1)):8.3f} ms", flush=True)
    t_old = timed(lambda: selection.topk_ids(x, W))
    ok = torch.equal(old, canon)
    print(f"{head} old topk         {t_old:8.3f} ms  canonical={ok}", flush=True)
    t_k = timed(lambda: torch.topk(x, 128, dim=-1, sorted=False))
    print(f"{head} topk k=128       {t_k:8.3f} ms  (selection only, no id sort)", flush=True)
    for L, F in ((8, 2), (16, 1), (16, 2), (4, 2)):
        selection.BLOCK, selection.BLOCKS_PER_TOKEN = L, F
        if not selection.uses_blocks(x, W):
            continue
        bmax = selection.block_max(x)[1]
        ids, bad = selection.select_blocks(x, W, bmax)
        got = selection.patch_rows(ids, bad, x, W, int(bad.sum()))
        t_bm = timed(lambda: selection.block_max(x))
        t_new = timed(lambda: selection.select_shortlist(x, W))
        print(
            f"{head} blocks L={L:<2} F={F}  {t_new:8.3f} ms  blockmax {t_bm:.3f} ms  "
            f"same_ids={torch.equal(got, old)} canonical={torch.equal(got, canon)} "
            f"bad={int(bad.sum())}/{N}",
            flush=True,
        )
    selection.BLOCK, selection.BLOCKS_PER_TOKEN = block
    parts(head, x)


def parts(head: str, x: torch.Tensor) -> None:
    """The default block path's steps, each timed alone (ms)."""
    if not selection.uses_blocks(x, W):
        return
    M, V = (int(s) for s in x.shape)
    L, nb = selection.BLOCK, selection.BLOCKS_PER_TOKEN * W
    bmax = selection.block_max(x)[1]
    top = torch.topk(bmax, nb, dim=-1, sorted=False)
    blocks = top.indices.sort(dim=-1).values
    idx = blocks[:, :, None].expand(M, nb, L)
    xb = x.reshape(M, V // L, L)
    cv = xb.gather(1, idx).reshape(M, nb * L)
    t = {
        "topk(bmax)": timed(lambda: torch.topk(bmax, nb, dim=-1, sorted=False)),
        "sort blocks": timed(lambda: top.indices.sort(dim=-1)),
        "gather": timed(lambda: xb.gather(1, idx)),
        "topk(cand)": timed(lambda: torch.topk(cv, W, dim=-1, sorted=False)),
        "select_blocks": timed(lambda: selection.select_blocks(x, W, bmax)),
    }
    print(f"{head} parts: " + ", ".join(f"{k} {v:.3f}" for k, v in t.items()), flush=True)


def end_to_end(name: str, x: torch.Tensor) -> None:
    """``shortlist_probs`` with SELECTION "topk" vs "blocks": time and bit-equality."""
    N = int(x.shape[0])
    dev = x.device
    g = torch.Generator(device=dev).manual_seed(1)
    u = torch.rand(N, generator=g, device=dev, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
    for label, sp in (
        ("t0.8 top-p0.95", SamplingParams(temperature=0.8, top_p=0.95)),
        ("t0.8 top-k50", SamplingParams(temperature=0.8, top_k=50)),
    ):
        params = SamplingTensors.from_params([sp] * N, device=dev)
        res = {}
        for mode in ("topk", "blocks"):
            selection.SELECTION = mode
            law = shortlist_probs(x, params, check=False)
            ms = timed(lambda: shortlist_probs(x, params, check=False))  # noqa: B023
            res[mode] = (law, ms)
        selection.SELECTION = "blocks"
        (a, ta), (b, tb) = res["topk"], res["blocks"]
        if a is None or b is None:
            print(f"{name:<28} N={N:<5} {label}: None old={a is None} new={b is None}")
            continue
        same = torch.equal(a.ids, b.ids) and torch.equal(a.probs, b.probs)
        dense = torch.equal(a.dense(), b.dense())
        draws = torch.equal(a.draw(u, check=False), b.draw(u, check=False))
        print(
            f"{name:<28} N={N:<5} shortlist_probs {label}: old {ta:.3f} ms new {tb:.3f} ms "
            f"(x{ta / tb:.2f}) ids+probs equal={same} dense equal={dense} draws equal={draws}",
            flush=True,
        )


def run_source(src: str, b16: torch.Tensor, rows: int) -> None:
    """Every line for one source's bf16 logits ``b16`` ``[rows·5, V]``."""
    x = b16.float() * 20.0  # what the pair returns: float32, × logit_scale (exact on bf16)
    stats_line(f"{src} float32 rows={rows}", x)
    for dt, t in (("float32", x), ("bf16", b16)):
        selection_lines(f"{src} {dt} rows={rows}", t)
    selection_lines(f"{src} float32 draft rows={rows}", x[::5].contiguous())
    end_to_end(f"{src} float32 rows={rows}", x)
    end_to_end(f"{src} float32 draft rows={rows}", x[::5].contiguous())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1024, 256])
    ap.add_argument("--no-realistic", action="store_true")
    ap.add_argument("--budget", type=float, default=45.0, help="no realistic rows after (s)")
    ap.add_argument("--vocab", type=int, default=V_QWEN, help="peaky rows' V (a CPU smoke run)")
    args = ap.parse_args()
    t0 = time.time()
    selection.SELECTION = "blocks"  # on CPU too (the smoke run); "auto" takes it on CUDA only
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    print(torch.cuda.get_device_name() if dev == "cuda" else "cpu", torch.__version__, flush=True)
    g = torch.Generator(device=dev).manual_seed(0)
    for rows in args.rows:
        shape = (rows * 5, args.vocab)
        run_source("peaky", (torch.randn(shape, device=dev, generator=g) * 0.5).bfloat16(), rows)
    print(f"peaky done at {time.time() - t0:.1f} s", flush=True)
    if args.no_realistic or time.time() - t0 > args.budget:
        return
    from spectest.models.zoo import load_model

    model = load_model("realistic:qwen3-0.6b", device=dev, dtype=torch.bfloat16)
    print(f"model built at {time.time() - t0:.1f} s", flush=True)
    for rows in args.rows:
        run_source("realistic", realistic_bf16(model, rows), rows)
    print(f"total {time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
