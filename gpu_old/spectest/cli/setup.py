"""``spectest setup ENGINE``: make an engine's pinned environment and its model exports.

Thin: parses the engine name and options, calls ``spectest.setup.<engine>.setup`` (which
streams a progress line at least every 10 s to stderr) and prints where things are."""

from __future__ import annotations

from typing import Annotated

import typer

from spectest.cli.common import boundary

ENGINES = ("openvino", "mistralrs", "mlx")


@boundary
def setup(
    engine: Annotated[str, typer.Argument(help="openvino, mistralrs or mlx")],
    version: Annotated[
        str | None,
        typer.Option("--version", help="mistralrs only: the release (0.5.0 default, 0.6.0)"),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="recreate the environment")] = False,
) -> None:
    """Create (once, cached under ~/.cache/spectest/ENGINE/VERSION) the pinned virtual
    environment an engine program runs in, and export spectest's tiny-llama fixture for it.
    Never installs into spectest's own environment. A second call returns at once."""
    from spectest.errors import ConfigError

    if engine == "openvino":
        from spectest.setup import openvino

        if version is not None and version != openvino.VERSION:
            raise ConfigError(f"--version: openvino is pinned to {openvino.VERSION}")
        info = openvino.setup(force=force)
    elif engine == "mistralrs":
        from spectest.setup import mistralrs

        info = mistralrs.setup(version or mistralrs.VERSION, force=force)
    elif engine == "mlx":
        from spectest.setup import mlx

        if version is not None and version != mlx.VERSION:
            raise ConfigError(f"--version: mlx-lm is pinned to {mlx.VERSION}")
        info = mlx.setup(force=force)
    else:
        raise ConfigError(
            f"spectest setup: unknown engine {engine!r} (known: {', '.join(ENGINES)})"
        )
    typer.echo(f"{engine}: python {info['python']}")
    models = info["models"]
    assert isinstance(models, dict)
    for spec, path in models.items():
        typer.echo(f"{engine}: {spec} -> {path}")
    typer.echo(f"{engine}: ready ({info['wall_s']} s)")
