"""Containing code spectest does not own: acceptor kernels and entry-point engines.

Owns: turning whatever a plug-in lets escape — an ``Exception``, or a ``BaseException`` that is
not one: ``SystemExit`` (``sys.exit``, an ``argparse`` at import), ``KeyboardInterrupt``,
``GeneratorExit`` — into one ``EngineError`` line naming the plug-in (exit 2: a plug-in that
misbehaves is bad input, not a verdict); holding a plug-in's output while it is imported, so an
``argparse`` usage text never reaches the terminal as if it were spectest's; and telling the
user's Ctrl-C (a real SIGINT, seen by the handler ``track_user_interrupts`` installs while a CLI
command runs) from a ``KeyboardInterrupt`` a plug-in raised: the first keeps its meaning (exit
130, completed shards kept), the second is the plug-in's fault.

Knows nothing about what a plug-in computes, about engines or about the CLI framework.

Notes
-----
A plug-in that calls ``os._exit`` or is killed by a signal ends the process without raising
anything: no Python code can contain that (a worker subprocess that dies is a killed subprocess,
exit 4). Everything that is raised is contained.
"""

from __future__ import annotations

import contextlib
import io
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from spectest.errors import EngineError, SpectestError

_state = {"tracking": False, "sigint": False}


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _state["sigint"] = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def track_user_interrupts() -> Iterator[None]:
    """While the block runs, a real SIGINT is recorded before it raises ``KeyboardInterrupt``
    (as Python's own handler does). Installed only over Python's default handler, in the main
    thread; elsewhere nothing is tracked and every ``KeyboardInterrupt`` counts as the user's."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    saved = dict(_state)
    _state.update(tracking=True, sigint=False)
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _state.update(saved)


def user_interrupted(err: BaseException | None = None) -> bool:
    """True when a ``KeyboardInterrupt`` may be the user's: a real SIGINT arrived, a signal
    handler raised it (it carries the shell's ``exit_code``, e.g. SIGTERM's 143:
    ``spectest.engines.children.Terminated``), or nobody is tracking (library use: then it
    cannot be told apart, and Python's meaning is kept)."""
    if err is not None and signal_exit_code(err) is not None:
        return True
    return bool(_state["sigint"]) or not _state["tracking"]


def signal_exit_code(err: BaseException) -> int | None:
    """The shell's code of an interrupt a signal handler raised (128 + signal number), else
    ``None`` (a plain ``KeyboardInterrupt``: SIGINT's 130 or a plug-in's)."""
    code = getattr(err, "exit_code", None) if isinstance(err, KeyboardInterrupt) else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def escape_reason(err: BaseException) -> str:
    """How a plug-in's escape reads in one line: ``raised ValueError: bad shape``, ``called
    sys.exit(0) (SystemExit): ...``, ``raised KeyboardInterrupt (no Ctrl-C was pressed)``."""
    if isinstance(err, SystemExit):
        return (
            f"called sys.exit({err.code!r}) (SystemExit): a plug-in must return or raise an "
            "exception, never end the process"
        )
    if isinstance(err, KeyboardInterrupt):
        return "raised KeyboardInterrupt (no Ctrl-C was pressed)"
    why = " ".join(str(err).split())
    return f"raised {type(err).__name__}" + (f": {why}" if why else "")


@contextlib.contextmanager
def _held_output() -> Iterator[io.StringIO]:
    """``sys.stdout`` / ``sys.stderr`` into one buffer (Python-level writes: print, argparse,
    warnings); the caller decides what becomes of it."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        yield buf


def _last_line(text: str, limit: int = 200) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:limit] if lines else ""


def contained(
    message: Callable[[BaseException], str],
    fn: Callable[..., Any],
    *args: Any,
    hold_output: bool = False,
    **kwargs: Any,
) -> Any:
    """``fn(*args, **kwargs)``; anything it lets escape becomes ``EngineError(message(err))``.

    A ``SpectestError`` passes through (the plug-in's check already named it); a
    ``KeyboardInterrupt`` passes through when it may be the user's (``user_interrupted``).
    ``hold_output`` (imports): the plug-in's prints are held; on success they are written out
    as they were, on failure the last line printed is appended to the message.
    """
    buf: io.StringIO | None = None
    try:
        if hold_output:
            with _held_output() as buf:
                out = fn(*args, **kwargs)
            if text := buf.getvalue():
                sys.stderr.write(text)
            return out
        return fn(*args, **kwargs)
    except SpectestError:
        raise
    except KeyboardInterrupt as err:
        if user_interrupted(err):
            raise
        raise EngineError(message(err)) from None
    except BaseException as err:
        line = message(err)
        printed = _last_line(buf.getvalue()) if buf is not None else ""
        if printed:
            line += f"; it printed {printed!r}"
        raise EngineError(line) from None
