"""Shared plumbing of the CLI commands: the error boundary, the rich console, progress bars, and
the printed summary of a run.

Owns: how a ``SpectestError`` — or an ``OSError``, a missing module, a failed subprocess or any
other exception escaping a command, or a ``BaseException`` that is not one (a plug-in's
``SystemExit``, ``KeyboardInterrupt`` or ``GeneratorExit``) — becomes one line on stderr and its
exit code (never 1: 1 means "the distributions differ"; 130 only for the user's own Ctrl-C), how
a ``RunResult`` is printed (verdict, the per-config summary table, teeth) with every piece of
user text escaped for rich markup and stripped of control characters, the rule that a printed
result exits with its verdict's code even when printing fails (``show_result``), and the rich
progress adapter that the runner's progress callback drives. Knows nothing about statistics or
files: it prints what ``spectest.runner`` returns.
"""

from __future__ import annotations

import contextlib
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
from rich.table import Table
from rich.text import Text

from spectest.contain import (
    escape_reason,
    signal_exit_code,
    track_user_interrupts,
    user_interrupted,
)
from spectest.errors import ExitCode, SpectestError, os_error_line
from spectest.report.escape import one_line, printable
from spectest.supervise import announce_verdict

F = TypeVar("F", bound=Callable[..., Any])
MAX_FAILING_PRINTED = 10

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


def show_result(result: Any) -> None:
    """Print a ``RunResult`` and exit with its verdict's code — the code ``summary.json``
    stores — even when printing fails (a closed stdout, a terminal that cannot encode a
    character, a bug in the printing): then one line on stderr says so and the code is kept."""
    code = int(result.verdict.exit_code)
    try:
        print_result(result)
        sys.stdout.flush()
    except BaseException as err:  # the run is complete: nothing here may change its code
        if isinstance(err, BrokenPipeError):  # NOTE: else Python's exit flush fails again (120)
            with open(os.devnull, "w") as devnull:
                os.dup2(devnull.fileno(), sys.stdout.fileno())
        v = result.summary.get("verdict", {})
        with contextlib.suppress(Exception):
            error_line(
                f"could not print the result ({type(err).__name__}: {err}); the verdict "
                f"stands: {v.get('decision', '?')} (exit {code}), stored in "
                f"{result.run_dir}/summary.json"
            )
    announce_verdict(code, result.run_dir)  # the verdict path, to a supervisor if there is one
    exit_with(code)


class Reporter:
    """What ``progress_bars`` yields: a ``(task, completed, total)`` callback, ``header`` (a
    line printed first, only while progress is shown) and ``say`` (a line printed always),
    both on stderr above any bars."""

    def __init__(self, update: Callable[[str, int, int], None],
                 say: Callable[[str], None] | None = None) -> None:  # fmt: skip
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


def fmt(x: float | None, digits: int = 4) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def print_result(result: Any, con: Console | None = None) -> None:
    """Print a ``RunResult``: the per-config summary table, teeth, failing cells, then the
    verdict as ``spectest.summary.verdict_lines`` words it (headline, what was tested, the
    resolution, every reason)."""
    from spectest.summary import rejections_account, verdict_lines

    con = con or console()
    summary = result.summary
    verdict = summary["verdict"]
    style = {"equivalent": "green", "sound": "green", "different": "red"}.get(
        verdict["decision"], "yellow"
    )
    con.print(
        f"[bold]spectest[/bold] {u(summary.get('kind', 'run'))} "
        f"[bold]{u(summary.get('name', ''))}[/bold]  "
        f"protocol {u(str(summary.get('protocol_hash') or '')[:12])}  "
        f"→ {u(summary.get('run_dir', ''))}"
    )
    if summary.get("arms_engines"):
        from spectest.report.rows import arms_line

        con.print(f"  {printable(arms_line(summary))}", markup=False, soft_wrap=True)
    for line in summary.get("notes", []):
        con.print(f"  {printable(line)}", markup=False)
    narrow = con.width < NARROW
    con.print(_config_table(summary, narrow))
    if narrow:
        _teeth_lines(con, summary)
    if account := rejections_account(summary):
        con.print(printable(account), markup=False, soft_wrap=True)
    if summary.get("teeth"):
        con.print(_teeth_table(summary["teeth"]))
    _print_failing(con, summary)
    _print_timings(con, summary.get("timings"))
    _print_looks(con, summary.get("sequential") or {}, summary)
    for line in verdict_lines(verdict):
        # NOTE: one physical line each (soft wrap): CI logs are grepped for them
        if line.startswith(" "):
            con.print(printable(line), markup=False, soft_wrap=True)
        else:
            word, _, rest = line.partition(" ")
            con.print(f"[bold {style}]{u(word)}[/bold {style}] ", end="", soft_wrap=True)
            con.print(printable(rest), markup=False, soft_wrap=True)


NARROW = 100  # a console narrower than this prints the teeth column below the table


