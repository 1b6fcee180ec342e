"""The training corpus of the bundled pair: English text that ships with CPython, built on demand.

Owns: which text goes in (``pydoc_data.topics`` and the standard library's docstrings), the
document order, the deterministic train / dev / validation split, the token streams, and the
corpus fingerprint (sha256). Knows nothing about models or training; nothing here is downloaded
and nothing from the corpus is committed.

Documents, in this order
------------------------
1. One document per ``pydoc_data.topics.topics`` entry, keys sorted.
2. One document per ``.py`` file of the standard library (``sysconfig`` ``stdlib`` path), files
   in sorted walk order, skipping ``site-packages``, test directories and ``__pycache__``: the
   module, class and function docstrings in source order (``ast.get_docstring``, cleaned),
   joined by a blank line. Sources are parsed with ``ast``, never imported (no side effects).

Split: document ``i`` goes to validation if ``i % 20 == 0``, to dev (early stopping) if
``i % 20 == 10``, else to training. A split's token stream is ``[BOS] + bytes + [EOS]`` per
document, concatenated in document order.

Usage: ``python -m spectest.models.corpus --out .corpus`` writes ``documents.jsonl`` and
``meta.json`` (sha256, sizes, Python version) for the training script to read.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from spectest.errors import InputError
from spectest.models import bytetok

SPLIT_PERIOD = 20  # every 20th document to validation, the one 10 later to dev
VAL_OFFSET = 0
DEV_OFFSET = 10
SKIP_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
)
DOCUMENTS_FILE = "documents.jsonl"
META_FILE = "meta.json"


@dataclass(frozen=True)
class CorpusMeta:
    """Fingerprint and sizes of one built corpus (what a model card records)."""

    sha256: str  # of the canonical serialisation: each document's UTF-8 bytes + b"\\0"
    num_documents: int
    num_bytes: int  # UTF-8 bytes over all documents
    train_bytes: int
    dev_bytes: int
    val_bytes: int
    python_version: str
    source: str


def split_of(index: int) -> str:
    """``"val"``, ``"dev"`` or ``"train"`` for document ``index`` (0-based, corpus order)."""
    r = index % SPLIT_PERIOD
    return "val" if r == VAL_OFFSET else "dev" if r == DEV_OFFSET else "train"


def pydoc_topic_documents() -> Iterator[str]:
    """The ``pydoc_data.topics`` texts, keys sorted (a pure data module: safe to import)."""
    from pydoc_data.topics import topics

    for key in sorted(topics):
        text = topics[key].strip()
        if text:
            yield text


def _docstrings_in_order(tree: ast.AST) -> Iterator[str]:
    """Module, class and function docstrings in source order (depth first)."""
    if isinstance(tree, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        doc = ast.get_docstring(tree, clean=True)
        if doc:
            yield doc.strip()
    for child in ast.iter_child_nodes(tree):
        yield from _docstrings_in_order(child)


def stdlib_source_files(root: str | None = None) -> list[Path]:
    """Sorted ``.py`` files of the standard library, test and site-packages directories skipped."""
    base = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    if not base.is_dir():
        raise InputError(f"corpus: standard library directory not found: {str(base)!r}")
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(base):
        # NOTE: sorting dirnames in place fixes the walk order, so the corpus is deterministic.
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return files


def stdlib_docstring_documents(root: str | None = None) -> Iterator[str]:
    """One document per standard-library source file: its docstrings joined by blank lines."""
    for path in stdlib_source_files(root):
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError, UnicodeDecodeError):
            continue  # a file this Python cannot parse contributes nothing
        text = "\n\n".join(_docstrings_in_order(tree))
        if text:
            yield text


def iter_documents(stdlib_root: str | None = None) -> Iterator[str]:
    """All corpus documents in corpus order (topics, then stdlib files)."""
    yield from pydoc_topic_documents()
    yield from stdlib_docstring_documents(stdlib_root)


def build_documents(stdlib_root: str | None = None) -> list[str]:
    """The whole corpus as a list of documents (about 2.2 MB of text on CPython 3.11)."""
    return list(iter_documents(stdlib_root))


def fingerprint(documents: list[str]) -> CorpusMeta:
    """sha256 and sizes of ``documents`` (split sizes in UTF-8 bytes, specials excluded)."""
    h = hashlib.sha256()
    sizes = {"train": 0, "dev": 0, "val": 0}
    for i, doc in enumerate(documents):
        data = doc.encode("utf-8")
        h.update(data + b"\0")
        sizes[split_of(i)] += len(data)
    return CorpusMeta(
        sha256=h.hexdigest(),
        num_documents=len(documents),
        num_bytes=sum(sizes.values()),
        train_bytes=sizes["train"],
        dev_bytes=sizes["dev"],
        val_bytes=sizes["val"],
        python_version=sys.version.split()[0],
        source="pydoc_data.topics + standard-library docstrings (ast)",
    )


def split_stream(documents: list[str], split: str) -> np.ndarray:
    """Token stream ``[BOS] + bytes + [EOS]`` per document of ``split``, concatenated.

    Returns int64 ids ``[N]``.
    """
    if split not in ("train", "dev", "val"):
        raise InputError(f"corpus: split must be 'train', 'dev' or 'val', got {split!r}")
    parts = [
        np.array(bytetok.encode(doc, bos=True, eos=True), dtype=np.int64)
        for i, doc in enumerate(documents)
        if split_of(i) == split
    ]
    if not parts:
        raise InputError(f"corpus: split {split!r} is empty ({len(documents)} documents)")
    return np.concatenate(parts)  # [N]


def validation_prefix_documents(min_bytes: int) -> tuple[list[str], str]:
    """The first validation documents until they hold ``min_bytes`` bytes, and their sha256.

    Builds only as much of the corpus as needed (the first validation documents are pydoc
    topics), so a test can check the recorded validation loss in well under a second. The hash
    covers the returned documents only, serialised as in ``fingerprint``.
    """
    out: list[str] = []
    total = 0
    h = hashlib.sha256()
    for i, doc in enumerate(iter_documents()):
        if split_of(i) != "val":
            continue
        out.append(doc)
        data = doc.encode("utf-8")
        h.update(data + b"\0")
        total += len(data)
        if total >= min_bytes:
            break
    return out, h.hexdigest()


def save(documents: list[str], out: Path) -> CorpusMeta:
    """Write ``documents.jsonl`` (one ``{"i", "split", "text"}`` per line) and ``meta.json``."""
    out.mkdir(parents=True, exist_ok=True)
    meta = fingerprint(documents)
    with open(out / DOCUMENTS_FILE, "w", encoding="utf-8") as f:
        for i, doc in enumerate(documents):
            f.write(json.dumps({"i": i, "split": split_of(i), "text": doc}) + "\n")
    (out / META_FILE).write_text(json.dumps(asdict(meta), indent=2) + "\n", encoding="utf-8")
    return meta


def load(directory: Path) -> tuple[list[str], CorpusMeta]:
    """Read a corpus written by ``save``; the sha256 is recomputed and must match ``meta.json``."""
    docs_path, meta_path = directory / DOCUMENTS_FILE, directory / META_FILE
    if not docs_path.is_file() or not meta_path.is_file():
        raise InputError(f"corpus: {str(directory)!r} lacks {DOCUMENTS_FILE} or {META_FILE}")
    with open(docs_path, encoding="utf-8") as f:
        documents = [json.loads(line)["text"] for line in f]
    recorded = CorpusMeta(**json.loads(meta_path.read_text(encoding="utf-8")))
    actual = fingerprint(documents)
    if actual.sha256 != recorded.sha256:
        raise InputError(
            f"corpus: {str(docs_path)!r} has sha256 {actual.sha256!r}, "
            f"meta.json says {recorded.sha256!r}"
        )
    return documents, recorded


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the bundled pair's training corpus.")
    parser.add_argument("--out", type=Path, required=True, help="output directory (e.g. .corpus)")
    args = parser.parse_args(argv)
    meta = save(build_documents(), args.out)
    print(json.dumps(asdict(meta), indent=2))


if __name__ == "__main__":
    main()
