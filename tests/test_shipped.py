"""The documented command from anywhere (issue 9, bullet 5): a bare ``--config`` name resolves
to a shipped protocol when no such local file exists (a local file always wins), the run
records which file it used, ``spectest protocols`` lists them, and a wheel built from this tree
carries the protocols and their prompt sets (tested by building and installing one into a
temporary directory and running from another)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from toy_protocol import write_toy
from typer.testing import CliRunner

from spectest.cli import app
from spectest.errors import ConfigError
from spectest.protocol import load_protocol
from spectest.shipped import list_shipped, resolve_protocol_file, shipped_dir, shipped_name

ROOT = Path(__file__).resolve().parents[1]
REPO_PROTOCOLS = ROOT / "protocols"


def test_the_shipped_directory_is_the_repository_protocols() -> None:
    d = shipped_dir()
    assert d is not None and d == REPO_PROTOCOLS.resolve()
    names = [p.name for p in list_shipped()]
    assert names == sorted(f.stem for f in REPO_PROTOCOLS.glob("*.yaml"))
    assert {"ci", "top_p", "top_k", "combined"} <= set(names)
    for p in list_shipped():  # every shipped protocol has a one-line description
        desc = yaml.safe_load(p.file.read_text())["description"]
        assert p.description == " ".join(desc.split()) and p.description


@pytest.mark.parametrize("given", ["top_p", "top_p.yaml", "protocols/top_p.yaml"])
def test_bare_names_resolve_to_the_shipped_protocol(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    monkeypatch.chdir(tmp_path)  # no local file of that name
    path, shipped = resolve_protocol_file(given)
    assert shipped and path == REPO_PROTOCOLS.resolve() / "top_p.yaml"
    proto = load_protocol(given)
    assert proto.name == "top_p" and proto.source == str(path)
    assert shipped_name(proto.source) == "top_p.yaml"
    # the shipped prompt set is found beside the shipped protocol, not in the cwd
    assert len(proto.prompts.items) == 2


def test_a_local_file_always_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_toy(tmp_path, name="top_p.yaml")
    for given in ("top_p.yaml", "top_p"):
        path, shipped = resolve_protocol_file(given)
        assert not shipped and path.resolve() == (tmp_path / "top_p.yaml").resolve()
        assert load_protocol(given).name == "toy"
    assert shipped_name(tmp_path / "top_p.yaml") is None
    (tmp_path / "protocols").mkdir()
    write_toy(tmp_path / "protocols", name="ci.yaml")
    assert load_protocol("protocols/ci.yaml").name == "toy"


def test_unknown_names_and_paths_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_protocol("nope")
    msg = str(info.value)
    assert msg.startswith("nope: no such protocol file (shipped protocols: ci, combined,")
    assert "`spectest protocols` lists them" in msg and "\n" not in msg
    # a path with a directory is never taken for a shipped name
    with pytest.raises(ConfigError, match=r"^elsewhere/top_p\.yaml: no such protocol file"):
        load_protocol("elsewhere/top_p.yaml")


def test_protocols_command_lists_names_and_descriptions() -> None:
    r = CliRunner().invoke(app, ["protocols"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert [ln.split()[0] for ln in lines[:-1]] == [p.name for p in list_shipped()]
    for line, p in zip(lines, list_shipped(), strict=False):
        assert line.endswith(f"  {p.description}")
        status = line[len(p.name) :].strip()[: -len(p.description)].strip()
        assert status.startswith(("ready", "needs ")), line  # readiness: test_setup_engines.py


@pytest.mark.slow
def test_built_wheel_ships_protocols_and_runs_from_anywhere(tmp_path: Path) -> None:
    """Build a wheel of this tree, install it into a --target directory, and from an unrelated
    working directory: `python -m spectest protocols`, then a tiny `run --config ci`, which must
    record the shipped file it used. (~1 min on the busy 2-core machine: marked slow.)"""
    pytest.importorskip("setuptools", reason="building a wheel without isolation needs it")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "protocols", src / "protocols", ignore=ignore)
    shutil.copytree(ROOT / "spectest", src / "spectest", symlinks=True, ignore=ignore)
    assert (src / "spectest" / "protocols_data").is_symlink()
    dist, site, cwd = tmp_path / "dist", tmp_path / "site", tmp_path / "elsewhere"
    cwd.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    (wheel,) = dist.glob("spectest-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    for f in REPO_PROTOCOLS.rglob("*"):
        if f.is_file():
            assert f"spectest/protocols_data/{f.relative_to(REPO_PROTOCOLS)}" in names, f
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(site), str(wheel)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    assert not (site / "spectest" / "protocols_data").is_symlink()
    env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "SPECTEST_NO_PROGRESS": "1",
        "OMP_NUM_THREADS": "1",
    }

    def spectest(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "spectest", *args],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip

    r = subprocess.run(
        [sys.executable, "-c", "import spectest; print(spectest.__file__)"],
        cwd=cwd, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert r.stdout.strip() == str(site / "spectest" / "__init__.py")
    r = spectest("protocols")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"in {site / 'spectest' / 'protocols_data'}," in r.stdout
    for p in list_shipped():
        assert p.name in r.stdout
    r = spectest(
        "run", "--config", "ci", "--seeds", "40", "--positions", "2",
        "--set", "tests.whitebox=false", "--out", "r",
    )  # fmt: skip
    assert r.returncode not in (1, 2, 4), r.stdout + r.stderr
    assert "using the shipped protocol" in r.stderr
    info = json.loads((cwd / "r" / "run.json").read_text())
    assert info["protocol_shipped"] == "ci.yaml"
    assert info["protocol_source"] == str(site / "spectest" / "protocols_data" / "ci.yaml")
    assert (cwd / "r" / "manifest.json").is_file()
