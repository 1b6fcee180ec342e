"""Pinned virtual environments for the engines spectest drives but never installs into its own:
``EnvSpec``, ``ensure`` / ``require``, ``run_logged``, ``cache_lock``, ``exec_program`` and the
``python -m spectest.setup.ENGINE`` entry point (``module_main``). Knows no engine.

The why and the details: docs/internals.md "spectest/setup/venv.py".
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spectest.errors import InfrastructureError
from spectest.models.fixtures import cache_root

PROGRESS_EVERY_S = 10.0
READY_FILE = ".ready"
EXPORT_FILE = "export.json"  # an exported model's metadata, written last
Log = Callable[[str], None]


def stderr_log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class EnvMissing(InfrastructureError):
    """An engine's environment (or an export it needs) is not on this machine: exit 4, one line
    saying which ``spectest setup`` command makes it."""


class SetupFailed(InfrastructureError):
    """Creating an environment or exporting a model failed: exit 4, with the log's tail."""


@dataclass(frozen=True)
class EnvSpec:
    """One engine's pinned environment.

    ``requirements`` go to one ``pip install`` (every version pinned); ``check`` is Python run
    by the new interpreter that must print one JSON object (the versions it imported; stored in
    ``.ready``); ``pip_args`` are extra pip options (tests pass ``--no-index``).
    """

    engine: str  # cache folder and the name of ``spectest setup ENGINE``
    version: str  # the engine's pinned release (cache sub-folder)
    requirements: tuple[str, ...]
    check: str
    pip_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = field(default=())  # extra environment for pip
    # pip commands run after the install, e.g. ("uninstall", "-y", "torchvision")
    post_pip: tuple[tuple[str, ...], ...] = ()
    setup_args: str = ""  # e.g. "--version 0.6.0" for a release other than the default

    @property
    def setup_command(self) -> str:
        return f"spectest setup {self.engine}" + (f" {self.setup_args}" if self.setup_args else "")


def env_dir(spec: EnvSpec) -> Path:
    """``<cache>/<engine>/<version>``: the venv, the lock, the install log, exported models."""
    return cache_root() / spec.engine / spec.version


def venv_python(spec: EnvSpec) -> Path:
    return env_dir(spec) / "venv" / "bin" / "python"


def ready_info(spec: EnvSpec) -> dict[str, object] | None:
    """What ``.ready`` recorded (pins, versions), or ``None`` when the environment is not ready."""
    f = env_dir(spec) / "venv" / READY_FILE
    if not f.is_file() or not venv_python(spec).is_file():
        return None
    try:
        return dict(json.loads(f.read_text()))
    except (OSError, ValueError):
        return None


def require(spec: EnvSpec) -> Path:
    """The environment's python, or ``EnvMissing`` (exit 4) naming the command that makes it."""
    if ready_info(spec) is None:
        raise EnvMissing(
            f"{spec.engine} {spec.version}: no environment at {env_dir(spec) / 'venv'}: "
            f'run "{spec.setup_command}" first'
        )
    return venv_python(spec)


@contextlib.contextmanager
def cache_lock(path: Path, what: str, log: Log = stderr_log) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created), waited for with a line every
    ``PROGRESS_EVERY_S`` seconds naming the holder's pid; released on exit, and by the kernel
    when this process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        start, next_line = time.monotonic(), 0.0
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                now = time.monotonic()
                if now >= next_line:  # at once, then every PROGRESS_EVERY_S
                    holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
                    who = f"pid {holder}" if holder.isdigit() else "another process"
                    log(f"{what}: waiting for {who} holding {path} ({now - start:.0f} s)")
                    next_line = now + PROGRESS_EVERY_S
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def _du_mb(path: Path) -> float:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total / 1e6


