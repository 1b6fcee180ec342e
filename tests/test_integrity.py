"""Integrity of run directories (issue 9, bullet 4), through the CLI (a real subprocess where
another process or a kill is the point, Typer's CliRunner elsewhere):
``analyze`` / ``report`` verify every data file's sha256 and name the one that changed; one
writer per directory (a second gets one line and exit 2; a killed writer's lock never blocks);
``summary.json`` says ``complete: false`` until the manifest exists; an incomplete directory is
never presented as a result; a failed ``compare`` never blocks its corrected re-run.

The bring-your-own data are iid draws from fixed laws with fixed seeds; no assertion here
depends on a statistical outcome except where a comment states its (negligible) failure rate.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from toy_protocol import write_toy
from typer.testing import CliRunner

from spectest.cli import app
from spectest.errors import InputError
from spectest.files import sha256_file
from spectest.store import LOCK_FILE, MANIFEST, SAMPLES, SUMMARY, RunDir
from spectest.stored import load_run

ROOT = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    "OMP_NUM_THREADS": "1",
    "SPECTEST_NO_PROGRESS": "1",
}
ZIPF = np.array([1 / k for k in range(1, 9)]) / sum(1 / k for k in range(1, 9))
SHIFTED = np.roll(ZIPF, 1)  # TV(ZIPF, SHIFTED) ≈ 0.31


def spectest(*args: str | Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spectest", *map(str, args)],
        cwd=cwd, env={**ENV, **env}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def invoke(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The CLI in-process, returned in the shape of a subprocess result."""
    r = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)


def one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: "), r.stderr
    return lines[0]


