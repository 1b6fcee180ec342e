"""``spectest power``: seeds per arm for a target TV, or the MDE (TV) for a number of seeds."""

from __future__ import annotations

from typing import Annotated

import typer

from spectest.cli.common import boundary, console
from spectest.errors import ConfigError


@boundary
def power(
    tv: Annotated[
        float | None, typer.Option(help="Target TV to detect: prints the seeds per arm needed.")
    ] = None,
    seeds: Annotated[
        int | None, typer.Option(help="Seeds per arm: prints the minimum detectable TV.")
    ] = None,
    df: Annotated[int, typer.Option(help="Degrees of freedom of the pooled χ² (bins − 1).")] = 10,
    alpha: Annotated[float, typer.Option(help="Level of each test.")] = 0.05,
    tests: Annotated[
        int,
        typer.Option(
            help="Number of tests sharing α (Bonferroni: α/tests, a conservative figure under BH)."
        ),
    ] = 1,
    power_: Annotated[float, typer.Option("--power", help="Required power.")] = 0.8,
) -> None:
    """Power of the pooled two-sample χ²: give --tv (→ seeds) or --seeds (→ MDE), not both."""
    from spectest.stats.power import lambda_star, mde_tv, seeds_for_tv

    if (tv is None) == (seeds is None):
        raise ConfigError(
            f"power: give exactly one of --tv or --seeds, got tv={tv!r}, seeds={seeds!r}"
        )
    if tests < 1:
        raise ConfigError(f"--tests: expected an integer >= 1, got {tests!r}")
    if df < 1:
        raise ConfigError(f"--df: expected an integer >= 1, got {df!r}")
    a = alpha / tests
    lam = lambda_star(df, a, power_)
    con = console()
    if tv is not None:
        n = seeds_for_tv(tv, df, a, power_)
        con.print(
            f"seeds per arm to detect TV {tv:g} with power {power_:g} at α {a:.3g} (df {df}): {n}"
        )
    else:
        if seeds is None or seeds < 1:
            raise ConfigError(f"--seeds: expected an integer >= 1, got {seeds!r}")
        m = float(mde_tv(seeds, seeds, df, a, power_))
        con.print(
            f"minimum detectable TV with {seeds} seeds per arm, power {power_:g}, "
            f"α {a:.3g} (df {df}): {m:.4f}"
        )
    con.print(f"(λ* = {lam:.2f}; MDE = √(λ*/(2N)), a worst case over the shape of the difference)")
