"""``spectest power``: seeds per arm for a target TV, or the MDE (TV) for a number of seeds."""

from __future__ import annotations

from typing import Annotated

import typer

from spectest.cli.common import boundary, console, progress_bars
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
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            help="Size this protocol's run as it will be made: α split over its active "
            "families, its prompts × configs × positions sharing the cells' α (--alpha and "
            "--tests are then the protocol's); without --tv or --seeds: at its seeds.",
        ),
    ] = None,
) -> None:
    """Power of the pooled two-sample χ²: give --tv (→ seeds) or --seeds (→ MDE), not both."""
    if config is not None:  # loading the protocol imports torch: seconds, so progress first
        with progress_bars() as cb:
            cb.header(f"spectest power --config {config}: loading the protocol")
            cb("load protocol", 0, 1)
            _power_of_protocol(config, tv=tv, seeds=seeds, df=df, power=power_)
            cb("load protocol", 1, 1)
        return
    _power_of_counts(tv, seeds, df, alpha, tests, power_)


def _power_of_counts(
    tv: float | None, seeds: int | None, df: int, alpha: float, tests: int, power_: float
) -> None:
    """Print the seeds per arm for ``tv``, or the MDE (TV) for ``seeds``, with λ*."""
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


def _power_of_protocol(
    config: str, *, tv: float | None, seeds: int | None, df: int, power: float
) -> None:
    from spectest.cli.supervised import (
        DEFAULT_TIMEOUT_S,
        engines_only,
        protocol_plugins,
        supervise_or_continue,
    )

    plugins = engines_only(protocol_plugins(config))  # imported to parse the protocol
    supervise_or_continue(plugins, DEFAULT_TIMEOUT_S, verdict=False)
    from spectest.protocol import load_protocol
    from spectest.sizing import size_protocol

    if tv is not None and seeds is not None:
        raise ConfigError(f"power: give at most one of --tv or --seeds, got {tv!r}, {seeds!r}")
    if df < 1:
        raise ConfigError(f"--df: expected an integer >= 1, got {df!r}")
    size = size_protocol(load_protocol(config), df=df, power=power)
    con = console()
    for line in size.lines():
        con.print(line, markup=False)
    if tv is not None:
        con.print(
            f"seeds per arm to detect a per-cell TV {tv:g} with power {power:g}: "
            f"{size.seeds_for(tv)} (the protocol has {size.seeds_per_arm})",
            markup=False,
        )
    else:
        n = size.seeds_per_arm if seeds is None else seeds
        if n < 1:
            raise ConfigError(f"--seeds: expected an integer >= 1, got {seeds!r}")
        con.print(
            f"per-cell MDE (TV) with {n} seeds per arm, power {power:g}: {size.mde_tv(n):.4f}",
            markup=False,
        )
    con.print(
        "(the run's own figure is the median over its cells, each at its data's df: "
        "bins − 1 after pooling to the minimum expected count)",
        markup=False,
    )
