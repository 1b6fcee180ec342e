"""notebooks/review.ipynb executes (nbclient) against a small stored run, found by default as the
newest under results/, and shows its verdict; ``latest_run`` picks the newest completed run."""

from __future__ import annotations

import os
from pathlib import Path

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


def test_latest_run_is_the_newest_completed_one(tmp_path: Path) -> None:
    from spectest.errors import ConfigError
    from spectest.report.latest import latest_run

    with pytest.raises(ConfigError, match="no completed run"):
        latest_run(tmp_path)
    for name, t in (("a-1", 100), ("b-2", 300), ("c-3", 200)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text("{}")
        os.utime(tmp_path / name / "manifest.json", (t, t))
    (tmp_path / "d-4").mkdir()  # incomplete: no manifest, never chosen
    assert latest_run(tmp_path) == tmp_path / "b-2"
    assert latest_run(tmp_path / "c-3") == tmp_path / "c-3"  # a run directory itself
