"""Reading one field of a protocol (``Fields``, ``real``): a value of the expected form, or one
``ConfigError`` line naming the file, the field path and the value.

The why and the details: docs/internals.md "spectest/protocol/fields.py".
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from spectest.errors import ConfigError
from spectest.prompts import NAME_RULE, is_name

_MAX_DETAIL = 400  # characters of a message after the field path


class Fields:
    """Carries the file name so every message names it."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, msg: str) -> ConfigError:
        if len(msg) > _MAX_DETAIL:  # a value's repr can be as long as the file: keep one line
            msg = f"{msg[:_MAX_DETAIL]}... ({len(msg)} characters)"
        return ConfigError(f"{self.source}: {path}: {msg}")

    def mapping(
        self, value: Any, path: str, allowed: Sequence[str], required: Sequence[str] = ()
    ) -> dict:
        if not isinstance(value, Mapping):
            raise self.fail(path or "<top>", f"expected a mapping, got {value!r}")
        for key in value:
            if not isinstance(key, str) or key not in allowed:
                shown = str(key) if is_name(key) or key is None else f"[{key!r:.60}]"
                where = f"{path}.{shown}" if path else shown
                raise self.fail(where, f"unknown key {key!r:.60} (allowed: {', '.join(allowed)})")
        for key in required:
            if key not in value:
                where = f"{path}.{key}" if path else key
                raise self.fail(where, "required field is missing")
        return dict(value)

    def int_(self, value: Any, path: str, lo: int | None = None, hi: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"expected an integer, got {value!r}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise self.fail(path, f"expected an integer {rng}, got {value!r}")
        return value

    def float_(self, value: Any, path: str, check: Callable[[float], bool], what: str) -> float:
        value = float_text(value)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise self.fail(path, f"expected a number{' ' + what if what else ''}, got {value!r}")
        if not check(float(value)):
            raise self.fail(path, f"expected a number {what}, got {value!r}")
        return float(value)

    def number(self, value: Any, path: str) -> float:
        """A finite number (its range is the caller's)."""
        return self.float_(value, path, lambda _: True, "")

    def str_(self, value: Any, path: str, choices: Sequence[str] | None = None) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(path, f"expected a non-empty string, got {value!r}")
        if choices is not None and value not in choices:
            raise self.fail(path, f"expected one of {', '.join(choices)}, got {value!r}")
        return value

    def bool_(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(path, f"expected true or false, got {value!r}")
        return value

    def name(self, value: Any, path: str) -> str:
        s = self.str_(value, path)
        if not is_name(s):
            raise self.fail(path, f"expected {NAME_RULE}, got {value!r}")
        return s


# a float as YAML 1.2 writes it; YAML 1.1 (PyYAML) reads "1e-12" (no dot) as a string
_FLOAT_TEXT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)[eE][-+]?[0-9]+")


def float_text(value: Any) -> Any:
    """A string that YAML 1.2 reads as a float (``1e-12``, ``5E-3``) as that float; anything
    else as it is. PyYAML follows YAML 1.1, whose floats need a dot, so ``--set
    tests.alpha=1e-12`` arrived as the string '1e-12' and was refused as not a number."""
    if isinstance(value, str) and _FLOAT_TEXT.fullmatch(value.strip()):
        return float(value)
    return value


def real(value: Any) -> Any:
    """A number (not a bool) as a float, as the hash has always seen it (an integer too large
    for a float reads as infinity, which every rule refuses); a float written without a dot
    (``float_text``) too; anything else as it is, for the rule that refuses it to name."""
    value = float_text(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    try:
        return float(value)
    except OverflowError:
        return math.inf
