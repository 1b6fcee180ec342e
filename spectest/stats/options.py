"""The one test-settings type, ``AnalysisOptions`` (frozen, validated on construction; a bad
value raises ``OptionError``). Each field carries its ``Option``: rule, the protocol's YAML path,
``spectest compare``'s flag, hash rule; the forms derived from the fields are ``canonical``
(hashed, summary.json's ``analysis``), ``from_canonical``, ``yaml_form``, ``yaml_paths`` and
``flags``. Knows no files, protocols or statistic. Adding an option: docs/architecture.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from spectest.errors import ConfigError
from spectest.stats import sequence

MULTIPLICITY = ("bh", "by", "maxT")
WHITEBOX_MODES = ("exact", "teacher")
SEQUENCE_DEFAULT = sequence.DEFAULT  # (the option ``sequence`` shadows the module in the class)
# The documented ranges (docs/protocols.md "Protocol reference"). α above one half is not a
# false-alarm rate anyone gates on; a pooling threshold above 1000 expected counts per bin
# leaves nothing testable at any seed count spectest runs; B above 20 000 permutations is
# 800 MB of labels per cell at 20 000 sequences, for a p-value resolution no α here needs.
ALPHA_MAX = 0.5
MIN_EXPECTED_MAX = 1000.0
NULL_PERMUTATIONS_MAX = 20_000
TRIE_DEPTH_MAX = 64
MAX_MDE_RULE = "expected a number in (0, 1]"  # tests.power.max_mde_tv, --max-mde-tv
# claim (b) (``spectest.numerics.table``): the numerics modes, the floors, the margin (TV/token)
NUMERICS_MODES = ("auto", "exact", "matched")
NUMERICS_FLOORS = ("auto", "batch", "prefill", "dtype")  # auto: spectest.numerics.floors
DEFAULT_NUMERICS_MARGIN = 0.002
# matched mode's claim (b) sequences (``spectest.numerics.table``): the drift's per (prompt,
# config) cell (its first seeds), and the batch floor's spread over the cells (at least 2 and at
# most the drift's per cell); docs/numerics.md "How many sequences"
DEFAULT_NUMERICS_SEQUENCES = 32
DEFAULT_FLOOR_SEQUENCES = 64
# the largest share of an arm's tokens (claim a) or of the candidate's prefixes (claim b
# teacher-forced) left out because a top-n list does not fix their law before the claim is
# unresolved (docs/numerics.md "A straddled token is left out")
DEFAULT_LEFT_OUT_MAX = 0.05
META = "spectest"  # the key of ``Option`` in a field's metadata


class OptionError(ConfigError):
    """An ``AnalysisOptions`` field outside its rule: ``option`` (the field), ``rule`` (what it
    must be) and ``value``, so a caller that took the value from a file or a flag can name that
    instead (``Option.yaml``, ``Option.flag``)."""

    def __init__(self, option: str, rule: str, value: Any) -> None:
        self.option, self.rule, self.value = option, rule, value
        super().__init__(f"analysis option {option}: {rule}, got {value!r:.200}")


@dataclass(frozen=True)
class Option:
    """What one setting is outside Python. ``rule``: the message's rule; ``ok(value, settings)``
    whether it holds. ``yaml``: the protocol's field path (None: not a protocol field).
    ``hashed``: 'always' (the settings every protocol has hashed since version 1), 'non-default'
    (hashed only when set to another value than the default, so no protocol that leaves it
    alone changes its hash: every new option) or 'never'. ``key``: the path in the hashed form
    (default: ``yaml`` without ``tests.``). ``flag``: ``spectest compare``'s flag. ``real``: a
    number read from YAML is stored as a float (what the hash has always seen)."""

    rule: str
    ok: Callable[[Any, Any], bool]
    yaml: str | None = None
    hashed: Literal["always", "non-default", "never"] = "never"
    key: str | None = None
    flag: str | None = None
    real: bool = False

    @property
    def path(self) -> tuple[str, ...]:
        """The hashed form's key path (``("trie", "depth")``)."""
        k = self.key if self.key is not None else str(self.yaml).removeprefix("tests.")
        return tuple(k.split("."))


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def number(lo: float, hi: float, *, lo_open: bool = True, hi_open: bool = False) -> Any:
    """``ok`` of a finite number in the interval (open or closed ends)."""
    return lambda v, _s: (
        _num(v) and (lo < v if lo_open else lo <= v) and (v < hi if hi_open else v <= hi)
    )


