"""Issue 33 item 1: a plug-in cannot talk the gate into "equivalent" by dying, exiting or
hanging. Each case is a real ``python -m spectest`` process (what is tested is the process's
exit code) on the toy protocol with teeth off; only the exit path matters.

Before ``spectest.supervise`` (the tree of 2026-12-02): a kernel's ``os._exit(0)`` ended the run
with exit 0 and no output, ``os._exit(3)`` with 3 ("inconclusive"), ``SIGKILL`` of itself with
137, an ``atexit`` hook's ``os._exit(0)`` turned a contained exit 2 into 0, a kernel that never
returned hung for ever (``--plugin-timeout`` did not exist: exit 2 as an unknown option) and
SIGTERM gave 143 without the ``interrupted:`` line.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from toy_protocol import write_toy

from spectest.cli.supervised import protocol_plugins, raw_plugins
from spectest.errors import ConfigError
from spectest.shipped import shipped_dir
from spectest.store import MANIFEST, SUMMARY
from spectest.supervise import Outcome, check_timeout, run_supervised

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from fuzzing.common import EXACT_ACCEPT as EXACT  # the exact kernel's one copy

ROOT = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    "OMP_NUM_THREADS": "1",
    "SPECTEST_NO_PROGRESS": "1",
}
NO_TEETH = {"null_arm": False, "epsilons": [], "mutants": []}


def kernel(d: Path, *, at_import: str = "", in_call: str = "") -> Path:
    """A kernel file; ``in_call`` runs before the correct return of the exact sampler."""
    f = d / "k.py"
    body = textwrap.indent(in_call, "    ") + "\n" if in_call else ""
    f.write_text(
        "import os, signal, sys, time\nimport torch\n"
        + (at_import + "\n" if at_import else "")
        + "def accept(draft_probs, draft_token_ids, uniforms, target_probs):\n"
        + body
        + textwrap.indent(EXACT, "    ")
    )
    return f


def spectest_popen(d: Path, k: Path, *extra: object) -> subprocess.Popen[str]:
    proto = write_toy(d / "proto", teeth=NO_TEETH, seeds={"per_arm": 20}, positions=2)
    argv = [sys.executable, "-m", "spectest", "run", "--config", str(proto), "--out",
            str(d / "run"), "--set", f"candidate=acceptor:{k}:accept", "--no-progress",
            *map(str, extra)]  # fmt: skip
    return subprocess.Popen(
        argv, cwd=d, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def run(d: Path, k: Path, *extra: object) -> tuple[int, str, str]:
    p = spectest_popen(d, k, *extra)
    out, err = p.communicate(timeout=600)
    return p.returncode, out, err


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def assert_not_complete_and_unlocked(run_dir: Path) -> None:
    """No result is presented, and the run directory's lock is free (a re-run can resume)."""
    assert not (run_dir / MANIFEST).exists()
    if (run_dir / SUMMARY).exists():
        assert json.loads((run_dir / SUMMARY).read_text())["complete"] is False
    if (run_dir / ".lock").exists():
        fd = os.open(run_dir / ".lock", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: a stale holder
        finally:
            os.close(fd)


def no_process_mentions(marker: str) -> None:
    """No live process has ``marker`` in its command line (no orphaned child or worker)."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            assert marker.encode() not in cmd, (proc.name, cmd)


DEATHS = {
    "os_exit0": ("os._exit(0)", "(it exited with status 0)"),
    "os_exit3": ("os._exit(3)", "(it exited with status 3)"),
    "sigkill_self": ("os.kill(os.getpid(), signal.SIGKILL)", "(it was killed by SIGKILL)"),
}


@pytest.mark.parametrize("case", sorted(DEATHS))
def test_a_kernel_that_ends_the_process_in_a_call_is_exit_2_naming_it(
    tmp_path: Path, case: str
) -> None:
    code, how = DEATHS[case]
    k = kernel(tmp_path, in_call=code)
    rc, out, err = run(tmp_path, k)
    assert rc == 2, (rc, out, err)
    line = one_line(err)
    assert line == (
        f"error: acceptor {k}:accept: calling the kernel ended spectest's process {how}; a "
        "plug-in must return or raise, never end the process: no verdict"
    )
    assert out == ""
    assert_not_complete_and_unlocked(tmp_path / "run")


def test_a_kernel_that_ends_the_process_at_import_is_exit_2_naming_it(tmp_path: Path) -> None:
    k = kernel(tmp_path, at_import="os._exit(0)")
    rc, out, err = run(tmp_path, k)
    assert rc == 2, (rc, out, err)
    assert one_line(err) == (
        f"error: acceptor {k}:accept: importing the kernel ended spectest's process (it exited "
        "with status 0); a plug-in must return or raise, never end the process: no verdict"
    )
    assert_not_complete_and_unlocked(tmp_path / "run")


def test_an_atexit_hook_cannot_turn_a_contained_error_into_exit_0(tmp_path: Path) -> None:
    """The kernel's ``sys.exit(0)`` is contained (exit 2, its line); its ``atexit`` hook then
    calls ``os._exit(0)`` as the interpreter ends: spectest's announced 2 stands."""
    k = kernel(
        tmp_path,
        at_import="import atexit\natexit.register(lambda: os._exit(0))",
        in_call="sys.exit(0)",
    )
    rc, out, err = run(tmp_path, k)
    assert rc == 2, (rc, out, err)
    assert one_line(err).startswith(f"error: acceptor {k}:accept: the kernel called sys.exit(0)")
    assert_not_complete_and_unlocked(tmp_path / "run")


def test_a_kernel_past_the_timeout_is_stopped_and_named(tmp_path: Path) -> None:
    k = kernel(tmp_path, in_call="time.sleep(3600)")
    t0 = time.monotonic()
    rc, out, err = run(tmp_path, k, "--plugin-timeout", "2")
    assert rc == 2, (rc, out, err)
    assert one_line(err) == (
        f"error: acceptor {k}:accept: calling the kernel gave no answer within 2 s (the limit "
        "on one plug-in call: --plugin-timeout); it was stopped: no verdict"
    )
    assert time.monotonic() - t0 < 300
    assert_not_complete_and_unlocked(tmp_path / "run")
    no_process_mentions(str(tmp_path / "run"))


def test_a_slow_kernel_under_the_timeout_gives_the_verdict(tmp_path: Path) -> None:
    """0.2 s per call under a 5 s limit: the run completes, its exit is the stored verdict's
    (whatever it is at 20 seeds: only the exit path is tested)."""
    k = kernel(tmp_path, in_call="time.sleep(0.2)")
    rc, out, err = run(tmp_path, k, "--plugin-timeout", "5")
    summary = json.loads((tmp_path / "run" / SUMMARY).read_text())
    assert summary["complete"] is True
    assert rc == summary["verdict"]["exit_code"] and rc in (0, 1, 3), (rc, out, err)
    assert err == "", err


def interrupt_a_hang(tmp_path: Path, sig: int) -> tuple[int, str, str]:
    """``sig`` to a run whose kernel hangs in its first call: (exit code, stdout, stderr)."""
    started = tmp_path / "started"
    k = kernel(tmp_path, in_call=f"open({str(started)!r}, 'w').close()\ntime.sleep(3600)")
    p = spectest_popen(tmp_path, k)
    deadline = time.monotonic() + 300
    while not started.exists():
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.1)
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert err.strip() == "interrupted: completed shards are kept; re-run to resume", err
    return p.returncode, out, err