def _config_table(summary: dict[str, Any], narrow: bool = False) -> Table:
    """The per-config table; ``narrow``: without its teeth column (``_teeth_lines`` prints it
    below, so at 80 columns nothing is cut to "always_acc…")."""
    table = Table(
        title="per config (candidate vs reference)"
        if summary.get("has_candidate")
        else "per config"
    )
    rows = summary.get("configs", [])
    cols = ["config", "cells tested", "rejections in this config", "max TV excess (where)",
            "MDE (TV)", *([] if narrow else ["teeth rejections"])]  # fmt: skip
    for col in cols:  # a config id keeps its width (the headers wrap); a longer one folds
        keep = _words_width(r["config_id"] for r in rows) if col == "config" else None
        table.add_column(col, min_width=keep, overflow="fold")
    for row in rows:
        where = f" ({row['max_tv_where']})" if row.get("max_tv_where") else ""
        table.add_row(
            cell(row["config_id"]),
            f"{row['cells_tested']}"
            + (f" (+{row['cells_untestable']} untestable)" if row.get("cells_untestable") else ""),
            "—"
            if row.get("rejections") is None
            else str(row["rejections"])
            + (
                " (" + ", ".join(f"{k} {n}" for k, n in row["rejections_by_family"].items()) + ")"
                if row.get("rejections_by_family")
                else ""
            ),
            cell(fmt(row.get("max_tv_excess")) + where),
            fmt(row.get("mde_tv")),
            *([] if narrow else [cell(row.get("teeth", ""))]),
        )
    return table


def _teeth_lines(con: Console, summary: dict[str, Any]) -> None:
    """The narrow table's teeth column, one line per config (wrapped between words)."""
    for row in summary.get("configs", []):
        if row.get("teeth"):
            con.print(f"teeth rejections in {printable(row['config_id'])}: "
                      f"{printable(row['teeth'])}", markup=False)  # fmt: skip


def _words_width(texts: Iterator[Any], cap: int = 28) -> int:
    """The longest word (split at spaces) of ``texts``, at most ``cap``: a column's minimum
    width, so that a narrow console wraps the headers rather than cutting the ids."""
    return min(cap, max((len(w) for t in texts for w in str(t).split()), default=0))


def _teeth_table(teeth: list[dict[str, Any]]) -> Table:
    tt = Table(title="teeth (each arm vs reference)")
    for col in ("arm", "expected", "rejections", "verdict"):
        tt.add_column(col)
    for t in teeth:
        tt.add_row(
            cell(t["arm"]),
            "pass" if t["expect"] == "pass" else "killed",
            str(t["rejections"]),
            cell(t["label"]),
        )
    return tt


def _print_failing(con: Console, summary: dict[str, Any]) -> None:
    cand = next((c for c in summary.get("comparisons", []) if c["role"] == "candidate"), None)
    if cand is not None and cand["failing"]:
        n = cand["rejections"]
        con.print(f"failing (candidate vs reference, {n} rejection(s), most significant first):")
        for f in cand["failing"][:MAX_FAILING_PRINTED]:
            con.print(f"  {printable(f)}", markup=False)
        if n > MAX_FAILING_PRINTED:
            more = printable(f"{summary.get('run_dir')}/tests.parquet")
            con.print(f"  ... {n - MAX_FAILING_PRINTED} more: see {more}", markup=False)


def _print_timings(con: Console, t: dict[str, Any] | None) -> None:
    """Phase wall times (``runner.run_protocol`` docstring)."""
    if not t:
        return
    gen = ", ".join(f"{printable(a)} {s:.1f}" for a, s in t.get("generate", {}).items())
    con.print(
        f"timings (s): load {t.get('load', 0):.1f} · generate [{gen}] · white-box "
        f"{t.get('whitebox', 0):.1f} · "
        + (f"tooth sizes {t['tooth sizes']:.1f} · " if "tooth sizes" in t else "")
        + (f"numerics {t['numerics']:.1f} · " if "numerics" in t else "")
        + f"analyze {t.get('analyze', 0):.1f} · write {t.get('write', 0):.1f}",
        markup=False,
    )
    if w := t.get("workers"):  # a spread run: each worker's phases (scaleout.generate_spread)
        con.print("workers (s): " + ", ".join(f"{printable(k)} {v:.1f}" for k, v in w.items()),
                  markup=False)  # fmt: skip


def _print_looks(con: Console, seq: dict[str, Any], summary: dict[str, Any]) -> None:
    """The path of the evidence of a sequential run (``report.markdown.sequential_rows``)."""
    if not seq.get("looks"):
        return
    from spectest.report.markdown import sequential_rows

    line, _, _ = sequential_rows(summary)
    con.print(printable(line.replace("**", "")), markup=False, soft_wrap=True)
    path = " · ".join(
        f"{lk['per_arm']} → {lk['decision']} (MDE {fmt(lk.get('mde_tv'))})" for lk in seq["looks"]
    )
    con.print(f"  looks: {path}", markup=False, soft_wrap=True)


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
