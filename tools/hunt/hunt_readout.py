"""Readouts of an hf-assisted run directory for the historical-bug hunt (issue 6).

Reads what ``spectest run`` stored (summary, white-box table, samples, rounds) and adds what
the run itself does not decide on:

- the acceptance readout of the candidate arm (transformers' assisted generation): observed
  acceptance per verified draft slot against its conditional expectation under three drafters
  (``hf.probe.ACCEPTANCE_MODELS``: the processed q it should use, the warpers applied twice as
  in 5.x, a greedy token with q = raw softmax as in 4.44), each as a martingale z
  (``stats.whitebox.acceptance_test``);
- a probe, per config, of which q transformers' ``_speculative_sampling`` actually used
  (``hf.probe.probe_draft_law``: recorded draft scores vs teacher-forced laws; where the laws
  coincide, e.g. T = 1 without filters, the first matching law of ``Q_LAWS`` is named).

Acceptance is reported per config and pooled ("all").

Usage (with the Python whose transformers made the run)::

    python tools/hunt/hunt_readout.py RUN_DIR [--json OUT.json] [--probe-seeds 4]

Prints a compact report and writes it as JSON. Computes nothing the verdict depends on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from spectest import schema
from spectest.engines.hf import probe as ht
from spectest.prompts import prompt_token_ids
from spectest.protocol import load_protocol
from spectest.stats.whitebox import acceptance_test
from spectest.store import ROUNDS, SAMPLES, WHITEBOX
from spectest.stored import load_run


def _tokens(samples: pd.DataFrame, arm: str, prompt_id: str, config_id: str) -> torch.Tensor:
    s = samples[
        (samples[schema.ARM] == arm)
        & (samples[schema.PROMPT_ID] == prompt_id)
        & (samples[schema.CONFIG_ID] == config_id)
    ]
    wide = s.pivot(index=schema.SEED, columns=schema.POSITION, values=schema.TOKEN_ID)
    return torch.tensor(wide.sort_index().to_numpy(dtype=np.int64))  # [B, T]


def readout(run_dir: Path, probe_seeds: int) -> dict[str, Any]:
    run = load_run(run_dir)
    pf = run.protocol_file
    assert pf is not None, f"{run_dir}: no protocol.yaml"
    protocol = load_protocol(pf)
    out = _from_summary(run, run_dir)

    from spectest.models.zoo import load_pair

    m = protocol.models
    target, draft = load_pair(m.target, m.draft, device=m.device, dtype=m.dtype)
    prompts = prompt_token_ids(protocol, target.vocab_size)
    samples = run.table(SAMPLES)
    rounds = run.table(ROUNDS)
    assert samples is not None and rounds is not None, f"{run_dir}: samples/rounds missing"
    cs = samples[samples[schema.ARM] == schema.CANDIDATE].copy()
    cs = cs.sort_values([schema.PROMPT_ID, schema.CONFIG_ID, schema.SEED, schema.POSITION])
    out["acceptance"] = _acceptance(protocol, target, draft, prompts, cs, rounds)
    rc = rounds[rounds[schema.ARM] == schema.CANDIDATE]
    out["tokens_per_round"] = float(rc["emitted"].sum() / len(rc))
    out["probe"] = _probe(protocol, target, draft, prompts, probe_seeds)
    return out


def _from_summary(run: Any, run_dir: Path) -> dict[str, Any]:
    """What the run's summary and white-box table say (no model needed)."""
    import transformers

    packages = run.provenance.get("packages", {})
    out: dict[str, Any] = {
        "run_dir": str(run_dir),
        "transformers_run": packages.get("transformers"),
        "transformers_readout": transformers.__version__,
        "verdict": run.summary["verdict"]["decision"],
        "exit_code": run.summary["verdict"]["exit_code"],
        "teeth": {t["arm"]: t["label"] for t in run.summary.get("teeth", [])},
    }
    cand = next(c for c in run.summary["comparisons"] if c["arm"] == schema.CANDIDATE)
    out["candidate"] = {
        "rejected": cand["rejected"],
        "cells_tested": cand["cells_tested"],
        "rejections": cand["rejections"],
        "failing": cand["failing"],
        "by_config": cand["by_config"],
    }
    wb = run.table(WHITEBOX)
    if wb is not None:
        w = wb[(wb["comparison"] == schema.CANDIDATE)]
        out["whitebox"] = [
            {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in r.items()}
            for r in w[["arm", "test", "statistic", "pvalue", "p_adj", "reject", "detail"]].to_dict(
                "records"
            )
        ]

    return out


