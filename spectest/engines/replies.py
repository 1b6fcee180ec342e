"""The schema of every reply a foreign engine sends, checked field by field.

Owns: a small declarative schema language (``Int``, ``Num``, ``Str``, ``Bool``, ``Const``,
``ListOf``, ``Obj``, ``Nullable``), the schemas of the ``spectest-jsonl/1`` lines
(``engines.command``) and of the HTTP replies (``engines.http``), ``check`` (a decoded JSON value
against a schema: the value, or a ``Violation`` naming the field), ``short`` and ``ReplyError``:
the one-line error (exit 2) of a reply that breaks its schema. Knows nothing about processes,
sockets, numpy or torch. The message's form and why not pydantic: docs/internals-engines.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spectest.errors import EngineError

PROTOCOL = "spectest-jsonl/1"
SHORT_CHARS = 80  # at most this much of a value's repr in a message
I32 = 2**31 - 1
I64 = 2**63 - 1
TOKEN_ID_MAX = 2**31 - 1  # the samples table's token ids are < 2^31 (stats.histograms)
TEXT_MAX = 10_000  # characters of a free-text field (an error message, a version string)


class ReplyError(EngineError):
    """An engine's reply (a line of the command protocol, an HTTP reply body) or its returned
    output breaks the engine contract: one line naming engine, arm, job or row, seed, field and
    value. Exit 2 (``EngineError``)."""


class Violation(Exception):
    """Where a value left its schema: ``path`` (``""`` = the whole value), what was expected and
    the value itself. Internal to this module's callers, which turn it into ``ReplyError``."""

    def __init__(self, path: str, expected: str, value: Any) -> None:
        super().__init__(path, expected)
        self.path, self.expected, self.value = path, expected, value

    def __str__(self) -> str:
        what = f"field {self.path!r}" if self.path else "the reply"
        return f"{what}: expected {self.expected}, got {short(self.value)}"


