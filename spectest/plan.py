"""The plan: a ``Protocol`` expanded into arms with disjoint seed ranges, cells and shards
(``make_plan``), and the run-level decisions resolved once (``RunSettings``).

The why and the details: docs/internals.md "spectest/plan.py".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from urllib.parse import quote

from spectest.engines.registry import engine_class
from spectest.errors import ConfigError
from spectest.models.dtypes import LOW_PRECISION
from spectest.protocol import MATCHED, ArmRole, EngineChoice, Protocol, arm_specs, is_plain_null
from spectest.sequential import look_alphas, stage_sizes
from spectest.stats.options import AnalysisOptions


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
    """One arm of the plan: a ``protocol.ArmSpec`` (role, variant, what it must do, engine; see
    there) with its seeds laid out (``seeds``: this arm's range, at this plan's stage)."""

    name: str
    role: ArmRole
    variant: str | None
    seeds: SeedRange
    expect: str
    engine: EngineChoice = field(default_factory=EngineChoice.builtin)

    @property
    def is_tooth(self) -> bool:
        return self.role in ("null", "eps", "mutant")

    @property
    def null_engine(self) -> str | None:
        """The engine a plain null compares with itself (the reference engine, plain vs plain
        on disjoint seeds: ``protocol.arms.null_spec``), else None."""
        return self.engine.name if is_plain_null(self.role, self.variant) else None

    @property
    def is_sized(self) -> bool:
        """A tooth that must be killed and has a size (``spectest.tooth_size``): ε arm, mutant."""
        return self.role in ("eps", "mutant")


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
class RunSettings:
    """The run-level decisions of a plan, made once (``make_plan``; ``spectest compare``:
    ``byo_settings``). ``options``: the test settings as the statistics take them — the
    protocol's ``tests`` with the white-box mode of the plan's engines (``whitebox_mode``) and, in
    a sequential plan, the α of this stage's look. ``key``: the analysis key (``seeds.key``).
    ``run_alpha``: the protocol's α (matched numerics mode's claim (b) is decided at it, not at
    a look's). ``readout``: arms whose rounds are a readout (``readout_arms``). ``sized_teeth``:
    (arm, variant) of the teeth with a size (``Arm.is_sized``). ``matched``: matched numerics
    mode (the plan has the ``matched`` arm)."""

    options: AnalysisOptions
    key: str
    run_alpha: float
    readout: frozenset[str] = frozenset()
    sized_teeth: tuple[tuple[str, str], ...] = ()
    matched: bool = False

    @property
    def max_mde_tv(self) -> float | None:
        """The verdict's power requirement (None: the verdict's default)."""
        return self.options.max_mde_tv


@dataclass(frozen=True)
class Plan:
    """The expansion of a protocol: what to generate and what to compare, and the run-level
    decisions (``settings``)."""

    protocol: Protocol
    arms: tuple[Arm, ...]
    cells: tuple[tuple[str, str], ...]  # (prompt_id, config_id)
    shards: tuple[Shard, ...]
    settings: RunSettings

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(name)

    @property
    def comparisons(self) -> tuple[Arm, ...]:
        """Every arm that is not a reference (plain or matched): each is compared with its
        reference (``reference_for``)."""
        return tuple(a for a in self.arms if a.role not in REFERENCE_ROLES)

    @property
    def matched(self) -> bool:
        """Matched numerics mode: the plan has the ``matched`` arm (``protocol.arms``)."""
        return self.settings.matched

    def reference_for(self, arm: Arm | str) -> str:
        """The name of the arm ``arm`` is compared with: ``matched`` (spectest's exact sampler
        in the candidate's own loop) in matched numerics mode, else the plain ``reference``
        (a plain null: always the plain ``reference``)."""
        return reference_for(self.arms, arm)

    @property
    def seed_ranges(self) -> dict[str, list[int]]:
        return {a.name: [a.seeds.start, a.seeds.stop] for a in self.arms}


REFERENCE_ROLES = ("reference", "matched", "floor")  # arms compared with no reference


def reference_for(arms: tuple[Arm, ...] | list[Arm], arm: Arm | str) -> str:
    """``Plan.reference_for`` over a bare list of arms (``judge.compare_all``'s callers). A
    plain null (the reference engine against itself) is always compared with ``reference``."""
    name = arm if isinstance(arm, str) else arm.name
    if name in ("reference", MATCHED):
        return "reference"
    if any(a.name == name and a.null_engine is not None for a in arms):
        return "reference"
    return MATCHED if any(a.role == "matched" for a in arms) else "reference"


def all_arms(protocol: Protocol) -> tuple[Arm, ...]:
    """Every arm the protocol defines (``protocol.arm_specs``), with disjoint seed ranges laid
    out consecutively in that order from ``seeds.start`` — so a teeth-only plan and a full plan
    give each arm the same seeds, and a tooth added at the end moves no earlier arm."""
    arms: list[Arm] = []
    cursor = protocol.seeds.start
    for a in arm_specs(protocol):
        arms.append(
            Arm(a.name, a.role, a.variant, SeedRange(cursor, cursor + a.seeds), a.expect, a.engine)
        )
        cursor += a.seeds
    return tuple(arms)


def stages(protocol: Protocol) -> tuple[int, ...]:
    """Seeds per arm after each stage (``spectest.sequential.stage_sizes``); one stage unless
    ``seeds.max_per_arm`` is set."""
    return stage_sizes(protocol.seeds.per_arm, protocol.seeds.max_per_arm)


def make_plan(
    protocol: Protocol, *, teeth_only: bool = False, teeth: bool = True, stage: int | None = None
) -> Plan:
    """Expand a protocol. ``teeth_only`` gives the plan of ``spectest teeth`` (no candidate
    arm); ``teeth=False`` skips the teeth arms. Seeds per arm are those of the full plan either
    way.

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
        if (a.role in REFERENCE_ROLES and not (a.role == "floor" and teeth_only))
        or (a.role == "candidate" and not teeth_only)
        or (a.is_tooth and teeth)
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
    alpha = protocol.tests.alpha
    if len(sizes) > 1 and not teeth_only:  # a sequential plan tests at its look's α
        alpha = look_alphas(alpha, sizes, protocol.seeds.spending)[k]
    settings = RunSettings(
        options=replace(
            protocol.tests, alpha=alpha, whitebox_mode=whitebox_mode(protocol.models.dtype, arms)
        ),
        key=protocol.seeds.key,
        run_alpha=protocol.tests.alpha,
        readout=readout_arms(arms),
        sized_teeth=tuple((a.name, str(a.variant)) for a in arms if a.is_sized),
        matched=any(a.role == "matched" for a in arms),
    )
    return Plan(protocol=protocol, arms=arms, cells=cells, shards=shards, settings=settings)


def whitebox_mode(dtype: str, arms: Sequence[Arm]) -> str:
    """'teacher' when some arm's white-box columns come from a teacher whose numerics may differ
    from its engine's — an engine with ``whitebox == "teacher"`` in bf16/fp16, or a token-only
    engine (``whitebox == "tokens"``: command, http) in any dtype — else 'exact'
    (``stats.options.AnalysisOptions.whitebox_mode``).

    The built-in engine records its columns at generation time in every dtype (exact); a
    teacher's full-sequence forward matches incremental decoding within float32 rounding but
    not in bf16/fp16. In teacher mode every arm is forced by one shared teacher
    (``generation.EngineSet``), so that the two-sample tests compare one function of the
    sequences.
    """
    kinds = {engine_class(a.engine.name).whitebox for a in arms}
    if "tokens" in kinds or ("teacher" in kinds and dtype in LOW_PRECISION):
        return "teacher"
    return "exact"


def readout_arms(arms: Sequence[Arm]) -> frozenset[str]:
    """Arms whose engine reports its rounds as a readout (``Engine.rounds == "readout"``)."""
    return frozenset(a.name for a in arms if engine_class(a.engine.name).rounds == "readout")


_GROWING = ("reference", "candidate", "matched")  # the arms a sequential run grows


def _at_stage(arm: Arm, n: int) -> Arm:
    if arm.role not in _GROWING:
        return arm
    return replace(arm, seeds=SeedRange(arm.seeds.start, arm.seeds.start + n))


def _shards(arm: Arm, prompt_id: str, sizes: tuple[int, ...]) -> tuple[Shard, ...]:
    """One shard, or (a growing arm of a sequential plan) one per stage with its new seeds."""
    if not sizes or arm.role not in _GROWING:
        return (Shard(arm.name, prompt_id),)
    lo = arm.seeds.start
    bounds = [lo, *(lo + n for n in sizes)]
    return tuple(
        Shard(arm.name, prompt_id, j, SeedRange(bounds[j], bounds[j + 1]))
        for j in range(len(sizes))
    )
