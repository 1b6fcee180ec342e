"""The documented contract stays true: README's exit-code table lists exactly ``ExitCode``, the
help text names every code, and the example CI workflow (examples/ci/spectest.yml) parses,
handles every exit code, and calls ``spectest run`` only with options the CLI has."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

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