def integer(lo: int, hi: float = math.inf) -> Any:
    return lambda v, _s: _int(v) and lo <= v <= hi


def one_of(choices: tuple[str, ...]) -> Any:
    return lambda v, _s: v in choices


def boolean(v: Any, _s: Any) -> bool:
    return isinstance(v, bool)


def option(default: Any, rule: str, ok: Callable[[Any, Any], bool], **where: Any) -> Any:
    """A field of ``AnalysisOptions``: its default and its ``Option`` (rule, YAML path, hash
    rule, flag: see there)."""
    return field(default=default, metadata={META: Option(rule, ok, **where)})


def choice(default: str, choices: tuple[str, ...], **where: Any) -> Any:
    """A field that takes one of ``choices``."""
    return option(default, f"expected one of {', '.join(choices)}", one_of(choices), **where)


def switch(default: bool, **where: Any) -> Any:
    """A field that is true or false."""
    return option(default, "expected true or false", boolean, **where)


def _statistics(v: Any, _s: Any) -> bool:
    return (
        isinstance(v, tuple)
        and bool(v)
        and len(set(v)) == len(v)
        and all(s in sequence.STATISTICS for s in v)
    )


_MODES = f"must be one of {list(WHITEBOX_MODES)!r}"
_STATISTICS_RULE = f"must be a tuple of {list(sequence.STATISTICS)!r}"


