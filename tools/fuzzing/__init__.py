"""The fuzzer's case generators (``tools/fuzz.py`` drives them): one hostile input per case, a
pure function of ``(seed, kind, index)``.

Modules: ``common`` (what a case is, hostile values, byte mutations, the toy protocol), one
generator per kind — ``protocols`` (its mapping changes in ``protocol_map``), ``byo`` (its
table mutations in ``byo_mutations``), ``replies`` (the command program's script in
``reply_command``), ``plugins``, ``provenance`` (resume, claim) —, ``worker`` (runs cases
in-process) and ``oracle`` (judges an outcome). ``make_case`` and ``schedule`` are the entry
points. Nothing here imports spectest except ``worker`` and ``oracle``.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

from fuzzing.byo import byo_case
from fuzzing.common import KINDS
from fuzzing.plugins import plugin_case, plugin_death_case, plugin_hang_case
from fuzzing.protocols import protocol_case
from fuzzing.provenance import claim_case, resume_case
from fuzzing.replies import reply_case

GENERATORS = {
    "protocol": protocol_case,
    "byo": byo_case,
    "reply": reply_case,
    "plugin": plugin_case,
    "plugin_death": plugin_death_case,
    "plugin_hang": plugin_hang_case,
    "resume": resume_case,  # issue 33.2: edited-program resumes, rewritten shards
    "claim": claim_case,  # issue 33.3: tooth-only power claims at few seeds
}


def make_case(seed: int, index: int, kind: str) -> dict[str, Any]:
    """The case ``index`` of ``kind`` under ``seed`` (a pure function of the three)."""
    case = GENERATORS[kind](seed, index)
    json.dumps(case)  # JSON-ready, or a generator bug
    return case


def schedule(seed: int, n: int, weights: dict[str, float]) -> list[str]:
    """The kind of each of ``n`` cases: the proportions of ``weights``, interleaved
    deterministically (largest remainder per prefix, then a seeded shuffle within blocks)."""
    total = sum(weights.values())
    counts = {k: math.floor(n * w / total) for k, w in weights.items()}
    rest = n - sum(counts.values())
    for k in sorted(weights, key=lambda k: -(n * weights[k] / total - counts[k]))[:rest]:
        counts[k] += 1
    kinds = [k for k in weights for _ in range(counts[k])]
    random.Random(f"{seed}/schedule").shuffle(kinds)
    return kinds


__all__ = ["KINDS", "make_case", "schedule"]
