"""The suite's file order under ``--dist loadfile`` (tests/conftest.py): the slowest files are
handed out first, not last. A real pytest-xdist session in a subprocess, on stand-in files named
like the heavy ones (one instant test each, as the real ones have few) beside a file of many
instant tests: with one worker the files run exactly in the order the scheduler hands them out.
xdist's own order (most tests first, ``--loadscope-reorder``) runs the many-test file first."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HEAVY, file_order

HERE = Path(__file__).resolve().parent
TEST = "import os\n\ndef test_{i}():\n    open(os.environ['ORDER_LOG'], 'a').write('{name}\\n')\n"


def test_file_order_puts_the_heavy_files_first_slowest_first() -> None:
    files = ["a/test_many.py"] * 5 + ["a/test_numerics_bf16.py"] * 2 + ["a/test_few.py"]
    files += ["a/test_wheel_protocols.py"] * 2
    assert file_order(files) == [
        "a/test_wheel_protocols.py", "a/test_numerics_bf16.py", "a/test_many.py", "a/test_few.py",
    ]  # fmt: skip
    assert list(HEAVY.values()) == sorted(HEAVY.values(), reverse=True)
    assert all((HERE / name).is_file() for name in HEAVY), HEAVY  # no stale name


def test_xdist_hands_out_the_heavy_files_first(tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    d = tmp_path / "suite"
    d.mkdir()
    (d / "pytest.ini").write_text("[pytest]\n")
    shutil.copy2(HERE / "conftest.py", d / "conftest.py")
    heavy = list(HEAVY)[:3]
    for name in ["test_many.py", *reversed(heavy)]:
        n = 6 if name == "test_many.py" else 1
        (d / name).write_text("\n".join(TEST.format(i=i, name=name) for i in range(n)))
    log = tmp_path / "order.log"
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "1", "--dist", "loadfile", "-q",
         "-p", "no:cacheprovider", "--rootdir", str(d), str(d)],
        cwd=d, env={**os.environ, "ORDER_LOG": str(log)},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    ran = list(dict.fromkeys(log.read_text().split()))
    assert ran == [*heavy, "test_many.py"], ran