def short(value: Any, limit: int = SHORT_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters (the cut says how long the whole was); never
    raises (an int too long to print, a value nested too deep)."""
    try:
        text = repr(value)
    except ValueError:  # an int beyond sys.get_int_max_str_digits
        return f"<an int of {value.bit_length()} bits>"
    except RecursionError:
        return f"<a {type(value).__name__} nested too deep to print>"
    if len(text) <= limit:
        return text
    return f"{text[: limit - 20]}… ({len(text)} chars)"


class _Missing:
    def __repr__(self) -> str:
        return "nothing (the key is missing)"


MISSING = _Missing()


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# ----------------------------------------------------------------------------- the language
class Schema:
    """A rule for one decoded JSON value. ``check`` returns None or raises ``Violation``."""

    def describe(self) -> str:
        raise NotImplementedError

    def check(self, value: Any, path: str) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Int(Schema):
    """An integer in ``[lo, hi]``; ``bool`` and floats (``1.0``) are not integers."""

    lo: int
    hi: int
    what: str = "an int"

    def describe(self) -> str:
        return f"{self.what} in [{self.lo}, {self.hi}]"

    def check(self, value: Any, path: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not self.lo <= value <= self.hi:
            raise Violation(path, self.describe(), value)


@dataclass(frozen=True)
class Num(Schema):
    """A finite number (int or float, not ``bool``) in ``[lo, hi]``."""

    lo: float = -math.inf
    hi: float = math.inf

    def describe(self) -> str:
        if math.isinf(self.lo) and math.isinf(self.hi):
            return "a finite number"
        return f"a finite number in [{self.lo:g}, {self.hi:g}]"

    def check(self, value: Any, path: str) -> None:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and isinstance(value, int):
            ok = abs(value) <= 2**1023  # float(value) would overflow
        if not ok or not math.isfinite(float(value)) or not self.lo <= float(value) <= self.hi:
            raise Violation(path, self.describe(), value)


@dataclass(frozen=True)
class Str(Schema):
    max_len: int = TEXT_MAX

    def describe(self) -> str:
        return f"a string of at most {self.max_len} characters"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, str) or len(value) > self.max_len:
            raise Violation(path, self.describe(), value)


@dataclass(frozen=True)
class Bool(Schema):
    def describe(self) -> str:
        return "true or false"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, bool):
            raise Violation(path, self.describe(), value)


@dataclass(frozen=True)
class Const(Schema):
    """One of ``values``, of the same type (``1`` does not match ``True``)."""

    values: tuple[Any, ...]

    def describe(self) -> str:
        if len(self.values) == 1:
            return repr(self.values[0])
        return "one of " + ", ".join(repr(v) for v in self.values)

    def check(self, value: Any, path: str) -> None:
        if not any(type(value) is type(v) and value == v for v in self.values):
            raise Violation(path, self.describe(), value)


@dataclass(frozen=True)
class Nullable(Schema):
    inner: Schema

    def describe(self) -> str:
        return f"null or {self.inner.describe()}"

    def check(self, value: Any, path: str) -> None:
        if value is None:
            return
        try:
            self.inner.check(value, path)
        except Violation as v:
            if v.path != path:  # a field inside the value: its own message
                raise
            raise Violation(path, self.describe(), value) from None


@dataclass(frozen=True)
class ListOf(Schema):
    """A JSON array of ``min_len`` to ``max_len`` items, each checked against ``item``."""

    item: Schema
    min_len: int = 0
    max_len: int = I64
    what: str = ""  # the whole list, for messages ("a list of 1 to 8 token ids")

    def describe(self) -> str:
        if self.what:
            return self.what
        if self.max_len == I64:
            return f"a list of at least {self.min_len} items"
        return f"a list of {self.min_len} to {self.max_len} items"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, list) or not self.min_len <= len(value) <= self.max_len:
            raise Violation(path, self.describe(), value)
        for i, v in enumerate(value):
            self.item.check(v, f"{path}[{i}]")


@dataclass(frozen=True)
class Obj(Schema):
    """A JSON object; the ``required`` keys must be present; every key of ``fields`` that is
    present must match its schema; other keys are allowed."""

    fields: Mapping[str, Schema] = field(default_factory=dict)
    required: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.required:
            return "a JSON object with " + ", ".join(repr(k) for k in self.required)
        return "a JSON object"

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise Violation(path, self.describe(), value)
        for key in self.required:
            if key not in value:
                raise Violation(join(path, key), self.fields[key].describe(), MISSING)
        for key, rule in self.fields.items():
            if key in value:
                rule.check(value[key], join(path, key))


def check(schema: Schema, value: Any, path: str = "") -> Any:
    """``value`` if it matches ``schema``, else ``Violation`` naming the first bad field."""
    schema.check(value, path)
    return value


# ----------------------------------------------------------------------------- the schemas
def token_ids(T: int, vocab_size: int | None) -> ListOf:
    """1 to ``T`` token ids of a vocabulary of ``vocab_size`` (fewer than ``T`` = the sequence
    ended; none at all has nothing to test and is refused)."""
    hi = (vocab_size if vocab_size is not None else TOKEN_ID_MAX + 1) - 1
    return ListOf(
        Int(0, hi, "an int token id"),
        1,
        T,
        f"a list of 1 to {T} int token ids (fewer than {T} = the sequence ended)",
    )


HELLO = Obj(
    {
        "type": Const(("hello",)),
        "protocol": Const((PROTOCOL,)),
        "engine": Str(200),
        "version": Str(200),
    },
    required=("type", "protocol"),
)
ROUND = Obj(
    {"drafted": Int(0, I32), "accepted": Int(0, I32), "emitted": Int(0, I32)},
    required=("drafted", "accepted", "emitted"),
)
# an engine-reported probability of one emitted token (docs/engines-reported-p.md): ``p`` the
# target law's probability of the token, ``cdf_lo`` the law's mass on the tokens ranked before it
# (more probable, or as probable with a smaller id)
PROB_SUM_SLACK = 1e-6  # p, cdf_lo and p + cdf_lo may exceed 1 by float rounding, no more
_UNIT = Num(0.0, 1.0 + PROB_SUM_SLACK)
PROB = Obj({"p": _UNIT, "cdf_lo": Nullable(_UNIT)}, required=("p",))
# a line read while results are pending (``log`` lines are skipped before this check)
JOB_LINE_TYPE = Obj({"type": Const(("result", "error"))}, required=("type",))
ERROR_LINE = Obj(
    {"type": Const(("error",)), "id": Nullable(Int(0, I64, "an int job id")), "message": Str()},
    required=("type", "message"),
)


def result_line(T: int, vocab_size: int | None) -> Obj:
    """A ``result`` line of a job with ``max_tokens = T`` (``rounds``: at most one per token)."""
    return Obj(
        {
            "type": Const(("result",)),
            "id": Int(0, I64, "an int job id"),
            "seed": Int(-(2**63), I64, "an int seed"),
            "tokens": token_ids(T, vocab_size),
            "rounds": Nullable(ListOf(ROUND, 0, T, f"a list of at most {T} rounds")),
            "probs": Nullable(ListOf(PROB, 1, T, f"a list of 1 to {T} reported probabilities")),
        },
        required=("type", "id", "seed", "tokens"),
    )


def check_probs(obj: Mapping[str, Any]) -> None:
    """The cross-field rules of a result's ``probs`` (its fields passed ``result_line``): one
    per token, and ``p + cdf_lo <= 1`` (up to ``PROB_SUM_SLACK``). ``Violation`` otherwise."""
    probs = obj.get("probs")
    if probs is None:
        return
    n = len(obj["tokens"])
    if len(probs) != n:
        raise Violation("probs", f"a list of {n} reported probabilities (one per token)", probs)
    for i, pr in enumerate(probs):
        lo = pr.get("cdf_lo")
        if lo is not None and float(pr["p"]) + float(lo) > 1.0 + PROB_SUM_SLACK:
            raise Violation(f"probs[{i}]", "p + cdf_lo <= 1 (a probability law)", pr)


# what llama.cpp echoes in generation_settings and spectest compares with what it sent
LLAMACPP_ECHO = Obj(
    {
        "temperature": Num(),
        "top_k": Int(-I32 - 1, I32),
        "top_p": Num(),
        "min_p": Num(),
        "seed": Int(-(2**63), I64, "an int seed"),
        "samplers": ListOf(Str(100), 0, 64, "a list of sampler names"),
        "ignore_eos": Bool(),
    }
)
LLAMACPP_TIMINGS = Obj(
    {
        "draft_n": Nullable(Int(0, I32, "an int count")),
        "draft_n_accepted": Nullable(Int(0, I32, "an int count")),
    }
)


def llamacpp_reply(T: int, vocab_size: int | None) -> Obj:
    """llama.cpp ``/completion`` (``return_tokens: true``)."""
    return Obj(
        {
            "tokens": token_ids(T, vocab_size),
            "generation_settings": Nullable(LLAMACPP_ECHO),
            "timings": Nullable(LLAMACPP_TIMINGS),
        },
        required=("tokens",),
    )


def openai_reply(T: int, vocab_size: int | None) -> Obj:
    """OpenAI-compatible ``/v1/completions`` (vLLM's ``return_token_ids: true``): exactly one
    choice (spectest asks for one sequence per request)."""
    choice = Obj({"token_ids": token_ids(T, vocab_size)}, required=("token_ids",))
    return Obj(
        {"choices": ListOf(choice, 1, 1, "a list of exactly 1 choice")}, required=("choices",)
    )


def where(engine: str, **context: Any) -> str:
    """``engine command (arm candidate, job 7, seed 400)``: the context items that are known
    (None = unknown, left out), values as given."""
    parts = [
        f"{k} {v if isinstance(v, str) else short(v, 40)}"
        for k, v in context.items()
        if v is not None
    ]
    return f"engine {engine} ({', '.join(parts)})" if parts else f"engine {engine}"


def known_int(value: Any) -> int | None:
    """``value`` when it is a plain int (for naming a job or seed in a message), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


__all__ = [
    "PROTOCOL",
    "ReplyError",
    "Violation",
    "check",
    "check_probs",
    "llamacpp_reply",
    "openai_reply",
    "result_line",
    "short",
    "token_ids",
    "where",
]