def test_sigterm_during_a_hang_is_the_interrupted_line_and_143(tmp_path: Path) -> None:
    rc, out, err = interrupt_a_hang(tmp_path, signal.SIGTERM)
    assert rc == 143, (out, err)
    assert_not_complete_and_unlocked(tmp_path / "run")
    no_process_mentions(str(tmp_path / "run"))


def test_ctrl_c_during_a_hang_is_130(tmp_path: Path) -> None:
    """SIGINT to the supervisor reaches the child's group: the child's own boundary says it."""
    rc, out, err = interrupt_a_hang(tmp_path, signal.SIGINT)
    assert rc == 130, (out, err)
    no_process_mentions(str(tmp_path / "run"))


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e9"])
def test_plugin_timeout_is_validated(tmp_path: Path, value: str) -> None:
    k = kernel(tmp_path)
    rc, out, err = run(tmp_path, k, "--plugin-timeout", value)
    assert rc == 2, (rc, out, err)
    assert one_line(err).startswith("error: --plugin-timeout: expected seconds in (0, 604800]")


def test_check_timeout() -> None:
    assert check_timeout(600) == 600.0
    for bad in (0, -1.0, float("nan"), float("inf"), 1e9, True, "5"):
        with pytest.raises(ConfigError):
            check_timeout(bad)


