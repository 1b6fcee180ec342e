"""notebooks/review.ipynb executes (nbclient) against a small stored run and shows its verdict."""

from __future__ import annotations

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
    result = run_protocol(proto, out=tmp_path / "run")
    monkeypatch.setenv("SPECTEST_RUN_DIR", str(result.run_dir))
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
