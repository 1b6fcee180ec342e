"""Power table (issue 14): kill rate of every catalogue mutant and of ε-biased acceptors at 256
seeds per arm, black-box only and with white-box, default families vs with the sequence-level
families, plus the false-alarm rate of every family under H0.

Benchmark shape (issue 14): the bundled pair, 4 prompts (english-8, first 4) × 2 configs × 12
positions, one-hot drafter K = 3. Generating is the expensive part, so a big *pool* is generated
once per arm — ``--reps × --per-arm`` seeds per cell, disjoint seed ranges per arm — and cached as
Parquet under ``<dir>/power_pool/<pair>-<seeds>/`` (ignored by git); replications are disjoint
slices of it. ``tools/gpu/power_table.sh`` runs the three steps on a GPU host in one command.

    # 1. pools (resumable: one file per arm × prompt; --workers/--worker deal the files out)
    OMP_NUM_THREADS=1 python benchmarks/power_table.py generate --pair bundled [--device cuda]
    # 2. analyses (resumable: one JSON line per (arm, replication) in <dir>/power_<pair>/w<k>.jsonl)
    OMP_NUM_THREADS=1 python benchmarks/power_table.py table --pair bundled [--workers N --worker k]
    # 3. the table (markdown; arms without a complete pool or short of replications are listed)
    python benchmarks/power_table.py report --pair bundled [--md F] [--json F]

Under H0 a replication draws 256 + 256 sequences per cell at random (without replacement) from
the reference and exact pools; replications then overlap a little (each uses 5 % of a pool), so
the false-alarm estimate is unbiased but its spread is slightly above the binomial one.

Configurations (``CONFIGS_FAMILIES``) combine families by the union bound, each at α / (their
number), as ``analyze`` splits the run's α; a family's decision is "its smallest adjusted p-value
≤ its level" (BH, Bonferroni and the max-T adjusted p-values do not depend on the level). The
issue's comparison is "sequence alone" (the new families) vs "chi2+BH alone", black-box; the
report prints that ratio, the ratio with the default black-box families + sequence, and each
family's H0 rate. The length family (``stats.lengths``) is recorded but only active when some
cell's length table is testable (an end-of-sequence token inside the 12 positions).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from spectest.stats.battery import Analysis

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
OUT_JSON = ROOT / "results" / "bench" / "power_table.json"

PROMPTS_FILE = ROOT / "protocols" / "prompts" / "english-8.jsonl"
N_PROMPTS = 4
# the pairs: the bundled byte-level pair (text prompts), and an analytic order-3 Markov pair
# (token-id prompts) ten times cheaper to sample on a CPU
PAIRS = {
    "bundled": ("bundled:target", "bundled:draft"),
    "toy": ("toy:V=64,order=3,scale=2.0,seed=1", "derived:noised,noise=0.5,seed=2"),
}
TOY_PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11]]
POSITIONS = 12
K = 3
CONFIGS = {
    "t0.8-k20-p0.95": dict(temperature=0.8, top_k=20, top_p=0.95),
    "t1.0-p0.9": dict(temperature=1.0, top_p=0.9),
}
RUN_KEY = 14_2026
SEED_STRIDE = 1_000_000  # arm i draws seeds [i·stride, i·stride + pool size)
# priority order: the pools are generated in this order (subtle bugs first)
ARMS = (
    "reference",
    "exact",
    "eps_biased:0.1",
    "eps_biased:0.05",
    "eps_biased:0.2",
    "reuse_accept_uniform",
    "raw_q",
    "swapped_filter_order",
    "residual_from_p",
    "commit_on_telemetry",
    "bonus_wrong_row",
    "target_unprocessed",
    "bf16_ratio",
    "onehot_softmax_q",
    "greedy_verify",
    "always_accept",
)
# the H0 pools, generated last: the reference and exact samplers again on their own seed ranges,
# ``--h0-reps × --per-arm`` seeds per cell, so each H0 replication is a disjoint slice of both —
# independent replications, an exact binomial false-alarm count. Until they are complete the H0
# replications resample the main reference and exact pools (unbiased, correlated: ``table``).
H0_ARMS = {"h0_reference": "reference", "h0_exact": "exact"}
ALL_ARMS = (*ARMS, *H0_ARMS)


def _prompts(pair: str) -> list[tuple[str, list[int]]]:
    """(prompt id, token ids) of the benchmark's prompts for ``pair``."""
    if pair == "toy":
        return [(f"p{i}", ids) for i, ids in enumerate(TOY_PROMPTS)]
    from spectest.models import bytetok

    rows = [json.loads(line) for line in PROMPTS_FILE.read_text().splitlines() if line.strip()]
    return [(r["id"], bytetok.encode(r["text"])) for r in rows[:N_PROMPTS]]


