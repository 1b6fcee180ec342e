"""The results of ``spectest conformance`` (``CheckResult``, ``ConformanceReport``) and the
small jobs it runs (``Workload``). Knows nothing of how a check runs (``conformance.session``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from spectest.engines.base import (
    DrafterSpec,
    RowSpec,
)
from spectest.errors import ExitCode
from spectest.sampling.params import SamplingParams

Status = Literal["pass", "fail", "skip", "not reproducible"]
CHECKS = (
    "class",
    "options",
    "needs",
    "output",
    "early stop",
    "rounds",
    "progress",
    "white-box",
    "same seeds",
    "batch composition",
    "provenance",
    "close",
)
DEFAULT_TARGET = "bundled:target"
DEFAULT_DRAFT = "bundled:draft"
DEFAULT_PROMPT = (1, 2, 3)  # ids every vocabulary has (a protocol's arm: its first prompt)
DEFAULT_CONFIGS = (
    ("t0.8-p0.9", SamplingParams(temperature=0.8, top_p=0.9)),
    ("t1.2-k8", SamplingParams(temperature=1.2, top_k=8)),
)  # one filter each: engines whose filter order cannot be set accept them
RUN_KEY = 20_261_201
UNKNOWN_KEY = "no_such_option_conformance"


@dataclass(frozen=True)
class CheckResult:
    """One check: its name (``CHECKS``), where it ran (a role, or ``""``), status and detail."""

    name: str
    status: Status
    detail: str = ""
    role: str = ""
    infrastructure: bool = False  # failed because the engine's process or server could not run

    def line(self) -> str:
        where = f" [{self.role}]" if self.role else ""
        return f"{self.status.upper():<5} {self.name}{where}" + (
            f": {self.detail}" if self.detail else ""
        )


@dataclass(frozen=True)
class ConformanceReport:
    """Every check of one engine; ``ok`` when none failed."""

    engine: str
    results: tuple[CheckResult, ...]

    @property
    def failures(self) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if r.status == "fail")

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def ran(self) -> bool:
        """Whether any job ran (every role may be refused by the engine's ``check_protocol``)."""
        return any(r.name == "output" for r in self.results)

    @property
    def exit_code(self) -> int:
        if self.ok:
            return int(ExitCode.OK if self.ran else ExitCode.INCONCLUSIVE)
        if any(r.infrastructure for r in self.failures):
            return int(ExitCode.INFRASTRUCTURE)
        return int(ExitCode.BAD_INPUT)

    def headline(self) -> str:
        n = {s: sum(r.status == s for r in self.results) for s in ("pass", "fail", "skip")}
        unrep = any(r.status == "not reproducible" for r in self.results)
        tail = f"{n['pass']} passed, {n['skip']} skipped" + (
            "; rows are not reproducible from their seeds (the engine says so)" if unrep else ""
        )
        if self.ok and not self.ran:
            return f"INCONCLUSIVE (exit 3): engine {self.engine}: no job ran ({tail})"
        if self.ok:
            return f"CONFORMS (exit 0): engine {self.engine} honours the contract: {tail}"
        return (
            f"DOES NOT CONFORM (exit {self.exit_code}): engine {self.engine}: "
            f"{n['fail']} check(s) failed, {tail}"
        )

    def lines(self) -> list[str]:
        return [r.line() for r in self.results] + [self.headline()]

    def assert_ok(self) -> None:
        """For a plug-in's own pytest: ``AssertionError`` listing every line unless ok."""
        if not self.ok:
            raise AssertionError("\n".join(self.lines()))


class _Failed(Exception):
    """A check failed; carries its result."""

    def __init__(self, result: CheckResult) -> None:
        super().__init__(result.detail)
        self.result = result


@dataclass(frozen=True)
class Workload:
    """The small jobs every role runs: one prompt, configs × seeds rows, T positions."""

    prompt: tuple[int, ...] = DEFAULT_PROMPT
    configs: tuple[tuple[str, SamplingParams], ...] = DEFAULT_CONFIGS
    seeds: int = 4
    positions: int = 5
    drafter: DrafterSpec = dataclasses.field(
        default_factory=lambda: DrafterSpec(onehot=False, q_mode="processed", k=3)
    )

    def rows(self) -> tuple[RowSpec, ...]:
        return tuple(
            RowSpec(cid, 1000 + s, sp) for cid, sp in self.configs for s in range(self.seeds)
        )
