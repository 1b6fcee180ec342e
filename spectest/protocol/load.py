"""Loading: a protocol file (or a shipped protocol's name) → a ``Protocol`` (``load_protocol``,
``yaml_load``), the CLI's overrides applied before validation (``apply_override``).

The why and the details: docs/internals.md "spectest/protocol/load.py".
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from spectest.errors import ConfigError
from spectest.files import read_input, refused
from spectest.protocol.parse import protocol_from_dict
from spectest.protocol.spec import Protocol

MAX_PROTOCOL_BYTES = 2**18  # a protocol is a few KB; PyYAML parses ~10⁵ B/s: a few s at most


MAX_YAML_DEPTH = 64  # nested collections; a protocol needs 4 (engines.candidate.env.NAME)


class _ProtocolLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without aliases, at most ``MAX_YAML_DEPTH`` collections deep, and
    with every value the constructors cannot build named by its line.

    Notes
    -----
    An alias is expanded wherever its value is used (10⁹ nodes from a 1 KB file), and PyYAML
    composes recursively (``[[[...]]]`` 400 deep is a ``RecursionError``): a protocol needs
    neither. A constructor's own error (an over-long integer, a date 2026-13-45) becomes a
    ``ConstructorError`` with the node's line."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            mark = event.start_mark
            raise _AliasRefused(event.anchor, mark.line + 1, mark.column + 1)
        if self.check_event(yaml.CollectionStartEvent):
            if self._depth >= MAX_YAML_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", mark
                )
            self._depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1
        return super().compose_node(parent, index)

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            value = super().construct_object(node, deep)
        # a scalar its constructor cannot build (``!!timestamp 'x'`` is an AttributeError)
        except (ValueError, OverflowError, TypeError, AttributeError) as err:
            why = (str(err).splitlines() or [type(err).__name__])[0]
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"cannot read the value {node.value!r:.60} ({why:.120})",
                node.start_mark,
            ) from None
        if isinstance(value, str) and (bad := unusable_text(value)) is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"the string {value!r:.60} {bad}", node.start_mark
            )
        return value


def unusable_text(value: str) -> str | None:
    """Why ``value`` cannot be a protocol's string, or None. A double-quoted YAML (or JSON)
    escape can make what no file name, id, environment value or UTF-8 file can hold: a NUL
    (``"\\0"``) or a lone surrogate (``"\\ud800"``). Both were exit 4 "internal error" where
    the string reached the filesystem (found by tools/fuzz.py, seed 20261203)."""
    if "\0" in value:
        return "holds a NUL character (\\0)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        return f"is not valid Unicode (a lone surrogate {value[err.start]!r})"
    return None


class _AliasRefused(Exception):
    def __init__(self, anchor: str, line: int, column: int) -> None:
        self.anchor, self.line, self.column = anchor, line, column


def yaml_load(text: str, source: str) -> Any:
    """``text`` as YAML (safe types only, no aliases); one ``ConfigError`` line naming
    ``source`` (the file, or ``--set KEY``) and the line otherwise."""
    try:
        return yaml.load(text, Loader=_ProtocolLoader)  # a SafeLoader subclass
    except _AliasRefused as err:
        raise ConfigError(
            f"{source}: line {err.line}, column {err.column}: YAML alias *{err.anchor:.40} is not "
            "allowed (aliases can expand without bound; write the value out)"
        ) from None
    except RecursionError:  # the depth cap above should make this unreachable
        raise ConfigError(f"{source}: YAML nested too deep to read") from None
    except yaml.reader.ReaderError as err:  # a character YAML refuses (NUL, C0 controls)
        pos = int(err.position)
        line = text.count("\n", 0, pos) + 1
        column = pos - (text.rfind("\n", 0, pos) + 1) + 1
        char = err.character if isinstance(err.character, int) else ord(str(err.character)[:1])
        raise ConfigError(
            f"{source}: malformed YAML at line {line}, column {column}: character "
            f"U+{char:04X} is not allowed in YAML"
        ) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "?"
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{source}: malformed YAML at {where}: {problem}") from None


def load_protocol(
    path: str | os.PathLike[str],
    *,
    overrides: Mapping[str, Any] | None = None,
    sets: Sequence[str] = (),
) -> Protocol:
    """Read, override and validate a protocol file.

    Parameters
    ----------
    path : the YAML file, or the name of a shipped protocol (``spectest.shipped``).
    overrides : dotted field path → value (e.g. ``{"seeds.per_arm": 64}``), applied before
        validation. ``None`` values are ignored (an unset CLI option).
    sets : ``"dotted.key=value"`` strings (CLI ``--set``); the value is parsed as YAML.
    """
    from spectest.shipped import resolve_protocol_file

    # a local file wins; a bare name (top_p, top_p.yaml) falls back to a shipped protocol, and
    # then ``source`` is the shipped file's full path, so the run records which one it used
    try:
        p, shipped = resolve_protocol_file(path)
    except OSError as err:  # a path component the machine will not let us look at
        raise refused(path, "protocol file", err.strerror or type(err).__name__) from None
    source = str(p) if shipped else str(path)
    data = read_input(p, "protocol file", MAX_PROTOCOL_BYTES)
    if len(data) > MAX_PROTOCOL_BYTES:
        raise ConfigError(
            f"{source}: larger than {MAX_PROTOCOL_BYTES} bytes: not a protocol (prompts live in "
            "the prompts.file)"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise ConfigError(
            f"{source}: line {line}: not UTF-8 text (byte 0x{data[err.start]:02x}: {err.reason})"
        ) from None
    raw = yaml_load(text, source)
    raw = copy.deepcopy(raw)
    all_overrides: dict[str, Any] = {}
    for item in sets:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set: expected key=value, got {item!r}")
        all_overrides[key.strip()] = yaml_load(text, f"--set {key.strip()}")
    all_overrides.update({k: v for k, v in (overrides or {}).items() if v is not None})
    for key, value in all_overrides.items():
        raw = apply_override(raw, key, value, source)
    return protocol_from_dict(raw, source=source, base_dir=p.resolve().parent)


def apply_override(raw: Any, key: str, value: Any, source: str) -> Any:
    """Set the dotted ``key`` in ``raw``. Names may themselves hold dots (config ``t0.8-p0.95``):
    at each level the longest existing key that prefixes the rest of the path wins, else the next
    dot-separated segment (created as a mapping when missing)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: cannot apply override {key!r}: the protocol is not a mapping")
    node: dict[str, Any] = raw
    rest, done = key, ""
    while True:
        match = max(
            (k for k in node if isinstance(k, str) and (rest == k or rest.startswith(k + "."))),
            key=len,
            default=None,
        )
        part = match if match is not None else rest.split(".", 1)[0]
        if part == rest:
            node[part] = value
            return raw
        done = f"{done}.{part}" if done else part
        rest = rest[len(part) + 1 :]
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(
                f"override {key}: {done} is not a mapping in {source} (it is {nxt!r})"
            )
        node = nxt