def _pool_dir(root: Path, pair: str, n_seeds: int) -> Path:
    """Pools of ``n_seeds`` seeds per cell (a different size never reuses a stale pool)."""
    return root / "power_pool" / f"{pair}-{n_seeds}"


def _pool_path(pool: Path, arm: str, prompt_id: str) -> Path:
    return pool / arm.replace(":", "_") / f"{prompt_id}.parquet"


def _rounds_path(pool: Path, arm: str, prompt_id: str) -> Path:
    return pool / arm.replace(":", "_") / f"{prompt_id}.rounds.parquet"


def _pool_seeds(arm: str, n_seeds: int, h0_seeds: int) -> int:
    """Seeds per cell of ``arm``'s pool (the H0 arms have their own size, and directory)."""
    return h0_seeds if arm in H0_ARMS else n_seeds


def units(pair: str, arms: list[str], workers: int, worker: int) -> list[tuple[str, str]]:
    """This worker's (arm, prompt id) pool files: every arm's prompts dealt round-robin in the
    arms' priority order, so each of ``workers`` processes (one per GPU) gets an equal share of
    every arm — balanced whatever an arm costs (speculative arms cost more than the reference),
    and the subtle arms are finished first by every worker (the big H0 pools last)."""
    all_units = [(a, pid) for a in ALL_ARMS if a in arms for pid, _ in _prompts(pair)]
    return all_units[worker::workers]


