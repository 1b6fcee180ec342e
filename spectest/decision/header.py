"""What a summary is about (``Header``) and a protocol run's setup (``protocol_setup``,
``arm_engines``). The details: docs/internals.md "spectest/decision/header.py".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spectest.protocol import Protocol as RunProtocol


@dataclass(frozen=True)
class Header:
    """What a summary is about: its ``kind`` (run, teeth, compare), ``name``, ``protocol_hash``
    (a comparison's: of its data and settings), ``analysis`` (the test settings,
    ``AnalysisOptions.canonical()``), ``notes`` and, for a protocol run, ``setup``
    (``protocol_setup``)."""

    kind: str
    name: str
    protocol_hash: str | None
    analysis: Mapping[str, Any] | None
    notes: tuple[str, ...] = ()
    setup: Mapping[str, Any] = field(default_factory=dict)


def protocol_setup(
    protocol: RunProtocol,
    *,
    seeds_per_arm: int,
    timings: Mapping[str, Any],
    sequential: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A protocol run's setup as its summary states it: models, drafter, engines, candidate,
    positions, the seeds per arm tested, the prompt set, the phase wall times and (sequential
    runs) the path of the evidence."""
    return {
        "models": vars(protocol.models).copy(),
        "drafter": protocol.drafter.canonical(),
        "engines": protocol.engines_canonical(),
        "arms_engines": arm_engines(protocol),
        "candidate": protocol.candidate,
        "positions": protocol.positions,
        "seeds_per_arm": seeds_per_arm,
        "prompt_set": protocol.prompts.file,
        "timings": dict(timings),
        **({} if sequential is None else {"sequential": dict(sequential)}),
    }


def arm_engines(protocol: RunProtocol) -> dict[str, str]:
    """Each arm's engine and drafter as the header states them: an engine of spectest's own
    decode loop (``BuiltinEngine`` and its subclasses) drafts with the protocol's drafter; any
    other engine (vLLM, llama.cpp, transformers, a command or plug-in) uses its own, which the
    protocol's drafter section does not describe. The ε and mutant teeth always run on
    ``builtin``; the null too unless it is the reference engine's own (``null``: stated then)."""
    from spectest.engines.builtin import BuiltinEngine
    from spectest.engines.registry import engine_class

    d = protocol.drafter
    q = f" q={d.q_mode}" if d.kind == "sampled" else ""
    ours = f"spectest's drafter {d.kind} K={d.k}{q}"

    def spectest_loop(name: str) -> bool:
        try:
            return issubclass(engine_class(name), BuiltinEngine)
        except Exception:  # an engine no longer installed: say nothing about its drafter
            return False

    ref, cand = protocol.reference_engine.name, protocol.candidate_engine.name
    out = {
        "reference": f"{ref} (plain decoding, no drafter)",
        "candidate": f"{cand} ({ours})"
        if spectest_loop(cand)
        else f"{cand} (the engine's own sampler and drafter)",
        "teeth": f"builtin ({ours})",
    }
    if protocol.null_on_reference:  # no builtin tooth left when there is no ε arm or mutant
        out["null"] = f"{ref} (plain vs plain, disjoint seeds)"
        if not (protocol.teeth.epsilons or protocol.teeth.mutants):
            del out["teeth"]
    return out
