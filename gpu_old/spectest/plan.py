"""The plan: a ``Protocol`` expanded into arms, disjoint seed ranges, cells and shards.

Owns: ``Arm`` (reference, candidate, null, ε and mutant arms with what each must do and the
engine that runs it: the protocol's reference and candidate engines, the built-in engine for
every tooth),
``SeedRange`` (consecutive, disjoint per arm, collision-free by construction), ``Shard`` (one arm
× one prompt [× one stage of a sequential run], the unit of generation and resume), ``stages``
and ``make_plan``; and the plan's size (``plan_size``) with its budget (``check_budget``).
Knows nothing about models, files or statistics.

The size budget
---------------
A protocol states how much work it asks for; spectest checks it before any. The plan's size is
its rows — arms × prompts × configs × seeds, every arm at its reserved seeds (the last stage of
a sequential run) — times ``positions``: the tokens to generate, store and test. A plan of more
than ``limits.max_tokens`` tokens (default ``DEFAULT_MAX_TOKENS``) is refused at load with one
line giving its size, an estimate of its memory and disk, and the knob (``--set
limits.max_tokens=N``). The default, 10⁸ tokens, is about 40 GB of peak memory by the measured
``MEMORY_BYTES_PER_TOKEN``: 8× the largest shipped plan at 4 000 seeds (openinfer-512: 4 arms × 8
prompts × 3 configs × 4 000 seeds × 32 positions = 1.2·10⁷ tokens). Before it, ``seeds.per_arm:
10**12`` generated until the machine ran out of memory (6.3 GB after 300 s).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal
from urllib.parse import quote

from spectest.errors import ConfigError
from spectest.protocol import LIMITS_FIELD, EngineChoice, Protocol
from spectest.sequential import stage_sizes

ArmRole = Literal["reference", "candidate", "null", "eps", "mutant"]
DEFAULT_MAX_TOKENS = 100_000_000  # limits.max_tokens when the protocol sets none
# Estimates for the refusal line, measured on CPU (results/LOG.md, 2026-12-01 h16): peak RSS
# grows by ~370 bytes per planned token (toy pair, white-box on: the samples frame with its
# white-box columns, the shards' concat and the analysis' encodings); samples.parquet holds
# 2.8 (toy) to 5.4 (bundled pair, ci at 3 000 seeds) bytes per token, white-box columns included.
MEMORY_BYTES_PER_TOKEN = 400
DISK_BYTES_PER_TOKEN = 8


@dataclass(frozen=True)
class SeedRange:
    """Seeds ``start, start + 1, ..., stop - 1``."""

    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start

    def seeds(self) -> range:
        return range(self.start, self.stop)

    def overlaps(self, other: SeedRange) -> bool:
        return self.start < other.stop and other.start < self.stop


@dataclass(frozen=True)
class Arm:
    """One arm of the plan.

    ``role``: reference (plain decode), candidate (the protocol's sampler), null / eps / mutant
    (teeth). ``variant``: the sampler variant spec (``None`` for the plain reference).
    ``expect``: ``"subject"`` for the candidate, ``"pass"`` for the null, ``"fail"`` for ε and
    mutants, ``"reference"`` for the reference. ``engine``: the engine that generates the arm
    (always the built-in engine for teeth: they prove the harness's power with spectest's own
    sampler, whatever engine is under test).
    """

    name: str
    role: ArmRole
    variant: str | None
    seeds: SeedRange
    expect: str
    engine: EngineChoice = field(default_factory=EngineChoice.builtin)

    @property
    def is_tooth(self) -> bool:
        return self.role in ("null", "eps", "mutant")


@dataclass(frozen=True)
class Shard:
    """The unit of generation and of resume: one arm × one prompt (all configs, all seeds).

    In a sequential run (``seeds.max_per_arm``) a growing arm has one shard per prompt and
    stage: ``seeds`` is the stage's new seed range (None = the arm's whole range), so the
    shards of earlier stages are reused as they are.
    """

    arm: str
    prompt_id: str
    stage: int = 0
    seeds: SeedRange | None = None

    @property
    def key(self) -> str:
        """A file-system-safe, injective name (``quote`` escapes ':' '=' '/' ...); stage 0 keeps
        the single-stage name, so a sequential run's first stage is a plain run's shards."""
        base = f"{quote(self.arm, safe='')}__{quote(self.prompt_id, safe='')}"
        return base if self.stage == 0 else f"{base}__stage{self.stage}"


@dataclass(frozen=True)
class Plan:
    """The expansion of a protocol: what to generate and what to compare."""

    protocol: Protocol
    arms: tuple[Arm, ...]
    cells: tuple[tuple[str, str], ...]  # (prompt_id, config_id)
    shards: tuple[Shard, ...]

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(name)

    @property
    def comparisons(self) -> tuple[Arm, ...]:
        """Every non-reference arm: each is compared with the reference."""
        return tuple(a for a in self.arms if a.role != "reference")

    @property
    def seed_ranges(self) -> dict[str, list[int]]:
        return {a.name: [a.seeds.start, a.seeds.stop] for a in self.arms}


def eps_arm_name(eps: float) -> str:
    return f"eps={eps:g}"


def mutant_arm_name(spec: str) -> str:
    return f"mutant:{spec}"


def all_arms(protocol: Protocol) -> tuple[Arm, ...]:
    """Every arm the protocol defines, with disjoint seed ranges laid out consecutively in the
    order reference, candidate, null, ε..., mutants... — so a teeth-only plan and a full plan give
    each arm the same seeds, and a tooth added at the end moves no earlier arm."""
    p = protocol
    builtin = EngineChoice.builtin()  # every tooth runs on spectest's own sampler
    specs: list[tuple[str, ArmRole, str | None, int, str, EngineChoice]] = [
        ("reference", "reference", None, _reserved(p, True), "reference", p.reference_engine),
        (
            "candidate", "candidate", p.candidate_variant, _reserved(p), "subject",
            p.candidate_engine,
        ),
    ]  # fmt: skip
    n_teeth = p.seeds.teeth_per_arm
    if p.teeth.null:
        specs.append(("null", "null", "exact", n_teeth, "pass", builtin))
    for eps in p.teeth.epsilons:
        specs.append((eps_arm_name(eps), "eps", f"eps_biased:{eps:g}", n_teeth, "fail", builtin))
    for mut in p.teeth.mutants:
        specs.append((mutant_arm_name(mut), "mutant", mut, n_teeth, "fail", builtin))
    arms: list[Arm] = []
    cursor = p.seeds.start
    for name, role, variant, n, expect, engine in specs:
        arms.append(Arm(name, role, variant, SeedRange(cursor, cursor + n), expect, engine))
        cursor += n
    names = [a.name for a in arms]
    if len(set(names)) != len(names):  # e.g. eps=0.1 and eps=0.10 both format as "eps=0.1"
        raise ConfigError(f"{p.source}: teeth: two teeth arms share the name {names!r}")
    return tuple(arms)


def _reserved(p: Protocol, reference: bool = False) -> int:
    """Seeds reserved for the reference and candidate arms: the last stage's (sequential); the
    reference's own size when ``seeds.reference_per_arm`` is set (never with stages)."""
    if p.seeds.max_per_arm is not None:
        return p.seeds.max_per_arm
    return p.seeds.reference if reference else p.seeds.per_arm


