"""Shared plumbing of the CLI commands: the error boundary, the rich console, progress bars, and
the printed summary of a run.

Owns: how a ``SpectestError`` — or an ``OSError``, a missing module, a failed subprocess or any
other exception escaping a command — becomes one line on stderr and its exit code (never 1:
1 means "the distributions differ"), how a ``RunResult``
is printed (verdict, the per-config summary table, teeth), and the rich progress adapter that
the runner's progress callback drives. Knows nothing about statistics or files: it prints what
``spectest.runner`` returns.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import click
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from spectest.errors import ExitCode, SpectestError, os_error_line

F = TypeVar("F", bound=Callable[..., Any])
MAX_FAILING_PRINTED = 10

EXIT_CODES_HELP = (
    "Exit codes: 0 tested and no difference found, at the stated resolution, every tooth "
    "asked for sound; 1 the distributions differ (failing cells listed); 2 bad input or usage; "
    "3 inconclusive (nothing testable, a null arm rejected, a tooth not killed or run on no "
    "data, or a resolution worse than required: the protocol's max_mde_tv, 0.15 by default "
    "when no tooth shows the power); 4 infrastructure error, no verdict (filesystem, "
    "permissions, disk full, missing package, killed subprocess, internal error)."
)
DEBUG_ENV = "SPECTEST_DEBUG"  # set to 1 to see the traceback of an infrastructure/internal error


def console() -> Console:
    """stdout console; plain (no colour, wide) when not a terminal so logs and tests read well."""
    return Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 120)


def err_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


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


def boundary(fn: F) -> F:
    """The one place errors are caught: one line on stderr and a documented exit code.

    ``SpectestError`` → its ``exit_code`` (2 or 4); anything else that escapes a command — an
    ``OSError`` (permissions, disk full, a path under a file), a missing module, a failed or
    killed subprocess, an internal error — → 4 (``ExitCode.INFRASTRUCTURE``), never Python's
    default 1, which a CI gate would read as "the distributions differ".
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SpectestError as err:
            line = " ".join(str(err).split("\n"))
            err_console().print(f"error: {line}", markup=False)
            raise typer.Exit(int(err.exit_code)) from None
        except KeyboardInterrupt:
            err_console().print("interrupted: completed shards are kept; re-run to resume")
            raise typer.Exit(130) from None
        except (typer.Exit, typer.Abort, click.ClickException):
            raise  # click's own exits and usage errors (exit 2) keep their meaning
        except Exception as err:
            if os.environ.get(DEBUG_ENV):
                traceback.print_exc()
            line = " ".join(infrastructure_line(err).split("\n"))
            err_console().print(f"error: {line}", markup=False)
            raise typer.Exit(int(ExitCode.INFRASTRUCTURE)) from None

    return wrapper  # type: ignore[return-value]


@contextmanager
def progress_bars(enabled: bool = True) -> Iterator[Callable[[str, int, int], None]]:
    """A ``(task, completed, total)`` callback drawing one rich bar per task label."""
    if not enabled or os.environ.get("SPECTEST_NO_PROGRESS"):
        yield lambda task, done, total: None
        return
    bars = Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=False,
    )
    tasks: dict[str, Any] = {}

    def update(task: str, done: int, total: int) -> None:
        if task not in tasks:
            tasks[task] = bars.add_task(task, total=total)
        bars.update(tasks[task], completed=done, total=total)

    with bars:
        yield update


