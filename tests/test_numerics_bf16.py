"""Issue 31 item 5 end to end, as a new user runs it: ``spectest run --config
protocols/top_p.yaml --set models.dtype=bfloat16`` on the bundled pair on CPU is decided —
EQUIVALENT for the exact sampler, and ``eps_biased:0.5`` DIFFERENT — with a floor that is not
identically 0 (``tests.numerics_floor: auto``). A real subprocess, torch's CPU bf16 kernels:
slow (several minutes on a loaded 2-core machine).

One run serves both (session 11; two runs before, ~290 s each in the loaded suite): the
protocol's teeth include the ε arm ``eps=0.5``, i.e. ``eps_biased:0.5`` drawn on its own seeds
and compared with the same reference by the same analysis (``decision.judge.compare_all``: one
code path for the candidate and every tooth) at the same size, so "eps_biased:0.5 is DIFFERENT
in bf16" is read off that arm: it ran, it can bite, and it is rejected. What the second run added
beyond that — a DIFFERENT candidate is exit 1 with decision ``different`` in bf16 — is
tests/test_numerics_run.py's ``test_bundled_pair_bfloat16[always_accept-different]`` (the
bundled pair in bf16, candidate ``always_accept``: decision ``different``, exit 1).
The same run is also that file's bf16 "exact is EQUIVALENT under matched numerics" (its
ci.yaml ``exact`` case, dropped in session 11 as a repeat of this run: h85 in results/LOG.md).

Fixed seeds (the protocol's): the run is deterministic on a given CPU. The false-failure rate
of the EQUIVALENT expectation is that of its level-α tests: claim (a)'s families share α = 0.05
(results/LOG.md: ≤ α under numerics), claim (b)'s pass side (UCB) misses ≤ α
(docs/numerics.md "Calibration"); results/LOG.md (h43, session 5) has the lines printed here.
The ε arm's size (TV ≈ 0.17 per cell-position, float32 run) is far above the run's MDE
(≈ 0.21 per cell, ≥ 14 of 16 cells rejected in float32): a miss is the power's complement.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spectest.protocol import load_protocol

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict, str]:
    """(exit code, summary.json, output) of the one bf16 run of protocols/top_p.yaml."""
    out = tmp_path_factory.mktemp("bf16") / "run"
    args = [sys.executable, "-m", "spectest", "run", "--config", "protocols/top_p.yaml",
            "--set", "models.dtype=bfloat16", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3000)
    summary = json.loads((out / "summary.json").read_text())
    return res.returncode, summary, res.stdout + res.stderr


@pytest.mark.slow
def test_bf16_top_p_is_equivalent_with_a_floor_that_measures_something(
    bf16_run: tuple[int, dict, str],
) -> None:
    rc, summary, text = bf16_run
    v = summary["verdict"]
    assert (rc, v["decision"]) == (0, "equivalent"), text
    n = v["numerics"]
    assert n["decision"] == "within" and n["floor_kind"] in ("batch", "prefill", "dtype")
    assert "measures nothing" not in n["floor_note"] and n["floor"] > 0, n
    assert f"floor ({n['floor_kind']}" in v["scope"]["claims"][1]
    # the run's `--set`, read as the run reads it: tests.numerics auto resolved to matched
    p = load_protocol(ROOT / "protocols" / "top_p.yaml", sets=["models.dtype=bfloat16"])
    assert (p.candidate, p.numerics_mode) == ("exact", "matched")


@pytest.mark.slow
def test_bf16_eps_biased_is_different(bf16_run: tuple[int, dict, str]) -> None:
    _, summary, _ = bf16_run
    (eps,) = [c for c in summary["comparisons"] if c["arm"] == "eps=0.5"]
    assert eps["role"] == "eps" and eps["rejected"] and eps["rejections"] > 0, eps
    (tooth,) = [t for t in summary["verdict"]["teeth"] if t["arm"] == "eps=0.5"]
    assert tooth["ran"] and tooth["cannot_bite"] is None and tooth["rejected"], tooth
    assert tooth["label"].startswith("killed"), tooth
