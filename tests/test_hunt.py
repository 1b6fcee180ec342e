"""``spectest hunt``: engines that are not set up are rows naming their setup command (nothing
is installed or built), and an engine that is set up runs its protocol as its own ``spectest
run`` and comes back as a row with its verdict (transformers' assisted generation, which is
always installed: EQUIVALENT, as tests/test_engine_hf.py finds for the same protocol; deterministic
seeds, so its false-failure rate over fresh seeds, ~10 %, does not apply to this fixed run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spectest import hunt

ROOT = Path(__file__).resolve().parents[1]


def test_engines_not_set_up_are_listed_with_their_setup_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECTEST_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECTEST_LLAMA_SERVER", raising=False)
    monkeypatch.delenv("SPECTEST_VLLM_PYTHON", raising=False)
    rows = hunt.hunt(tmp_path / "out", only=("openvino-spec", "mistralrs-spec", "mlx-spec",
                                            "llamacpp-spec", "vllm-cpu-spec"))  # fmt: skip
    assert [r.status for r in rows] == ["not set up"] * 5
    notes = {r.protocol: r.note for r in rows}
    assert notes["openvino-spec"] == 'run "spectest setup openvino"'
    assert notes["mistralrs-spec"] == 'run "spectest setup mistralrs"'
    assert notes["mlx-spec"] == 'run "spectest setup mlx"'
    assert "spectest setup llamacpp" in notes["llamacpp-spec"]
    assert "spectest setup vllm-cpu" in notes["vllm-cpu-spec"]
    assert not (tmp_path / "out").exists()  # nothing ran


def test_every_hunted_protocol_is_shipped() -> None:
    from spectest.shipped import list_shipped

    names = {p.name for p in list_shipped()}
    assert {e.protocol for e in hunt.ENGINES} <= names


@pytest.mark.slow
def test_hunt_runs_an_installed_engine_and_prints_one_table(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "spectest", "hunt", "--out", str(tmp_path), "--only",
         "hf-assisted-ci"],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "spectest hunt" in r.stdout and "EQUIVALENT (0)" in r.stdout
    (row,) = json.loads((tmp_path / "hunt.json").read_text())
    assert row["status"] == "ran" and row["exit_code"] == 0 and row["rejections"] == 0
    assert row["version"].startswith("transformers ") and row["seeds"] == "per row"
    assert (tmp_path / "hf-assisted-ci" / "summary.json").is_file()
