"""Shared plumbing of the CLI commands: the one error boundary (``boundary``), the consoles,
progress bars and shared options. Not here: printing a result, statistics, files.

The why and the details: docs/internals.md "spectest/cli/common.py".
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import sysconfig
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Annotated, Any, TypeVar

import click
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from spectest.contain import (
    escape_reason,
    signal_exit_code,
    track_user_interrupts,
    user_interrupted,
)
from spectest.errors import ExitCode, SpectestError, os_error_line
from spectest.report.escape import one_line, printable

F = TypeVar("F", bound=Callable[..., Any])

EXIT_CODES_HELP = (
    "Exit codes: 0 tested and no difference found, at the stated power claim, every tooth "
    "asked for sound; 1 the distributions differ (failing cells listed); 2 bad input or usage; "
    "3 inconclusive (nothing testable, a null arm rejected, a tooth not killed or run on no "
    "data, or a power claim — the better of the per-cell MDE and the weakest killed tooth's "
    "size — worse than required or unknown: the protocol's max_mde_tv, 0.15 by default, "
    "always); 4 infrastructure error, no verdict (filesystem, permissions, disk full, missing "
    "package, killed subprocess, internal error)."
    " 130 interrupted by the user (Ctrl-C)."
)
DEBUG_ENV = "SPECTEST_DEBUG"  # set to 1 to see the traceback of an infrastructure/internal error
USER_INTERRUPT = 130  # the user's Ctrl-C (128 + SIGINT), as a shell reports it
_SPECTEST_DIR = str(Path(__file__).resolve().parents[1]) + os.sep
_STDLIB_DIR = str(Path(sysconfig.get_paths()["stdlib"]).resolve()) + os.sep


class _Console(Console):
    """rich's console, except that a closed pipe is a ``BrokenPipeError`` (an ``OSError``:
    exit 4, or the verdict's code once a result is complete) — rich's own reaction is
    ``SystemExit(1)``, which a CI gate would read as "the distributions differ"."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # NOTE: else Python's exit flush fails again
        raise BrokenPipeError(32, "Broken pipe", "<stdout>")


def console() -> Console:
    """stdout console; plain (no colour, wide) when not a terminal so logs and tests read well
    (``COLUMNS`` set: that width, as in a terminal).
    ``emoji=False``: a config id ``:x:`` is printed as it is, never as an emoji."""
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit() else 120
    return _Console(highlight=False, soft_wrap=False, width=width, emoji=False)


def err_console() -> Console:
    return _Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)


def u(text: object) -> str:
    """User text inside a markup string: control characters shown, rich markup escaped."""
    return escape(printable(text))


def cell(text: object) -> Text:
    """User text as a table cell (a ``Text`` is never parsed as markup)."""
    return Text(printable(text))


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def infrastructure_line(err: BaseException) -> str:
    """The one line for an exception that is not a ``SpectestError`` (exit 4)."""
    if isinstance(err, OSError):
        return os_error_line(err)
    if isinstance(err, ModuleNotFoundError) and not (err.name or "").startswith("spectest"):
        return (
            f"missing package {err.name!r}: this command needs it; install it into this "
            "environment (pip install ...) and re-run"
        )
    if isinstance(err, subprocess.CalledProcessError):
        cmd = err.cmd if isinstance(err.cmd, str) else " ".join(map(str, err.cmd))
        how = (
            f"was killed by {_signal_name(err.returncode)}"
            if err.returncode < 0
            else f"exited with status {err.returncode}"
        )
        return f"subprocess {cmd[:120]!r} {how}"
    if isinstance(err, subprocess.TimeoutExpired):
        return f"subprocess {str(err.cmd)[:120]!r} timed out after {err.timeout} s"
    if isinstance(err, MemoryError):
        return "out of memory"
    first = (str(err).splitlines() or [""])[0]
    return (
        f"internal error: {type(err).__name__}: {first} "
        f"(a bug in spectest, not a verdict; {DEBUG_ENV}=1 shows the traceback)"
    )


