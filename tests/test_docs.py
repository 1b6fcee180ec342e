"""docs/ stays true of the code: docs/architecture.md names every module of ``spectest/`` and only
modules that exist; every ``docs/FILE.md "Section"`` the code cites is a file with that heading;
nothing cites the lab notes outside the repository; docs/bugs.md's catalogue table is the mutant
catalogue. Exact checks, no models."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from spectest.sampling.mutants import VARIANT_NAMES, get_variant

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CITING = ("spectest", "tests", "examples", "scripts", "tools", "benchmarks", "docs")
OUTSIDE = ("tools/", "scripts/")  # rows of docs/architecture.md's "Outside the package" table


def _sources() -> list[Path]:
    out = []
    for d in CITING:
        for ext in ("*.py", "*.md", "*.sh", "*.yaml", "*.toml"):
            out += (ROOT / d).rglob(ext)
    return [p for p in out if p.is_file()]


def test_architecture_names_every_module_and_only_modules_that_exist() -> None:
    text = (DOCS / "architecture.md").read_text()
    rows = set(re.findall(r"^\| `([\w/]+\.py)` \|", text, flags=re.M))
    outside = {r for r in rows if r.startswith(OUTSIDE)}
    assert all((ROOT / r).is_file() for r in outside), sorted(
        r for r in outside if not (ROOT / r).is_file()
    )
    named = rows - outside
    modules = {str(p.relative_to(ROOT / "spectest")) for p in (ROOT / "spectest").rglob("*.py")}
    assert not modules - named, (
        f"modules docs/architecture.md does not name: {sorted(modules - named)}"
    )
    assert not named - modules, (
        f"named in docs/architecture.md, not in spectest/: {sorted(named - modules)}"
    )


def test_every_docs_citation_resolves() -> None:
    headings: dict[str, set[str]] = {}
    for f in DOCS.glob("*.md"):
        headings[f.name] = {m.strip() for m in re.findall(r"^#+ (.+)$", f.read_text(), flags=re.M)}
    cited = 0
    for src in _sources():
        if src.name == "test_docs.py":
            continue
        text = src.read_text(encoding="utf-8", errors="replace")
        for name, section in re.findall(r'docs/([\w-]+\.md)(?: "([^"]+)")?', text):
            cited += 1
            assert name in headings, (
                f"{src.relative_to(ROOT)} cites docs/{name}, which is not there"
            )
            if section:
                assert section in headings[name], (
                    f"{src.relative_to(ROOT)} cites docs/{name} {section!r}; its headings: "
                    f"{sorted(headings[name])}"
                )
    assert cited > 20  # the code does cite docs/


def test_nothing_cites_notes_outside_the_repository() -> None:
    for src in _sources():
        if src.name == "test_docs.py":
            continue
        text = src.read_text(encoding="utf-8", errors="replace")
        for bad in ("STATS.md", "BUGS.md", "DESIGN.md", "../shared"):
            assert bad not in text, f"{src.relative_to(ROOT)} cites {bad}"


def test_bugs_catalogue_table_is_the_mutant_catalogue() -> None:
    text = (DOCS / "bugs.md").read_text()
    table = text[text.index("| variant | exact | mirrors |") :]
    rows = re.findall(r"^\| `([\w]+)` \| (yes|no) \| (.*) \|$", table, flags=re.M)
    want = []
    for n in VARIANT_NAMES:
        v = get_variant(n if n != "eps_biased" else "eps_biased:0.1")
        want.append((n, "yes" if v.exact else "no", v.mirrors or "(the exact sampler)"))
    assert rows == want


# ---- docs/architecture.md's prose: every dotted name, path, import arrow and "X calls `f`" ----

PKG = ROOT / "spectest"
# Backticked dotted words of docs/architecture.md that are not Python names: YAML paths, the
# entry-point group, the example's hypothetical option. Each must still be in the doc.
NOT_PYTHON = {
    "tests.min_sequences",
    "tests.power.max_mde_tv",
    "tests.sequence",
    "tests.trie.depth",
    "tests.whitebox",
    "limits.max_tokens",
    "spectest.engines",
    "inputs.options.x",
    "plan.settings.options.x",
}
FILE_SUFFIXES = (".py", ".sh", ".md", ".json", ".yaml", ".html", ".parquet")


def _defined(tree: ast.AST) -> dict[str, ast.AST]:
    """Names a module or class body defines (not imports): defs, classes, assignments."""
    out: dict[str, ast.AST] = {}
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
    return out


def _package_modules() -> dict[str, ast.Module]:
    """``stats.battery`` → its AST, for every module of spectest/ (packages as ``stats``)."""
    out = {}
    for f in PKG.rglob("*.py"):
        parts = list(f.relative_to(PKG).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = ast.parse(f.read_text(), str(f))
    return out


MODS = _package_modules()
CLASSES = {
    name: node
    for tree in MODS.values()
    for name, node in _defined(tree).items()
    if isinstance(node, ast.ClassDef)
}


def _foreign(parts: list[str]) -> bool:
    """A name of a package spectest depends on (``torch.topk``), by import."""
    try:
        obj = importlib.import_module(parts[0])
    except ImportError:
        return False
    return all((obj := getattr(obj, p, None)) is not None for p in parts[1:])


def _resolves(dotted: str) -> bool:
    """``module.name[.attr]`` (a module by its path in spectest/, or by a tail of it the
    table's section makes plain: ``base.check_output`` in the engines section), ``Class.attr``
    with ``Class`` defined in spectest/, or a dependency's name (``torch.topk``)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        mod = ".".join(parts[:cut])
        hits = [mod] if mod in MODS else [m for m in MODS if m.endswith("." + mod)]
        if hits:
            return any(_in_scope(MODS[m], parts[cut:]) for m in hits)
    if parts[0] in CLASSES:
        return _in_scope(CLASSES[parts[0]], parts[1:])
    return _foreign(parts)


def _in_scope(scope: ast.AST, names: list[str]) -> bool:
    for i, name in enumerate(names):
        found = _defined(scope).get(name)
        if found is None and isinstance(scope, ast.ClassDef):
            # a property or method: any def of that name inside the class
            found = next((n for n in ast.walk(scope) if getattr(n, "name", None) == name), None)
        if found is None:
            return False
        if isinstance(found, ast.ClassDef):
            scope = found
        elif isinstance(found, (ast.Assign, ast.AnnAssign)) and i < len(names) - 1:
            # an attribute of a value (``Plan.settings.options``): its class from the annotation
            ann = getattr(found, "annotation", None)
            cls = ann.id if isinstance(ann, ast.Name) else None
            if cls not in CLASSES:
                return False
            scope = CLASSES[cls]
    return True


def _imports(tree: ast.Module, here: str) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:  # relative to ``here``
                base = ".".join(["spectest", *here.split(".")[: -node.level], node.module])
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


ARCH = (DOCS / "architecture.md").read_text()
TICKED = set(re.findall(r"`([A-Za-z_][\w./]*)`", ARCH))


def test_architecture_dotted_names_exist() -> None:
    dotted = {t for t in TICKED if "." in t and not t.endswith(FILE_SUFFIXES) and "/" not in t}
    assert NOT_PYTHON <= dotted, sorted(NOT_PYTHON - dotted)  # the exceptions do not rot
    assert len(dotted - NOT_PYTHON) >= 10
    missing = sorted(t for t in dotted - NOT_PYTHON if not _resolves(t))
    assert not missing, f"docs/architecture.md cites names spectest does not define: {missing}"


def test_architecture_paths_exist() -> None:
    paths = {t for t in TICKED if "/" in t and (t.endswith(("/", ".py", ".sh")))}
    missing = sorted(p for p in paths if not ((ROOT / p).exists() or (PKG / p).exists()))
    assert not missing, missing
    # the "Outside the package" table: a file a directory's row names lies in that directory
    for d, row in re.findall(r"^\| `([\w/]+/)` \| (.*) \|$", ARCH, flags=re.M):
        for f in re.findall(r"`([\w.]+\.(?:py|sh))`", row):
            assert (ROOT / d / f).is_file(), f"docs/architecture.md: {d}{f} is not there"


def test_architecture_diagram_arrows_are_imports() -> None:
    diagram = ARCH[ARCH.index("```text") : ARCH.index("```", ARCH.index("```text") + 3)]
    arrows = re.findall(r"([\w/]+)\.py\b[^\n►]*?──►\s*([\w/]+)\.py\b", diagram)
    assert arrows  # the diagram draws some
    for a, b in arrows:
        src, dst = a.replace("/", "."), "spectest." + b.replace("/", ".")
        assert dst in _imports(MODS[src], src), f"diagram: {a}.py ──► {b}.py, no such import"


def _calls(tree: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            f = n.func
            out.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return out


def test_architecture_who_calls_what() -> None:
    claims = re.findall(r"(?:\bthe (\w+)|`([\w/]+)\.py`) calls `(\w+)`", ARCH)
    assert claims
    for word, path, fn in claims:
        mod = (path or word).replace("/", ".")
        assert mod in MODS, f"docs/architecture.md: 'the {mod} calls' names no module"
        assert fn in _calls(MODS[mod]), f"docs/architecture.md: {mod}.py never calls {fn}"