def run_logged(
    argv: Sequence[str],
    log_file: Path,
    what: str,
    log: Log = stderr_log,
    env: dict[str, str] | None = None,
    grow: Path | None = None,
) -> float:
    """Run ``argv`` with its output appended to ``log_file``; a progress line (elapsed time, the
    size of ``grow`` when given, the log's last line) every ``PROGRESS_EVERY_S`` seconds,
    whether or not stdout is a terminal. A non-zero exit is ``SetupFailed`` with the log's last
    lines. Returns the wall time in seconds."""
    start = time.monotonic()
    with open(log_file, "ab") as out:
        out.write(f"$ {' '.join(argv)}\n".encode())
        out.flush()
        try:
            proc = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
            )
        except OSError as err:
            raise SetupFailed(f"{what}: cannot start {argv[0]!r}: {err.strerror}") from None

        def line() -> str:
            size = f", {_du_mb(grow):.0f} MB" if grow is not None and grow.exists() else ""
            return f"{what}: {time.monotonic() - start:.0f} s{size}; {_last_line(log_file)[:100]}"

        wait_logged(proc, PROGRESS_EVERY_S, log, line)
    if proc.returncode != 0:
        tail = " | ".join(_tail(log_file, 4))
        raise SetupFailed(
            f"{what}: {argv[0]} exited with status {proc.returncode}; log {log_file}: {tail}"
        )
    return time.monotonic() - start


def wait_logged(
    proc: subprocess.Popen[Any], every: float, log: Log, line: Callable[[], str]
) -> None:
    """Wait for ``proc``, logging ``line()`` every ``every`` seconds."""
    while True:
        try:
            proc.wait(every)
            return
        except subprocess.TimeoutExpired:
            log(line())


def _tail(path: Path, n: int) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [ln.strip() for ln in lines if ln.strip()][-n:]


def _last_line(path: Path) -> str:
    t = _tail(path, 1)
    return t[0] if t else ""


def ensure(spec: EnvSpec, log: Log = stderr_log, force: bool = False) -> Path:
    """The environment's python, created on first call (``force``: recreate it).

    Under ``cache_lock``: a concurrent call waits, then finds it ready. A fresh install prints a
    line at least every ``PROGRESS_EVERY_S`` seconds and records its wall time and size in
    ``.ready``; a failed one leaves no ``.ready`` (the next call starts over).
    """
    base = env_dir(spec)
    if not force and ready_info(spec) is not None:
        return venv_python(spec)
    with cache_lock(base / ".lock", f"setup {spec.engine}", log):
        if not force and ready_info(spec) is not None:
            return venv_python(spec)  # made by the holder we waited for
        venv = base / "venv"
        log_file = base / "install.log"
        log_file.write_text("")
        if venv.exists():
            log(f"setup {spec.engine}: removing the unfinished environment {venv}")
            shutil.rmtree(venv)
        log(f"setup {spec.engine}: creating {venv} (log: {log_file})")
        start = time.monotonic()
        run_logged([sys.executable, "-m", "venv", str(venv)], log_file, "venv", log)
        py = venv_python(spec)
        log(f"setup {spec.engine}: pip install {' '.join(spec.requirements)}")
        run_logged(
            [str(py), "-m", "pip", "install", "--no-input", *spec.pip_args, *spec.requirements],
            log_file,
            f"setup {spec.engine}: pip install",
            log,
            env=dict(spec.env),
            grow=venv,
        )
        for extra in spec.post_pip:
            log(f"setup {spec.engine}: pip {' '.join(extra)}")
            run_logged([str(py), "-m", "pip", *extra], log_file, f"setup {spec.engine}", log)
        proc = subprocess.run([str(py), "-c", spec.check], capture_output=True, text=True)
        if proc.returncode != 0:
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            raise SetupFailed(f"setup {spec.engine}: the import check failed: {tail}")
        try:
            versions = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise SetupFailed(
                f"setup {spec.engine}: the import check printed no JSON: {proc.stdout[-200:]!r}"
            ) from None
        info = {
            "engine": spec.engine,
            "version": spec.version,
            "requirements": list(spec.requirements),
            "versions": versions,
            "install_s": round(time.monotonic() - start, 1),
            "size_mb": round(_du_mb(venv), 1),
            "python": sys.version.split()[0],
        }
        (venv / READY_FILE).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
        log(
            f"setup {spec.engine}: ready in {info['install_s']} s, {info['size_mb']:.0f} MB "
            f"({', '.join(f'{k} {v}' for k, v in versions.items())})"
        )
        return py


