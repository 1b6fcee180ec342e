"""The user's reporting engine of examples/engines/ (issue 31: a numerics-sized bug decided from
engine-reported p) through the real command engine and ``spectest run``, at a small budget.

What is checked here is the plumbing the measured verdicts rest on (results/LOG.md, session 7:
the mutant DIFFERENT by the reported-p PIT at 16 000 seeds, 11 minutes, too slow for CI): both
engine arms report a p for every token; that p is the engine's own — computed by its own
forwards at its own batch shape, so it differs from spectest's teacher by the toy's numerics,
yet stays within the tolerance the reference measures — and the mutant reports the law it
should have sampled from (its cross-check passes while its tokens are biased). The run's
fingerprints name the program's content. Deterministic (fixed seeds): no false-failure rate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spectest import schema as sc

ROOT = Path(__file__).resolve().parents[1]
MUTANT = ROOT / "examples/engines/numerics-reporting-mutant.yaml"
SEEDS = 300  # per arm: 300 × 4 configs × 8 positions = 9 600 tokens an arm


@pytest.mark.slow
def test_the_reporting_example_reports_its_own_numerics(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "spectest", "run", "--config", str(MUTANT), "--out",
           str(tmp_path / "run"), "--no-progress", "--set", f"seeds.per_arm={SEEDS}",
           "--set", "seeds.teeth_per_arm=100"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode in (1, 3), proc.stdout + proc.stderr  # not 0/2/4: decided or short
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    details = summary["details"]["candidate"]
    tokens = SEEDS * 4 * 8
    assert details["reported_candidate_tokens_with_p"] == tokens
    assert details["reported_reference_tokens_with_p"] == tokens
    assert details["reported_rejected"] is False  # far too few tokens for a 0.01-TV bug
    assert "claim (a) from engine-reported p: no difference found" in proc.stdout
    samples = pd.read_parquet(tmp_path / "run/samples.parquet")
    tol = details["reported_crosscheck_tol"]
    for arm in ("reference", "candidate", "floor"):
        s = samples[samples[sc.ARM] == arm]
        d = np.abs(s[sc.REP_P].to_numpy() - s[sc.WB_P].to_numpy())
        assert len(s) == tokens and not np.isnan(d).any()
        assert d.max() > 1e-6  # the engine's own forwards, not the teacher's: numerics differ
        assert np.quantile(d, 0.99) <= tol  # ... by no more than the reference's own floor
    prints = summary["fingerprints"]["candidate"]
    assert any(k.endswith("examples/engines/numerics_reporting.py") for k in prints)
