"""spectest.setup: the pinned-venv cache (create once, under a lock, with progress lines, never
half-ready), the missing-environment message (one line, exit 4, the setup command named), the
mistral.rs export and the ``spectest setup`` CLI. Real venvs and a real pip, installing a tiny
wheel built here (``--no-index``: nothing is downloaded)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from spectest.errors import ExitCode
from spectest.setup import venv

ROOT = Path(__file__).resolve().parents[1]


def dummy_wheel(where: Path, version: str = "0.1") -> Path:
    """A pure-Python wheel of package ``spectest_dummy`` (exact format, no build backend)."""
    name = f"spectest_dummy-{version}"
    files = {
        "spectest_dummy/__init__.py": f"VERSION = {version!r}\n",
        f"{name}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: spectest-dummy\nVersion: {version}\n"
        ),
        f"{name}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{name}.dist-info/RECORD,,")
    files[f"{name}.dist-info/RECORD"] = "\n".join(record) + "\n"
    whl = where / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return whl


CHECK = "import json, spectest_dummy; print(json.dumps({'spectest-dummy': spectest_dummy.VERSION}))"


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECTEST_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def spec_for(wheels: Path, req: str = "spectest-dummy==0.1") -> venv.EnvSpec:
    return venv.EnvSpec(
        engine="dummy",
        version="0.1",
        requirements=(req,),
        check=CHECK,
        pip_args=("--no-index", "--find-links", str(wheels)),
    )


def test_missing_environment_is_one_line_exit_4_naming_the_setup_command(cache: Path) -> None:
    spec = spec_for(cache)
    with pytest.raises(venv.EnvMissing) as e:
        venv.require(spec)
    assert e.value.exit_code == ExitCode.INFRASTRUCTURE
    msg = str(e.value)
    assert "\n" not in msg and msg.endswith('run "spectest setup dummy" first')
    assert str(cache / "dummy" / "0.1" / "venv") in msg
    other = venv.EnvSpec("mistralrs", "0.6.0", (), "", setup_args="--version 0.6.0")
    assert other.setup_command == "spectest setup mistralrs --version 0.6.0"


def test_ensure_creates_once_under_a_lock_and_records_what_it_made(
    cache: Path, tmp_path: Path
) -> None:
    dummy_wheel(tmp_path)
    spec = spec_for(tmp_path)
    lines: list[str] = []
    results: list[Path] = []
    lock = threading.Lock()

    def worker() -> None:
        py = venv.ensure(spec, log=lambda s: (lock.acquire(), lines.append(s), lock.release()))
        results.append(py)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    py = cache / "dummy" / "0.1" / "venv" / "bin" / "python"
    assert results == [py, py]
    assert sum("creating" in s for s in lines) == 1  # one install; the other waited or found it
    info = venv.ready_info(spec)
    assert info is not None
    assert info["versions"] == {"spectest-dummy": "0.1"}
    assert info["requirements"] == ["spectest-dummy==0.1"]
    out = subprocess.run(
        [str(py), "-c", "import spectest_dummy, sys; print(sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == str(cache / "dummy" / "0.1" / "venv")
    with pytest.raises(ImportError):  # never installed into spectest's own environment
        __import__("spectest_dummy")
    log = (cache / "dummy" / "0.1" / "install.log").read_text()
    assert log.count("pip install") == 1
    start = time.monotonic()
    assert venv.ensure(spec, log=lines.append) == py  # cached: no pip, no venv
    assert time.monotonic() - start < 1.0
    assert venv.require(spec) == py


def test_failed_install_leaves_no_ready_environment_and_the_next_call_starts_over(
    cache: Path, tmp_path: Path
) -> None:
    spec = spec_for(tmp_path, "spectest-dummy==9.9")  # not in the wheel folder
    with pytest.raises(venv.SetupFailed) as e:
        venv.ensure(spec, log=lambda s: None)
    assert e.value.exit_code == ExitCode.INFRASTRUCTURE
    assert "install.log" in str(e.value) and "\n" not in str(e.value)
    assert venv.ready_info(spec) is None
    with pytest.raises(venv.EnvMissing):
        venv.require(spec)
    dummy_wheel(tmp_path, "9.9")
    lines: list[str] = []
    py = venv.ensure(spec, log=lines.append)
    assert any("removing the unfinished environment" in s for s in lines)
    assert venv.require(spec) == py


def test_run_logged_prints_progress_while_output_is_not_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(venv, "PROGRESS_EVERY_S", 0.3)
    lines: list[str] = []
    cmd = [
        sys.executable,
        "-c",
        "import time\nfor i in range(4):\n print('step', i, flush=True)\n time.sleep(0.4)",
    ]
    wall = venv.run_logged(cmd, tmp_path / "x.log", "slow step", lines.append)
    assert wall >= 1.5
    assert len(lines) >= 3 and all(s.startswith("slow step: ") for s in lines)
    assert any("step" in s.split("; ", 1)[1] for s in lines)  # the log's last line is shown
    with pytest.raises(venv.SetupFailed, match="exited with status 3"):
        venv.run_logged([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "y.log", "s")


def test_cache_lock_waits_and_says_who_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(venv, "PROGRESS_EVERY_S", 0.2)
    path = tmp_path / "l" / ".lock"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys, time\n"
         f"fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX); os.pwrite(fd, b'%d\\n' % os.getpid(), 0)\n"
         "print('held', flush=True); time.sleep(1.2)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    lines: list[str] = []
    start = time.monotonic()
    with venv.cache_lock(path, "setup x", lines.append):
        waited = time.monotonic() - start
    holder.wait()
    assert waited > 0.5
    assert lines and f"waiting for pid {holder.pid}" in lines[0]


def test_launcher_without_environment_exits_4_with_the_setup_line(cache: Path) -> None:
    for mod, engine in (("spectest.setup.openvino", "openvino"),
                        ("spectest.setup.mistralrs", "mistralrs")):  # fmt: skip
        r = subprocess.run(
            [sys.executable, "-m", mod, "run", "--target", "fixture:tiny-llama/target"],
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert r.returncode == 4, r.stderr
        assert r.stdout == ""
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].endswith(f'run "spectest setup {engine}" first')


def test_spectest_run_of_an_engine_protocol_without_its_environment_exits_4(
    cache: Path, tmp_path: Path
) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "spectest", "run", "--config", "protocols/mistralrs-null.yaml",
         "--out", str(tmp_path / "run"), "--no-progress"],
        capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert r.returncode == 4, r.stdout[-2000:] + r.stderr[-2000:]
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "run `spectest setup mistralrs` first" in err[0]  # the pre-flight


def test_setup_cli_refuses_an_unknown_engine_and_a_foreign_version() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "spectest", "setup", "nope"],
                       capture_output=True, text=True, env=env)  # fmt: skip
    assert r.returncode == 2 and "unknown engine 'nope'" in r.stderr
    r = subprocess.run([sys.executable, "-m", "spectest", "setup", "mistralrs", "--version",
                        "0.9.5"], capture_output=True, text=True, env=env)  # fmt: skip
    assert r.returncode == 2 and "no target/draft speculative decoding" in r.stderr


def test_mistralrs_export_is_an_exact_word_tokenizer_with_an_unreachable_eos(
    tmp_path: Path,
) -> None:
    from tokenizers import Tokenizer

    from spectest.setup import mistralrs

    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(
        json.dumps({"vocab_size": 16, "eos_token_id": 2, "rope_parameters": {"rope_theta": 500.0}})
    )
    (src / "model.safetensors").write_bytes(b"weights")
    dst = tmp_path / "dst"
    dst.mkdir()
    mistralrs.write_export(src, dst, 16)
    cfg = json.loads((dst / "config.json").read_text())
    assert cfg["eos_token_id"] == 16 and cfg["rope_theta"] == 500.0
    assert (dst / "model.safetensors").read_bytes() == b"weights"
    tok = Tokenizer.from_file(str(dst / "tokenizer.json"))
    ids = [1, 0, 15, 2, 7, 7]
    assert tok.encode(" ".join(f"t{i}" for i in ids)).ids == ids
    assert tok.decode(ids).split() == [f"t{i}" for i in ids]
    assert tok.token_to_id("<eos>") == 16