def byo(seed: int, probs: np.ndarray, seeds: range, T: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for pid in ("p0", "p1"):
        toks = rng.choice(len(probs), size=(len(seeds), T), p=probs)
        rows += [(pid, "c0", s, t, int(toks[i, t])) for i, s in enumerate(seeds) for t in range(T)]
    return pd.DataFrame(rows, columns=["prompt_id", "config_id", "seed", "position", "token_id"])


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    ref, cand = tmp_path / "ref.parquet", tmp_path / "cand.parquet"
    byo(1, ZIPF, range(300)).to_parquet(ref, index=False)
    byo(2, ZIPF, range(300, 600)).to_parquet(cand, index=False)
    return ref, cand


def compare(
    ref: Path, cand: Path, out: Path, *, subprocess_: bool = False, **env: str
) -> subprocess.CompletedProcess[str]:
    args = ("compare", "--reference", ref, "--candidate", cand, "--out", out, "--no-progress")
    return spectest(*args, cwd=out.parent, **env) if subprocess_ or env else invoke(*args)


# ----------------------------------------------------------------------------- sha256
def test_same_size_edit_of_samples_is_named_by_analyze_and_report(
    tmp_path: Path, pair: tuple[Path, Path]
) -> None:
    """The issue's exact case: samples.parquet edited without changing its size (here its
    provenance: still a valid Parquet file, so only the sha256 can tell)."""
    out = tmp_path / "cmp"
    r = compare(*pair, out)
    assert r.returncode not in (2, 4), r.stdout + r.stderr
    f = out / SAMPLES
    blob = f.read_bytes()
    edited = blob.replace(b'"device": "n/a"', b'"device": "cpu"')
    assert edited != blob and len(edited) == len(blob)
    f.write_bytes(edited)
    assert pq.read_table(f).num_rows == 2 * 2 * 300 * 3  # still readable: only sha256 tells
    manifest_before = (out / MANIFEST).read_bytes()
    for cmd in ("analyze", "report"):
        r = invoke(cmd, out)
        assert r.returncode == 2, r.stdout + r.stderr
        line = one_error_line(r)
        assert f"{f}: sha256 differs from manifest.json" in line, line
        assert "modified after the run" in line
    assert (out / MANIFEST).read_bytes() == manifest_before  # report did not bless the edit


def test_every_listed_data_file_is_verified(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    """A one-byte flip in any data file (not only samples) is named; rendered reports are
    views that ``report`` re-renders and are not data."""
    out = tmp_path / "cmp"
    assert compare(*pair, out).returncode not in (2, 4)
    load_run(out)
    for name in ("histograms.parquet", "tests.parquet", "run.json", SUMMARY):
        f = out / name
        original = f.read_bytes()
        b = bytearray(original)
        b[len(b) // 2] ^= 0x01
        f.write_bytes(bytes(b))
        r = invoke("analyze", out)
        assert r.returncode == 2, r.stdout + r.stderr
        assert str(f) in one_error_line(r)
        f.write_bytes(original)
    (out / "report.md").write_text("edited by hand\n")
    load_run(out)  # a view, not data


# ----------------------------------------------------------------------------- complete flag
@pytest.mark.parametrize(
    ("point", "has_manifest"),
    [(f"final:{SAMPLES}", False), ("manifest", False), ("manifest-written", True)],
)
def test_killed_compare_is_incomplete_everywhere_and_its_rerun_succeeds(
    tmp_path: Path, pair: tuple[Path, Path], point: str, has_manifest: bool
) -> None:
    """SIGKILL during the final writes: summary.json (when written) says complete: false, no
    command presents the directory as a result, and the same compare re-run into the same
    --out (a stale lock of the killed process included) completes."""
    out = tmp_path / "cmp"
    r = compare(*pair, out, SPECTEST_CRASH_AT=point)
    assert r.returncode == -signal.SIGKILL, r.stdout + r.stderr
    assert (out / MANIFEST).exists() == has_manifest
    if (out / SUMMARY).exists():
        assert json.loads((out / SUMMARY).read_text())["complete"] is False
    assert (out / LOCK_FILE).read_text().strip().isdigit()  # the dead writer's pid stays
    for cmd in ("analyze", "report"):
        r = invoke(cmd, out)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "incomplete" in one_error_line(r) or "complete: false" in one_error_line(r)
    r = compare(*pair, out)
    assert r.returncode not in (2, 4), r.stdout + r.stderr
    assert json.loads((out / SUMMARY).read_text())["complete"] is True
    load_run(out)


def test_summary_says_complete_false_until_the_manifest(tmp_path: Path) -> None:
    """In-process order of writes: complete: false in summary.json while the run writes, true
    (and matching the manifest's sha256) once the manifest exists; reopening flips it back."""
    run = tmp_path / "run"
    rd = RunDir.open(run, {"kind": "run", "protocol_hash": "abc"})
    df = byo(0, ZIPF, range(3)).assign(arm="reference")
    rd.write_final(
        tables={SAMPLES: (df, None)}, summary={"verdict": 1}, texts={}, provenance={},
        manifest=False,
    )  # fmt: skip
    written = {"verdict": 1, "data_files": [SAMPLES]}  # data_files: what verify_manifest needs
    assert json.loads((run / SUMMARY).read_text()) == {**written, "complete": False}
    rd.write_manifest({})
    assert json.loads((run / SUMMARY).read_text()) == {**written, "complete": True}
    # the manifest's sha256 of summary.json is that of the final bytes
    entry = json.loads((run / MANIFEST).read_text())["files"][SUMMARY]
    assert entry["sha256"] == sha256_file(run / SUMMARY)
    with pytest.raises(InputError, match=r"protocol\.yaml: not listed in manifest\.json although "
                       "every run of kind .run. has it"):  # fmt: skip
        load_run(run)  # a "run" without its protocol is not a complete run
    RunDir.open(run, {"kind": "run", "protocol_hash": "abc"})  # resume: incomplete again
    assert json.loads((run / SUMMARY).read_text())["complete"] is False
    assert not (run / MANIFEST).exists()


# ----------------------------------------------------------------------------- failed compare
def test_failed_compare_does_not_block_its_corrected_rerun(
    tmp_path: Path, pair: tuple[Path, Path]
) -> None:
    """A compare that finds a difference (exit 1), then the corrected candidate into the same
    --out: the directory is replaced, not refused. (TV ≈ 0.31 at 300 sequences per arm: the
    first compare fails to reject with probability < 1e-6.)"""
    ref, good = pair
    bad = tmp_path / "bad.parquet"
    byo(3, SHIFTED, range(300)).to_parquet(bad, index=False)
    out = tmp_path / "cmp"
    r = compare(ref, bad, out)
    assert r.returncode == 1, r.stdout + r.stderr
    first = json.loads((out / "run.json").read_text())["protocol_hash"]
    r = compare(ref, good, out)
    assert r.returncode not in (2, 4), r.stdout + r.stderr
    info = json.loads((out / "run.json").read_text())
    assert info["protocol_hash"] != first and info["candidate"] == str(good)
    stored = load_run(out)
    assert stored.summary["verdict"]["decision"] != "different"
    # a compare never replaces a protocol run's directory
    run_dir = tmp_path / "a-run"
    RunDir.open(run_dir, {"kind": "run", "protocol_hash": "abc"}).release()
    r = compare(ref, good, run_dir)
    assert r.returncode == 2 and "holds a 'run' run" in one_error_line(r), r.stderr


# ----------------------------------------------------------------------------- the lock
def test_second_writer_gets_one_line_and_exit_2(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    """While a writer holds a run directory, `run` and `compare` into it are refused with one
    line naming the holder's pid; once it is released they proceed."""
    out = tmp_path / "cmp"
    holder = RunDir.open(out, {"kind": "compare", "protocol_hash": "other"})
    r = compare(*pair, out, subprocess_=True)
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_error_line(r)
    assert f"another spectest process (pid {os.getpid()}) is writing to this run directory" in line
    proto = write_toy(tmp_path / "proto", seeds={"per_arm": 20}, positions=2)
    run_out = tmp_path / "run"
    run_holder = RunDir.open(run_out, {"kind": "run", "protocol_hash": "whatever"})
    r = spectest("run", "--config", proto, "--out", run_out, "--no-progress", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "another spectest process" in one_error_line(r)
    run_holder.release()
    holder.release()
    r = compare(*pair, out)
    assert r.returncode not in (2, 4), r.stdout + r.stderr