def _write_pool_file(
    args: argparse.Namespace,
    models: tuple[Any, Any],
    drafter: Any,
    ids: list[int],
    arm: str,
    pid: str,
    rows: list[Any],
    pool: Path,
) -> None:
    """Decode ``rows`` of one (arm, prompt) with white-box columns and write its pool file (and
    rounds file, first): the file on disk is complete."""
    from spectest.engines import builtin
    from spectest.engines.base import DecodeRequest, rounds_frame, samples_frame
    from spectest.sampling.mutants import get_variant

    target, draft = models
    sampler = H0_ARMS.get(arm, arm)
    path = _pool_path(pool, arm, pid)
    t0 = time.perf_counter()
    req = DecodeRequest(
        ids,
        rows,
        num_positions=POSITIONS,
        run_key=RUN_KEY,
        prompt_id=pid,
        batch_size=args.batch,
        whitebox=True,
    )
    if sampler == "reference":
        out = builtin.plain_decode(target, req, draft=draft, drafter=drafter)
    else:
        out = builtin.speculative_decode(
            target, draft, req, drafter=drafter, variant=get_variant(sampler)
        )
    assert out.whitebox is not None
    samples = pd.concat([samples_frame(out.tokens, pid, rows, arm), out.whitebox], axis=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    if out.rounds is not None:
        rp = _rounds_path(pool, arm, pid)
        rounds_frame(out.rounds, pid, rows, arm).to_parquet(rp.with_suffix(".tmp"))
        rp.with_suffix(".tmp").rename(rp)
    tmp = path.with_suffix(".tmp")
    samples.to_parquet(tmp, index=False)
    tmp.rename(path)  # last: a pool file on disk is complete (rounds written before it)
    print(f"{arm} {pid}: {len(rows)} rows in {time.perf_counter() - t0:.1f} s", flush=True)


def generate(args: argparse.Namespace) -> None:
    """Generate this worker's pool files (skips those on disk: resumable). White-box columns are
    recorded by the decode loops at generation time from the exact p_t / q_t rows (the built-in
    engine's own path, equal to teacher forcing to 1e-12 — tests/test_engine_whitebox*.py), so
    no second forward pass is paid."""
    import torch

    from spectest.engines import builtin
    from spectest.models.zoo import load_pair
    from spectest.sampling.params import SamplingParams

    if args.device == "cpu" and not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(1)
    arms = args.arms.split(",") if args.arms else list(ALL_ARMS)
    unknown = sorted(set(arms) - set(ALL_ARMS))
    if unknown:
        sys.exit(f"--arms: unknown arm(s) {unknown}; known: {list(ALL_ARMS)}")
    n_seeds, h0_seeds = args.reps * args.per_arm, args.h0_reps * args.per_arm

    def pool_of(arm: str) -> Path:
        return _pool_dir(Path(args.dir), args.pair, _pool_seeds(arm, n_seeds, h0_seeds))

    todo = [
        u for u in units(args.pair, arms, args.workers, args.worker)
        if not _pool_path(pool_of(u[0]), *u).exists()
    ]  # fmt: skip
    if not todo:
        print(f"worker {args.worker}: every pool file is on disk", flush=True)
        return
    t_load = time.perf_counter()
    target, draft = load_pair(*PAIRS[args.pair], device=args.device, dtype="float32")
    dt = time.perf_counter() - t_load
    print(f"worker {args.worker}: models loaded in {dt:.1f} s", flush=True)
    drafter = builtin.DrafterSpec(onehot=True, k=K)
    prompt_ids = dict(_prompts(args.pair))
    for arm, pid in todo:
        rows = [
            builtin.RowSpec(cid, ALL_ARMS.index(arm) * SEED_STRIDE + s, SamplingParams(**p))
            for cid, p in CONFIGS.items()
            for s in range(_pool_seeds(arm, n_seeds, h0_seeds))
        ]
        _write_pool_file(
            args, (target, draft), drafter, prompt_ids[pid], arm, pid, rows, pool_of(arm)
        )


def pool_complete(root: Path, pair: str, n_seeds: int, arm: str) -> bool:
    """Every prompt's pool file of ``arm`` (``n_seeds`` seeds per cell) is on disk."""
    pool = _pool_dir(root, pair, n_seeds)
    return all(_pool_path(pool, arm, pid).exists() for pid, _ in _prompts(pair))


def load_pool(
    root: Path, pair: str, n_seeds: int, arm: str
) -> tuple[pd.DataFrame, pd.DataFrame | None] | None:
    """An arm's pool (samples, rounds) with ``seed`` rebased to 0..n-1, or None if incomplete."""
    pool = _pool_dir(root, pair, n_seeds)
    parts, rparts = [], []
    base = ALL_ARMS.index(arm) * SEED_STRIDE
    for pid, _ in _prompts(pair):
        path = _pool_path(pool, arm, pid)
        if not path.exists():
            return None
        s = pd.read_parquet(path)
        s["seed"] -= base
        parts.append(s)
        rp = _rounds_path(pool, arm, pid)
        if rp.exists():
            r = pd.read_parquet(rp)
            r["seed"] -= base
            rparts.append(r)
    rounds = pd.concat(rparts, ignore_index=True) if rparts else None
    return pd.concat(parts, ignore_index=True), rounds


# ----------------------------------------------------------------------------- analysis
PER_ARM = 256
ALPHA = 0.05
# a configuration = the families whose decisions are combined, each at α / (number of them)
CONFIGS_FAMILIES = {
    "chi2+BH alone": ("cells",),
    "default black-box (cells, trie)": ("cells", "trie"),
    "black-box + sequence": ("cells", "trie", "sequence"),
    "sequence alone": ("sequence",),
    "default + white-box": ("cells", "trie", "whitebox"),
    "all (+ white-box + sequence)": ("cells", "trie", "whitebox", "sequence"),
}


def family_pvalues(a: Analysis) -> dict[str, float]:
    """Each family's smallest adjusted p-value (it rejects at level x iff this is <= x; the
    adjusted p-values of BH, Bonferroni and the max-T do not depend on the level) and each
    sequence statistic's own permutation p-value."""
    out: dict[str, float] = {}
    cells = a.table("cells")
    ok = cells["status"] == "ok"
    out["cells"] = float(cells.loc[ok, "p_adj"].min()) if ok.any() else 1.0
    trie = a.table("trie")
    out["trie"] = float(trie["p_adj"].min()) if len(trie) and trie["p_adj"].notna().any() else 1.0
    wb = a.table("whitebox")
    cand = wb[(wb["arm"] == "candidate")] if len(wb) else wb
    if len(cand):
        support = bool(((cand["test"] == "support") & (cand["statistic"] > 0)).any())
        rest = cand[cand["test"] != "support"]["p_adj"].astype(float)
        out["whitebox"] = 0.0 if support else float(rest.min()) if len(rest) else 1.0
    else:
        out["whitebox"] = float("nan")
    out["sequence"] = float(getattr(a.families["sequence"], "pvalue", float("nan")))
    seq = a.table("sequence")
    for r in seq[seq["scope"] == "pooled"].itertuples(index=False):
        out[f"seq:{r.test}"] = float(r.pvalue)
        out[f"mde:{r.test}"] = float(r.mde)
    ln = a.table("lengths")
    # the length family is active only where some cell's length table is testable (EOS inside
    # the 12 positions): recorded, not part of the configurations below
    has_len = len(ln) and "p_adj" in ln and ln["p_adj"].notna().any()
    out["lengths"] = float(ln["p_adj"].min()) if has_len else float("nan")
    out["mde_tv_cells"] = float(a.mde_tv)
    return out


def _slice(df: pd.DataFrame | None, seeds: np.ndarray, arm: str) -> pd.DataFrame | None:
    if df is None:
        return None
    return df[np.isin(df["seed"].to_numpy(), seeds)].assign(arm=arm)


def _analyze_one(
    ref: tuple[pd.DataFrame, pd.DataFrame | None],
    cand: tuple[pd.DataFrame, pd.DataFrame | None],
    ref_seeds: np.ndarray,
    cand_seeds: np.ndarray,
    perms: int,
    seed: int,
    statistics: tuple[str, ...] = (),
) -> dict[str, float]:
    from spectest.stats import AnalysisOptions, analyze

    s = pd.concat(
        [_slice(ref[0], ref_seeds, "reference"), _slice(cand[0], cand_seeds, "candidate")],
        ignore_index=True,
    )
    rounds = _slice(cand[1], cand_seeds, "candidate")
    a = analyze(
        s,
        reference="reference",
        candidate="candidate",
        options=AnalysisOptions(
            alpha=ALPHA,
            null_permutations=perms,
            **({"sequence_statistics": statistics} if statistics else {}),
        ),
        rounds=rounds,
        rng_seed=seed,
    )
    return family_pvalues(a)


def _cache_dir(root: Path, pair: str, tag: str) -> Path:
    return root / f"power_{pair}{tag}"


def read_records(cache: Path) -> list[dict]:
    """Every record of the cache (one JSON line per analysis, one file per worker); a line cut by
    a killed worker is skipped, and a (arm, rep) seen twice keeps its first record."""
    seen: set[tuple[str, int]] = set()
    out = []
    for f in sorted(cache.glob("w*.jsonl")) if cache.is_dir() else []:
        for line in f.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if (r["arm"], r["rep"]) not in seen:
                seen.add((r["arm"], r["rep"]))
                out.append(r)
    return out


def job_list(reps: int, h0_reps: int, with_h0: bool) -> list[tuple[str, int]]:
    """Every (arm, replication) in rep-major order, the H0 replications dealt evenly among them:
    a run cut short leaves every arm with about the same number of replications (the report
    shows the count), not some arms complete and others empty."""
    jobs: list[tuple[str, int]] = []
    h0 = list(range(h0_reps)) if with_h0 else []
    per = -(-len(h0) // max(reps, 1)) if h0 else 0
    for r in range(max(reps, 1 if h0 else 0)):
        jobs += [("H0", i) for i in h0[r * per : (r + 1) * per]]
        if r < reps:
            jobs += [(arm, r) for arm in ARMS[2:]]
    jobs += [("H0", i) for i in h0[max(reps, 1) * per :]]
    return jobs


def _h0_pools(args: argparse.Namespace, disjoint: bool, ref: Any) -> tuple[Any, Any]:
    """The H0 replications' (reference-side, exact-side) pools: the two H0 pools when both are
    complete ("disjoint"), else the main reference and exact pools ("resampled")."""
    root, n_seeds, h0_seeds = Path(args.dir), args.reps * args.per_arm, args.h0_reps * args.per_arm
    if disjoint:
        return (
            load_pool(root, args.pair, h0_seeds, "h0_reference"),
            load_pool(root, args.pair, h0_seeds, "h0_exact"),
        )
    return ref, load_pool(root, args.pair, n_seeds, "exact")


def _h0_seeds(r: int, disjoint: bool, per_arm: int, n_seeds: int) -> tuple[np.ndarray, np.ndarray]:
    """H0 replication r's (reference, candidate) seeds: a disjoint block, or drawn at random."""
    if disjoint:
        rs = np.arange(r * per_arm, (r + 1) * per_arm)
        return rs, rs
    rng = np.random.default_rng([14, r])
    rs = rng.choice(n_seeds, per_arm, replace=False)
    return rs, rng.choice(n_seeds, per_arm, replace=False)


def table(args: argparse.Namespace) -> None:
    """Analyse slices of the pools; one JSON line per (arm, replication) in this worker's file.
    Stops starting analyses once ``--budget-s`` would be exceeded (the last analysis's wall time
    as the estimate), so a timed step ends cleanly; re-running resumes.

    H0 replication r: with both H0 pools complete ("disjoint"), seeds [r·n, (r+1)·n) of each —
    independent replications; otherwise ("resampled") n + n sequences per cell drawn at random
    from the main reference and exact pools — each replication exact, but replications share
    sequences (each uses n / pool of them), so the count's spread exceeds the binomial one."""
    t_start = time.perf_counter()
    root = Path(args.dir)
    n_seeds, h0_seeds = args.reps * args.per_arm, args.h0_reps * args.per_arm
    cache = _cache_dir(root, args.pair, args.tag)
    cache.mkdir(parents=True, exist_ok=True)
    done = {(r["arm"], r["rep"]) for r in read_records(cache)}
    ref = load_pool(root, args.pair, n_seeds, "reference")
    if ref is None:
        sys.exit(f"no complete reference pool under {_pool_dir(root, args.pair, n_seeds)}")
    disjoint = all(pool_complete(root, args.pair, h0_seeds, a) for a in H0_ARMS)
    h0_pair: tuple | None = None  # (reference-side pool, exact-side pool), loaded when needed
    with_h0 = disjoint or pool_complete(root, args.pair, n_seeds, "exact")
    jobs = [j for j in job_list(args.reps, args.h0_reps, with_h0) if j not in done]
    jobs = jobs[args.worker :: args.workers]
    pools: dict[str, tuple[pd.DataFrame, pd.DataFrame | None] | None] = {}
    stats_ = tuple(x for x in args.statistics.split(",") if x)
    last = 0.0
    with (cache / f"w{args.worker}.jsonl").open("a") as fh:
        for arm, r in jobs:
            if args.budget_s and time.perf_counter() - t_start + 1.5 * last > args.budget_s:
                print(f"worker {args.worker}: budget {args.budget_s} s reached", flush=True)
                break
            t0 = time.perf_counter()
            if arm == "H0":
                if h0_pair is None:
                    h0_pair = _h0_pools(args, disjoint, ref)
                h0_ref, h0_exact = h0_pair
                assert h0_ref is not None and h0_exact is not None
                rs, cs = _h0_seeds(r, disjoint, args.per_arm, n_seeds)
                res = _analyze_one(h0_ref, h0_exact, rs, cs, args.perms, r, stats_)
                res["h0_scheme"] = "disjoint" if disjoint else "resampled"  # type: ignore[assignment]
            else:
                if arm not in pools:
                    pools[arm] = load_pool(root, args.pair, n_seeds, arm)
                pool = pools[arm]
                if pool is None:
                    continue
                seeds = np.arange(r * args.per_arm, (r + 1) * args.per_arm)
                res = _analyze_one(ref, pool, seeds, seeds, args.perms, r, stats_)
            last = time.perf_counter() - t0
            rec = {"arm": arm, "rep": r, "wall_s": last, "perms": args.perms, **res}
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            print(f"{arm} rep {r}: {last:.1f} s", flush=True)


def report(args: argparse.Namespace) -> None:
    """The table from the cache (``power_table_report.report``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from power_table_report import report as _report

    _report(args)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="generate the per-arm pools (resumable)")
    g.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    g.add_argument("--batch", type=int, default=1024)
    g.add_argument("--arms", default="", help="comma-separated subset of the arms")
    t = sub.add_parser("table", help="analyse replications (resumable JSON lines cache)")
    t.add_argument("--perms", type=int, default=200)
    t.add_argument("--statistics", default="", help="sequence statistics (default: DEFAULT)")
    t.add_argument("--budget-s", type=float, default=0.0, help="stop starting analyses after")
    r = sub.add_parser("report", help="print the kill-rate table from the cache")
    r.add_argument("--md", default="", help="also write the markdown here")
    r.add_argument("--json", default="", help="write the JSON summary here")
    for p in (g, t, r):
        p.add_argument("--pair", default="toy", choices=sorted(PAIRS))
        p.add_argument("--reps", type=int, default=20)
        p.add_argument("--per-arm", type=int, default=PER_ARM)
        p.add_argument("--h0-reps", type=int, default=200, help="H0 replications (H0 pools)")
        p.add_argument("--dir", default=str(RESULTS), help="results root (pools, caches)")
    for p in (t, r):
        p.add_argument("--tag", default="", help="suffix of the cache directory (e.g. -all5)")
    for p in (g, t):
        p.add_argument("--workers", type=int, default=1, help="split the work over N processes")
        p.add_argument("--worker", type=int, default=0)
    a = ap.parse_args()
    {"generate": generate, "table": table, "report": report}[a.cmd](a)