def _origin(tb: TracebackType | None) -> tuple[str, int] | None:
    """The innermost frame of a traceback that is neither spectest's nor the standard library's
    (site-packages counts as outside: an installed plug-in lives there): where a plug-in raised.
    ``None`` when every frame is spectest's or the standard library's."""
    found = None
    while tb is not None:
        f = os.path.realpath(tb.tb_frame.f_code.co_filename)
        own = f.startswith(_SPECTEST_DIR)
        stdlib = f.startswith(_STDLIB_DIR) and "site-packages" not in f
        if not own and not stdlib and not f.startswith("<frozen"):
            found = (f, tb.tb_lineno)
        elif own:
            found = None  # spectest called on after the plug-in returned: not the plug-in's
        tb = tb.tb_next
    return found


def escaped_line(err: BaseException) -> tuple[int, str]:
    """Exit code and line for a ``BaseException`` that is not an ``Exception`` (or a click
    exit raised outside spectest) escaping a command: raised by code outside spectest — a
    plug-in's ``sys.exit``, ``KeyboardInterrupt`` without a Ctrl-C, ``GeneratorExit`` — it is
    bad input, exit 2, naming the file and line; raised inside spectest, an internal error, 4."""
    where = _origin(err.__traceback__)
    what = (
        f"{type(err).__name__}({err.exit_code!r})"
        if isinstance(err, click.exceptions.Exit)
        else escape_reason(err)
    )
    if where is not None:
        return int(ExitCode.BAD_INPUT), (
            f"code outside spectest (a plug-in) at {where[0]}:{where[1]} {what}; "
            "contained: no verdict"
        )
    return int(ExitCode.INFRASTRUCTURE), (
        f"internal error: {what} inside spectest (a bug in spectest, not a verdict; "
        f"{DEBUG_ENV}=1 shows the traceback)"
    )


def _raised_by_spectest(err: BaseException) -> bool:
    return _origin(err.__traceback__) is None


def error_line(text: str) -> None:
    """``error: <text>`` as one physical line on stderr, control characters shown."""
    err_console().print(f"error: {one_line(text)}", markup=False, soft_wrap=True)


_NOTES: list[str] = []  # notes for stderr, printed only when the command ends with a result
VERDICT_CODES = (0, 1, 3)


def _flush_notes() -> None:
    for note in _NOTES:
        err_console().print(note, markup=False)
    _NOTES.clear()


