"""``spectest run`` killed with SIGKILL at several points, then resumed, gives results identical
to an uninterrupted run (issue 9, "done when"): the same samples, histograms, tests, trie and
white-box tables, the same verdict and exit code. Between the kill and the resume the directory
is never taken for a result (no manifest, or ``complete: false``; ``analyze`` refuses it), and
the killed writer's lock does not block the resume.

The kill is a real SIGKILL sent by the process to itself at a named point of its writes
(``SPECTEST_CRASH_AT``, ``spectest.store._crash_point``): no handler, no cleanup, no flush, and
no race with a timer. Real subprocesses on the analytic toy LM; ~5 min on the busy 2-core
machine in all (each case ~50 s measured), hence ``slow``. Deterministic: seeds are fixed,
so the outcome cannot vary between runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from toy_protocol import write_toy

from spectest.errors import InputError
from spectest.store import (
    HISTOGRAMS,
    MANIFEST,
    ROUNDS,
    SAMPLES,
    SEQUENCE,
    SUMMARY,
    TESTS,
    TRIE,
    WHITEBOX,
)
from spectest.stored import load_run

ROOT = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    "OMP_NUM_THREADS": "1",
    "SPECTEST_NO_PROGRESS": "1",
}
TABLES = (SAMPLES, ROUNDS, HISTOGRAMS, TESTS, TRIE, WHITEBOX, SEQUENCE)
N_SHARDS = 10  # 5 arms (reference, candidate, null, eps=0.5, mutant:always_accept) x 2 prompts

pytestmark = pytest.mark.slow


def run(proto: Path, out: Path, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**ENV, "SPECTEST_CRASH_AT": crash_at} if crash_at else ENV
    return subprocess.run(
        [sys.executable, "-m", "spectest", "run", "--config", str(proto), "--out", str(out),
         "--no-progress"],
        cwd=proto.parent, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def protocol(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("proto")
    return write_toy(
        d,
        seeds={"per_arm": 120},
        tests={"alpha": 0.05, "trie": {"depth": 1, "min_count": 50}, "null_permutations": 50},
    )


@pytest.fixture(scope="module")
def whole(protocol: Path) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = protocol.parent / "whole"
    r = run(protocol, out)
    assert r.returncode in (0, 1, 3), r.stdout + r.stderr
    return out, r


@pytest.mark.parametrize(
    "points",
    [
        ["shard:3"],  # during generation, after 3 of 10 shards
        ["shard:3", "shard:4"],  # killed again while resuming (after 7 shards in all)
        [f"final:{SAMPLES}"],  # during the final writes: first table written
        ["manifest"],  # the case: summary.json and every table, but no manifest
        ["manifest-written"],  # the manifest, but summary.json still complete: false
    ],
    ids=lambda p: "+".join(p),
)
def test_sigkill_then_resume_is_identical_to_an_uninterrupted_run(
    protocol: Path, whole: tuple[Path, subprocess.CompletedProcess[str]], points: list[str]
) -> None:
    whole_dir, whole_res = whole
    out = protocol.parent / ("killed-" + "+".join(points).replace(":", "-"))
    shards_so_far = 0
    for point in points:
        r = run(protocol, out, crash_at=point)
        assert r.returncode == -signal.SIGKILL, (point, r.stdout, r.stderr)
        if point.startswith("shard:"):
            shards_so_far += int(point.split(":")[1])
            done = list((out / "shards").glob("*.samples.parquet"))
            assert len(done) == shards_so_far, point
        # never a result: no manifest (or a summary saying complete: false), analyze refuses
        summary = out / SUMMARY
        if summary.exists():
            assert json.loads(summary.read_text())["complete"] is False, point
        assert (out / MANIFEST).exists() == (point == "manifest-written"), point
        with pytest.raises(InputError, match=r"incomplete|complete: false"):
            load_run(out)
    r = run(protocol, out)  # the resume (the killed process's lock must not block it)
    assert r.returncode == whole_res.returncode, r.stdout + r.stderr
    if points[0].startswith("shard:"):
        assert f"{N_SHARDS - shards_so_far} generated, {shards_so_far} resumed" in r.stdout
    stored, ref = load_run(out), load_run(whole_dir)
    assert stored.summary["complete"] is True
    assert stored.summary["verdict"] == ref.summary["verdict"]
    for name in TABLES:
        a = pq.read_table(out / name).to_pandas()
        b = pq.read_table(whole_dir / name).to_pandas()
        pd.testing.assert_frame_equal(a, b, check_exact=True, obj=name)
    assert not list(out.glob(".*.tmp"))  # a dead writer's temporaries are cleaned on resume
