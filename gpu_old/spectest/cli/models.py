"""``spectest models``: list the model zoo's presets and the spec grammar. Prints only."""

from __future__ import annotations

from rich.table import Table

from spectest.cli.common import boundary, console


@boundary
def models() -> None:
    """List the model zoo: spec prefixes usable as models.target / models.draft in a protocol."""
    from spectest.models.fixtures import FIXTURES, status
    from spectest.models.zoo import PRESETS

    table = Table(title="spectest model zoo (nothing is ever downloaded)")
    table.add_column("spec")
    table.add_column("what it is")
    for name, desc in PRESETS.items():
        table.add_row(name, desc)
    console().print(table)
    fixtures = Table(title="real-engine fixtures (built on first use, cached by content key)")
    fixtures.add_column("fixture")
    fixtures.add_column("what it is")
    fixtures.add_column("cache")
    for name, spec in FIXTURES.items():
        fixtures.add_row(name, spec.description, status(name))
    console().print(fixtures)
