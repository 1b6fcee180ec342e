"""``spectest reported-p``: audit an engine by the probabilities it reports, and print it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spectest.cli.common import boundary, console
from spectest.cli.supervised import PluginTimeoutOpt, protocol_plugins, supervise_or_continue
from spectest.supervise import DEFAULT_TIMEOUT_S


@boundary
def reported_p(
    config: Annotated[
        Path,
        typer.Option("--config", "-c", help="The protocol whose arm to audit.", readable=False),
    ],
    arm: Annotated[str, typer.Option(help="reference or candidate.")] = "candidate",
    seeds: Annotated[int, typer.Option(help="Seeds per sampling config.")] = 64,
    alpha: Annotated[float, typer.Option(help="The PIT tests' α (α/2 each).")] = 0.01,
    tol: Annotated[float, typer.Option(help="Cross-check: per-token tolerance.")] = 1e-3,
    max_fraction: Annotated[
        float, typer.Option(help="Cross-check: fraction of tokens allowed beyond --tol.")
    ] = 0.01,
    plugin_timeout: PluginTimeoutOpt = DEFAULT_TIMEOUT_S,
) -> None:
    """Audit the engine of a protocol's arm by the per-token probabilities it reports
    (`probs`): support and PIT conditional on its reported p, and the cross-check with
    spectest's teacher. Exit 0 every check passed, 1 one failed, 2 bad input or no
    probabilities reported, 4 its process could not run."""
    supervise_or_continue(protocol_plugins(config), plugin_timeout, verdict=False)
    from spectest.audit_reported import audit_arm

    res = audit_arm(config, arm, seeds=seeds, alpha=alpha, tol=tol, max_fraction=max_fraction)
    con = console()
    for line in res.lines():
        con.print(line, markup=False)
    raise typer.Exit(res.exit_code)
