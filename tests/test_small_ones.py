"""Issue 34.7, the small ones, on one real toy run (``spectest run`` subprocesses): at 80
columns (``COLUMNS=80``) the per-config table cuts nothing (it was "always_acc…"); the report's
seed ranges are ranges, not a Python dict; the resolution plot's x-axis names the
cell-positions (it was an index 0..15). Exact checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from spectest.report.evidence import cell_labels, sizes_vs_resolution
from spectest.report.sections import seed_ranges_text
from spectest.store import TESTS
from spectest.stored import load_run
from tests.toy_protocol import write_toy

REPO = Path(__file__).resolve().parents[1]
LONG = "t0.8-k20-p0.95-long"  # a config id longer than its column at 80 columns


def spectest(*args: object, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
            "SPECTEST_NO_PROGRESS": "1", **env}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "spectest", *map(str, args)], cwd=cwd, env=full,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    d = tmp_path_factory.mktemp("small")
    proto = write_toy(
        d, configs={LONG: {"temperature": 0.8, "top_k": 20, "top_p": 0.95}},
        teeth={"null_arm": True, "epsilons": [0.5],
               "mutants": ["always_accept", "swapped_filter_order"]},
    )  # fmt: skip
    r = spectest("run", "--config", proto, "--out", d / "run", cwd=d, COLUMNS="80")
    assert r.returncode in (0, 1, 3), r.stdout + r.stderr
    return d / "run", r.stdout


def test_per_config_table_at_80_columns_cuts_nothing(toy_run: tuple[Path, str]) -> None:
    run, out = toy_run
    table = [ln for ln in out.splitlines() if ln[:1] in "┏┃┡│└"]
    assert table and all(len(ln) <= 80 for ln in table), "\n".join(table)
    assert "…" not in out, out
    assert any(LONG in ln for ln in table), out  # the config id whole
    summary = load_run(run).summary
    teeth = summary["configs"][0]["teeth"]
    assert "swapped_filter_order" in teeth and "always_accept" in teeth
    flat = " ".join(out.split())  # the line is wrapped at 80 columns, between words
    assert f"teeth rejections in {LONG}: {teeth}" in flat  # the narrow table's teeth column


def test_wide_console_keeps_the_teeth_column(toy_run: tuple[Path, str], tmp_path: Path) -> None:
    run, _ = toy_run
    r = spectest("analyze", run, "--no-progress", cwd=tmp_path, COLUMNS="160")
    assert r.returncode in (0, 1, 3), r.stdout + r.stderr
    assert "teeth rejections in" not in r.stdout and "swapped_filter_order" in r.stdout


def test_seed_ranges_read_as_ranges(toy_run: tuple[Path, str]) -> None:
    run, _ = toy_run
    md = (run / "report.md").read_text()
    line = next(ln for ln in md.splitlines() if "Seed ranges per arm" in ln)
    assert "{" not in line and "[" not in line, line
    assert "reference 0–199 · candidate 200–399 · null 400–599 · eps=0.5 600–799" in line, line
    assert seed_ranges_text({"a": [5, 6]}) == "a 5–5 (seeds, inclusive)"


def test_resolution_plot_axis_names_the_cell_positions(toy_run: tuple[Path, str]) -> None:
    stored = load_run(toy_run[0])
    tests = stored.table(TESTS)
    assert tests is not None
    sizes = pd.read_parquet(toy_run[0] / "tooth_sizes.parquet")
    arms = [c["arm"] for c in stored.summary["comparisons"]]
    fig = sizes_vs_resolution(tests, sizes, "candidate", ["reference", *arms])
    assert fig is not None
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    df = tests[(tests["comparison"] == "candidate") & (tests["status"] == "ok")]
    assert ticks == cell_labels(df) and ticks[:2] == ["p0@0", "p0@1"], ticks
