"""Shared plumbing of the CLI commands: the error boundary, the rich console, progress bars, and
the printed summary of a run.

Owns: how a ``SpectestError`` becomes one line on stderr and its exit code, how a ``RunResult``
is printed (verdict, the per-config summary table, teeth), and the rich progress adapter that
the runner's progress callback drives. Knows nothing about statistics or files: it prints what
``spectest.runner`` returns.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from spectest.errors import ExitCode, SpectestError

F = TypeVar("F", bound=Callable[..., Any])
MAX_FAILING_PRINTED = 10

EXIT_CODES_HELP = (
    "Exit codes: 0 tested and no difference found, at the stated resolution, every tooth "
    "asked for sound; 1 the distributions differ (failing cells listed); 2 bad input or usage; "
    "3 inconclusive (nothing testable, a null arm rejected, a tooth not killed or run on no "
    "data, or a resolution worse than required: the protocol's max_mde_tv, 0.15 by default "
    "when no tooth shows the power)."
)


def console() -> Console:
    """stdout console; plain (no colour, wide) when not a terminal so logs and tests read well."""
    return Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 120)


def err_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def boundary(fn: F) -> F:
    """The one place a ``SpectestError`` is caught: one line on stderr, ``err.exit_code``."""

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
ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="Protocol YAML file.")]
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
