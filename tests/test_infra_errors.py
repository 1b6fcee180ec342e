"""Infrastructure errors (issue 9, bullet 3) are one line and exit 4, never 1 (which a CI gate
reads as "the distributions differ") and never a traceback: an unwritable ``--out`` for ``run``
and ``compare``, an ``--out`` whose parent is a file, a full disk (a real ENOSPC on a tiny
tmpfs where this machine lets us mount one, and the file-size limit's EFBIG everywhere), a
missing package, a killed subprocess, an internal error. Real subprocesses, real filesystems.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import typer
from toy_protocol import write_toy

from spectest.cli.common import boundary
from spectest.errors import ExitCode

ROOT = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    "OMP_NUM_THREADS": "1",
    "SPECTEST_NO_PROGRESS": "1",
}
INFRA = int(ExitCode.INFRASTRUCTURE)
assert INFRA == 4


def spectest(*args: str | Path, cwd: Path, preexec=None, prelude: str = ""):
    code = f"{prelude}\nfrom spectest.cli import main\nmain()"
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300, preexec_fn=preexec,
    )  # fmt: skip


def one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def byo_files(d: Path, n: int = 200) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    rows = [("p0", "c0", s, t, int(rng.integers(8))) for s in range(n) for t in range(3)]
    cols = ["prompt_id", "config_id", "seed", "position", "token_id"]
    ref, cand = d / "ref.parquet", d / "cand.parquet"
    pd.DataFrame(rows, columns=cols).to_parquet(ref, index=False)
    pd.DataFrame(rows, columns=cols).assign(seed=lambda x: x.seed + n).to_parquet(cand, index=False)
    return ref, cand


@contextmanager
def unwritable(d: Path) -> Iterator[None]:
    """``d`` as a directory nobody can write into — root included (``chattr +i``)."""
    d.mkdir()
    as_root = os.geteuid() == 0
    if as_root:
        if subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode != 0:
            pytest.skip("running as root on a filesystem without chattr +i")
    else:
        d.chmod(0o500)
    try:
        try:
            (d / "probe").touch()
        except OSError:
            pass
        else:
            pytest.skip(f"{d} stays writable here")
        yield
    finally:
        if as_root:
            subprocess.run(["chattr", "-i", str(d)], check=True)
        else:
            d.chmod(0o700)


# ----------------------------------------------------------------------------- --out
def test_unwritable_out_for_run_and_compare(tmp_path: Path) -> None:
    proto = write_toy(tmp_path / "proto", seeds={"per_arm": 20}, positions=2)
    ref, cand = byo_files(tmp_path)
    out = tmp_path / "ro"
    with unwritable(out):
        for target in (out, out / "sub"):
            for cmd in (
                ("run", "--config", proto),
                ("compare", "--reference", ref, "--candidate", cand),
            ):
                r = spectest(*cmd, "--out", target, "--no-progress", cwd=tmp_path)
                assert r.returncode == INFRA, (cmd, r.stdout, r.stderr)
                line = one_error_line(r)
                assert line.startswith(f"error: --out: cannot write into '{target}': "), line
                assert line.endswith(("Permission denied", "Operation not permitted")), line


def test_out_whose_parent_is_a_file_for_run_and_compare(tmp_path: Path) -> None:
    proto = write_toy(tmp_path / "proto", seeds={"per_arm": 20}, positions=2)
    ref, cand = byo_files(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    for cmd in (
        ("run", "--config", proto),
        ("compare", "--reference", ref, "--candidate", cand),
    ):
        r = spectest(*cmd, "--out", blocker / "out", "--no-progress", cwd=tmp_path)
        assert r.returncode == INFRA, r.stdout + r.stderr
        assert one_error_line(r) == (
            f"error: --out: cannot create '{blocker / 'out'}': '{blocker}' is a file, "
            "not a directory"
        )
        r = spectest(*cmd, "--out", blocker, "--no-progress", cwd=tmp_path)
        assert r.returncode == INFRA, r.stdout + r.stderr
        assert one_error_line(r) == f"error: --out: '{blocker}' exists and is not a directory"
    assert blocker.read_text() == "not a directory\n"


# ----------------------------------------------------------------------------- disk full
def _fsize_limit(nbytes: int):
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then write() fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))

    return preexec


def test_file_size_limit_during_compare_is_exit_4_and_rerun_works(tmp_path: Path) -> None:
    """The kernel refuses writes past RLIMIT_FSIZE (EFBIG, as it refuses ENOSPC): one line,
    exit 4; the same compare without the limit then completes into the same --out."""
    ref, cand = byo_files(tmp_path)
    out = tmp_path / "cmp"
    args = ("compare", "--reference", ref, "--candidate", cand, "--out", out, "--no-progress")
    r = spectest(*args, cwd=tmp_path, preexec=_fsize_limit(4096))
    assert r.returncode == INFRA, r.stdout + r.stderr
    assert "File too large" in one_error_line(r)
    r = spectest(*args, cwd=tmp_path)
    assert r.returncode not in (2, 4), r.stdout + r.stderr
    assert (out / "manifest.json").is_file()


def test_disk_full_on_a_tiny_tmpfs_is_exit_4(tmp_path: Path) -> None:
    """A real ENOSPC: a 64 KiB tmpfs (needs the right to mount; skipped where there is none)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True
    )
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root / no CAP_SYS_ADMIN)")
    try:
        ref, cand = byo_files(tmp_path, n=3000)
        args = ("compare", "--reference", ref, "--candidate", cand, "--out", mnt / "cmp")
        r = spectest(*args, "--no-progress", cwd=tmp_path)
        assert r.returncode == INFRA, r.stdout + r.stderr
        assert "No space left on device" in one_error_line(r)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


