"""How a ``RunResult`` is printed (tables, teeth, failing cells, timings, the verdict's lines),
user text escaped; ``show_result`` exits with the verdict's code. Not the verdict's words.

The why and the details: docs/internals.md "spectest/cli/printing.py".
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.table import Table

from spectest.cli.common import cell, console, error_line, exit_with, u
from spectest.report.escape import printable
from spectest.report.rows import config_counts
from spectest.supervise import announce_verdict

MAX_FAILING_PRINTED = 10


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


def fmt(x: float | None, digits: int = 4) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def print_result(result: Any, con: Console | None = None) -> None:
    """Print a ``RunResult``: the per-config summary table, teeth, failing cells, then the
    verdict as ``spectest.decision.summary.verdict_lines`` words it (headline, what was tested, the
    resolution, every reason)."""
    from spectest.decision.summary import rejections_account, verdict_lines

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
    cols = [
        "config",
        "cells tested",
        "rejections in this config",
        "max TV excess (where)",
        "MDE (TV)",
        *([] if narrow else ["teeth rejections"]),
    ]
    for col in cols:  # a config id keeps its width (the headers wrap); a longer one folds
        keep = _words_width(r["config_id"] for r in rows) if col == "config" else None
        table.add_column(col, min_width=keep, overflow="fold")
    for row in rows:
        where = f" ({row['max_tv_where']})" if row.get("max_tv_where") else ""
        table.add_row(
            cell(row["config_id"]),
            *config_counts(row),
            cell(fmt(row.get("max_tv_excess")) + where),
            fmt(row.get("mde_tv")),
            *([] if narrow else [cell(row.get("teeth", ""))]),
        )
    return table


def _teeth_lines(con: Console, summary: dict[str, Any]) -> None:
    """The narrow table's teeth column, one line per config (wrapped between words)."""
    for row in summary.get("configs", []):
        if row.get("teeth"):
            con.print(
                f"teeth rejections in {printable(row['config_id'])}: {printable(row['teeth'])}",
                markup=False,
            )


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


_BESIDE = "tooth sizes beside generation"  # runner: the thread's own wall time
_BESIDE_N = "analyze beside numerics"  # decision.where.BESIDE: the process's own wall time


def _print_timings(con: Console, t: dict[str, Any] | None) -> None:
    """Phase wall times (``runner.run_protocol`` docstring)."""
    if not t:
        return
    gen = ", ".join(f"{printable(a)} {s:.1f}" for a, s in t.get("generate", {}).items())
    con.print(
        f"timings (s): load {t.get('load', 0):.1f} · generate [{gen}] · white-box "
        f"{t.get('whitebox', 0):.1f} · "
        + (f"tooth sizes {t['tooth sizes']:.1f} · " if "tooth sizes" in t else "")
        + (f"(beside generation {t[_BESIDE]:.1f}) · " if _BESIDE in t else "")
        + (f"numerics {t['numerics']:.1f} · " if "numerics" in t else "")
        + f"analyze {t.get('analyze', 0):.1f} · "
        + (f"(beside numerics {t[_BESIDE_N]:.1f}) · " if _BESIDE_N in t else "")
        + f"write {t.get('write', 0):.1f}",
        markup=False,
    )
    if w := t.get("workers"):  # a spread run: each worker's phases (scaleout.generate_spread)
        con.print(
            "workers (s): " + ", ".join(f"{printable(k)} {v:.1f}" for k, v in w.items()),
            markup=False,
        )


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