def boundary(fn: F) -> F:
    """The one place errors are caught: one line on stderr and a documented exit code.

    ``SpectestError`` → its ``exit_code`` (2 or 4); anything else that escapes a command — an
    ``OSError`` (permissions, disk full, a path under a file), a missing module, a failed or
    killed subprocess, an internal error — → 4 (``ExitCode.INFRASTRUCTURE``), never Python's
    default 1, which a CI gate would read as "the distributions differ". A ``BaseException``
    that is not an ``Exception`` is contained too (``escaped_line``): exit 2 naming the plug-in
    code that raised it, or 4. The user's own Ctrl-C (a real SIGINT, ``spectest.contain``) is
    130, completed shards kept; a ``KeyboardInterrupt`` a plug-in raises is not the user's.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _NOTES.clear()
        with track_user_interrupts():
            try:
                out = fn(*args, **kwargs)
                _flush_notes()
                return out
            except SpectestError as err:
                error_line(str(err))
                raise typer.Exit(int(err.exit_code)) from None
            except KeyboardInterrupt as err:
                if user_interrupted(err):
                    err_console().print(
                        "interrupted: completed shards are kept; re-run to resume", markup=False
                    )
                    raise typer.Exit(signal_exit_code(err) or USER_INTERRUPT) from None
                code, line = escaped_line(err)
                error_line(line)
                raise typer.Exit(code) from None
            except (typer.Exit, typer.Abort, click.ClickException) as err:
                if _raised_by_spectest(err):
                    if getattr(err, "exit_code", None) in VERDICT_CODES:
                        _flush_notes()  # a verdict was printed: the notes follow it
                    raise  # click's own exits and usage errors (exit 2) keep their meaning
                code, line = escaped_line(err)  # a plug-in raising typer.Exit(0)
                error_line(line)
                raise typer.Exit(code) from None
            except Exception as err:
                if os.environ.get(DEBUG_ENV):
                    traceback.print_exc()
                error_line(infrastructure_line(err))
                raise typer.Exit(int(ExitCode.INFRASTRUCTURE)) from None
            except BaseException as err:  # SystemExit, GeneratorExit: never the process's code
                if os.environ.get(DEBUG_ENV):
                    traceback.print_exc()
                code, line = escaped_line(err)
                error_line(line)
                raise typer.Exit(code) from None

    return wrapper  # type: ignore[return-value]


class Reporter:
    """What ``progress_bars`` yields: a ``(task, completed, total)`` callback, ``header`` (a
    line printed first, only while progress is shown) and ``say`` (a line printed always),
    both on stderr above any bars."""

    def __init__(
        self, update: Callable[[str, int, int], None], say: Callable[[str], None] | None = None
    ) -> None:
        self.update, self.say_fn = update, say

    def __call__(self, task: str, done: int, total: int) -> None:
        self.update(task, done, total)

    def header(self, text: str) -> None:
        if self.say_fn is not None:
            self.say_fn(printable(text))

    def say(self, text: str) -> None:
        (self.say_fn or (lambda t: err_console().print(t, markup=False)))(printable(text))


@contextmanager
def progress_bars(enabled: bool = True) -> Iterator[Reporter]:
    """A ``(task, completed, total)`` callback drawing one rich bar per task label in a
    terminal; where stderr is not a terminal (CI logs, redirects), a plain line at least every
    10 s instead (``spectest.progress.PlainProgress``; ``SPECTEST_PROGRESS_INTERVAL``)."""
    from spectest.progress import PlainProgress, interval_from_env, split_label

    if not enabled or os.environ.get("SPECTEST_NO_PROGRESS"):
        yield Reporter(lambda task, done, total: None)
        return
    if not sys.stderr.isatty():
        plain = PlainProgress(sys.stderr, interval_from_env()).start()
        try:
            yield Reporter(plain, plain.say)
        finally:
            plain.stop()
        return
    bars = Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=_Console(stderr=True, emoji=False),
        transient=False,
    )
    tasks: dict[str, Any] = {}

    def update(task: str, done: int, total: int) -> None:
        name, arm = split_label(task)  # the shard counter: one bar, its arm in the description
        if name not in tasks:  # a label may hold a prompt id: markup escaped, controls shown
            tasks[name] = bars.add_task(u(name), total=total)
        what = u(f"{name} ({arm})") if arm else None
        bars.update(tasks[name], completed=done, total=total, description=what)

    with bars:
        yield Reporter(update, lambda text: bars.console.print(text, markup=False))


def exit_with(code: int | ExitCode) -> None:
    raise typer.Exit(int(code))


# Options shared by the commands that load a protocol (``run``, ``teeth``): one definition each.
ConfigOpt = Annotated[
    Path,
    typer.Option(
        "--config",
        "-c",
        help="Protocol YAML file, or the name of a shipped one (`spectest protocols`); "
        "a local file wins.",
        readable=False,  # spectest reads it: an unreadable file is exit 4 naming it, not click's 2
    ),
]
DeviceOpt = Annotated[str | None, typer.Option(help="Override models.device: cpu or cuda.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Override any field: --set tests.alpha=0.01 (value parsed as YAML; repeatable).",
    ),
]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(help="torch CPU threads (default 1 unless OMP_NUM_THREADS is set; see README)."),
]
ProgressOpt = Annotated[bool, typer.Option(help="Show progress bars on stderr.")]
JunitOpt = Annotated[str | None, typer.Option(help="Also write JUnit XML here (empty: skipped).")]
RunDirArg = Annotated[Path, typer.Argument(help="A completed run directory (with manifest.json).")]


def optional_output(value: str | None, option: str) -> Path | None:
    """An output-file option given as text: ``None`` when absent, and also when empty — the CI
    recipe's ``--summary-md "$GITHUB_STEP_SUMMARY"`` outside GitHub Actions, where the variable
    is unset — then with a one-line note on stderr that nothing is written there, printed after
    the result (a command that fails prints its one error line alone)."""
    if value is None:
        return None
    if not value.strip():
        _NOTES.append(f"{option}: empty path, skipped (nothing written)")
        return None
    return Path(value)