@dataclass(frozen=True)
class AnalysisOptions:
    """How a run tests and judges (validated on construction; a bad value raises
    ``OptionError``). docs/statistics.md and docs/protocols.md say what each setting means;
    the field's ``Option`` says where it is written. The fields' order is the order of the
    protocol's ``tests`` keys and of the hashed form.

    ``whitebox_mode`` is not the protocol's: it is a property of the run's engines, resolved
    once by ``spectest.plan.make_plan`` (``RunSettings.options``): 'exact' — the wb_* columns
    are the laws the tokens were drawn from; 'teacher' — a teacher whose numerics may differ
    (two-sample tests and the tolerance control, ``stats.whitebox_two_sample``).
    """

    alpha: float = option(
        0.05,
        f"expected a number in (0, {ALPHA_MAX:g}]",
        number(0, ALPHA_MAX),
        yaml="tests.alpha",
        hashed="always",
        flag="--alpha",
        real=True,
    )
    multiplicity: str = choice(
        "bh", MULTIPLICITY, yaml="tests.multiplicity", hashed="always", flag="--multiplicity"
    )
    min_expected: float = option(
        5.0,
        f"expected a number in (0, {MIN_EXPECTED_MAX:g}]",
        number(0, MIN_EXPECTED_MAX),
        yaml="tests.min_expected",
        hashed="always",
        real=True,
    )
    trie_depth: int = option(
        2,
        f"expected an integer in [0, {TRIE_DEPTH_MAX}]",
        integer(0, TRIE_DEPTH_MAX),
        yaml="tests.trie.depth",
        hashed="always",
    )
    trie_min_count: int = option(
        200, "expected an integer >= 1", integer(1), yaml="tests.trie.min_count", hashed="always"
    )
    whitebox: bool = switch(True, yaml="tests.whitebox", hashed="always")
    null_permutations: int = option(
        200,
        f"expected an integer in [0, {NULL_PERMUTATIONS_MAX}]",
        integer(0, NULL_PERMUTATIONS_MAX),
        yaml="tests.null_permutations",
        hashed="always",
    )
    # the verdict's power requirement: the run's MDE in TV must not exceed it (None: the
    # verdict's default, ``verdict.DEFAULT_MAX_MDE_TV``)
    max_mde_tv: float | None = option(
        None,
        MAX_MDE_RULE,
        lambda v, _s: v is None or (_num(v) and 0.0 < v <= 1.0),
        yaml="tests.power.max_mde_tv",
        key="max_mde_tv",
        hashed="always",
        flag="--max-mde-tv",
        real=True,
    )
    sequence: bool = switch(True, yaml="tests.sequence", hashed="non-default")
    numerics: str = choice("auto", NUMERICS_MODES, yaml="tests.numerics", hashed="non-default")
    numerics_floor: str = choice(
        "auto", NUMERICS_FLOORS, yaml="tests.numerics_floor", hashed="non-default"
    )
    numerics_margin: float = option(
        DEFAULT_NUMERICS_MARGIN,
        "expected a number in [0, 1)",
        number(0, 1, lo_open=False, hi_open=True),
        yaml="tests.numerics_margin",
        hashed="non-default",
        real=True,
    )
    numerics_sequences: int = option(
        DEFAULT_NUMERICS_SEQUENCES,
        "expected an integer >= 2",
        integer(2),
        yaml="tests.numerics_sequences",
        hashed="non-default",
    )
    numerics_floor_sequences: int = option(
        DEFAULT_FLOOR_SEQUENCES,
        "expected an integer >= 2",
        integer(2),
        yaml="tests.numerics_floor_sequences",
        hashed="non-default",
    )
    left_out_max: float = option(
        DEFAULT_LEFT_OUT_MAX,
        "expected a number in [0, 1]",
        number(0, 1, lo_open=False),
        yaml="tests.left_out_max",
        hashed="non-default",
        real=True,
    )
    # the statistics' own constants: no protocol field, never hashed
    permutation_pvalues: bool = switch(False)
    tv_quantile: float = option(
        0.95, "must be in [0.5, 1)", number(0.5, 1, lo_open=False, hi_open=True)
    )
    power: float = option(0.8, "must be in (alpha, 1)", lambda v, s: _num(v) and s.alpha < v < 1.0)
    whitebox_mode: str = option("exact", _MODES, one_of(WHITEBOX_MODES))
    whitebox_tolerance: float = option(
        0.05, "must be a number in [0, 1)", number(0, 1, lo_open=False, hi_open=True)
    )
    whitebox_permutations: int = option(
        1999, "must be an integer in [1, 100000]", integer(1, 100_000)
    )
    testable_shares: tuple[float, ...] = option(
        (0.5, 0.9),
        "must be floats in (0, 1]",
        lambda v, _s: all(isinstance(x, float) and 0.0 < x <= 1.0 for x in v),
    )
    sequence_statistics: tuple[str, ...] = option(SEQUENCE_DEFAULT, _STATISTICS_RULE, _statistics)

    def __post_init__(self) -> None:
        for name, opt in options():
            if not opt.ok(getattr(self, name), self):
                raise OptionError(name, opt.rule, getattr(self, name))
        B = self.null_permutations  # the rules across fields
        if self.multiplicity == "maxT" and B < 1:
            raise OptionError(
                "null_permutations", "expected an integer >= 1 with multiplicity 'maxT'", B
            )
        if self.permutation_pvalues and B < 1:
            raise OptionError(
                "null_permutations", "expected an integer >= 1 for permutation_pvalues", B
            )

    def _hashed(self) -> Iterator[tuple[Option, Any]]:
        """Each field whose ``Option.hashed`` is 'always', or 'non-default' and not at its
        default, with its value."""
        for name, opt in options():
            v = getattr(self, name)
            if opt.hashed == "always" or (opt.hashed == "non-default" and v != _DEFAULTS[name]):
                yield opt, v

    def canonical(self) -> dict[str, Any]:
        """The hashed form, also summary.json's ``analysis``: ``_hashed`` at ``Option.path``."""
        out: dict[str, Any] = {}
        for opt, v in self._hashed():
            _put(out, opt.path, v)
        return out

    @classmethod
    def from_canonical(cls, d: dict[str, Any]) -> AnalysisOptions:
        """The inverse of ``canonical`` (a stored summary's ``analysis``); absent: the default."""
        given = {}
        for name, opt in options():
            node: Any = d
            for part in opt.path:
                node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
            if opt.hashed != "never" and node is not _MISSING:
                given[name] = node
        return cls(**given)

    def yaml_form(self) -> dict[str, Any]:
        """The protocol's ``tests`` section that reads back to these settings (``_hashed`` at
        the YAML paths)."""
        out: dict[str, Any] = {}
        for opt, v in self._hashed():
            _put(out, tuple(str(opt.yaml).split("."))[1:], v)
        return out


_MISSING = object()


def _put(out: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        out = out.setdefault(part, {})
    out[path[-1]] = value


def options() -> Iterator[tuple[str, Option]]:
    """Every setting's name and ``Option``, in the fields' order."""
    for f in fields(AnalysisOptions):
        yield f.name, f.metadata[META]


def yaml_paths() -> dict[str, str]:
    """A setting → the protocol's field path, for the settings a protocol sets."""
    return {name: opt.yaml for name, opt in options() if opt.yaml is not None}


def flags() -> dict[str, str]:
    """A setting → ``spectest compare``'s flag, for the settings it takes."""
    return {name: opt.flag for name, opt in options() if opt.flag is not None}


_DEFAULTS = {f.name: f.default for f in fields(AnalysisOptions)}