def _acceptance(
    protocol: Any, target: Any, draft: Any, prompts: Any, cs: Any, rounds: Any
) -> dict[str, dict[str, Any]]:
    """The candidate's acceptance rate against each acceptance model's expectation, per config
    and over all."""
    expected: dict[str, list[np.ndarray]] = {k: [] for k in ht.ACCEPTANCE_MODELS}
    for (pid, cid), _ in cs.groupby([schema.PROMPT_ID, schema.CONFIG_ID], sort=True):
        toks = _tokens(cs, schema.CANDIDATE, pid, cid)
        exp = ht.expected_acceptance(target, draft, prompts[pid], protocol.config_map[cid], toks)
        for k, v in exp.items():
            expected[k].append(v.reshape(-1).numpy())
    cs = cs.assign(**{f"_exp_{k}": np.concatenate(expected[k]) for k in ht.ACCEPTANCE_MODELS})
    acc: dict[str, dict[str, Any]] = {}
    for cid in ["all", *protocol.config_map]:
        sub = cs if cid == "all" else cs[cs[schema.CONFIG_ID] == cid]
        rsub = rounds if cid == "all" else rounds[rounds[schema.CONFIG_ID] == cid]
        acc[cid] = {}
        for k in ht.ACCEPTANCE_MODELS:
            r = acceptance_test(
                rsub, sub.assign(**{schema.WB_OVERLAP: sub[f"_exp_{k}"]}), schema.CANDIDATE
            )
            acc[cid][k] = {
                "observed_rate": r.observed_rate,
                "expected_rate": r.expected_rate,
                "z": r.statistic,
                "pvalue": r.pvalue,
                "n_slots": r.n_attempted,
            }
    return acc


def _probe(
    protocol: Any, target: Any, draft: Any, prompts: Any, probe_seeds: int
) -> dict[str, Any]:
    """Which law transformers' assistant really uses as q, per config, on the first prompt."""
    out: dict[str, Any] = {"probe": {}}
    pid = protocol.prompts.items[0].id
    for cid, params in protocol.configs:
        probe = ht.probe_draft_law(
            target,
            draft,
            torch.tensor(prompts[pid]),
            params,
            protocol.positions,
            protocol.drafter.k,
            seeds=range(probe_seeds),
        )
        out["probe"][cid] = {
            "q_law": probe.q_law,
            "max_abs_diff": probe.max_abs_diff,
            "argmax_fraction": probe.argmax_fraction,
            "n_positions": probe.n_positions,
        }
    return out["probe"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--probe-seeds", type=int, default=4)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    res = readout(a.run_dir, a.probe_seeds)
    text = json.dumps(res, indent=1, default=str)
    if a.json is not None:
        a.json.write_text(text + "\n", encoding="utf-8")
    v = res["transformers_run"]
    print(f"transformers {v}: verdict {res['verdict']} (exit {res['exit_code']})")
    print(f"  teeth: {res['teeth']}")
    c = res["candidate"]
    print(f"  candidate: {c['rejections']} rejection(s), {c['cells_tested']} cells tested")
    for f in c["failing"][:6]:
        print(f"    failing: {f}")
    for bc in c["by_config"]:
        print(
            f"  {bc['config_id']}: max TV excess {bc['max_tv_excess']:.4f} at {bc['max_tv_where']}"
        )
    for r in res.get("whitebox", []):
        if r["test"] in ("pit_ks", "directed_z"):
            print(
                f"  wb {r['arm']:9s} {r['test']:10s} stat {r['statistic']:+.4f} p {r['pvalue']:.3g}"
            )
    for cid, models in res["acceptance"].items():
        for k, v in models.items():
            print(
                f"  acceptance [{cid}] vs {k:15s}: observed {v['observed_rate']:.4f} expected "
                f"{v['expected_rate']:.4f} z {v['z']:+.2f} (n={v['n_slots']})"
            )
    for cid, p in res["probe"].items():
        diffs = ", ".join(f"{k} {v:.2g}" for k, v in p["max_abs_diff"].items())
        share = p["argmax_fraction"]
        print(f"  q used [{cid}]: {p['q_law']} (max |Δ|: {diffs}); argmax share {share:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
