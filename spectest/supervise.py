"""Supervising a command that runs plug-in code, both ends: the supervisor (``run_supervised``)
and the child's marks (``plugin_call``, ``heartbeat``, ``announce_exit``, ``announce_verdict``),
so a plug-in cannot end, kill or hang spectest into an exit code that is not spectest's.

The why and the details: docs/internals.md "spectest/supervise.py".
"""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV = "SPECTEST_SUPERVISOR"  # "<watch dir>:<supervisor pid>" in a supervised process tree
DEFAULT_TIMEOUT_S = 600.0  # one plug-in call (an engine's generate: between progress reports)
MAX_TIMEOUT_S = 7 * 86400.0
POLL_S = 0.1  # the supervisor's clock: timeouts are seen within this
GRACE_S = 10.0  # after a forwarded SIGINT / SIGTERM, before the child's group is killed
INTERRUPTED = "interrupted: completed shards are kept; re-run to resume"
_WORD = struct.Struct("<Q")  # (call counter << 16) | plug-in index (0: outside any call)

_MAIN = threading.main_thread().ident


# ----------------------------------------------------------------------------- the child's side
class _Marks:
    """This process's word in the watch directory and its table of plug-in names."""

    def __init__(self, watch: Path) -> None:
        pid = os.getpid()
        fd = os.open(watch / f"{pid}.state", os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, mmap.PAGESIZE)
        self.mm = mmap.mmap(fd, mmap.PAGESIZE)
        os.close(fd)
        self.names_fd = os.open(watch / f"{pid}.names", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self.index: dict[tuple[str, str], int] = {}
        self.stack: list[int] = []
        self.counter = 0

    def mark(self, idx: int) -> None:
        self.counter += 1
        _WORD.pack_into(self.mm, 0, (self.counter << 16) | idx)

    def enter(self, who: str, what: str) -> None:
        idx = self.index.get((who, what))
        if idx is None:
            idx = self.index[(who, what)] = len(self.index) + 1
            row = json.dumps([idx, who, what]) + "\n"
            os.write(self.names_fd, row.encode())
        self.stack.append(idx)
        self.mark(idx)

    def leave(self) -> None:
        self.stack.pop()
        self.mark(self.stack[-1] if self.stack else 0)


_state: dict[str, Any] = {"marks": None, "ready": False}


def _reset() -> None:
    _state.update(marks=None, ready=False)


os.register_at_fork(after_in_child=_reset)  # a forked worker makes its own word


def _env() -> tuple[Path, int] | None:
    raw = os.environ.get(ENV)
    if not raw:
        return None
    path, _, pid = raw.rpartition(":")
    return (Path(path), int(pid)) if pid.isdigit() and path else None


def _marks() -> _Marks | None:
    """This process's marks (made on first use; a forked or spawned worker makes its own)."""
    if _state["ready"]:
        return _state["marks"]
    found = _env()
    marks = None
    if found is not None and found[0].is_dir():
        with contextlib.suppress(OSError):
            marks = _Marks(found[0])
    _state.update(marks=marks, ready=True)
    return marks


def watching() -> bool:
    """A supervisor watches this process's plug-in calls."""
    return _marks() is not None


def is_supervised_child() -> bool:
    """This process is the child a supervisor started (not a grandchild of one)."""
    found = _env()
    return found is not None and found[1] == os.getppid()


@contextlib.contextmanager
def plugin_call(who: str, what: str) -> Iterator[None]:
    """While the block runs, this process is "inside ``who``: ``what``" for the supervisor
    (``who``: the plug-in, e.g. ``acceptor /k.py:accept``; ``what``: ``calling the kernel``).
    Calls from other threads than the main one are not marked."""
    m = _marks()
    if m is None or threading.get_ident() != _MAIN:
        yield
        return
    m.enter(who, what)
    try:
        yield
    finally:
        m.leave()


def heartbeat() -> None:
    """The plug-in call in progress answered (an engine reported progress): its clock restarts."""
    m = _state["marks"]
    if m is not None and m.stack and threading.get_ident() == _MAIN:
        m.mark(m.stack[-1])


def _announce(name: str, body: dict[str, Any]) -> None:
    found = _env()
    if found is None or not is_supervised_child():
        return
    path = found[0] / f"{os.getpid()}.{name}"
    with contextlib.suppress(OSError):
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(body))
        os.replace(tmp, path)


