"""The shipped protocols of the engines set up by ``spectest setup`` (OpenVINO GenAI, mistral.rs,
MLX-LM), each run to its documented verdict through ``spectest run`` (opt-in, slow).

A protocol runs when its engine's environment is already cached on this machine, or when
``SPECTEST_REAL_ENGINES=1`` asks for it (then the test sets the engine up first: OpenVINO
~2-4 min and 1.5 GB, mistral.rs ~10 s and 70 MB, MLX ~1.5 min and 0.35 GB; results/LOG.md).
Otherwise it is skipped, so the default suite and CI never install them; ``=0`` skips them even
where the environments are cached.

Expected outcomes and their error rates (measured in results/LOG.md):
- ``*-spec`` of OpenVINO 2026.4.1.0 and mistral.rs 0.5.0: DIFFERENT (exit 1) with p-values
  below 1e-60; a false pass is practically impossible.
- ``*-misconfigured`` / ``mlx-misordered`` (the teeth that run on the engine): DIFFERENT.
- ``*-null`` and ``mlx-spec``: EQUIVALENT (exit 0). OpenVINO and MLX seed every row, so a run
  is deterministic on a machine; over fresh seeds it would fail about 10 % of the time (α of
  the candidate plus α of the null tooth). mistral.rs cannot be seeded on CPU, but its RNG
  starts from a fixed state and requests run in order, so its runs replay too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import venv_engines

ROOT = Path(__file__).resolve().parents[1]

CASES = [
    ("openvino", "openvino-spec", 1),
    ("openvino", "openvino-null", 0),
    ("openvino", "openvino-misconfigured", 1),
    ("mistralrs", "mistralrs-spec", 1),
    ("mistralrs", "mistralrs-null", 0),
    ("mistralrs", "mistralrs-misconfigured", 1),
    ("mlx", "mlx-spec", 0),
    ("mlx", "mlx-null", 0),
    ("mlx", "mlx-misordered", 1),
]


@pytest.mark.slow
@pytest.mark.parametrize(("engine", "protocol", "expected"), CASES, ids=[c[1] for c in CASES])
def test_shipped_engine_protocol_gives_its_documented_verdict(
    engine: str, protocol: str, expected: int, tmp_path: Path
) -> None:
    if (why := venv_engines.skip_reason(engine)) is not None:
        pytest.skip(why)
    if not venv_engines.ready(engine):
        import importlib

        importlib.import_module(f"spectest.setup.{engine}").setup()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "spectest", "run", "--config", f"protocols/{protocol}.yaml",
         "--out", str(tmp_path / "run"), "--no-progress"],
        capture_output=True, text=True, cwd=ROOT, env=env,
    )  # fmt: skip
    assert r.returncode == expected, r.stdout[-3000:] + r.stderr[-2000:]
    word = {0: "EQUIVALENT (exit 0)", 1: "DIFFERENT (exit 1)"}[expected]
    assert word in r.stdout
