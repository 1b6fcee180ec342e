"""``spectest reported-p``: audit a protocol arm's engine by the probabilities it reports.

Owns: ``audit_arm`` — the engine of a protocol's ``reference`` or ``candidate`` arm, with its
options, models, first prompt, configs, positions and drafter (what a run gives it), run on
``seeds`` seeds per config through ``engines.reported`` (the reported-p family: support and PIT
conditional on the engine's reported p, and the cross-check with spectest's teacher). Knows
nothing about run directories or the verdict of ``spectest run``: this audit is decided beside a
run; inside a run the reported-p family decides claim (a) from the same reports
(``stats.family_reported``, docs/engines-reported-p.md). Exit codes: 0 every check passed,
1 one failed (named), 2 bad input or an engine that reports no probabilities, 4 its process
could not run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from spectest.stats import reported_p


def audit_arm(
    path: str | Path,
    arm: str = "candidate",
    *,
    seeds: int = 64,
    alpha: float = reported_p.DEFAULT_ALPHA,
    tol: float = reported_p.DEFAULT_TOL,
    max_fraction: float = reported_p.DEFAULT_MAX_FRACTION,
    rng_seed: int = 0,
) -> reported_p.ReportedResult:
    """The reported-p family of one job of the protocol arm's engine (module docstring)."""
    from spectest.conformance import protocol_arm
    from spectest.engines import reported
    from spectest.engines.registry import engine_class

    a = protocol_arm(path, arm, seeds)
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
    return reported.audit(
        collected, np.random.default_rng(rng_seed), alpha=alpha, tol=tol, max_fraction=max_fraction
    )


__all__ = ["audit_arm"]
