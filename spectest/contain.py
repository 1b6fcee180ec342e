"""Containing code spectest does not own (acceptor kernels, entry-point engines): whatever a
plug-in lets escape becomes one ``EngineError`` line naming it; its import-time output is held;
the user's Ctrl-C is told from a plug-in's ``KeyboardInterrupt``.

The why and the details: docs/internals.md "spectest/contain.py".
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
from spectest.supervise import plugin_call

_state = {"tracking": False, "sigint": False}


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _state["sigint"] = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def track_user_interrupts() -> Iterator[None]:
    """While the block runs, a real SIGINT is recorded before it raises ``KeyboardInterrupt``
    (as Python's own handler does). Installed only over Python's default handler, in the main
    thread; where SIGINT is ignored (a background job of a non-interactive shell, ``nohup``: no
    Ctrl-C can arrive) every ``KeyboardInterrupt`` is code's, and is tracked as such; elsewhere
    nothing is tracked and every ``KeyboardInterrupt`` counts as the user's (why:
    docs/internals.md "spectest/contain.py")."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.getsignal(signal.SIGINT)
    if handler is not signal.default_int_handler and handler is not signal.SIG_IGN:
        yield
        return
    saved = dict(_state)
    _state.update(tracking=True, sigint=False)
    if handler is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
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


def err_text(err: BaseException, *, first_line: bool = False) -> str:
    """``str(err)`` on one line (or its first line), never raising: a plug-in's exception class
    is plug-in code too, and its ``__str__`` may itself raise (then a placeholder says so)."""
    try:
        text = str(err)
    except Exception:
        return "(its message could not be printed)"
    if first_line:
        return (text.splitlines() or [""])[0].strip()
    return " ".join(text.split())


def _safe_repr(value: object) -> str:
    try:
        return repr(value)[:200]
    except Exception:
        return f"<a {type(value).__name__} that cannot be printed>"


def escape_reason(err: BaseException) -> str:
    """How a plug-in's escape reads in one line: ``raised ValueError: bad shape``, ``called
    sys.exit(0) (SystemExit): ...``, ``raised KeyboardInterrupt (no Ctrl-C was pressed)``."""
    if isinstance(err, SystemExit):
        return (
            f"called sys.exit({_safe_repr(err.code)}) (SystemExit): a plug-in must return or "
            "raise an exception, never end the process"
        )
    if isinstance(err, KeyboardInterrupt):
        return "raised KeyboardInterrupt (no Ctrl-C was pressed)"
    why = err_text(err)
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
    watch: tuple[str, str] | None = None,
    **kwargs: Any,
) -> Any:
    """``fn(*args, **kwargs)``; anything it lets escape becomes ``EngineError(message(err))``.

    A ``SpectestError`` passes through (the plug-in's check already named it); a
    ``KeyboardInterrupt`` passes through when it may be the user's (``user_interrupted``).
    ``hold_output`` (imports): the plug-in's prints are held; on success they are written out
    as they were, on failure the last line printed is appended to the message. ``watch``
    (``(plug-in, what it is doing)``): the call is marked for a supervisor
    (``spectest.supervise.plugin_call``), which names it when it ends the process or hangs.
    """
    buf: io.StringIO | None = None
    try:
        with plugin_call(*watch) if watch is not None else contextlib.nullcontext():
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
        try:
            line = message(err)
        except Exception:  # the message reads the plug-in's objects; they may raise too
            line = f"a plug-in raised {type(err).__name__} (its message could not be built)"
        printed = _last_line(buf.getvalue()) if buf is not None else ""
        if printed:
            line += f"; it printed {printed!r}"
        raise EngineError(line) from None
