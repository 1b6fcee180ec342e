"""The documented contract stays true: README's exit-code table lists exactly ``ExitCode``, the
help text names every code, and the example CI workflow (examples/ci/spectest.yml) parses,
handles every exit code, and calls ``spectest run`` only with options the CLI has."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from spectest.cli import app
from spectest.cli.common import EXIT_CODES_HELP
from spectest.errors import ExitCode

ROOT = Path(__file__).resolve().parents[1]


def test_readme_exit_code_table_is_exit_code() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Exit codes") :].split("\n\n")[1]
    codes = [int(m) for m in re.findall(r"^\| (\d+) \|", table, flags=re.M)]
    assert codes == [int(c) for c in ExitCode]
    for code in ExitCode:
        assert f"{int(code)} " in EXIT_CODES_HELP


def test_example_workflow_gates_on_every_exit_code() -> None:
    wf = yaml.safe_load((ROOT / "examples" / "ci" / "spectest.yml").read_text())
    steps = wf["jobs"]["gate"]["steps"]
    gate = next(s for s in steps if s.get("id") == "gate")
    script = gate["run"]
    for code in ExitCode:
        assert re.search(rf"^\s*{int(code)}\) echo", script, flags=re.M), code
    assert 'exit "$code"' in script
    command = " ".join(
        ln.strip().rstrip("\\")
        for ln in script.splitlines()
        if ln.strip().startswith(("spectest", "--"))
    )
    argv = shlex.split(command)
    assert argv[:2] == ["spectest", "run"]
    help_text = CliRunner().invoke(app, ["run", "--help"], terminal_width=200).stdout
    for opt in (a for a in argv if a.startswith("--")):
        assert opt in help_text, opt
    assert (ROOT / argv[argv.index("--config") + 1]).is_file()
    assert any("action-junit-report" in str(s.get("uses")) for s in steps)


def _readme_block(heading: str, doc: str = "README.md") -> str:
    """The first ```bash block after ``heading`` in ``doc`` (README.md), as written."""
    readme = (ROOT / doc).read_text()
    rest = readme[readme.index(heading) :]
    return rest.split("```bash\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow
def test_ci_recipe_runs_verbatim_outside_github(tmp_path: Path) -> None:
    """The CI recipe (docs/ci.md, README points there), run as written by bash in an empty
    directory with ``GITHUB_STEP_SUMMARY`` unset (a local try of the recipe): the empty
    ``--summary-md`` is skipped with a note, the verdict is printed, the exit code is the
    verdict's (0), and the JUnit file is written. (The full ``ci`` protocol: ~1 min on 2 busy
    cores, hence slow.)"""
    recipe = _readme_block("## CI: spectest as a merge gate", "docs/ci.md")
    assert recipe.lstrip().startswith("spectest run --config ci"), recipe
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "spectest"  # `spectest` = this interpreter's spectest (the tree under test)
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m spectest "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}
    env.update(PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}", SPECTEST_NO_PROGRESS="1")
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run(
        ["bash", "-c", recipe], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "--summary-md: empty path, skipped (nothing written)" in r.stderr
    assert "EQUIVALENT" in r.stdout
    assert (tmp_path / "spectest-junit.xml").is_file()
    summary = json.loads((tmp_path / "results" / "ci" / "summary.json").read_text())
    assert summary["complete"] is True


def test_empty_output_option_is_skipped_with_a_note() -> None:
    """``--summary-md ""`` / ``--junit ""`` mean "not asked" (an unset CI variable), with a note;
    a real path is a path."""
    from spectest.cli.common import optional_output

    assert optional_output(None, "--junit") is None
    assert optional_output("", "--summary-md") is None
    assert optional_output("  ", "--junit") is None
    assert optional_output("s.md", "--summary-md") == Path("s.md")


@pytest.mark.slow
def test_readme_setup_section_verbatim_in_a_fresh_venv(tmp_path: Path) -> None:
    """README's first command, as written, by bash in a copy of the tree with a fresh venv on
    PATH: a container-like machine whose torch and dependencies are already there
    (``--system-site-packages``; pip may not reach an index: ``PIP_NO_INDEX``, and builds
    without isolation). It installs spectest editable and runs the main job: EQUIVALENT,
    exit 0, with the run's protocol read from the copy. (~2-4 min on 2 busy cores: slow.)"""
    pytest.importorskip("setuptools", reason="an editable build without isolation needs it")
    first = _readme_block("# spectest")
    assert first.strip() == (
        'pip install "torch==2.13.0" -e . && spectest run --config protocols/top_p.yaml'
    ), first
    src = tmp_path / "checkout"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(ROOT / "protocols", src / "protocols", ignore=ignore)
    shutil.copytree(ROOT / "spectest", src / "spectest", symlinks=True, ignore=ignore)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    # Python <= 3.11's venv bundles an old setuptools (no built-in bdist_wheel) that would
    # shadow this machine's: drop it, so the no-isolation build uses the machine's (a no-op
    # where the venv has none).
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-y", "-q",
                    "setuptools"], capture_output=True, timeout=300)  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
        PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0", PIP_DISABLE_PIP_VERSION_CHECK="1",
        SPECTEST_NO_PROGRESS="1", OMP_NUM_THREADS="1",
    )  # fmt: skip
    r = subprocess.run(["bash", "-c", first], cwd=src, env=env, capture_output=True, text=True,
                       timeout=1500)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "EQUIVALENT" in r.stdout
    (run,) = (src / "results").glob("top_p-*/run.json")
    info = json.loads(run.read_text())
    assert (src / info["protocol_source"]).resolve() == (src / "protocols" / "top_p.yaml").resolve()
    r = subprocess.run(["python", "-c", "import spectest; print(spectest.__file__)"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, check=True)  # fmt: skip
    assert Path(r.stdout.strip()).resolve() == (src / "spectest" / "__init__.py").resolve()
