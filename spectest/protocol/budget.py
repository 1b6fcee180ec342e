"""The size budget: ``PlanSize``, ``plan_size`` and ``check_budget`` (a protocol over
``limits.max_tokens`` is refused before any work).

The why and the details: docs/internals.md "spectest/protocol/budget.py".
"""

from __future__ import annotations

from dataclasses import dataclass

from spectest.errors import ConfigError
from spectest.protocol.arms import arm_specs
from spectest.protocol.spec import LIMITS_FIELD, Protocol

DEFAULT_MAX_TOKENS = 100_000_000  # limits.max_tokens when the protocol sets none
# the refusal line's estimates, measured: docs/internals.md "spectest/protocol/budget.py"
MEMORY_BYTES_PER_TOKEN = 400
DISK_BYTES_PER_TOKEN = 8


@dataclass(frozen=True)
class PlanSize:
    """The size of a protocol's full plan: ``arms`` arms holding ``seeds`` seeds between them
    (each at its reserved size), over ``prompts`` × ``configs`` cells, so ``rows`` sequences of
    ``positions`` tokens: ``tokens`` in all; ``memory_bytes`` / ``disk_bytes`` are estimates
    (``MEMORY_BYTES_PER_TOKEN``, ``DISK_BYTES_PER_TOKEN``)."""

    arms: int
    prompts: int
    configs: int
    seeds: int
    positions: int

    @property
    def rows(self) -> int:
        return self.seeds * self.prompts * self.configs

    @property
    def tokens(self) -> int:
        return self.rows * self.positions

    @property
    def memory_bytes(self) -> int:
        return self.tokens * MEMORY_BYTES_PER_TOKEN

    @property
    def disk_bytes(self) -> int:
        return self.tokens * DISK_BYTES_PER_TOKEN

    def describe(self) -> str:
        return (
            f"{self.rows:,} rows ({_n(self.prompts, 'prompt')} × {_n(self.configs, 'config')} × "
            f"{self.seeds:,} seeds over {_n(self.arms, 'arm')}) × {_n(self.positions, 'position')}"
            f" = {self.tokens:,} tokens (about {_bytes(self.memory_bytes)} of memory, "
            f"{_bytes(self.disk_bytes)} on disk)"
        )


def _n(n: int, what: str) -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


def _bytes(n: int) -> str:
    for unit, size in (("PB", 10**15), ("TB", 10**12), ("GB", 10**9), ("MB", 10**6)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n / 10**3:.3g} kB"


def plan_size(protocol: Protocol) -> PlanSize:
    """The size of the full plan (every arm, candidate and teeth, at its reserved seeds)."""
    arms = arm_specs(protocol)
    return PlanSize(
        arms=len(arms),
        prompts=len(protocol.prompts.items),
        configs=len(protocol.configs),
        seeds=sum(a.seeds for a in arms),
        positions=protocol.positions,
    )


def max_tokens(protocol: Protocol) -> int:
    """The protocol's token budget: ``limits.max_tokens``, else ``DEFAULT_MAX_TOKENS``."""
    n = protocol.limits.max_tokens
    return DEFAULT_MAX_TOKENS if n is None else n


def check_budget(protocol: Protocol) -> PlanSize:
    """``plan_size`` of ``protocol``, or a ``ConfigError`` (one line: the file, the size, the
    budget and the knob) when it exceeds ``max_tokens``. Pure arithmetic: nothing is built."""
    size = plan_size(protocol)
    budget = max_tokens(protocol)
    if size.tokens > budget:
        raise ConfigError(
            f"{protocol.source}: {LIMITS_FIELD}: the plan is {size.describe()}, over the budget "
            f"of {budget:,} tokens; lower seeds / positions / prompts / configs, or raise the "
            f"budget with --set {LIMITS_FIELD}={size.tokens}"
        )
    return size
