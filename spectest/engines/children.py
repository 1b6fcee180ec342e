"""The child processes of engines (command programs, managed servers) and SIGTERM.

Owns: the set of live children (``register`` / ``unregister``), the SIGTERM handler that stops
them, and ``Terminated`` (a ``KeyboardInterrupt``, exit code 143), the exception SIGTERM
becomes. Knows nothing about what the children are (anything with a ``stop_now()``). Why, and
when the handler is installed: docs/internals-engines.md.
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