def announce_verdict(code: int, run_dir: str | os.PathLike[str]) -> None:
    """The verdict path: ``summary.json`` of ``run_dir`` is complete and stores ``code``."""
    _announce("verdict", {"code": int(code), "run_dir": os.fspath(run_dir)})


def announce_exit(code: int) -> None:
    """spectest's command ended with ``code`` (its line, if any, is printed)."""
    _announce("exit", {"code": int(code)})


# ----------------------------------------------------------------------------- the supervisor
@dataclass(frozen=True)
class Outcome:
    """How a supervised command ended: its exit code and the one line the supervisor prints on
    stderr (None: the child printed its own; ``interrupted``: the line is not an error)."""

    code: int
    line: str | None = None
    interrupted: bool = False


def check_timeout(value: Any, option: str = "--plugin-timeout") -> float:
    """A per-call limit in seconds: a finite number in (0, 7 days]; ``ConfigError`` otherwise."""
    from spectest.errors import ConfigError

    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT_S:
        raise ConfigError(f"{option}: expected seconds in (0, {MAX_TIMEOUT_S:g}], got {value!r}")
    return float(value)


class _Watch:
    """The supervisor's view of the watch directory: each process's word and when the
    supervisor first saw it (its own clock: a call is timed from then, never from less)."""

    def __init__(self, d: Path) -> None:
        self.d = d
        self.seen: dict[str, tuple[int, float]] = {}

    def word(self, pid: str) -> int:
        try:
            with open(self.d / f"{pid}.state", "rb") as f:
                raw = f.read(_WORD.size)
        except OSError:
            return 0
        return _WORD.unpack(raw)[0] if len(raw) == _WORD.size else 0

    def overdue(self, timeout_s: float, now: float) -> tuple[str, int] | None:
        """(pid, plug-in index) of a call that has not moved for more than ``timeout_s``."""
        for f in self.d.glob("*.state"):
            pid, word = f.stem, self.word(f.stem)
            if word & 0xFFFF == 0:
                self.seen.pop(pid, None)
                continue
            first = self.seen.get(pid)
            if first is None or first[0] != word:
                self.seen[pid] = (word, now)
            elif now - first[1] > timeout_s:
                return pid, word & 0xFFFF
        return None

    def name(self, pid: str, idx: int) -> tuple[str, str]:
        with contextlib.suppress(OSError, ValueError):
            for line in (self.d / f"{pid}.names").read_text().splitlines():
                row = json.loads(line)
                if row[0] == idx:
                    return str(row[1]), str(row[2])
        return "a plug-in", "its call"

    def inside(self, pid: str) -> tuple[str, str] | None:
        idx = self.word(pid) & 0xFFFF
        return self.name(pid, idx) if idx else None

    def announced(self, pid: str, name: str) -> dict[str, Any] | None:
        with contextlib.suppress(OSError, ValueError):
            body = json.loads((self.d / f"{pid}.{name}").read_text())
            return body if isinstance(body, dict) else None
        return None


def _die_with_parent() -> None:  # in the child, before exec: a killed supervisor leaves no child
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def how_it_ended(rc: int) -> str:
    if rc < 0:
        try:
            return f"it was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"it was killed by signal {-rc}"
    return f"it exited with status {rc}"


