"""The arms a protocol defines (``ArmSpec``, ``arm_specs``): which, in which order, with how
many seeds, on which engine.

The why and the details: docs/internals.md "spectest/protocol/arms.py".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from spectest.errors import ConfigError
from spectest.protocol.spec import EngineChoice, Protocol

ArmRole = Literal["reference", "candidate", "null", "eps", "mutant", "matched", "floor"]
MATCHED = "matched"  # the numerics-matched reference arm's name (``tests.numerics: matched``)
FLOOR = "floor"  # the floor arm's name (``arms.floor``)


@dataclass(frozen=True)
class ArmSpec:
    """One arm a protocol defines, before its seeds are laid out (``plan.Arm``).

    ``role``: reference (plain decode), candidate (the protocol's sampler), null / eps / mutant
    (teeth). ``variant``: the sampler variant spec (``None`` for the plain reference).
    ``seeds``: how many seeds it reserves (a sequential arm's last stage). ``expect``:
    ``"subject"`` for the candidate, ``"pass"`` for the null, ``"fail"`` for ε and mutants,
    ``"reference"`` for the reference. ``engine``: the engine that generates it (the built-in
    engine for ε arms and mutants: they prove the harness's power with spectest's own sampler,
    whatever engine is under test; the null's: ``null_spec``)."""

    name: str
    role: ArmRole
    variant: str | None
    seeds: int
    expect: str
    engine: EngineChoice


def eps_arm_name(eps: float) -> str:
    return f"eps={eps:g}"


def mutant_arm_name(spec: str) -> str:
    return f"mutant:{spec}"


def arm_specs(protocol: Protocol) -> tuple[ArmSpec, ...]:
    """Every arm the protocol defines, in the order reference, candidate, null, ε...,
    mutants... (the order their seed ranges are laid out in: a tooth added at the end moves no
    earlier arm). Two teeth of one name (``eps=0.1`` and ``eps=0.10``) are a ``ConfigError``."""
    p = protocol
    builtin = EngineChoice.builtin()  # ε arms and mutants run on spectest's own sampler
    n_teeth = p.seeds.teeth_per_arm
    arms = [
        ArmSpec(
            "reference", "reference", None, _reserved(p, True), "reference", p.reference_engine
        ),
        ArmSpec(
            "candidate",
            "candidate",
            p.candidate_variant,
            _reserved(p),
            "subject",
            p.candidate_engine,
        ),
    ]
    if p.teeth.null:
        arms.append(null_spec(p, n_teeth))
    for eps in p.teeth.epsilons:
        arms.append(
            ArmSpec(eps_arm_name(eps), "eps", f"eps_biased:{eps:g}", n_teeth, "fail", builtin)
        )
    for mut in p.teeth.mutants:
        arms.append(ArmSpec(mutant_arm_name(mut), "mutant", mut, n_teeth, "fail", builtin))
    if p.numerics_mode == MATCHED:
        host = p.candidate_engine if p.candidate_engine.name in ("builtin", "fast") else builtin
        arms.append(ArmSpec(MATCHED, "matched", "exact", _reserved(p, True), "reference", host))
    if p.floor is not None and p.floor.teacher is None:  # last: no earlier arm's seeds move
        arms.append(ArmSpec(FLOOR, "floor", None, _reserved(p, True), "reference", p.floor.engine))
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise ConfigError(f"{p.source}: teeth: two teeth arms share the name {names!r}")
    return tuple(arms)


def null_spec(p: Protocol, seeds: int) -> ArmSpec:
    """The null tooth: the reference engine itself, plain decoding on its own seeds, when
    ``Protocol.null_on_reference`` (a foreign reference: the same law as the reference by
    construction, at any numerics, so a rejection says its seeding does not give independent
    draws of one law); else spectest's exact sampler on the built-in engine (its law is plain
    decoding's by the exactness theorem). docs/protocols.md "The null tooth"."""
    if p.null_on_reference:
        return ArmSpec("null", "null", None, seeds, "pass", p.reference_engine)
    return ArmSpec("null", "null", "exact", seeds, "pass", EngineChoice.builtin())


def is_plain_null(role: str, variant: str | None) -> bool:
    """A null arm that plain-decodes on the reference engine (``null_spec``)."""
    return role == "null" and variant is None


def _reserved(p: Protocol, reference: bool = False) -> int:
    """Seeds reserved for the reference and candidate arms: the last stage's (sequential); the
    reference's own size when ``seeds.reference_per_arm`` is set (never with stages)."""
    if p.seeds.max_per_arm is not None:
        return p.seeds.max_per_arm
    return p.seeds.reference if reference else p.seeds.per_arm
