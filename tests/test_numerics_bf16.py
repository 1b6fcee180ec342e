"""Issue 31 item 5 end to end, as a new user runs it: ``spectest run --config
protocols/top_p.yaml --set models.dtype=bfloat16`` on the bundled pair on CPU is decided —
EQUIVALENT for the exact sampler, DIFFERENT for ``eps_biased:0.5`` — with a floor that is not
identically 0 (``tests.numerics_floor: auto``). Real subprocesses, torch's CPU bf16 kernels:
slow (several minutes each on a loaded 2-core machine).

Fixed seeds (the protocol's): each run is deterministic on a given CPU. The false-failure rate
of the EQUIVALENT expectation is that of its level-α tests: claim (a)'s families share α = 0.05
(results/LOG.md: ≤ α under numerics), claim (b)'s pass side (UCB) misses ≤ α
(docs/numerics.md "Calibration"); results/LOG.md (h43, session 5) has the lines printed here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, *sets: str) -> tuple[int, dict, str]:
    out = tmp_path / "run"
    args = [sys.executable, "-m", "spectest", "run", "--config", "protocols/top_p.yaml",
            "--set", "models.dtype=bfloat16", *(x for s in sets for x in ("--set", s)),
            "--out", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3000)
    summary = json.loads((out / "summary.json").read_text())
    return res.returncode, summary, res.stdout + res.stderr


@pytest.mark.slow
def test_bf16_top_p_is_equivalent_with_a_floor_that_measures_something(tmp_path: Path) -> None:
    rc, summary, text = _run(tmp_path)
    v = summary["verdict"]
    assert (rc, v["decision"]) == (0, "equivalent"), text
    n = v["numerics"]
    assert n["decision"] == "within" and n["floor_kind"] in ("batch", "prefill", "dtype")
    assert "measures nothing" not in n["floor_note"] and n["floor"] > 0, n
    assert f"floor ({n['floor_kind']}" in v["scope"]["claims"][1]


@pytest.mark.slow
def test_bf16_eps_biased_is_different(tmp_path: Path) -> None:
    rc, summary, text = _run(tmp_path, "candidate=eps_biased:0.5")
    assert (rc, summary["verdict"]["decision"]) == (1, "different"), text
