"""Overrides: ``--set dotted.key=value`` and the CLI's options, placed in a raw protocol mapping.

Owns: ``apply_override`` (where a dotted key lands: names may hold dots themselves). The values
are checked afterwards by the parser, exactly like the file's (``spectest.protocol.load``).
"""

from __future__ import annotations

from typing import Any

from spectest.errors import ConfigError


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
