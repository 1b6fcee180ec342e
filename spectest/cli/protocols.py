"""``spectest protocols``: list the shipped protocols with their one-line descriptions."""

from __future__ import annotations

from rich.table import Table

from spectest.cli.common import boundary, console


@boundary
def protocols() -> None:
    """List the protocols shipped with spectest (``--config NAME`` runs one from anywhere)."""
    from spectest.errors import InfrastructureError
    from spectest.shipped import list_shipped, shipped_dir

    items = list_shipped()
    if not items:
        raise InfrastructureError(
            "no shipped protocols in this install (spectest/protocols_data is missing)"
        )
    con = console()
    table = Table(title=f"shipped protocols ({shipped_dir()})")
    table.add_column("name")
    table.add_column("description")
    for p in items:
        table.add_row(p.name, p.description)
    con.print(table)
    con.print("run one from anywhere: spectest run --config NAME (a local file of that name wins)")
