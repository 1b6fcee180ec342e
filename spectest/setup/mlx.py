"""MLX-LM on Linux CPU: its pinned environment (``SPEC``), ``setup`` and the launcher
(``python -m spectest.setup.mlx run ...``). Knows nothing about the line protocol or sampling.

The why and the details: docs/internals.md "spectest/setup/mlx.py".
"""

from __future__ import annotations

import sys
from pathlib import Path

from spectest.errors import ConfigError
from spectest.setup.venv import (
    EnvSpec,
    Log,
    module_main,
    setup_report,
    stderr_log,
)

VERSION = "0.32.2"  # mlx-lm
PROGRAM = "mlx_lm_engine.py"
CHECK = (
    "import json, importlib.metadata as m, mlx.core as mx, mlx_lm; "
    "print(json.dumps({p: m.version(p) for p in ('mlx-lm', 'mlx', 'mlx-cpu', 'transformers')}))"
)
SPEC = EnvSpec(
    engine="mlx",
    version=VERSION,
    requirements=("mlx==0.32.4", "mlx-cpu==0.32.4", f"mlx-lm=={VERSION}", "transformers==5.24.0"),
    check=CHECK,
)


def model_dir(model: str) -> Path:
    """The HF directory mlx-lm loads: a fixture's (built on first use) or a directory."""
    p = Path(model)
    if (p / "config.json").is_file():
        return p
    if not model.startswith("fixture:"):
        raise ConfigError(f"mlx: model {model!r}: expected fixture:NAME/ROLE or an HF directory")
    from spectest.models.fixtures import hf_dir, parse_fixture_spec

    return hf_dir(*parse_fixture_spec(model[len("fixture:") :]))


def setup(log: Log = stderr_log, force: bool = False) -> dict[str, object]:
    """``spectest setup mlx``: the environment (the fixtures need no export)."""
    return setup_report(SPEC, log, force, model_dir, ("tiny-llama",))


if __name__ == "__main__":
    sys.exit(
        module_main("spectest.setup.mlx", sys.argv[1:], setup, PROGRAM, lambda _: SPEC, model_dir)
    )
