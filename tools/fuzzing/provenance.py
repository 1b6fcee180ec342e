"""The ``resume`` and ``claim`` generators (issue 33, items 2 and 3).

``resume``: a run with an acceptor kernel file, then one edit of what it left — the kernel
rewritten with a bug, with a comment only, or byte for byte the same; a shard's samples file
rewritten with one token changed or truncated; a shard's digest deleted — then the same command
again into the same ``--out`` (``worker.run_resume``). What the second run must do
(``expect_resume``, checked by ``oracle.judge_resume``): an edited kernel regenerates the
candidate's shards and says so in the notes, never "0 generated"; an unchanged one resumes
everything, to the same exit code; a rewritten or truncated shard is exit 2 naming it; a deleted
digest regenerates that shard, to the same exit code.

``claim``: a tiny toy run whose teeth and candidate are catalogue mutants at few seeds, with or
without ``tests.power.max_mde_tv`` (1.0 included): the oracle's claim checks
(``oracle.judge_claim``) hold for every verdict — an exit 0 rests on a known per-cell MDE
within the requirement with cell-positions tested, never on a tooth's size, and a tooth killed
by the support check alone says so. Knows nothing about running a case.
"""

from __future__ import annotations

from typing import Any

import yaml

from fuzzing.common import (
    BAD_INPUT,
    KERNEL_OK,
    MAX_TOKENS,
    VERDICTS,
    file_entry,
    new_case,
    rng_for,
    toy_prompts,
    toy_protocol,
)

KERNEL_BUGGY = KERNEL_OK.replace(
    "ok = (p > 0) & (uniforms[:, :K] * q <= p)", "ok = (p > 0) | (uniforms[:, :K] >= 0)"
)
assert KERNEL_BUGGY != KERNEL_OK
EDITS = ("buggy", "comment", "same", "tamper_shard", "truncate_shard", "drop_digest")
MUTANTS = ("always_accept", "residual_from_p", "reuse_accept_uniform", "swapped_filter_order",
           "raw_q", "bonus_wrong_row", "greedy_verify")  # fmt: skip
CANDIDATES = ("exact", "exact", *MUTANTS)


def _argv(case: dict[str, Any]) -> list[str]:
    return [
        "run", "--config", "proto.yaml", "--out", case["out"], "--no-progress",
        "--set", f"limits.max_tokens={MAX_TOKENS}",
    ]  # fmt: skip


def resume_case(seed: int, index: int) -> dict[str, Any]:
    r = rng_for(seed, "resume", index)
    case = new_case("resume", index, seed, mode="resume")
    proto = toy_protocol(r)
    proto["version"] = 1
    proto["candidate"] = "acceptor:kernel.py:accept"
    proto["seeds"] = {"per_arm": r.choice([10, 20])}
    first = r.choice([KERNEL_OK, KERNEL_OK, KERNEL_BUGGY])
    case["files"]["proto.yaml"] = file_entry(yaml.safe_dump(proto, sort_keys=False))
    case["files"]["prompts.jsonl"] = file_entry(toy_prompts(r))
    case["files"]["kernel.py"] = file_entry(first)
    edit = r.choice(EDITS)
    after = {
        "buggy": KERNEL_BUGGY if first == KERNEL_OK else KERNEL_OK,
        "comment": first + "\n# edited after the first run\n",
        "same": first,
    }.get(edit)
    case["edit"] = {"op": edit, "files": {} if after is None else {"kernel.py": after}}
    case["argv"] = _argv(case)
    case["bound_s"] *= 2  # two runs
    case["notes"].append(f"edit {edit}; first kernel {'ok' if first == KERNEL_OK else 'buggy'}")
    return case


def expect_resume(op: str) -> str:
    """What the second run must do after edit ``op``: ``regenerate`` (a provenance note, the
    candidate's shards generated again), ``resume`` (the first run's exit, every shard resumed
    but the one whose digest was dropped), ``refuse`` (exit 2 naming the shard)."""
    if op in ("buggy", "comment"):
        return "regenerate"
    if op in ("tamper_shard", "truncate_shard"):
        return "refuse"
    return "resume"


def claim_case(seed: int, index: int) -> dict[str, Any]:
    r = rng_for(seed, "claim", index)
    case = new_case("claim", index, seed)
    proto = toy_protocol(r)
    proto["version"] = 1
    proto["seeds"] = {"per_arm": r.choice([5, 10, 20, 40])}
    proto["candidate"] = r.choice(CANDIDATES)
    proto["teeth"] = {
        "null_arm": r.random() < 0.5,
        "epsilons": r.choice([[], [], [0.5], [0.2, 0.5]]),
        "mutants": sorted(set(r.sample(MUTANTS, r.choice([1, 1, 2, 3])))),
        "size_budget": r.choice([64, 256]),
    }
    proto["tests"]["whitebox"] = r.random() < 0.5
    req = r.choice([None, None, 0.3, 0.6, 1.0])
    if req is not None:
        proto["tests"]["power"] = {"max_mde_tv": req}
    case["files"]["proto.yaml"] = file_entry(yaml.safe_dump(proto, sort_keys=False))
    case["files"]["prompts.jsonl"] = file_entry(toy_prompts(r))
    case["argv"] = _argv(case)
    # a mutant that coincides with the exact sampler under the configs is refused (exit 2, one
    # line): a correct answer, not a verdict
    case["expect"] = [*VERDICTS, *BAD_INPUT]
    case["notes"].append(
        f"candidate {proto['candidate']}, teeth {proto['teeth']}, seeds "
        f"{proto['seeds']['per_arm']}, max_mde_tv {req}"
    )
    return case
