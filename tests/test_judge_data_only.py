"""``spectest.decision`` decides from data only: no module of it imports (at module or function
level) anything that drives an engine, loads a model or reads prompts — the runner asks the
engines (``engines.plain_laws.law_table``) and hands the judge tables (issue 30). One module is
set apart, by name: ``decision/header.py`` imports the engine classes to name each arm's engine
in the run's header (``arm_engines``), and decides nothing. Exact check on the source (ast, no
imports run)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE_IO = ("spectest.engines", "spectest.generation", "spectest.prompts", "spectest.models")
HEADER = ROOT / "spectest" / "decision" / "header.py"


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_the_decision_imports_no_engine_io() -> None:
    deciding = sorted(set((ROOT / "spectest" / "decision").glob("*.py")) - {HEADER})
    assert {f.name for f in deciding} >= {"judge.py", "claims.py", "verdict.py", "summary.py"}
    bad = {f.name: sorted(m for m in _imports(f) if m.startswith(ENGINE_IO)) for f in deciding}
    assert not any(bad.values()), f"spectest/decision imports engine I/O: {bad}"


def test_the_runner_asks_the_plain_engine_for_its_laws() -> None:
    assert "spectest.engines.plain_laws" in _imports(ROOT / "spectest" / "runner.py")
