"""What a protocol needs on this machine beyond spectest (``Need``, ``protocol_needs``) and
``require_ready``, the pre-flight of ``spectest run`` (one line, exit 4, "run `spectest setup
X` first").

The why and the details: docs/internals.md "spectest/readiness.py".
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from spectest.setup.venv import EnvMissing

SETUP_ENGINES = ("openvino", "mistralrs", "mlx")  # python -m spectest.setup.NAME programs


@dataclass(frozen=True)
class Need:
    """One thing a protocol needs: ``what`` (``spectest setup llamacpp``, ``GPU``) and why it is
    missing on this machine (``None``: it is there)."""

    what: str
    missing: str | None

    @property
    def ready(self) -> bool:
        return self.missing is None


def _argv_of(options: Any) -> tuple[str, ...]:
    out: list[str] = []
    for key in ("command", "server"):
        v = getattr(options, key, None)
        if isinstance(v, tuple):
            out.extend(a for a in v if isinstance(a, str))
    return tuple(out)


def _env_missing(engine: str) -> str | None:
    from spectest.setup.venv import ready_info

    mod = importlib.import_module(f"spectest.setup.{engine}")
    spec = getattr(mod, "SPEC", None)
    if spec is None:
        specs = mod.SPECS
        spec = specs[mod.VERSION]
    if ready_info(spec) is not None:
        return None
    return f"{engine} {spec.version}: no environment: run `{spec.setup_command}` first"


def _llamacpp_missing(converter: bool = False) -> str | None:
    from spectest.setup import llamacpp

    return llamacpp.missing_reason(converter)


def _vllm_missing() -> str | None:
    import os

    if os.environ.get("SPECTEST_VLLM_PYTHON"):
        return None
    from spectest.setup import vllm_cpu

    return vllm_cpu.missing_reason()


def _gpu_missing() -> str | None:
    try:
        import torch
    except ImportError:
        return "no torch"
    if torch.cuda.is_available():
        return None
    return "needs a CUDA GPU, and this machine has none (or run it with --device cpu)"


def argv_needs(argv: Iterable[str]) -> list[tuple[str, Callable[[], str | None]]]:
    """The set-up steps an engine command line needs (label, how to tell it is missing)."""
    args = list(argv)
    joined = " ".join(args)
    out: list[tuple[str, Callable[[], str | None]]] = []
    if "{gguf:" in joined:  # the build's converter, whatever SPECTEST_LLAMA_SERVER says
        out.append(("spectest setup llamacpp", lambda: _llamacpp_missing(converter=True)))
    elif "{llama_server}" in joined:
        out.append(("spectest setup llamacpp", _llamacpp_missing))
    if "{vllm_python}" in joined:
        out.append(("spectest setup vllm-cpu", _vllm_missing))
    for i, a in enumerate(args[:-1]):
        if a == "-m" and args[i + 1].startswith("spectest.setup."):
            engine = args[i + 1].split(".")[2]
            if engine in SETUP_ENGINES:
                out.append((f"spectest setup {engine}", functools.partial(_env_missing, engine)))
    return out


def _needs(argvs: Iterable[tuple[str, ...]], device: str) -> list[Need]:
    found: dict[str, Callable[[], str | None]] = {}
    for argv in argvs:
        for what, check in argv_needs(argv):
            found.setdefault(what, check)
    if device.startswith("cuda"):
        found.setdefault("GPU", _gpu_missing)
    return [Need(what, check()) for what, check in found.items()]


def protocol_needs(protocol: Any) -> list[Need]:
    """Every need of a loaded ``Protocol`` (each once, in a stable order)."""
    argvs = [_argv_of(c.options) for c in (protocol.reference_engine, protocol.candidate_engine)]
    return _needs(argvs, str(protocol.models.device))


def file_needs(raw: Any) -> list[Need]:
    """The same from a protocol file's parsed YAML, without loading it (``spectest protocols``
    lists every shipped file this way: no torch import). Unknown shapes need nothing here;
    ``load_protocol`` judges them when the protocol runs."""
    if not isinstance(raw, dict):
        return []
    argvs: list[tuple[str, ...]] = []
    engines = raw.get("engines")
    for arm in engines.values() if isinstance(engines, dict) else ():
        for key in ("command", "server"):
            v = arm.get(key) if isinstance(arm, dict) else None
            if isinstance(v, str):
                argvs.append(tuple(v.split()))
            elif isinstance(v, list):
                argvs.append(tuple(a for a in v if isinstance(a, str)))
    models = raw.get("models")
    device = models.get("device", "cpu") if isinstance(models, dict) else "cpu"
    return _needs(argvs, str(device))


def require_ready(protocol: Any) -> None:
    """``EnvMissing`` (exit 4), one line, when a set-up step ``protocol`` needs is missing here.
    A missing GPU is not one: a CUDA protocol on a machine without CUDA is a usage error the
    run's own device check names (``models.device``, exit 2); ``spectest protocols`` lists it."""
    missing = [n for n in protocol_needs(protocol) if not n.ready and n.what != "GPU"]
    if missing:
        raise EnvMissing(f"protocol {protocol.name}: {missing[0].missing}")
