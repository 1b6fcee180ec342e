"""The protocol's YAML form: what a run directory stores as ``protocol.yaml``.

Owns: ``to_raw`` (a ``Protocol`` → a YAML-ready mapping that ``protocol_from_dict`` reads back to
the same hash, with the prompt set pointing at a given file: the store copies the prompts beside
it, so a run directory is self-contained; ``spectest.prompts.prompts_jsonl`` writes that file).
"""

from __future__ import annotations

from typing import Any

from spectest.protocol.spec import Protocol


def to_raw(protocol: Protocol, *, prompts_file: str) -> dict[str, Any]:
    """The protocol as a YAML-ready mapping, prompts at ``prompts_file``."""
    p = protocol
    return {
        "version": p.version,
        "name": p.name,
        "description": p.description,
        "models": vars(p.models).copy(),
        "drafter": p.drafter.canonical(),
        "prompts": {"file": prompts_file},
        "configs": {cid: vars(sp).copy() for cid, sp in p.configs},
        "seeds": p.seeds.canonical(),
        "positions": p.positions,
        "candidate": p.candidate,
        "tests": p.tests.yaml_form(),
        "teeth": p.teeth.raw(),
        "output": p.output,
        "batch_size": p.batch_size,
        **({} if p.limits.max_tokens is None else {"limits": vars(p.limits).copy()}),
        **p.engine_fields(),
        **({"arms": {"floor": p.floor.canonical()}} if p.floor is not None else {}),
    }
