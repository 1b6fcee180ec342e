"""A child process spoken to in JSON lines, for the ``command`` engine: a writer thread feeding
its stdin, a reader thread queueing its stdout lines (bounded), a bounded stderr tail, the
timeouts on a line, and a dead or misbehaving program turned into one ``EngineProcessError``
line (docs/engines-command.md). Knows nothing about jobs, results or sampling.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shlex
import subprocess
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from spectest import errors
from spectest.engines import children, replies
from spectest.errors import EngineError

STDERR_TAIL_LINES = 5
STDERR_LINE_BYTES = 4096  # a longer stderr line is kept in pieces
MAX_LINE_BYTES = 64 * 2**20  # a result line of T tokens is far shorter: longer = a runaway program
EXIT_GRACE_S = 5.0  # a program that closed stdout gets this long to exit with its status


class EngineProcessError(EngineError):
    """The engine's process (or server) died, timed out or broke the line protocol: exit 4
    (infrastructure, ``errors.ExitCode``), never the statistical 1."""

    exit_code = errors.ExitCode.INFRASTRUCTURE


class _Event:
    """A pump's note in the line queue (not a line)."""

    def __init__(self, name: str) -> None:
        self.name = name


EOF = _Event("stdout closed")
TOO_LONG = _Event("a line too long")
STDIN_CLOSED = _Event("stdin closed")


class LineProcess:
    """A child process spoken to in lines: a writer thread feeds its stdin (so a program that
    never reads cannot block spectest), a reader thread queues its stdout lines (each at most
    ``MAX_LINE_BYTES``), its stderr is kept as a bounded tail. Registered with
    ``engines.children`` (stopped on SIGTERM) while it lives."""

    def __init__(self, argv: tuple[str, ...], env: Mapping[str, str], cwd: str | None, label: str):
        self.label = label
        self.argv = argv
        try:
            self.proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**os.environ, **env},
                cwd=cwd,
                start_new_session=True,  # Ctrl-C reaches spectest, which then closes us
            )
        except OSError as err:
            raise EngineProcessError(f"{label}: cannot start {argv[0]!r}: {err.strerror}") from None
        children.register(self)
        self.lines: queue.Queue[bytes | _Event] = queue.Queue()
        self.outbox: queue.Queue[bytes | None] = queue.Queue()
        self.stderr: deque[str] = deque(maxlen=200)
        for target in (self._pump_out, self._pump_err, self._write):
            threading.Thread(target=target, daemon=True).start()

    def _pump_out(self) -> None:
        out = self.proc.stdout
        assert out is not None
        while True:
            try:
                line = out.readline(MAX_LINE_BYTES + 1)
            except (OSError, ValueError):
                line = b""
            if not line:
                self.lines.put(EOF)
                return
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                self.lines.put(TOO_LONG)
                return
            self.lines.put(line)

    def _pump_err(self) -> None:
        err = self.proc.stderr
        assert err is not None
        with contextlib.suppress(OSError, ValueError):
            while chunk := err.readline(STDERR_LINE_BYTES):
                self.stderr.append(chunk.decode("utf-8", errors="replace").rstrip("\n"))

    def _write(self) -> None:
        """The only writer of the program's stdin; ``None`` in the outbox closes it."""
        stdin = self.proc.stdin
        assert stdin is not None
        while True:
            data = self.outbox.get()
            try:
                if data is None:
                    stdin.close()
                    return
                stdin.write(data)
                stdin.flush()
            except (OSError, ValueError):  # BrokenPipeError: the program closed its stdin
                self.lines.put(STDIN_CLOSED)
                return

    def send(self, obj: Mapping[str, Any]) -> None:
        """Queue one line for the program; never blocks (the writer thread writes it)."""
        self.outbox.put(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

    def read(self, timeout_s: float, waiting_for: str, where: str) -> Any:
        """The next JSON value of a line (``{"type": "log"}`` objects skipped), or the program is
        killed: ``EngineProcessError`` (exit 4) when it ended its output or stayed silent for
        ``timeout_s``, ``ReplyError`` (exit 2, naming ``where``) for a line that is too long,
        not UTF-8 or not JSON."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                item = self.lines.get(timeout=max(left, 0.0))
            except queue.Empty:
                raise self.failure(
                    f"sent nothing for {timeout_s:g} s while {waiting_for}", where=where
                ) from None
            if item is EOF:  # stdout closed: the program is exiting, let it say how
                raise self.failure(
                    f"ended its output while {waiting_for}", EXIT_GRACE_S, where=where
                )
            if item is STDIN_CLOSED:
                raise self.failure(
                    f"closed its stdin while {waiting_for}", EXIT_GRACE_S, where=where
                )
            if item is TOO_LONG:
                raise self.violation(where, f"printed a line longer than {MAX_LINE_BYTES} bytes")
            assert isinstance(item, bytes)
            try:
                obj = json.loads(item.decode("utf-8"))
            except UnicodeDecodeError:
                raise self.violation(
                    where, f"printed a line that is not UTF-8: {replies.short(item)}"
                ) from None
            except (ValueError, RecursionError):  # JSONDecodeError, an int of > 4300 digits
                raise self.violation(
                    where,
                    f"printed a line that is not JSON: {replies.short(item.decode().strip())}",
                ) from None
            if isinstance(obj, dict) and obj.get("type") == "log":
                if time.monotonic() > deadline:
                    raise self.failure(
                        f"sent only log lines for {timeout_s:g} s while {waiting_for}",
                        where=where,
                    )
                continue
            return obj

    def violation(self, where: str, what: str) -> replies.ReplyError:
        """Kill the program and build the one-line error of a reply that breaks the protocol
        (exit 2: the engine's output is wrong, not the machine)."""
        self.kill()
        return replies.ReplyError(f"{where}: {what} (the program was stopped)")

    def failure(
        self, what: str, grace_s: float = 0.0, where: str | None = None
    ) -> EngineProcessError:
        """Kill the program and build the one-line error: what happened, exit status, stderr.
        ``grace_s``: how long a program that closed its pipes may take to exit on its own (its
        exit status is the useful part of the message) before it counts as killed."""
        if grace_s > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
        alive = self.proc.poll() is None
        self.kill()
        status = "killed by spectest" if alive else f"exit status {self.proc.returncode}"
        time.sleep(0.05)  # let the stderr pump drain
        tail = " | ".join(list(self.stderr)[-STDERR_TAIL_LINES:]) or "(empty)"
        return EngineProcessError(
            f"{where or self.label}: {shlex.join(self.argv)} {what} ({status}); stderr tail: {tail}"
        )

    def kill(self) -> None:
        """SIGKILL to the program's process group and reap it; idempotent."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, 9)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        children.unregister(self)

    def stop_now(self) -> None:
        """``engines.children``: SIGTERM to spectest stops the program at once."""
        self.kill()

    def close(self, timeout_s: float = 10.0) -> int | None:
        """Close stdin (after the lines already queued), wait for a clean exit, kill otherwise;
        the exit status."""
        if self.proc.poll() is None:
            self.outbox.put(None)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        return self.proc.returncode
