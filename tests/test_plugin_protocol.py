"""A protocol outside the checkout (issue 34.2): the example plug-in's ``my-engine.yaml``, copied
to a temporary directory and run from there as a user runs it (a real ``spectest run``
subprocess, the plug-in found through its entry point), names a prompt set shipped with spectest
(``prompts: {shipped: NAME}``); a prompt file that is not found is one line naming each folder
looked in once and the shipped sets. Exact checks (no statistics)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from test_engine_seam import _plugin_distribution

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "examples" / "plugin"
SHIPPED = "english-2, english-8, ids-fixture, ids-tiny"


def spectest(*args: str, cwd: Path, pythonpath: list[Path]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, [REPO, *pythonpath])),
           "OMP_NUM_THREADS": "1", "SPECTEST_NO_PROGRESS": "1"}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "spectest", *args], cwd=cwd, env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip


def test_readme_protocol_is_the_shipped_file_and_the_install_line_uses_no_deps() -> None:
    readme = (PLUGIN / "README.md").read_text()
    block = readme.split("```yaml\n# my-engine.yaml", 1)[1].split("```", 1)[0]
    assert "# my-engine.yaml" + block == (PLUGIN / "my-engine.yaml").read_text()
    install = next(ln for ln in readme.splitlines() if ln.startswith("pip install"))
    assert "--no-deps" in install.split("#")[0], install


def test_plugin_protocol_runs_from_its_own_folder_outside_the_checkout(tmp_path: Path) -> None:
    """It was exit 2: ``no such prompt file 'prompts/english-2.jsonl' (looked in X/prompts,
    X/prompts)``."""
    here = tmp_path / "my-plugin"
    here.mkdir()
    shutil.copy(PLUGIN / "my-engine.yaml", here / "my-engine.yaml")
    site = _plugin_distribution(tmp_path / "site")
    r = spectest("run", "--config", "my-engine.yaml", "--seeds", "120", "--out", "run",
                 cwd=here, pythonpath=[PLUGIN / "src", site])  # fmt: skip
    assert r.returncode in (0, 3), r.stdout + r.stderr  # 120 seeds may be too few for 0
    assert "tested: 4 of 4 cell-positions" in r.stdout, r.stdout
    prompts = (here / "run" / "prompts.jsonl").read_text().splitlines()
    first = (REPO / "protocols" / "prompts" / "english-2.jsonl").read_text().splitlines()[0]
    assert [json.loads(p) for p in prompts] == [json.loads(first)]  # limit 1 of the shipped set


def test_missing_prompt_file_names_each_folder_once_and_the_shipped_sets(tmp_path: Path) -> None:
    text = (PLUGIN / "my-engine.yaml").read_text()
    old = "prompts: {shipped: english-2, limit: 1}"
    assert old in text
    (tmp_path / "p.yaml").write_text(
        text.replace(old, "prompts: {file: prompts/english-2.jsonl, limit: 1}")
    )
    r = spectest("run", "--config", "p.yaml", cwd=tmp_path, pythonpath=[])
    assert r.returncode == 2, r.stdout + r.stderr
    line = r.stderr.strip()
    want = (
        f"prompts.file: no such prompt file 'prompts/english-2.jsonl' (looked in "
        f"{tmp_path.resolve() / 'prompts'}); the shipped prompt sets are {SHIPPED} (name one "
        "with prompts: {shipped: NAME} from a protocol anywhere)"
    )
    assert line.startswith("error: ") and line.endswith(want), line
    (tmp_path / "q.yaml").write_text(text.replace(old, "prompts: {shipped: english-3}"))
    r = spectest("run", "--config", "q.yaml", cwd=tmp_path, pythonpath=[])
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().endswith(
        f"prompts.shipped: no shipped prompt set 'english-3'; the shipped prompt sets are "
        f"{SHIPPED} (name one with prompts: {{shipped: NAME}} from a protocol anywhere)"
    ), r.stderr
    (tmp_path / "r.yaml").write_text(
        text.replace(old, "prompts: {shipped: english-2, file: x.jsonl}")
    )
    r = spectest("run", "--config", "r.yaml", cwd=tmp_path, pythonpath=[])
    assert r.returncode == 2 and "prompts: give exactly one of file or shipped" in r.stderr
