"""``spectest reported-p``: ``audit_arm`` runs a protocol arm's engine through
``engines.reported`` and checks the probabilities it reports.

The why and the details: docs/internals.md "spectest/audit_reported.py".
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
