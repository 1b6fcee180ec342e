"""docs/ stays true of the code: docs/architecture.md names every module of ``spectest/`` and only
modules that exist; every ``docs/FILE.md "Section"`` the code cites is a file with that heading;
nothing cites the lab notes outside the repository; docs/bugs.md's catalogue table is the mutant
catalogue. Exact checks, no models."""

from __future__ import annotations

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