# ----------------------------------------------------------------------------- environment
def test_missing_package_is_exit_4(tmp_path: Path) -> None:
    """`report` needs matplotlib; with it made unimportable (``sys.modules[name] = None`` is
    how Python itself spells "not importable") the command says so in one line, exit 4."""
    ref, cand = byo_files(tmp_path)
    out = tmp_path / "cmp"
    r = spectest("compare", "--reference", ref, "--candidate", cand, "--out", out, cwd=tmp_path)
    assert r.returncode not in (2, 4), r.stdout + r.stderr
    r = spectest(
        "report", out, cwd=tmp_path, prelude="import sys; sys.modules['matplotlib'] = None"
    )
    assert r.returncode == INFRA, r.stdout + r.stderr
    assert one_error_line(r).startswith("error: missing package 'matplotlib'")


def _run_boundary(fn, capsys) -> tuple[int, str]:
    with pytest.raises(typer.Exit) as info:
        boundary(fn)()
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return info.value.exit_code, lines[0]


def test_killed_subprocess_and_internal_error_are_exit_4(capsys, monkeypatch) -> None:
    def killed() -> None:  # a real child killed by SIGKILL (as the OOM killer would)
        subprocess.run(
            [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
            check=True,
        )

    code, line = _run_boundary(killed, capsys)
    assert code == INFRA and line.startswith("error: subprocess ") and "killed by SIGKILL" in line

    def failed() -> None:
        subprocess.run([sys.executable, "-c", "raise SystemExit(7)"], check=True)

    code, line = _run_boundary(failed, capsys)
    assert code == INFRA and "exited with status 7" in line

    def bug() -> None:
        raise TypeError("unsupported operand")

    code, line = _run_boundary(bug, capsys)
    assert code == INFRA
    assert line == (
        "error: internal error: TypeError: unsupported operand (a bug in spectest, not a "
        "verdict; SPECTEST_DEBUG=1 shows the traceback)"
    )
    monkeypatch.setenv("SPECTEST_DEBUG", "1")
    with pytest.raises(typer.Exit):
        boundary(bug)()
    assert "Traceback" in capsys.readouterr().err
