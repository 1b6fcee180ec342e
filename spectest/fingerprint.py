"""What each arm runs, hashed (``arm_fingerprint``): the provenance that a resume must find
unchanged.

The why and the details: docs/internals.md "spectest/fingerprint.py".
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, entry_points, version
from pathlib import Path
from typing import Any

from spectest.files import sha256_file

UNFINGERPRINTED = "unfingerprinted"  # the key of an arm's fingerprint that says why not


@dataclass(frozen=True)
class Fingerprint:
    """An arm's provenance: ``items`` maps what was hashed (``file:/abs/path``,
    ``package:name``, ``engine-version:name``) to its digest or version; ``unfingerprinted``
    says, in words, what could not be hashed (None: everything the arm runs is covered)."""

    items: tuple[tuple[str, str], ...] = ()
    unfingerprinted: str | None = None

    def to_dict(self) -> dict[str, str]:
        out = dict(self.items)
        if self.unfingerprinted is not None:
            out[UNFINGERPRINTED] = self.unfingerprinted
        return out


_CACHE: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) → sha256, per process
MAX_HASHED_BYTES = 256 << 20  # a larger file (a model's weights) is fingerprinted by size + mtime


def _file_digest(p: Path) -> str:
    st = p.stat()
    if st.st_size > MAX_HASHED_BYTES:
        return f"stat:{st.st_size}:{st.st_mtime_ns}"
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key not in _CACHE:
        _CACHE[key] = sha256_file(p)
    return _CACHE[key]


def _candidates(token: str, cwd: Path) -> Iterable[Path]:
    """Paths a string may name: itself, its part after ``=`` (``--model=x``), the part before
    the last ``:`` (``kernel.py:fn``), each relative to ``cwd`` when not absolute."""
    parts = {token, token.partition("=")[2], token.rpartition(":")[0]}
    for part in sorted(p for p in parts if p and "\n" not in p and len(p) < 4096):
        raw = Path(os.path.expanduser(part))
        yield raw if raw.is_absolute() else cwd / raw


def _files_in(values: Iterable[str], cwd: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        for p in _candidates(v, cwd):
            try:
                if p.is_file():
                    out[f"file:{p.resolve()}"] = _file_digest(p.resolve())
            except OSError:  # unreadable, a name too long: nothing to hash
                continue
    return out


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def _program(argv: Iterable[str]) -> dict[str, str]:
    """The program of an argv found on PATH (``python3``, ``llama-server``), hashed."""
    first = next(iter(argv), "")
    found = shutil.which(first) if first and os.sep not in first else None
    return {f"file:{Path(found).resolve()}": _file_digest(Path(found).resolve())} if found else {}


def _module(module: str) -> dict[str, str]:
    """A module named in a kernel spec or an entry point: its file and its package's version."""
    out: dict[str, str] = {}
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin and Path(spec.origin).is_file():
        out[f"file:{Path(spec.origin).resolve()}"] = _file_digest(Path(spec.origin))
    top = module.partition(".")[0]
    try:
        out[f"package:{top}"] = version(top)
    except PackageNotFoundError:
        pass
    return out


def _plugin(name: str) -> dict[str, str]:
    """An entry-point engine: its distribution's name and version, and its module's file."""
    out: dict[str, str] = {}
    for ep in entry_points(group="spectest.engines"):
        if ep.name == name:
            if ep.dist is not None:
                out[f"package:{ep.dist.name}"] = str(ep.dist.version)
            out.update(_module(ep.value.partition(":")[0]))
    return out


def arm_fingerprint(
    name: str,
    options: Mapping[str, Any],
    engine_version: str | None,
    *,
    expand: Callable[[tuple[str, ...]], tuple[str, ...]] = lambda argv: argv,
    builtin: Collection[str] = (),
) -> Fingerprint:
    """The fingerprint of an engine ``name`` with canonical ``options`` (``EngineChoice``).

    Notes
    -----
    Every string among the options that names an existing file (relative ones against the
    command's ``cwd``, else the working directory; ``{python}`` / ``{programs}`` expanded) is
    hashed by content, so a command engine's program and the files among its arguments, a
    kernel file and a server binary are covered; an argv's first word found on PATH is hashed
    too. A file reached only indirectly (a module the program imports) is not: a plug-in
    package's version and an engine's declared ``version`` (a class attribute) stand for
    those. An HTTP engine given a ``url`` (a server spectest does not start) cannot be
    fingerprinted, and says so. ``expand`` resolves a command's placeholders
    (``engines.command.expand``); an engine not in ``builtin`` (spectest's own names) is a
    plug-in, whose distribution's version is part of the fingerprint.
    """
    strings = expand(tuple(_strings(options)))
    cwd = Path(str(options.get("cwd") or "") or os.getcwd())
    items = _files_in(strings, cwd)
    for key in ("command", "server"):
        if options.get(key):
            items.update(_program(expand(tuple(options[key]))))
    kernel = str(options.get("kernel") or "")
    target = kernel.rpartition(":")[0]
    if kernel and not target.endswith(".py"):
        items.update(_module(target))
    if name not in builtin:
        items.update(_plugin(name))
    if engine_version:
        items[f"engine-version:{name}"] = engine_version
    why = None
    if options.get("url") and not options.get("server"):
        why = (
            f"a running server at {options['url']} (spectest does not start it, so what it runs "
            "cannot be hashed)"
        )
    return Fingerprint(tuple(sorted(items.items())), why)


def digest(fp: Mapping[str, str]) -> str:
    """A short digest of a fingerprint's items, for messages."""
    text = "\n".join(f"{k}={v}" for k, v in sorted(fp.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def arm_fingerprints(
    arms: Iterable[Any], version_of: Callable[[str], str | None], **kw: Any
) -> dict[str, dict[str, str]]:
    """Each plan arm's fingerprint (``Arm.engine``: an ``EngineChoice``), as run.json stores it
    (``spectest.store.FINGERPRINTS_KEY``); ``version_of(name)``: an engine's declared version,
    ``kw``: ``arm_fingerprint``'s. Arms of spectest's own loop with no file to name (builtin,
    fast, hf-*) have an empty one."""
    out: dict[str, dict[str, str]] = {}
    memo: dict[str, dict[str, str]] = {}
    for arm in arms:
        canon = arm.engine.canonical()
        key = repr(sorted(canon.items()))
        if key not in memo:
            fp = arm_fingerprint(arm.engine.name, canon, version_of(arm.engine.name), **kw)
            memo[key] = fp.to_dict()
        out[arm.name] = memo[key]
    return out


def what_changed(old: Mapping[str, str], new: Mapping[str, str]) -> str:
    """What differs between two fingerprints of one arm, in words (the first three items)."""
    keys = sorted(set(old) | set(new))
    diffs = [k for k in keys if old.get(k) != new.get(k) and k != UNFINGERPRINTED]
    words = []
    for k in diffs[:3]:
        what = k.partition(":")[2] or k
        if k not in old:
            words.append(f"{what} (not recorded before)")
        elif k not in new:
            words.append(f"{what} (no longer used)")
        else:
            words.append(f"{what} ({str(old[k])[:12]} → {str(new[k])[:12]})")
    more = f" and {len(diffs) - 3} more" if len(diffs) > 3 else ""
    return ", ".join(words) + more
