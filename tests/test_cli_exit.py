"""How ``spectest`` leaves (``cli.leave``): once a command is done, the process ends without the
interpreter's teardown of every module, yet as a normal exit would for everything that can be
seen — the exit code, what was printed, the ``atexit`` handlers (multiprocessing's children,
temporary directories) — and it exits normally where a thread is still alive or with
``SPECTEST_FULL_EXIT`` set. Real subprocesses; a finalizer that only module teardown runs tells
the two exits apart. No randomness: every check is exact.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# a module-level object whose finalizer runs only in the interpreter's teardown of modules, an
# atexit handler and a temporary directory cleaned up at exit (weakref.finalize's atexit hook)
PRELUDE = """
import atexit, pathlib, sys, tempfile, threading, time
out = pathlib.Path(sys.argv.pop(1))
class Teardown:
    def __del__(self):
        (out / "teardown").write_text("ran")
keep = Teardown()
atexit.register(lambda: (out / "atexit").write_text("ran"))
tmp = tempfile.TemporaryDirectory(dir=out)
(out / "tmp").write_text(tmp.name)
if sys.argv[1] == "thread":
    sys.argv.pop(1)
    threading.Thread(target=lambda: (time.sleep(1), (out / "thread").write_text("ran"))).start()
sys.argv[0] = "spectest"
from spectest.cli import main
main()
"""


def _spectest(out: Path, *args: str, full: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SPECTEST_FULL_EXIT", None)
    if full:
        env["SPECTEST_FULL_EXIT"] = "1"
    cmd = [sys.executable, "-c", PRELUDE, str(out), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def _ran(out: Path) -> set[str]:
    return {n for n in ("teardown", "atexit", "thread") if (out / n).exists()}


def test_spectest_leaves_without_the_teardown_as_a_normal_exit_otherwise(tmp_path: Path) -> None:
    from spectest import __version__

    quick = tmp_path / "quick"
    quick.mkdir()
    r = _spectest(quick, "--version")
    assert r.returncode == 0 and r.stdout == f"spectest {__version__}\n", r.stderr
    assert _ran(quick) == {"atexit"}  # the handlers ran, the modules were not torn down
    assert not Path((quick / "tmp").read_text()).exists()  # cleaned up by its atexit hook

    bad = tmp_path / "bad"
    bad.mkdir()
    r = _spectest(bad, "analyze", str(tmp_path / "missing"))
    assert r.returncode == 2 and r.stderr.startswith("error: "), r.stderr  # code and line kept
    assert _ran(bad) == {"atexit"}

    full = tmp_path / "full"
    full.mkdir()
    r = _spectest(full, "--version", full=True)
    assert r.returncode == 0 and r.stdout == f"spectest {__version__}\n"
    assert _ran(full) == {"atexit", "teardown"}  # SPECTEST_FULL_EXIT: the interpreter's exit

    thread = tmp_path / "thread"
    thread.mkdir()
    r = _spectest(thread, "thread", "--version")
    assert r.returncode == 0 and r.stdout == f"spectest {__version__}\n"
    assert _ran(thread) == {"atexit", "teardown", "thread"}  # a live thread: joined, as always
