"""The house rules of ``spectest/`` as exact checks on its source (ast, no imports run).

- no function over 60 lines and no module over 500, docstrings included (tools/ and benchmarks/
  too);
- a module docstring says what the module owns and points on: at most 40 lines;
- the import graph (module-level AND function-level imports, ``TYPE_CHECKING`` ones too) has no
  cycle, and no import runs back up the layers of ``LAYERS`` (a module imports only its own layer
  or lower ones);
- nothing in ``spectest/`` reaches into ``tools/`` or ``scripts/`` (the package runs without them).

docs/architecture.md describes the layers in words; this is the check.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "spectest"
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 500
MAX_DOCSTRING_LINES = 40

# The layers, bottom to top: each top-level module or package of spectest/ (the first name after
# ``spectest.``) may import its own layer or lower ones, never a higher one.
LAYERS: dict[str, int] = {
    # 0: foundations that know nothing of spectest's concepts
    "spectest": 0,
    "errors": 0,
    "seeding": 0,
    "schema": 0,
    "contain": 0,
    "supervise": 0,
    "sequential": 0,
    "acceptors": 0,
    "shipped": 0,
    "progress": 0,
    "files": 0,
    # 1: the store, the sampling maths, the statistics (torch-free)
    "store": 1,
    "stored": 1,
    "fingerprint": 1,
    "sampling": 1,
    "stats": 1,
    # 2: models; tooth sizes; BYO samples
    "models": 2,
    "numerics": 2,
    "tooth_size": 2,
    "byo": 2,
    # 3: engines, prompts, environment set-up
    "engines": 3,
    "prompts": 3,
    "setup": 3,
    "readiness": 3,
    # 4-5: protocols, then what is planned, summarised and sized from them
    "protocol": 4,
    "plan": 5,
    "sizing": 5,
    # 6: generation and the tooth-size phase beside it, and the commands beside the run (bench,
    # conformance, hunt)
    "generation": 6,
    "reuse": 6,
    "teeth_phase": 6,
    "bench": 6,
    "conformance": 6,
    "hunt": 6,
    # 7-9: the run path; the decision (judge, claims, ladder, verdict, summary) and the reports
    # that render its summary sit on one floor
    "scaleout": 7,
    "decision": 7,
    "report": 7,
    "byo_compare": 8,
    "runner": 8,
    "analyze": 9,
    # 10-11: the command line
    "cli": 10,
    "__main__": 11,
}


def _modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PKG.rglob("*.py")):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


MODULES = _modules()
TREES = {m: ast.parse(f.read_text(), str(f)) for m, f in MODULES.items()}


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(mod: str) -> set[str]:
    """The spectest modules ``mod`` imports anywhere in its body (``from pkg import sub`` is
    an import of ``pkg.sub`` when that is a module)."""
    is_pkg = MODULES[mod].name == "__init__.py"
    out: set[str | None] = set()
    for node in ast.walk(TREES[mod]):
        if isinstance(node, ast.Import):
            out |= {_resolve(a.name) for a in node.names if a.name.startswith("spectest")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if not name.startswith("spectest"):
                continue
            for a in node.names:
                sub = f"{name}.{a.name}"
                out.add(sub if sub in MODULES else _resolve(name))
    out.discard(mod)
    out.discard(None)
    return {m for m in out if m is not None}


GRAPH = {m: _imports(m) for m in MODULES}


def _top(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "spectest"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = len(index)
                stack.append(w)
                on.add(w)
                work.append((w, iter(sorted(graph[w]))))
            elif w in on:
                low[v] = min(low[v], index[w])
    return out


def test_cycle_finder_finds_a_cycle() -> None:
    """The checker itself can fail: a three-module loop and a self-contained pair are found."""
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert sorted(_cycles(g)) == [["a", "b", "c"], ["d", "e"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_import_graph_has_no_cycle() -> None:
    assert len(GRAPH) > 80 and sum(map(len, GRAPH.values())) > 200  # the walk sees the house
    assert _cycles(GRAPH) == []


def test_every_top_level_name_has_a_layer() -> None:
    assert {_top(m) for m in MODULES} == set(LAYERS)


def test_no_import_runs_back_up() -> None:
    up = [
        f"{m} (layer {LAYERS[_top(m)]}) imports {w} (layer {LAYERS[_top(w)]})"
        for m, out in sorted(GRAPH.items())
        for w in sorted(out)
        if LAYERS[_top(w)] > LAYERS[_top(m)]
    ]
    assert not up, up


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_no_function_over_60_lines() -> None:
    long = [
        f"{MODULES[m].relative_to(ROOT)}:{fn.lineno} {fn.name}: {n} lines"
        for m, tree in TREES.items()
        for fn in _functions(tree)
        if (n := (fn.end_lineno or fn.lineno) - fn.lineno + 1) > MAX_FUNCTION_LINES
    ]
    assert not long, long


def test_no_module_over_500_lines() -> None:
    long = {
        str(f.relative_to(ROOT)): n
        for f in MODULES.values()
        if (n := len(f.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, long


def test_module_docstrings_are_short() -> None:
    long = {
        str(MODULES[m].relative_to(ROOT)): n
        for m, tree in TREES.items()
        if (n := len((ast.get_docstring(tree) or "").splitlines())) > MAX_DOCSTRING_LINES
    }
    assert not long, long


def _code_strings(tree: ast.AST) -> list[ast.Constant]:
    """String constants that are not docstrings."""
    docs = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            docs.add(id(body[0].value))
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def test_nothing_in_the_package_reaches_into_tools_or_scripts() -> None:
    found = []
    for m, tree in TREES.items():
        rel = str(MODULES[m].relative_to(PKG))
        for node in _code_strings(tree):
            head = node.value.split("/")[0]
            if head in ("tools", "scripts"):
                found.append(f"{rel}:{node.lineno} {node.value[:60]!r}")
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                names.append(getattr(node, "module", None) or "")
                found += [
                    f"{rel}:{node.lineno} imports {n}"
                    for n in names
                    if n.split(".")[0] in ("tools", "fuzzing", "pair", "corpus", "train_pair")
                ]
    assert not found, found


# ---- tools/ and benchmarks/ under the same size rules -------------------------------------

OUTSIDE_DIRS = ("tools", "benchmarks")
# tools/ and benchmarks/ under the package's caps (issue 30 item 4): no allow-list
OUTSIDE_MAX_FUNCTION_LINES = MAX_FUNCTION_LINES
OUTSIDE_MAX_MODULE_LINES = MAX_MODULE_LINES


def _outside_files() -> list[Path]:
    return sorted(f for d in OUTSIDE_DIRS for f in (ROOT / d).rglob("*.py"))


def test_tools_and_benchmarks_functions_at_most_60_lines() -> None:
    long = {
        f"{f.relative_to(ROOT)} {fn.name}": n
        for f in _outside_files()
        for fn in _functions(ast.parse(f.read_text(), str(f)))
        if (n := (fn.end_lineno or fn.lineno) - fn.lineno + 1) > OUTSIDE_MAX_FUNCTION_LINES
    }
    assert not long, long


def test_tools_and_benchmarks_modules_at_most_500_lines() -> None:
    long = {
        str(f.relative_to(ROOT)): n
        for f in _outside_files()
        if (n := len(f.read_text().splitlines())) > OUTSIDE_MAX_MODULE_LINES
    }
    assert not long, long