def fmt(x: float | None, digits: int = 4) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def print_result(result: Any, con: Console | None = None) -> None:
    """Print a ``RunResult``: the per-config summary table, teeth, failing cells, then the
    verdict as ``spectest.summary.verdict_lines`` words it (headline, what was tested, the
    resolution, every reason)."""
    from spectest.summary import verdict_lines

    con = con or console()
    summary = result.summary
    verdict = summary["verdict"]
    style = {"equivalent": "green", "sound": "green", "different": "red"}.get(
        verdict["decision"], "yellow"
    )
    con.print(
        f"[bold]spectest[/bold] {summary.get('kind', 'run')} "
        f"[bold]{summary.get('name', '')}[/bold]  "
        f"protocol {str(summary.get('protocol_hash') or '')[:12]}  "
        f"→ {summary.get('run_dir', '')}"
    )
    for line in summary.get("notes", []):
        con.print(f"  {line}", markup=False)
    table = Table(
        title="per config (candidate vs reference)"
        if summary.get("has_candidate")
        else "per config"
    )
    for col in (
        "config",
        "cells tested",
        "rejections",
        "max TV excess (where)",
        "MDE (TV)",
        "teeth rejections",
    ):
        table.add_column(col)
    for row in summary.get("configs", []):
        where = f" ({row['max_tv_where']})" if row.get("max_tv_where") else ""
        table.add_row(
            row["config_id"],
            f"{row['cells_tested']}"
            + (f" (+{row['cells_untestable']} untestable)" if row.get("cells_untestable") else ""),
            "—" if row.get("rejections") is None else str(row["rejections"]),
            fmt(row.get("max_tv_excess")) + where,
            fmt(row.get("mde_tv")),
            row.get("teeth", ""),
        )
    con.print(table)
    if summary.get("teeth"):
        tt = Table(title="teeth (each arm vs reference)")
        for col in ("arm", "expected", "rejections", "verdict"):
            tt.add_column(col)
        for t in summary["teeth"]:
            tt.add_row(
                t["arm"],
                "pass" if t["expect"] == "pass" else "killed",
                str(t["rejections"]),
                t["label"],
            )
        con.print(tt)
    cand = next((c for c in summary.get("comparisons", []) if c["role"] == "candidate"), None)
    if cand is not None and cand["failing"]:
        n = cand["rejections"]
        con.print(f"failing (candidate vs reference, {n} rejection(s), most significant first):")
        for f in cand["failing"][:MAX_FAILING_PRINTED]:
            con.print(f"  {f}", markup=False)
        if n > MAX_FAILING_PRINTED:
            more = f"{summary.get('run_dir')}/tests.parquet"
            con.print(f"  ... {n - MAX_FAILING_PRINTED} more: see {more}", markup=False)
    if t := summary.get("timings"):  # phase wall times (runner.run_protocol docstring)
        gen = ", ".join(f"{a} {s:.1f}" for a, s in t.get("generate", {}).items())
        con.print(
            f"timings (s): load {t.get('load', 0):.1f} · generate [{gen}] · white-box "
            f"{t.get('whitebox', 0):.1f} · analyze {t.get('analyze', 0):.1f} · write "
            f"{t.get('write', 0):.1f}",
            markup=False,
        )
        if w := t.get("workers"):  # a spread run: each worker's phases (runner._generate_spread)
            con.print("workers (s): " + ", ".join(f"{k} {v:.1f}" for k, v in w.items()),
                      markup=False)  # fmt: skip
    seq = summary.get("sequential") or {}
    if seq.get("looks"):  # the path of the evidence (report.markdown.sequential_rows)
        from spectest.report.markdown import sequential_rows

        line, _, _ = sequential_rows(summary)
        con.print(line.replace("**", ""), markup=False, soft_wrap=True)
        path = " · ".join(
            f"{lk['per_arm']} → {lk['decision']} (MDE {fmt(lk.get('mde_tv'))})"
            for lk in seq["looks"]
        )
        con.print(f"  looks: {path}", markup=False, soft_wrap=True)
    for line in verdict_lines(verdict):
        # NOTE: one physical line each (soft wrap): CI logs are grepped for them
        if line.startswith(" "):
            con.print(line, markup=False, soft_wrap=True)
        else:
            word, _, rest = line.partition(" ")
            con.print(f"[bold {style}]{word}[/bold {style}] ", end="", soft_wrap=True)
            con.print(rest, markup=False, soft_wrap=True)


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