# ----------------------------------------------------------------------------- entry points
ENGINE_MODULE = """
import os, time
from dataclasses import dataclass

from spectest.engines.base import Engine

MODE = {mode!r}


class Hostile(Engine):
    name = "hostile"
    needs = "target"
    whitebox = "none"
    rounds = "none"

    @dataclass(frozen=True)
    class Options:
        pass

    def generate(self, job):
        if MODE == "exit":
            os._exit(0)
        time.sleep(3600)
"""


@pytest.mark.parametrize("mode", ["exit", "hang"])
def test_an_entry_point_engine_that_dies_or_hangs_is_exit_2_naming_it(
    tmp_path: Path, mode: str
) -> None:
    site = tmp_path / "site"
    (site / "hostile_engine").mkdir(parents=True)
    (site / "hostile_engine" / "__init__.py").write_text(ENGINE_MODULE.format(mode=mode))
    info = site / "hostile_engine-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hostile-engine\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[spectest.engines]\nhostile = hostile_engine:Hostile\n")
    proto = write_toy(
        tmp_path / "proto", teeth=NO_TEETH, seeds={"per_arm": 20}, positions=2, version=2,
        engines={"candidate": {"name": "hostile"}},
    )  # fmt: skip
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}
    r = subprocess.run(
        [sys.executable, "-m", "spectest", "run", "--config", str(proto), "--out",
         str(tmp_path / "run"), "--no-progress", "--plugin-timeout", "2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    line = one_line(r.stderr)
    who = "error: engine 'hostile' (hostile_engine:Hostile): calling its generate"
    if mode == "exit":
        assert line.startswith(f"{who} ended spectest's process (it exited with status 0)"), line
    else:
        assert line.startswith(f"{who} gave no answer within 2 s"), line
    assert_not_complete_and_unlocked(tmp_path / "run")


# ----------------------------------------------------------------------------- the pieces
def test_protocol_plugins_reads_the_yaml_and_the_sets(tmp_path: Path) -> None:
    """Every shipped protocol names no plug-in (so none of them is supervised, and the main
    job runs as before); ``--set`` adds one the way the protocol would."""
    d = shipped_dir()
    assert d is not None
    for f in sorted(d.glob("*.yaml")):
        assert protocol_plugins(f) == [] or all(
            p.startswith("acceptor spectest.acceptors.") for p in protocol_plugins(f)
        ), f
    assert protocol_plugins("ci", ["candidate=acceptor:/k.py:accept"]) == ["acceptor /k.py:accept"]
    assert protocol_plugins("ci", ["engines.candidate.name=mine", "version=2"]) == ["engine 'mine'"]
    assert raw_plugins({"engines": {"candidate": {"name": "acceptor", "kernel": "m:f"}}}) == [
        "acceptor m:f"
    ]
    assert raw_plugins({"engine": {"candidate": "hf-assisted"}}) == []
    bad = tmp_path / "bad.yaml"
    bad.write_text("{unclosed")
    assert protocol_plugins(bad) == []


def _child(tmp: Path, code: str, *, verdict: bool = True) -> Outcome:
    prog = tmp / "child.py"
    prog.write_text(
        "import json, os, sys, time\nfrom spectest import supervise as s\n" + textwrap.dedent(code)
    )
    return run_supervised([sys.executable, str(prog)], ["p"], 2.0, verdict=verdict)


def test_a_verdict_code_stands_only_with_its_summary(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])
    rd = tmp_path / "rd"
    rd.mkdir()
    (rd / SUMMARY).write_text(json.dumps({"complete": True, "verdict": {"exit_code": 0}}))
    ok = _child(tmp_path, f"s.announce_verdict(0, {str(rd)!r}); s.announce_exit(0)")
    assert ok == Outcome(0)
    no_verdict = _child(tmp_path, "s.announce_exit(0)")
    assert no_verdict.code == 4 and "without a stored verdict" in (no_verdict.line or "")
    other = _child(tmp_path, f"s.announce_verdict(1, {str(rd)!r}); s.announce_exit(1)")
    assert other.code == 4
    assert _child(tmp_path, "s.announce_exit(0)", verdict=False) == Outcome(0)
    assert _child(tmp_path, "s.announce_exit(2); os._exit(0)") == Outcome(2)
    silent = _child(tmp_path, "os._exit(0)")
    assert silent.code == 4 and "outside any plug-in call (it exited with status 0)" in (
        silent.line or ""
    )
    inside = _child(tmp_path, "with s.plugin_call('acceptor x', 'calling the kernel'):\n"
                    "    os._exit(1)")  # fmt: skip
    assert inside.code == 2 and (inside.line or "").startswith(
        "acceptor x: calling the kernel ended spectest's process (it exited with status 1)"
    )
    hang = _child(tmp_path, "with s.plugin_call('engine e', 'calling its generate'):\n"
                  "    time.sleep(60)")  # fmt: skip
    assert hang.code == 2 and (hang.line or "").startswith(
        "engine e: calling its generate gave no answer within 2 s"
    )


def test_a_heartbeat_keeps_a_long_call_alive(tmp_path: Path, monkeypatch) -> None:
    """An engine's generate that reports progress every 0.5 s for 4 s under a 2 s limit."""
    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])
    out = _child(tmp_path, """\
        with s.plugin_call('engine e', 'calling its generate'):
            for _ in range(8):
                time.sleep(0.5)
                s.heartbeat()
        s.announce_exit(2)
    """)  # fmt: skip
    assert out == Outcome(2)