def setup_report(
    spec: EnvSpec,
    log: Log,
    force: bool,
    model: Callable[[str], Path] | None = None,
    names: Sequence[str] = (),
) -> dict[str, object]:
    """What ``spectest setup ENGINE`` made: the environment of ``spec``, then ``model`` of each
    fixture's (``names``) target and draft; paths and the wall time."""
    start = time.monotonic()
    py = ensure(spec, log, force=force)
    specs = [f"fixture:{n}/{r}" for n in names for r in ("target", "draft")]
    models = {m: str(model(m)) for m in specs} if model is not None else {}
    return {"python": str(py), "models": models, "wall_s": round(time.monotonic() - start, 1)}


def program_path(name: str) -> Path:
    """An engine program shipped inside the package (``spectest/engines/programs/NAME``)."""
    return Path(__file__).resolve().parents[1] / "engines" / "programs" / name


def exec_program(python: Path, program: Path, args: Sequence[str]) -> None:
    """Replace this process with ``python program args`` (same pid, same stdin/stdout: the
    command engine keeps talking to it). Never returns."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(str(python), [str(python), str(program), *args])


def export_once(
    out: Path, lock: Path, what: str, log: Log, make: Callable[[Path], tuple[dict[str, Any], str]]
) -> Path:
    """``out``, an exported model, made once under the cache lock ``lock``: ``make(tmp)`` fills a
    fresh directory beside it and returns its metadata (written last, as ``EXPORT_FILE``) and the
    line logged once the directory is renamed into place (a half-made export is never found)."""
    with cache_lock(lock, what, log):
        if (out / EXPORT_FILE).is_file():
            return out
        tmp = out.parent / f".{out.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        meta, done = make(tmp)
        (tmp / EXPORT_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
        log(done)
    return out


def launch_program(
    argv: Sequence[str],
    module: str,
    program: str,
    spec: Callable[[str], EnvSpec],
    model: Callable[[str], Path],
    version: str | None = None,
) -> None:
    """``run [--version V] --target MODEL [--draft MODEL] [-- PROGRAM ARGS]``: the venv (``spec``
    of the version, ``--version`` only where a pinned ``version`` is given) and the models
    (``model``: a fixture → the path the program reads), then become the program (``exec``).
    ``EnvMissing`` (exit 4) when that environment is not set up."""
    ap = argparse.ArgumentParser(prog=f"python -m {module} run")
    if version is not None:
        ap.add_argument("--version", default=version)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", default=None)
    ap.add_argument("rest", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    rest = a.rest[1:] if a.rest[:1] == ["--"] else a.rest
    py = require(spec(getattr(a, "version", "")))
    args = ["--target", str(model(a.target))]
    if a.draft:
        args += ["--draft", str(model(a.draft))]
    exec_program(py, program_path(program), [*args, *rest])


def module_main(
    module: str,
    argv: list[str],
    setup: Callable[[], object],
    program: str,
    spec: Callable[[str], EnvSpec],
    model: Callable[[str], Path],
    version: str | None = None,
) -> int:
    """The ``python -m spectest.setup.ENGINE run ...|setup`` entry point of an engine module:
    ``run`` becomes ``program`` (``launch_program``), ``setup`` prints what ``setup`` made; a
    ``SpectestError`` is one line on stderr and its exit code (4 for a missing environment)."""
    from spectest.errors import ConfigError, SpectestError

    try:
        if argv[:1] == ["run"]:
            launch_program(argv[1:], module, program, spec, model, version)
        elif argv[:1] == ["setup"]:
            print(json.dumps(setup()))
        else:
            raise ConfigError(f"usage: python -m {module} run|setup ...")
    except SpectestError as err:
        print(f"spectest: {err}", file=sys.stderr, flush=True)
        return int(err.exit_code)
    return 0
