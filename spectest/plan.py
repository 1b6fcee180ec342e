"""The plan: a ``Protocol`` expanded into arms, disjoint seed ranges, cells and shards.

Owns: ``Arm`` (reference, candidate, null, ε and mutant arms with what each must do and the
engine that runs it: the protocol's reference and candidate engines, the built-in engine for
every tooth),
``SeedRange`` (consecutive, disjoint per arm, collision-free by construction), ``Shard`` (one arm
× one prompt, the unit of generation and resume) and ``make_plan``. Knows nothing about models,
files or statistics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import quote

from spectest.errors import ConfigError
from spectest.protocol import EngineChoice, Protocol

ArmRole = Literal["reference", "candidate", "null", "eps", "mutant"]


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
    """The unit of generation and of resume: one arm × one prompt (all configs, all seeds)."""

    arm: str
    prompt_id: str

    @property
    def key(self) -> str:
        """A file-system-safe, injective name (``quote`` escapes ':' '=' '/' ...)."""
        return f"{quote(self.arm, safe='')}__{quote(self.prompt_id, safe='')}"


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
        ("reference", "reference", None, p.seeds.per_arm, "reference", p.reference_engine),
        (
            "candidate", "candidate", p.candidate_variant, p.seeds.per_arm, "subject",
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


def make_plan(protocol: Protocol, *, candidate: bool = True, teeth: bool = True) -> Plan:
    """Expand a protocol. ``candidate=False`` gives the teeth-only plan of ``spectest teeth``;
    ``teeth=False`` skips the teeth arms. Seeds per arm are those of the full plan either way."""
    arms = tuple(
        a
        for a in all_arms(protocol)
        if a.role == "reference" or (a.role == "candidate" and candidate) or (a.is_tooth and teeth)
    )
    for i, a in enumerate(arms):  # collision-freedom is by construction; assert it anyway
        for b in arms[i + 1 :]:
            assert not a.seeds.overlaps(b.seeds), (a, b)
    cells = tuple((pr.id, cid) for pr in protocol.prompts.items for cid, _ in protocol.configs)
    shards = tuple(Shard(a.name, pr.id) for a in arms for pr in protocol.prompts.items)
    return Plan(protocol=protocol, arms=arms, cells=cells, shards=shards)