def test_unsupervised_marks_cost_nothing_and_write_nothing(tmp_path: Path) -> None:
    """Without ``SPECTEST_SUPERVISOR`` (every run without a plug-in, library use) a mark is a
    no-op: nothing is written anywhere."""
    code = (
        "import os; os.environ.pop('SPECTEST_SUPERVISOR', None)\n"
        "from spectest import supervise as s\n"
        "with s.plugin_call('a', 'b'):\n    pass\n"
        "print(s.watching(), s.is_supervised_child())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True)
    assert r.stdout.strip() == "False False", r.stderr


def test_conformance_of_a_kernel_that_ends_the_process_is_exit_2_naming_it(
    tmp_path: Path,
) -> None:
    """``spectest conformance acceptor --options '{kernel: ...}'`` loads the kernel too: it is
    supervised like a run (before: exit 0 and nothing printed after the kernel's os._exit(0))."""
    k = kernel(tmp_path, in_call="os._exit(0)")
    r = subprocess.run(
        [sys.executable, "-m", "spectest", "conformance", "acceptor", "--options",
         f"{{kernel: '{k}:accept'}}", "--target", "toy:V=16,order=2,scale=2.0,seed=3",
         "--draft", "toy:V=16,order=2,scale=1.0,seed=4", "--seeds", "2"],
        cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert one_line(r.stderr) == (
        f"error: acceptor {k}:accept: calling the kernel ended spectest's process (it exited "
        "with status 0); a plug-in must return or raise, never end the process: no verdict"
    )
