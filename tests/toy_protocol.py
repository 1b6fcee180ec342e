"""Test helper (not a test module): a tiny protocol on the analytic toy LM, written to a
directory, so CLI / e2e / notebook tests run in seconds without the bundled pair."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

TOY = {
    "version": 1,
    "name": "toy",
    "models": {
        "target": "toy:V=16,order=2,scale=2.0,seed=3",
        "draft": "toy:V=16,order=2,scale=1.0,seed=4",
    },
    "drafter": {"kind": "onehot", "k": 3},
    "prompts": {"file": "prompts.jsonl"},
    "configs": {"a": {"temperature": 0.8, "top_p": 0.95}, "b": {"temperature": 1.0, "top_k": 5}},
    "seeds": {"per_arm": 200},
    "positions": 4,
    # the per-cell MDE at 200 seeds is ≈ 0.3 here: the requirement says so (issue 33: a killed
    # tooth's size no longer stands in for the MDE)
    "tests": {
        "alpha": 0.05,
        "trie": {"depth": 2, "min_count": 100},
        "null_permutations": 100,
        "power": {"max_mde_tv": 0.4},
    },
    "teeth": {"null_arm": True, "epsilons": [0.5], "mutants": ["always_accept"]},
    "batch_size": 400,
}


def write_toy(directory: Path, name: str = "toy.yaml", **sections: Any) -> Path:
    """Write the toy protocol (top-level sections replaced by ``sections``) and its prompts."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "prompts.jsonl").write_text(
        '{"id": "p0", "ids": [1, 2, 3]}\n{"id": "p1", "ids": [4, 5]}\n'
    )
    body = {**TOY, **sections}
    path = directory / name
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path
