"""The ``spectest`` command line: a Typer app with one module per subcommand.

Owns: the app, the global ``--version`` option and the ``main()`` entry point
(``spectest = "spectest.cli:main"`` in pyproject). Each subcommand module parses its options,
calls one library function and prints the result; ``common.boundary`` turns a ``SpectestError``
into one line and its exit code. Knows nothing else.
"""

from __future__ import annotations

from typing import Annotated

import typer

from spectest import __version__
from spectest.cli import (
    analyze,
    bench,
    compare,
    hunt,
    models,
    power,
    protocols,
    report,
    run,
    setup,
    teeth,
)
from spectest.cli.common import EXIT_CODES_HELP

app = typer.Typer(
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
app.command("teeth", epilog=EXIT_CODES_HELP)(teeth.teeth)
app.command("power")(power.power)
app.command("report")(report.report)
app.command("models")(models.models)
app.command("protocols")(protocols.protocols)
app.command("bench")(bench.bench)
app.command("setup")(setup.setup)
app.command("hunt")(hunt.hunt)


def main() -> None:
    """Console-script entry point."""
    app()
