"""``report.prefetch``: the renderers' modules (matplotlib, on the Agg backend) imported on a
daemon thread, so that the report written at a run's end finds them imported; in a fresh
interpreter (a real subprocess) nothing of them is imported before it and all of it after. The
check is exact."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CODE = """
import sys, threading
import spectest.report as report
before = [m for m in ("matplotlib", "spectest.report.plots") if m in sys.modules]
report.prefetch()
for t in threading.enumerate():
    if t.name == "spectest-report-imports":
        t.join(120)
import matplotlib
print(before, "spectest.report.html" in sys.modules, "matplotlib.pyplot" in sys.modules,
      matplotlib.get_backend().lower())
"""


def test_prefetch_imports_the_renderers_on_a_thread() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": ""}
    r = subprocess.run(
        [sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=180
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["[]", "True", "True", "agg"], r.stdout
