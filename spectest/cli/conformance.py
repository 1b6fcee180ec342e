"""``spectest conformance``: run an engine through the engine contract's checks and print them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from spectest.cli.common import boundary, console
from spectest.cli.supervised import (
    DEFAULT_TIMEOUT_S,
    PluginTimeoutOpt,
    engine_plugins,
    protocol_plugins,
    supervise_or_continue,
)
from spectest.errors import ConfigError

if TYPE_CHECKING:
    from spectest import conformance as conf


@boundary
def conformance(
    engine: Annotated[
        str | None,
        typer.Argument(help="A registered engine name (`spectest` engines and entry points)."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="Instead of ENGINE: the engine of a protocol's arm (--arm), with its options, "
            "models, prompt, configs, positions and drafter.",
            readable=False,
        ),
    ] = None,
    arm: Annotated[str, typer.Option(help="With --config: reference or candidate.")] = (
        "candidate"
    ),
    options: Annotated[
        str | None,
        typer.Option(help="With ENGINE: its options as a YAML mapping ({OPTION: VALUE, ...})."),
    ] = None,
    target: Annotated[str, typer.Option(help="With ENGINE: the target model spec.")] = (
        "bundled:target"
    ),
    draft: Annotated[str, typer.Option(help="With ENGINE: the draft model spec.")] = (
        "bundled:draft"
    ),
    device: Annotated[str, typer.Option(help="With ENGINE: cpu or cuda[:i].")] = "cpu",
    seeds: Annotated[int, typer.Option(help="Seeds per sampling config in each job.")] = 4,
    plugin_timeout: PluginTimeoutOpt = DEFAULT_TIMEOUT_S,
) -> None:
    """Does ENGINE honour the engine contract? Options, needs, output shape and vocabulary,
    early stops, rounds, seeds, white-box, provenance, close. Exit 0 conforms, 2 does not,
    4 its process could not run."""
    from spectest import conformance as conf

    if (engine is None) == (config is None):
        raise ConfigError("conformance: give exactly one of ENGINE or --config")
    if isinstance(seeds, bool) or seeds < 1:
        raise ConfigError(f"--seeds: expected an integer >= 1, got {seeds!r}")
    plugins = protocol_plugins(config) if config is not None else engine_plugins(engine)
    supervise_or_continue(plugins, plugin_timeout, verdict=False)
    if config is not None:
        report = conf.check_arm(config, arm, seeds=seeds)
    else:
        assert engine is not None
        report = _engine_report(engine, options, target, draft, device, seeds)
    con = console()
    for line in report.lines():
        con.print(line, markup=False)
    raise typer.Exit(report.exit_code)


def _engine_report(
    engine: str, options: str | None, target: str, draft: str, device: str, seeds: int
) -> conf.ConformanceReport:
    """The conformance report of a registered engine with its ``--options`` YAML mapping."""
    import yaml

    from spectest import conformance as conf

    raw = yaml.safe_load(options) if options else {}
    if not isinstance(raw, dict):
        raise ConfigError(f"--options: expected a YAML mapping, got {options!r}")
    return conf.check(
        engine,
        raw,
        target=target,
        draft=draft,
        device=device,
        workload=conf.Workload(seeds=seeds),
        base_dir=Path.cwd(),
    )
