"""Bring your own samples: ``spectest compare`` on two files an external engine produced.

Owns: reading and checking the pair of files (same cells in both), the arms and test settings of
a comparison (no teeth, no white-box), its result directory (``results/compare-<hash>``, hashed on
the data and the settings). Knows nothing about models; the tests and the verdict go through the
same ``judge.compare_all`` / ``judge.finish_run`` as a protocol run.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from spectest import schema
from spectest.byo import read_samples_file
from spectest.errors import ConfigError, InputError
from spectest.judge import (
    ProgressFn,
    RunResult,
    analysis_options,
    compare_all,
    finish_run,
    no_progress,
)
from spectest.plan import Arm, SeedRange
from spectest.protocol import TestsSpec, TrieSpec
from spectest.stats.analyze import OptionError
from spectest.store import RunDir, make_provenance


def byo_arms() -> list[Arm]:
    return [
        Arm("reference", "reference", None, SeedRange(0, 0), "reference"),
        Arm("candidate", "candidate", None, SeedRange(0, 0), "subject"),
    ]


def byo_tests(d: Mapping[str, Any]) -> Any:
    return TestsSpec(
        alpha=d["alpha"],
        multiplicity=d["multiplicity"],
        min_expected=d["min_expected"],
        trie=TrieSpec(**d["trie"]),
        whitebox=False,
        null_permutations=d["null_permutations"],
        max_mde_tv=d.get("max_mde_tv"),
    )


def compare_files(
    reference: str | Path,
    candidate: str | Path,
    *,
    alpha: float = 0.05,
    multiplicity: str = "bh",
    max_mde_tv: float | None = None,
    out: str | Path | None = None,
    progress: ProgressFn | None = None,
) -> RunResult:
    """Black-box tests on two bring-your-own samples files; results stored like a run's.

    ``max_mde_tv``: the required per-cell resolution (median MDE in TV); ``None`` applies
    ``spectest.verdict.DEFAULT_MAX_MDE_TV``, since a comparison runs no teeth (see there).
    """
    t0 = time.perf_counter()
    progress = progress or no_progress
    if max_mde_tv is not None and not (0.0 < max_mde_tv <= 1.0):
        raise ConfigError(f"--max-mde-tv: expected a number in (0, 1], got {max_mde_tv!r}")
    analysis_d = {
        "alpha": alpha,
        "multiplicity": multiplicity,
        "min_expected": 5.0,
        "trie": {"depth": 2, "min_count": 200},
        "whitebox": False,
        "null_permutations": 200,
        "max_mde_tv": max_mde_tv,
    }
    tests = byo_tests(analysis_d)
    try:  # the analysis' own validator, before any file is read (protocol._check_tests)
        analysis_options(tests)
    except OptionError as err:
        flag = {"alpha": "--alpha", "multiplicity": "--multiplicity"}.get(err.option, err.option)
        raise ConfigError(f"{flag}: {err.rule}, got {err.value!r}") from None
    ref = read_samples_file(reference)
    cand = read_samples_file(candidate)
    cells_r = set(map(tuple, ref[list(schema.CELL)].drop_duplicates().to_numpy().tolist()))
    cells_c = set(map(tuple, cand[list(schema.CELL)].drop_duplicates().to_numpy().tolist()))
    if cells_r != cells_c:
        only_r, only_c = sorted(cells_r - cells_c), sorted(cells_c - cells_r)
        which, cell, other = (
            (reference, only_r[0], candidate) if only_r else (candidate, only_c[0], reference)
        )
        raise InputError(
            f"{which}: cell (prompt_id, config_id) = {cell!r} is not in {other} "
            f"({len(only_r) + len(only_c)} cell(s) not shared; "
            "the two files must hold the same cells)"
        )
    samples = pd.concat(
        [ref.assign(**{schema.ARM: "reference"}), cand.assign(**{schema.ARM: "candidate"})],
        ignore_index=True,
    )
    samples = samples[[f.name for f in schema.SAMPLES_SCHEMA]]
    digest = hashlib.sha256()
    for df in (ref, cand):
        digest.update(
            pd.util.hash_pandas_object(df[[f.name for f in schema.BYO_SCHEMA]], index=False)
            .to_numpy()
            .tobytes()
        )
    digest.update(repr(sorted(analysis_d.items())).encode())
    h = digest.hexdigest()
    run_dir = Path(out) if out is not None else Path("results") / f"compare-{h[:10]}"
    rd = RunDir.open(
        run_dir,
        {
            "kind": "compare",
            "protocol_hash": h,
            "name": "compare",
            "reference": str(reference),
            "candidate": str(candidate),
        },
        replace=True,  # nothing to resume: a re-run (after a failure, or of new data) replaces it
    )
    provenance = make_provenance(protocol_hash=h, device="n/a", seed_ranges={}, kind="compare")
    results = compare_all(samples, None, byo_arms(), tests, "compare", progress)
    verdict, comparisons, summary = finish_run(
        rd,
        samples=samples,
        rounds=None,
        results=results,
        summary_base={
            "kind": "compare",
            "name": f"{Path(reference).name} vs {Path(candidate).name}",
            "protocol_hash": h,
            "analysis": analysis_d,
            "notes": [],
        },
        provenance=provenance,
        max_mde_tv=max_mde_tv,
        junit=None,
        summary_md=None,
    )
    return RunResult(rd.path, verdict, comparisons, summary, 0, 0, time.perf_counter() - t0)
