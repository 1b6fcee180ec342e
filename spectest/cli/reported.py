"""``spectest reported-p``: audit a protocol arm's engine by the probabilities it reports
(``engines.reported``), and print it.

The why and the details: docs/internals.md "spectest/cli/reported.py".
"""

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
    import numpy as np

    from spectest.conformance import protocol_arm
    from spectest.engines import reported
    from spectest.engines.registry import engine_class

    a = protocol_arm(config, arm, seeds)
    target = a.models.target
    assert target is not None
    engine = engine_class(a.choice.name)(a.choice.options, a.models)
    try:
        w = a.work
        collected = reported.collect(
            engine, target, w.prompt, w.configs, range(seeds), w.positions, drafter=w.drafter
        )
    finally:
        engine.close()
    rng = np.random.default_rng(0)
    res = reported.audit(collected, rng, alpha=alpha, tol=tol, max_fraction=max_fraction)
    con = console()
    for line in res.lines():
        con.print(line, markup=False)
    raise typer.Exit(res.exit_code)
