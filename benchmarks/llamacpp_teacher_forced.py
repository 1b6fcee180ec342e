"""Claim (b) for llama.cpp from the plain server teacher-forced at the candidate's prefixes: a
measurement of a design (issue 31 item 3). The decision is now built into ``spectest run``
(``arms.floor.teacher_forced``, ``stats.teacher_forced``); this script is kept as the measurement.

Usage: python benchmarks/llamacpp_teacher_forced.py RUN_DIR URL [--n 1500] [--boot 200]

RUN_DIR is a finished ``spectest run`` of ``protocols/llamacpp-spec-floor.yaml`` (its
samples.parquet, prompts.jsonl, protocol.yaml); URL a running *plain* llama-server on the same
GGUF (``llama-server -m target.gguf -np 4 -t 1``). For the first N sequences per cell of the
candidate and of the reference, every prefix (prompt + the first t tokens) is sent once with
``n_predict 1``, ``n_probs`` = the vocabulary and ``post_sampling_probs``: the plain server's
full processed law π at that prefix. Per unit (cell, position) with Z_i = e_{x_i} − π_i:

- **U1** = (‖Σ Z_i‖² − Σ ‖Z_i‖²) / (n(n − 1)), unbiased for ‖p̄_spec − E_h π(·|h)‖² — the
  candidate's marginal against the plain server's one-step law averaged over the candidate's
  own prefixes (0 for an exact sampler up to prefill-vs-decode numerics, which only add to it:
  no floor is subtracted, so it is conservative for "within");
- **U2**, the shipped two-sample statistic (stats.token_floor.token_drift) between the
  candidate's and the reference's marginals, on the same sequences, for comparison.

Printed: each one's mean over units and a plain bootstrap sd (sequences resampled within each
cell; pairs of copies not removed, so a rough spread, not the shipped bootstrap-t). U1's
variance has one sample's noise, not two, and conditions on the prefix: results/LOG.md
(2026-12-03 h54) has the measured ratio.
"""

from __future__ import annotations

import argparse
import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

V = 512  # the tiny-llama fixture's vocabulary


def plain_law(url: str, prompt: list[int], cfg: dict[str, Any]) -> np.ndarray:
    """The plain server's full processed law at ``prompt`` (one token, every id's p)."""
    body = {
        "prompt": prompt, "n_predict": 1, "seed": 1, "temperature": cfg["temperature"],
        "top_k": int(cfg.get("top_k", 0)), "top_p": cfg.get("top_p", 1.0),
        "min_p": cfg.get("min_p", 0.0), "typical_p": 1.0, "repeat_penalty": 1.0,
        "dry_multiplier": 0.0, "xtc_probability": 0.0,
        "samplers": ["temperature", "top_k", "top_p", "min_p"], "n_probs": V,
        "post_sampling_probs": True, "cache_prompt": False,
    }  # fmt: skip
    req = urllib.request.Request(
        url + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        reply = json.loads(r.read())
    p = np.zeros(V)
    for e in reply["completion_probabilities"][0]["top_probs"]:
        p[int(e["id"])] = float(e["prob"])
    return p


def u1(X: np.ndarray, P: np.ndarray) -> np.ndarray:
    """[n, T] tokens, [n, T, V] plain laws → [T] unbiased ‖E(e_x − π)‖²."""
    n, T = X.shape
    Z = -P.astype(np.float64)
    Z[np.arange(n)[:, None], np.arange(T)[None, :], X] += 1.0
    s = Z.sum(0)
    return ((s * s).sum(-1) - (Z * Z).sum((0, 2))) / (n * (n - 1))


def u2(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """[n, T], [m, T] tokens → [T] the two-sample U-statistic of Σ_v (p_v − q_v)²."""
    n, m = len(X), len(Y)
    out = []
    for t in range(X.shape[1]):
        a = np.bincount(X[:, t], minlength=V).astype(float)
        b = np.bincount(Y[:, t], minlength=V).astype(float)
        aa = ((a * a).sum() - n) / (n * (n - 1))
        out.append(aa + ((b * b).sum() - m) / (m * (m - 1)) - 2 * (a @ b) / (n * m))
    return np.array(out)


def collect(run: Path, url: str, n: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per cell and arm: the first n sequences' tokens [n, T] and plain laws [n, T, V]."""
    S = pd.read_parquet(run / "samples.parquet")
    prompts = {}
    for line in (run / "prompts.jsonl").read_text().splitlines():
        rec = json.loads(line)
        prompts[rec["id"]] = list(rec["ids"])
    configs = yaml.safe_load((run / "protocol.yaml").read_text())["configs"]
    out = {}
    for (pid, cid, arm), d in S[S.arm.isin(["candidate", "reference"])].groupby(
        ["prompt_id", "config_id", "arm"]
    ):
        X = d.pivot(index="seed", columns="position", values="token_id").sort_index()
        X = X.to_numpy()[:n]
        keys = sorted({tuple(X[i, :t]) for i in range(len(X)) for t in range(X.shape[1])})
        with ThreadPoolExecutor(8) as ex:
            pre, cfg = prompts[pid], configs[cid]
            laws = ex.map(lambda k, p=pre, c=cfg: plain_law(url, p + [int(v) for v in k], c), keys)
            by = dict(zip(keys, laws, strict=True))
        P = np.stack([[by[tuple(X[i, :t])] for t in range(X.shape[1])] for i in range(len(X))])
        out[f"{pid}|{cid}|{arm}"] = (X, P)
        print(f"{pid} {cid} {arm}: {len(keys)} prefixes", flush=True)
    return out


def _resample(rng: np.random.Generator, ix: np.ndarray) -> np.ndarray:
    return rng.integers(0, len(ix), len(ix))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("url")
    ap.add_argument("--n", type=int, default=1500)
    ap.add_argument("--boot", type=int, default=200)
    a = ap.parse_args()
    data = collect(a.run, a.url.rstrip("/"), a.n)
    cells = sorted({k.rsplit("|", 1)[0] for k in data})

    def stats(idx: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, float]:
        acc: dict[str, list[np.ndarray]] = {"U1 candidate": [], "U1 reference": [], "U2": []}
        for c in cells:
            (Xc, Pc), (Xr, Pr) = data[c + "|candidate"], data[c + "|reference"]
            i, j = idx[c]
            acc["U1 candidate"].append(u1(Xc[i], Pc[i]))
            acc["U1 reference"].append(u1(Xr[j], Pr[j]))
            acc["U2"].append(u2(Xc[i], Xr[j]))
        return {k: float(np.concatenate(v).mean()) for k, v in acc.items()}

    n_of = {k: len(v[0]) for k, v in data.items()}
    full = {
        c: (np.arange(n_of[c + "|candidate"]), np.arange(n_of[c + "|reference"])) for c in cells
    }
    est = stats(full)
    rng = np.random.default_rng(20261203)
    boots = [
        stats({c: (_resample(rng, full[c][0]), _resample(rng, full[c][1])) for c in cells})
        for _ in range(a.boot)
    ]
    print(f"n = {a.n} per cell per arm, {len(cells)} cells, bootstrap B = {a.boot}")
    for k, v in est.items():
        sd = float(np.std([b[k] for b in boots]))
        print(f"  {k:13s} mean {v:+.3e}  bootstrap sd {sd:.2e}  ±1.96 sd {1.96 * sd:.2e}")


if __name__ == "__main__":
    main()
