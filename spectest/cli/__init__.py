"""The ``spectest`` command line: the Typer app, ``--version`` and ``main()``; one module per
subcommand. Knows nothing else.

The why and the details: docs/internals.md "spectest/cli/__init__.py".
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Annotated, Any

import click
import typer
import typer.core

from spectest import __version__
from spectest.cli import (
    analyze,
    bench,
    compare,
    conformance,
    hunt,
    models,
    power,
    protocols,
    report,
    reported,
    run,
    setup,
    supervised,
)
from spectest.cli.common import EXIT_CODES_HELP, error_line
from spectest.supervise import announce_exit

# typer >= 0.2x vendors its own copy of click: its usage errors are that copy's classes
_CLICK = getattr(typer.core, "_click", click)
_USAGE_ERRORS = tuple({_CLICK.exceptions.ClickException, click.exceptions.ClickException})
_ABORTS = (typer.Abort, click.exceptions.Abort)
FULL_EXIT_ENV = "SPECTEST_FULL_EXIT"  # set: the interpreter's own exit (``leave``)
_HELP_ERRORS = tuple(
    getattr(m.exceptions, "NoArgsIsHelpError", ())
    for m in {_CLICK, click}
    if hasattr(m.exceptions, "NoArgsIsHelpError")
)


class _OneLineErrors(typer.core.TyperGroup):
    """typer's group, except that a usage error (or any ClickException, whose code would be
    click's 1) is one line on stderr and exit 2 (README "Commands"); ``spectest`` with no
    arguments still prints the help. Why: docs/internals.md "spectest/cli/__init__.py"."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        kw = {
            "args": args,
            "prog_name": prog_name,
            "complete_var": complete_var,
            "windows_expand_args": windows_expand_args,
            **extra,
        }
        if not standalone_mode:
            return super().main(standalone_mode=False, **kw)
        try:
            rv = super().main(standalone_mode=False, **kw)
        except _USAGE_ERRORS as err:
            if _HELP_ERRORS and isinstance(err, _HELP_ERRORS):
                err.show()
                sys.exit(2)
            ctx = getattr(err, "ctx", None)
            hint = f" ({ctx.command_path} --help lists the options)" if ctx is not None else ""
            error_line(f"{err.format_message()}{hint}")
            sys.exit(2)
        except _ABORTS:  # click's Abort (EOF at a prompt) outside a command: never its exit 1
            error_line("aborted: no verdict")
            sys.exit(130)
        # standalone_mode=False returns a command's exit code (typer.Exit) instead of exiting
        sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else 0)


app = typer.Typer(
    cls=_OneLineErrors,
    name="spectest",
    help=(
        "Prove or disprove that a speculative-decoding sampler has exactly the law of plain "
        "sampling from the target.\n\n" + EXIT_CODES_HELP
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"spectest {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """spectest: statistical tests that a speculative sampler is exact."""


app.command("run", epilog=EXIT_CODES_HELP)(run.run)
app.command("analyze", epilog=EXIT_CODES_HELP)(analyze.analyze)
app.command("compare", epilog=EXIT_CODES_HELP)(compare.compare)
app.command("teeth", epilog=EXIT_CODES_HELP)(run.teeth)
app.command("power")(power.power)
app.command("report")(report.report)
app.command("models")(models.models)
app.command("protocols")(protocols.protocols)
app.command("bench")(bench.bench)
app.command("conformance")(conformance.conformance)
app.command("setup")(setup.setup)
app.command("hunt")(hunt.hunt)
app.command("reported-p", epilog=EXIT_CODES_HELP)(reported.reported_p)


def main() -> None:
    """Console-script entry point (and ``python -m spectest``'s): the command line's own process,
    which may supervise a command that loads plug-ins (``cli.supervised``). Its exit code is
    announced to a supervisor when this process is a supervised child; then the process leaves
    without the interpreter's teardown where nothing is left to run (``leave``)."""
    supervised.ENTRY["standalone"] = True
    try:
        app()
    except SystemExit as err:
        code = err.code
        announce_exit(code if isinstance(code, int) else 0 if code is None else 1)
        if code is None or isinstance(code, int):
            leave(code or 0)
        raise


def leave(code: int) -> None:
    """End the process with ``code`` now, as a normal exit would but without tearing down every
    module (about 1 s once torch, transformers, pandas and matplotlib are imported: results/
    LOG.md "lead (session 24)"): the ``atexit`` handlers run (multiprocessing's children,
    temporary directories, logging), stdout and stderr are flushed, then ``os._exit``. Returns,
    for the interpreter's own exit, where another thread is alive (a normal exit joins it), under
    a tracer or profiler (they report after ``main``) or with ``SPECTEST_FULL_EXIT`` set."""
    import atexit
    import os
    import threading

    if threading.active_count() > 1 or sys.gettrace() or sys.getprofile():
        return
    if os.environ.get(FULL_EXIT_ENV):
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: the normal exit would not write it either
            pass
    os._exit(code)
