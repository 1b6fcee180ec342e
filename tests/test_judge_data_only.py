"""``spectest.judge`` decides from data only: it imports (at module or function level) nothing
that drives an engine, loads a model or reads prompts — the runner asks the engines
(``engines.plain_laws.law_table``) and hands the judge tables (issue 30). Exact check on the
source (ast, no imports run)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE_IO = ("spectest.engines", "spectest.generation", "spectest.prompts", "spectest.models")


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_the_judge_imports_no_engine_io() -> None:
    bad = sorted(m for m in _imports(ROOT / "spectest" / "judge.py") if m.startswith(ENGINE_IO))
    assert not bad, f"spectest/judge.py imports engine I/O: {bad}"


def test_the_runner_asks_the_plain_engine_for_its_laws() -> None:
    assert "spectest.engines.plain_laws" in _imports(ROOT / "spectest" / "runner.py")
