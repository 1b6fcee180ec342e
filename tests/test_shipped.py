"""The documented command from anywhere (issue 9, bullet 5): a bare ``--config`` name resolves
to a shipped protocol when no such local file exists (a local file always wins), the run
records which file it used, ``spectest protocols`` lists them. That a wheel built from this tree
carries the protocols and their prompt sets, and runs ``ci`` by name from another directory
recording the shipped file it used, is checked on the wheel tests/test_wheel_protocols.py builds
and installs anyway (here until session 11, with a second wheel of the same tree)."""

from __future__ import annotations

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
