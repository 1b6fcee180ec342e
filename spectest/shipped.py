"""The protocols shipped with spectest: where they live, their descriptions, and how a bare
``--config`` name resolves to one.

The why and the details: docs/internals.md "spectest/shipped.py".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from spectest.errors import ConfigError
from spectest.files import not_regular, refused

PACKAGE_DIR = "protocols_data"  # inside the spectest package (a symlink in a checkout)
REPO_DIR = "protocols"
_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class ShippedProtocol:
    """One shipped protocol file: its name (file stem), path and one-line description."""

    name: str
    file: Path
    description: str


def shipped_dir() -> Path | None:
    """The directory of the shipped protocols, or ``None`` when this install has none."""
    here = Path(__file__).resolve().parent
    for d in (here / PACKAGE_DIR, here.parent / REPO_DIR):
        if d.is_dir() and any(d.glob("*.yaml")):
            return d.resolve()
    return None


def _description(f: Path) -> str:
    try:
        raw = yaml.safe_load(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        return f"(unreadable: {type(err).__name__})"
    desc = raw.get("description", "") if isinstance(raw, dict) else ""
    return " ".join(str(desc or "").split())


def list_shipped() -> list[ShippedProtocol]:
    """Every shipped protocol, sorted by name (empty when the install has none)."""
    d = shipped_dir()
    if d is None:
        return []
    files = sorted(
        (f for f in d.iterdir() if f.suffix in _SUFFIXES and f.is_file()), key=lambda f: f.stem
    )
    return [ShippedProtocol(f.stem, f, _description(f)) for f in files]


def shipped_name(path: str | os.PathLike[str]) -> str | None:
    """The file name of ``path`` when it is one of the shipped protocols, else ``None``."""
    d = shipped_dir()
    if d is None:
        return None
    p = Path(path).resolve()
    return p.name if p.parent == d and p.is_file() else None


def resolve_protocol_file(path: str | os.PathLike[str]) -> tuple[Path, bool]:
    """The protocol file ``--config PATH`` means, and whether it is a shipped one.

    Local first (``PATH``, then ``PATH.yaml``); then, for a bare name or ``protocols/NAME``,
    the shipped ``NAME`` / ``NAME.yaml``. Otherwise ``ConfigError`` naming ``PATH`` and the
    shipped names — or, when ``PATH`` is there but is not a regular file (a directory, a FIFO)
    and no shipped one matches, ``InfrastructureError`` (exit 4) naming it; an ``OSError`` of
    the file system (a directory that cannot be searched) passes through."""
    p = Path(path)  # (click makes --config '' the path ".", a directory: exit 4)
    if p.is_file():
        return p, False
    named = bool(p.name)  # "." and "/" have no name to add a suffix to (with_name raises)
    if named and p.suffix not in _SUFFIXES:
        for suffix in _SUFFIXES:
            local = p.with_name(p.name + suffix)
            if local.is_file():
                return local, False
    parts = p.parts
    bare = len(parts) == 1 or (len(parts) == 2 and parts[0] == REPO_DIR)
    d = shipped_dir()
    if bare and d is not None and p.name not in ("", ".", ".."):
        names = [p.name] if p.suffix in _SUFFIXES else [p.name + s for s in _SUFFIXES]
        for name in names:
            f = d / name
            if f.is_file():
                return f, True
    suffixed = (
        [p.with_name(p.name + s) for s in _SUFFIXES] if named and p.suffix not in _SUFFIXES else []
    )
    for cand in (p, *suffixed):
        try:  # there but not a regular file (a directory, a FIFO): the machine's (exit 4)
            why = not_regular(cand.stat().st_mode)
        except (FileNotFoundError, NotADirectoryError):
            continue
        if why is not None:
            raise refused(cand, "protocol file", why)
    shipped = ", ".join(s.name for s in list_shipped()) or "none in this install"
    raise ConfigError(
        f"{path}: no such protocol file (shipped protocols: {shipped}; "
        "`spectest protocols` lists them)"
    )
