"""The child processes of engines (command programs, managed servers) and SIGTERM.

Owns: the set of live children (``register`` / ``unregister``), the SIGTERM handler that stops
them, and ``Terminated``, the exception SIGTERM becomes. Knows nothing about what the children
are (``engines.line_process.LineProcess``, ``engines.server.ManagedServer``: anything with a
``stop_now()``).

Why
---
A command program and a managed server run in their own session (``start_new_session``), so a
signal to spectest's process group does not reach them, and Python's default SIGTERM ends the
interpreter without running ``finally`` blocks or ``atexit``: a CI runner cancelling a job used to
leave the program running. While at least one child is live, SIGTERM therefore stops every child
at once (SIGKILL to a program's process group; a server: SIGTERM to its group, SIGKILL after 2 s)
and raises ``Terminated`` in the main thread, so the run unwinds as on Ctrl-C: the runner's
``finally`` closes every engine, the run directory's lock is released, completed shards are kept
and a re-run resumes.

Notes
-----
The handler is installed only from the main thread and only over the default disposition (an
application embedding spectest that set its own SIGTERM handler keeps it), and the previous
disposition is restored when the last child is gone. ``Terminated`` subclasses
``KeyboardInterrupt`` so every boundary that handles an interrupt handles it; its ``exit_code``
is 143 (128 + SIGTERM), the shell's convention.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Protocol


class Child(Protocol):
    def stop_now(self) -> None: ...


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while engine children were live; they have been stopped."""

    exit_code = 128 + int(signal.SIGTERM)


_live: set[Child] = set()
_lock = threading.RLock()
_previous: Any = None
_installed = False


def _on_sigterm(signum: int, frame: Any) -> None:
    for child in list(_live):  # list(set) copies under the GIL; no lock in a signal handler
        with contextlib.suppress(Exception):
            child.stop_now()
    raise Terminated("SIGTERM: the engines' child processes were stopped")


def register(child: Child) -> None:
    """A child was started: it is stopped on SIGTERM until ``unregister``."""
    global _installed, _previous
    with _lock:
        _live.add(child)
        if _installed or threading.current_thread() is not threading.main_thread():
            return
        current = signal.getsignal(signal.SIGTERM)
        if current in (signal.SIG_DFL, None):
            _previous = current
            signal.signal(signal.SIGTERM, _on_sigterm)
            _installed = True


def unregister(child: Child) -> None:
    """A child was stopped (idempotent); the last one restores SIGTERM's disposition."""
    global _installed
    with _lock:
        _live.discard(child)
        if _live or not _installed:
            return
        if threading.current_thread() is not threading.main_thread():
            return  # restored by the next unregister on the main thread
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, _previous if _previous is not None else signal.SIG_DFL)
        _installed = False


def live() -> list[Child]:
    """The children live now (for tests and diagnostics)."""
    return list(_live)