def stages(protocol: Protocol) -> tuple[int, ...]:
    """Seeds per arm after each stage (``spectest.sequential.stage_sizes``); one stage unless
    ``seeds.max_per_arm`` is set."""
    return stage_sizes(protocol.seeds.per_arm, protocol.seeds.max_per_arm)


def make_plan(
    protocol: Protocol, *, candidate: bool = True, teeth: bool = True, stage: int | None = None
) -> Plan:
    """Expand a protocol. ``candidate=False`` gives the teeth-only plan of ``spectest teeth``;
    ``teeth=False`` skips the teeth arms. Seeds per arm are those of the full plan either way.

    ``stage`` (sequential protocols): the reference and candidate arms use the first
    ``stages(protocol)[stage]`` seeds of their reserved range, in one shard per prompt and
    stage ≤ ``stage``; None = the last stage. Teeth arms never grow.
    """
    sizes = stages(protocol)
    k = len(sizes) - 1 if stage is None else stage
    if not (0 <= k < len(sizes)):
        raise ConfigError(f"{protocol.source}: stage {stage!r} outside the {len(sizes)} stages")
    arms = tuple(
        _at_stage(a, sizes[k]) if len(sizes) > 1 else a  # one stage: the reserved sizes
        for a in all_arms(protocol)
        if a.role == "reference" or (a.role == "candidate" and candidate) or (a.is_tooth and teeth)
    )
    for i, a in enumerate(arms):  # collision-freedom is by construction; assert it anyway
        for b in arms[i + 1 :]:
            assert not a.seeds.overlaps(b.seeds), (a, b)
    cells = tuple((pr.id, cid) for pr in protocol.prompts.items for cid, _ in protocol.configs)
    shards = tuple(
        shard
        for a in arms
        for pr in protocol.prompts.items
        for shard in _shards(a, pr.id, sizes[: k + 1] if len(sizes) > 1 else ())
    )
    return Plan(protocol=protocol, arms=arms, cells=cells, shards=shards)


def _at_stage(arm: Arm, n: int) -> Arm:
    if arm.role not in ("reference", "candidate"):
        return arm
    return replace(arm, seeds=SeedRange(arm.seeds.start, arm.seeds.start + n))


def _shards(arm: Arm, prompt_id: str, sizes: tuple[int, ...]) -> tuple[Shard, ...]:
    """One shard, or (a growing arm of a sequential plan) one per stage with its new seeds."""
    if not sizes or arm.role not in ("reference", "candidate"):
        return (Shard(arm.name, prompt_id),)
    lo = arm.seeds.start
    bounds = [lo, *(lo + n for n in sizes)]
    return tuple(
        Shard(arm.name, prompt_id, j, SeedRange(bounds[j], bounds[j + 1]))
        for j in range(len(sizes))
    )


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
    arms = all_arms(protocol)
    return PlanSize(
        arms=len(arms),
        prompts=len(protocol.prompts.items),
        configs=len(protocol.configs),
        seeds=sum(len(a.seeds) for a in arms),
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
