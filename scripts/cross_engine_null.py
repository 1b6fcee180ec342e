"""Cross-engine null (issue 6): spectest's built-in plain decode vs transformers' plain generate.

Same target, same configs, disjoint seed ranges: both arms sample plainly from the target, so
``analyze`` must not reject. The built-in arm is teacher-forced with spectest's pipeline
(``engines.teacher``), the transformers arm with transformers' own warpers (``hf_teacher``), so
each arm's white-box PIT is checked against the law that arm claims to sample from. Also reports
the largest |p_spectest − p_transformers| over the emitted prefixes (float64 pipeline vs
transformers' float32 warper chain).

Usage::

    python scripts/cross_engine_null.py [PROTOCOL] [--seeds N] [--positions T]

Models, prompts and configs come from PROTOCOL (default protocols/hf-assisted.yaml); only
``analyze`` decides. Prints one line per config.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import pandas as pd
import torch

from spectest.engines import hf
from spectest.engines import hf_teacher as ht
from spectest.engines.builtin import RowSpec, plain_decode, to_samples_frame
from spectest.engines.teacher import teacher_force
from spectest.models.zoo import load_model
from spectest.protocol import load_protocol
from spectest.runner import prompt_token_ids
from spectest.sampling.params import SamplingTensors
from spectest.sampling.transforms import logits_to_probs
from spectest.seeding import run_key_from
from spectest.stats.analyze import AnalysisOptions, analyze


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("protocol", nargs="?", default="protocols/hf-assisted.yaml")
    ap.add_argument("--seeds", type=int, default=2000, help="rows per arm and config")
    ap.add_argument("--positions", type=int, default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    p = load_protocol(a.protocol)
    T = a.positions or p.positions
    N = a.seeds
    target = load_model(p.models.target, device=p.models.device, dtype=p.models.dtype)
    prompts = prompt_token_ids(p, target.vocab_size)
    run_key = run_key_from(f"{p.seeds.key}/cross-engine-null")
    t = p.tests
    opts = AnalysisOptions(
        alpha=t.alpha,
        multiplicity=t.multiplicity,
        min_expected=t.min_expected,
        trie_depth=t.trie.depth,
        trie_min_count=t.trie.min_count,
        null_permutations=t.null_permutations,
    )
    print(f"transformers {hf.transformers_version()}: {p.models.target}, {N} rows/arm, T={T}")
    worst = 0
    for pid, ids in prompts.items():
        for cid, params in p.configs:
            ref_rows = [RowSpec(cid, s, params) for s in range(N)]
            hf_rows = [RowSpec(cid, s, params) for s in range(N, 2 * N)]
            kw: dict[str, Any] = dict(
                num_positions=T, run_key=run_key, prompt_id=pid, batch_size=p.batch_size
            )
            ref = plain_decode(target, ids, ref_rows, **kw)
            cand = hf.hf_plain_decode(target, ids, hf_rows, **kw)
            wb_ref = teacher_force(target, ids, [r.params for r in ref_rows], ref.tokens)
            wb_hf = ht.hf_teacher_force(target, ids, [r.params for r in hf_rows], cand.tokens)
            samples = pd.concat(
                [
                    pd.concat([to_samples_frame(ref, pid, ref_rows, "builtin"), wb_ref], axis=1),
                    pd.concat([to_samples_frame(cand, pid, hf_rows, "hf-generate"), wb_hf], axis=1),
                ],
                ignore_index=True,
            )
            res = analyze(
                samples, reference="builtin", candidate="hf-generate", options=opts, rng_seed=1
            )
            # the two pipelines on the transformers arm's prefixes
            seqs = torch.cat([torch.tensor(ids).expand(N, len(ids)), cand.tokens], dim=1)
            logits = ht.next_token_logits(target, seqs, len(ids))  # [N, T, V]
            p_hf = ht.processed_probs(logits, params)
            st = SamplingTensors.from_params([params] * N)
            p_st = logits_to_probs(logits, st)
            dmax = float((p_hf - p_st).abs().max())
            same_support = bool(torch.equal(p_hf > 0, p_st > 0))
            wb = res.whitebox
            pit = {r.arm: r.pvalue for r in wb[wb["test"] == "pit_ks"].itertuples(index=False)}
            print(
                f"  {pid}/{cid}: {'REJECTED' if res.rejected else 'not rejected'}; "
                f"{res.n_rejected}/{res.n_tested} cells; max TV excess {res.max_tv_excess:.4f}; "
                f"PIT-KS p builtin {pit.get('builtin', float('nan')):.3g}, "
                f"hf {pit.get('hf-generate', float('nan')):.3g}; "
                f"max |p_spectest - p_hf| {dmax:.2e}, same support {same_support}"
            )
            worst = max(worst, int(res.rejected))
    return worst


if __name__ == "__main__":
    sys.exit(main())
