"""``spectest compare --from-run DIR`` (issue 34.5) on a real toy run directory, as real
subprocesses: two arms of the run's samples.parquet are compared as two bring-your-own files
(``arm`` and ``wb_*`` dropped), giving the same per-cell p-values as the run's own candidate
tests, and the same result (protocol hash included) as docs/compare.md's by-hand recipe.
Exact checks (same data, same tests: equal numbers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.toy_protocol import write_toy

REPO = Path(__file__).resolve().parents[1]
COLS = ["prompt_id", "config_id", "seed", "position", "token_id"]


def spectest(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "SPECTEST_NO_PROGRESS": "1"}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "spectest", *map(str, args)], cwd=cwd, env=env,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fromrun")
    proto = write_toy(d, teeth={"null_arm": True, "epsilons": [], "mutants": ["always_accept"]})
    r = spectest("run", "--config", proto, "--out", d / "run", cwd=d)
    assert r.returncode in (0, 1, 3), r.stdout + r.stderr
    assert any(c.startswith("wb_") for c in pd.read_parquet(d / "run" / "samples.parquet"))
    return d / "run"


def cell_pvalues(run: Path, comparison: str) -> pd.Series:
    t = pd.read_parquet(run / "tests.parquet")
    t = t[t["comparison"] == comparison].set_index(["prompt_id", "config_id", "position"])
    return t["pvalue"].sort_index()


def test_from_run_compares_two_arms_as_the_run_did(run_dir: Path, tmp_path: Path) -> None:
    r = spectest("compare", "--from-run", run_dir, "--out", tmp_path / "cmp", cwd=tmp_path)
    assert r.returncode in (0, 3), r.stdout + r.stderr
    info = json.loads((tmp_path / "cmp" / "run.json").read_text())
    src = run_dir.resolve() / "samples.parquet"
    assert (info["reference"], info["candidate"]) == (f"{src}[arm=reference]",
                                                      f"{src}[arm=candidate]")  # fmt: skip
    pd.testing.assert_series_equal(
        cell_pvalues(tmp_path / "cmp", "candidate"), cell_pvalues(run_dir, "candidate")
    )
    # docs/compare.md's recipe by hand: the same inputs, so the same hash and p-values
    s = pd.read_parquet(run_dir / "samples.parquet")
    s.loc[s.arm == "reference", COLS].to_parquet(tmp_path / "ref.parquet", index=False)
    s.loc[s.arm == "candidate", COLS].to_parquet(tmp_path / "cand.parquet", index=False)
    r2 = spectest("compare", "--reference", "ref.parquet", "--candidate", "cand.parquet",
                  "--out", tmp_path / "cmp2", cwd=tmp_path)  # fmt: skip
    assert r2.returncode == r.returncode, r2.stdout + r2.stderr
    hashes = [json.loads((tmp_path / d / "summary.json").read_text())["protocol_hash"]
              for d in ("cmp", "cmp2")]  # fmt: skip
    assert hashes[0] == hashes[1]


def test_from_run_chooses_arms_and_refuses_what_is_not_there(run_dir: Path, tmp_path: Path) -> None:
    r = spectest("compare", "--from-run", run_dir, "--arms", "mutant:always_accept,reference",
                 "--out", tmp_path / "m", "--max-mde-tv", "1", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr  # the gross mutant differs
    pd.testing.assert_series_equal(
        cell_pvalues(tmp_path / "m", "candidate"),
        cell_pvalues(run_dir, "mutant:always_accept"), check_names=False,
    )  # fmt: skip
    r = spectest("compare", "--from-run", run_dir, "--arms", "eps=0.5,reference", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().endswith(
        "--arms: no arm 'eps=0.5' in "
        f"{run_dir.resolve() / 'samples.parquet'} (its arms: reference, candidate, null, "
        "mutant:always_accept)"
    ), r.stderr
    r = spectest("compare", "--from-run", run_dir, "--reference", "x.csv", cwd=tmp_path)
    assert r.returncode == 2 and "--from-run DIR takes no --reference" in r.stderr, r.stderr
