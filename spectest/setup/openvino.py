"""OpenVINO GenAI: its pinned environment (``SPEC``), the fixtures exported to OpenVINO IR
(``export``), ``setup`` and the launcher (``python -m spectest.setup.openvino run ...``). Knows
nothing about the line protocol or sampling.

The why and the details: docs/internals.md "spectest/setup/openvino.py".
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from spectest.errors import ConfigError, SpectestError
from spectest.setup.venv import (
    EXPORT_FILE,
    EnvSpec,
    Log,
    env_dir,
    export_once,
    module_main,
    require,
    run_logged,
    setup_report,
    stderr_log,
)

VERSION = "2026.4.1.0"
PROGRAM = "openvino_genai_engine.py"
CHECK = (
    "import json, importlib.metadata as m, openvino_genai, optimum.intel.openvino; "
    "print(json.dumps({p: m.version(p) for p in ('openvino-genai', 'openvino', "
    "'openvino-tokenizers', 'optimum-intel', 'transformers', 'torch')}))"
)
SPEC = EnvSpec(
    engine="openvino",
    version=VERSION,
    requirements=(
        "torch==2.13.0",
        "openvino==2026.4.1",
        f"openvino-genai=={VERSION}",
        f"openvino-tokenizers=={VERSION}",
        "optimum-intel==2.2.0",
        "optimum==2.3.0",
        "transformers==5.5.4",
        "nncf==3.4.0",
    ),
    check=CHECK,
    post_pip=(("uninstall", "-y", "torchvision"),),
)


EXPORTER = (
    "optimum-cli",
    "export",
    "openvino",
    "--task",
    "text-generation-with-past",
    "--weight-format",
    "fp32",
)


def _fixture(model: str) -> tuple[str, str]:
    from spectest.models.fixtures import parse_fixture_spec

    if not model.startswith("fixture:"):
        raise ConfigError(
            f"openvino: model {model!r}: expected fixture:NAME/target or fixture:NAME/draft, "
            "or a directory holding openvino_model.xml"
        )
    return parse_fixture_spec(model[len("fixture:") :])


def export_dir(model: str) -> Path:
    """Where ``export`` puts (or found) the IR of ``fixture:NAME/ROLE``."""
    from spectest.models.fixtures import fixture_key

    name, role = _fixture(model)
    return env_dir(SPEC) / "models" / f"{name}-{fixture_key(name)[:12]}" / role


def export(model: str, log: Log = stderr_log) -> Path:
    """The OpenVINO IR directory of ``model`` (a fixture spec, exported once and cached; or an
    IR directory, used as it is). Needs the environment (``EnvMissing`` otherwise)."""
    p = Path(model)
    if (p / "openvino_model.xml").is_file():
        return p
    out = export_dir(model)
    if (out / EXPORT_FILE).is_file():
        return out
    py = require(SPEC)
    from spectest.models.fixtures import export_meta, hf_dir

    name, role = _fixture(model)
    src = hf_dir(name, role)

    def make(tmp: Path) -> tuple[dict[str, Any], str]:
        log(f"openvino: exporting {model} ({src}) to OpenVINO IR (about 20-40 s)")
        cli = str(py.parent / "optimum-cli")
        argv = [cli, *EXPORTER[1:3], "--model", str(src), *EXPORTER[3:], str(tmp)]
        wall = run_logged(argv, env_dir(SPEC) / "export.log", f"openvino export {model}", log)
        if not (tmp / "openvino_model.xml").is_file():
            raise SpectestError(f"openvino export {model}: no openvino_model.xml in {tmp}")
        meta = {
            **export_meta(model, name, role, src),
            "exporter": list(EXPORTER),
            "requirements": list(SPEC.requirements),
            "export_s": round(wall, 1),
        }
        return meta, f"openvino: exported {model} in {wall:.0f} s -> {out}"

    lock = env_dir(SPEC) / "export.lock"
    return export_once(out, lock, f"openvino export {model}", log, make)


def setup(
    fixtures: tuple[str, ...] = ("tiny-llama",), log: Log = stderr_log, force: bool = False
) -> dict[str, object]:
    """``spectest setup openvino``: the environment, then the IR of each fixture's target and
    draft (``setup_report``)."""
    return setup_report(SPEC, log, force, lambda m: export(m, log), fixtures)


if __name__ == "__main__":
    sys.exit(
        module_main("spectest.setup.openvino", sys.argv[1:], setup, PROGRAM, lambda _: SPEC, export)
    )
