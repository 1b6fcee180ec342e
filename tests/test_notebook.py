"""notebooks/review.ipynb executes (nbclient) against a small stored run, found by default as the
newest under results/, and shows its verdict; ``latest_run`` picks the newest completed run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from toy_protocol import write_toy

REPO = Path(__file__).resolve().parents[1]


def test_review_notebook_runs_on_a_small_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from spectest.protocol import load_protocol
    from spectest.runner import run_protocol

    small = {"alpha": 0.05, "trie": {"depth": 1, "min_count": 50}, "null_permutations": 20}
    proto = load_protocol(write_toy(tmp_path, seeds={"per_arm": 60}, tests=small))
    # no SPECTEST_RUN_DIR: the notebook opens the newest completed run under results/ (runs
    # are results/<name>-<hash10>); an older run beside it must not be the one shown
    older = tmp_path / "results" / "older-0000000000"
    older.mkdir(parents=True)
    (older / "manifest.json").write_text("{}")
    os.utime(older / "manifest.json", (1, 1))
    result = run_protocol(proto, out=tmp_path / "results" / "toy-0123456789")
    monkeypatch.delenv("SPECTEST_RUN_DIR", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(REPO / "notebooks" / "review.ipynb", as_version=4)
    nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = " ".join(str(o.get("data", {}).get("text/markdown", "")) for o in outputs)
    assert result.summary["verdict"]["decision"].upper() in text
    assert any("image/png" in o.get("data", {}) for o in outputs)
    check_says_what_the_run_says(nb, result)


def tagged(nb: Any, tag: str) -> list[dict[str, Any]]:
    cell = next(c for c in nb.cells if tag in c.get("metadata", {}).get("tags", []))
    return list(cell.get("outputs", []))


def check_says_what_the_run_says(nb: Any, result: Any) -> None:
    """Issue 34.6: the notebook opens with the run directory it loaded and the same three
    things as every other output — headline, scope (tested) and resolution — read from
    summary.json (it showed the reasons list as its headline); its per-cell table holds the
    candidate's cells only (sorted across arms, its top rows were all the mutant's); the seed
    ranges are ranges."""
    from spectest.report.escape import md_text

    first = str(tagged(nb, "verdict")[0]["data"]["text/markdown"])
    lines = [ln.rstrip() for ln in first.splitlines() if ln.strip()]  # "  ": a line break
    verdict = result.summary["verdict"]
    assert lines[0] == f"Run directory: `{result.run_dir.resolve()}`", lines[0]
    assert lines[1] == f"**{md_text(verdict['headline'])}**", lines[1]  # the claim, first
    scope = verdict["scope"]
    assert lines[2] == f"*{md_text(scope['tested'])}*", lines[2]
    assert lines[3] == f"*{md_text(scope['resolution'])}*", lines[3]
    assert lines[4] == f"- {md_text(verdict['reasons'][0])}", lines[4]  # reasons after
    table = str(tagged(nb, "per-cell")[0]["data"]["text/plain"])
    others = [c["arm"] for c in result.summary["comparisons"] if c["arm"] != "candidate"]
    words = set(table.split())
    assert "candidate" in words and others, table
    assert not words & set(others), table  # null, eps=0.5, mutant:always_accept
    shown = tagged(nb, "provenance")
    prov = " ".join(str(o.get("data", {}).get("text/markdown", "")) for o in shown)
    assert "Seed ranges per arm: reference 0–59" in prov and "{" not in prov, prov


def test_latest_run_is_the_newest_completed_one(tmp_path: Path) -> None:
    from spectest.errors import ConfigError
    from spectest.stored import latest_run

    with pytest.raises(ConfigError, match="no completed run"):
        latest_run(tmp_path)
    for name, t in (("a-1", 100), ("b-2", 300), ("c-3", 200)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text("{}")
        os.utime(tmp_path / name / "manifest.json", (t, t))
    (tmp_path / "d-4").mkdir()  # incomplete: no manifest, never chosen
    assert latest_run(tmp_path) == tmp_path / "b-2"
    assert latest_run(tmp_path / "c-3") == tmp_path / "c-3"  # a run directory itself
