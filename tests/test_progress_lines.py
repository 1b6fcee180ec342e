"""Progress without a terminal (issue 34.4): a real ``spectest run`` subprocess whose stderr is
a pipe prints the header first, then a plain line at least every ``SPECTEST_PROGRESS_INTERVAL``
seconds (10 by default; 0.25 here, to keep the test fast) naming the phase, the arm, the shards
done of their total and an ETA. The gaps are measured from the arrival times of the lines.

Bound: no gap above 4 s (16 intervals) from the header until the result starts on stdout (the
ticker then stops; interpreter exit is not the run's: measured to the process's end, one run on
the busy 2-core machine saw 6 s there). The ticker is a thread of its own, so only a starved
machine exceeds the bound; its false-failure rate is not measured."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from spectest.progress import PlainProgress, shards_label
from tests.toy_protocol import write_toy

REPO = Path(__file__).resolve().parents[1]
INTERVAL = 0.25
MAX_GAP = 4.0


def timed_lines(stream, out: list[tuple[float, str]]) -> None:
    for line in iter(stream.readline, ""):
        out.append((time.monotonic(), line.rstrip("\n")))


def test_run_without_a_terminal_prints_a_line_at_least_every_interval(tmp_path: Path) -> None:
    proto = write_toy(tmp_path, seeds={"per_arm": 400})
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "SPECTEST_PROGRESS_INTERVAL": str(INTERVAL)}  # fmt: skip
    env.pop("SPECTEST_NO_PROGRESS", None)
    p = subprocess.Popen(
        [sys.executable, "-m", "spectest", "run", "--config", str(proto), "--out",
         str(tmp_path / "run")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    err: list[tuple[float, str]] = []
    out: list[tuple[float, str]] = []
    readers = [threading.Thread(target=timed_lines, args=(s, acc))
               for s, acc in ((p.stderr, err), (p.stdout, out))]  # fmt: skip
    for t in readers:
        t.start()
    code = p.wait(timeout=600)
    for t in readers:
        t.join()
    assert code in (0, 1, 3), "\n".join(x for _, x in err + out)
    lines = [x for _, x in err]
    header = next(i for i, x in enumerate(lines) if x.startswith("spectest run toy  protocol"))
    assert lines[header].endswith(f"→ {tmp_path / 'run'}"), lines[header]
    assert all(x.startswith("progress ") for x in lines[:header]), lines[:header]  # loading
    assert err[header][0] < out[0][0]  # the header before any of the result
    # until the result starts (then the ticker has stopped; interpreter exit is not the run's)
    times = [t for t, _ in err[header:] if t < out[0][0]] + [out[0][0]]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    worst = max(range(len(gaps)), key=gaps.__getitem__)
    assert gaps[worst] <= MAX_GAP, (gaps[worst], lines[header + worst - 1 : header + worst + 2])
    gen = [x for x in lines if ": generate · arm " in x]
    assert gen and any(" · shards " in x and " · ETA " in x for x in gen), lines
    assert {x.split(": ", 1)[1].split(" · ")[0] for x in lines if x.startswith("progress ")} >= {
        "generate",
        "analyze",
    }, lines


def test_plain_line_names_phase_arm_shards_and_eta() -> None:
    import io

    buf = io.StringIO()
    pr = PlainProgress(buf, 60.0)  # not started: lines on demand
    pr("load models", 0, 1)
    assert pr.line().endswith(": load models · 0/1 · ETA —")
    pr(shards_label("candidate"), 2, 8)
    pr("generate", 0, 1000)
    pr.since -= 10.0  # the phase began 10 s ago
    pr("generate", 250, 1000)
    assert pr.line().endswith(": generate · arm candidate · shards 2/8 · 250/1000 · ETA 30 s")
    pr("write", 1, 1)
    assert pr.line().endswith(": write · shards 2/8 · 1/1 · done")