def run_supervised(
    argv: Sequence[str], plugins: Sequence[str], timeout_s: float, *, verdict: bool
) -> Outcome:
    """Run ``argv`` (this command line again) as the supervised child and judge its end.

    ``plugins``: what the command loads (named when the child dies outside a plug-in call);
    ``verdict``: the command decides a verdict, so exit 0, 1 or 3 stands only with a
    ``summary.json`` that stores it. SIGINT goes to the child's process group (as a terminal's
    Ctrl-C would), SIGTERM and SIGHUP to the child; a second signal, or ``GRACE_S`` without an
    end, kills the group. The child's group is killed when it ends (no orphans)."""
    d = Path(tempfile.mkdtemp(prefix="spectest-watch-"))
    got: list[int] = []
    old: dict[int, Any] = {}
    for s in (int(signal.SIGINT), int(signal.SIGTERM), int(signal.SIGHUP)):
        if signal.getsignal(s) is not signal.SIG_IGN:  # a background job's SIGINT stays ignored
            old[s] = signal.signal(s, lambda signum, frame: got.append(signum))
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        proc = subprocess.Popen(
            list(argv),
            env={**os.environ, ENV: f"{d}:{os.getpid()}"},
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        watch = _Watch(d)
        try:
            rc, sent, overdue = _watch_child(proc, watch, timeout_s, got)
        finally:
            _kill_group(proc.pid)
            proc.wait()
        return _judge(rc, sent, overdue, watch, str(proc.pid), plugins, timeout_s, verdict)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        shutil.rmtree(d, ignore_errors=True)


def _watch_child(
    proc: subprocess.Popen[Any], watch: _Watch, timeout_s: float, got: list[int]
) -> tuple[int, int | None, tuple[str, int] | None]:
    """Poll until the child ends: (its status, the signal forwarded or None, the overdue call
    that got it killed or None)."""
    sent: int | None = None
    overdue = None
    deadline = math.inf
    while (rc := proc.poll()) is None:
        now = time.monotonic()
        if got:
            sig = got.pop(0)
            if sent is None:
                sent, deadline = sig, now + GRACE_S
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    if sig == signal.SIGINT:
                        os.killpg(proc.pid, sig)
                    else:
                        os.kill(proc.pid, sig)
            else:
                deadline = now  # a second signal: now
        if now >= deadline:
            _kill_group(proc.pid)
        elif sent is None and overdue is None:
            overdue = watch.overdue(timeout_s, now)
            if overdue is not None:
                _kill_group(proc.pid)
        time.sleep(POLL_S)
    return rc, sent, overdue


def _judge(
    rc: int,
    sent: int | None,
    overdue: tuple[str, int] | None,
    watch: _Watch,
    pid: str,
    plugins: Sequence[str],
    timeout_s: float,
    verdict: bool,
) -> Outcome:
    if overdue is not None:
        who, what = watch.name(*overdue)
        return Outcome(
            2,
            (
                f"{who}: {what} gave no answer within {timeout_s:g} s (the limit on one plug-in "
                "call: --plugin-timeout); it was stopped: no verdict"
            ),
        )
    ended = watch.announced(pid, "exit")
    if ended is not None and isinstance(ended.get("code"), int):
        code = int(ended["code"])
        said = watch.announced(pid, "verdict")
        if verdict and code in (0, 1, 3) and not _verdict_stored(said, code):
            return Outcome(
                4,
                (
                    f"spectest's process ended with exit {code} without a stored verdict (no "
                    "complete summary.json says so): no verdict"
                ),
            )
        return Outcome(code)
    if sent is not None:
        return Outcome(128 + sent, INTERRUPTED, interrupted=True)
    inside = watch.inside(pid)
    if inside is not None:
        who, what = inside
        return Outcome(
            2,
            (
                f"{who}: {what} ended spectest's process ({how_it_ended(rc)}); a plug-in must "
                "return or raise, never end the process: no verdict"
            ),
        )
    return Outcome(
        4,
        (
            f"spectest's process ended outside any plug-in call ({how_it_ended(rc)}) with plug-ins "
            f"loaded ({'; '.join(plugins)}): no verdict; completed shards are kept"
        ),
    )


def _verdict_stored(said: dict[str, Any] | None, code: int) -> bool:
    """The verdict path's word, checked against the run directory's ``summary.json``."""
    if said is None or said.get("code") != code or not isinstance(said.get("run_dir"), str):
        return False
    try:
        summary = json.loads((Path(said["run_dir"]) / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    v = summary.get("verdict") if isinstance(summary, dict) else None
    return bool(summary.get("complete")) and isinstance(v, dict) and v.get("exit_code") == code
