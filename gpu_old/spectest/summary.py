"""The run summary: what ``summary.json`` stores and the CLI and the reports print.

Owns: ``build_summary`` (verdict, per-config table, teeth, every comparison), the tidy tables of
all comparisons concatenated with a ``comparison`` column, ``verdict_lines`` (the verdict as
every renderer prints it: headline, what was tested, the resolution, the reasons) and
``json_safe``. Knows nothing about
how tests are computed (it reads ``verdict.Comparison``) nor about files.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from spectest.plan import Arm
from spectest.store import SEQUENCE, TESTS, TRIE, WHITEBOX
from spectest.verdict import Comparison, Verdict

MAX_FAILING_LISTED = 20


def tidy_tables(results: Sequence[tuple[Arm, Any]]) -> dict[str, pd.DataFrame]:
    """Concatenate each analysis's tidy tables with a ``comparison`` column (the arm name)."""
    tables: dict[str, list[pd.DataFrame]] = {TESTS: [], TRIE: [], WHITEBOX: [], SEQUENCE: []}
    for arm, a in results:
        for fname, attr in (
            (TESTS, "cells"),
            (TRIE, "trie"),
            (WHITEBOX, "whitebox"),
            (SEQUENCE, "sequence"),
        ):
            df = getattr(a, attr, None)
            if df is not None and len(df):
                tables[fname].append(df.assign(comparison=arm.name))
    return {k: pd.concat(v, ignore_index=True) for k, v in tables.items() if v}


def build_summary(
    *,
    kind: str,
    name: str,
    protocol_hash: str | None,
    run_dir: Path,
    comparisons: Sequence[Comparison],
    verdict: Verdict,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """``summary.json``: everything the CLI, the reports and the JUnit file print."""
    cand = verdict.candidate
    teeth = [c for c in comparisons if c.is_tooth]
    tooth_v = {t.arm: t for t in verdict.teeth}
    config_ids: list[str] = []
    for c in comparisons:
        for cs in c.by_config:
            if cs.config_id not in config_ids:
                config_ids.append(cs.config_id)
    configs = []
    for cid in config_ids:
        main = cand or (teeth[0] if teeth else None)
        row: dict[str, Any] = {"config_id": cid}
        stats = next((cs for cs in main.by_config if cs.config_id == cid), None) if main else None
        if stats is not None:
            row.update(
                cells_tested=stats.cells_tested,
                cells_untestable=stats.cells_untestable,
                rejections=stats.rejections if cand is not None else None,
                max_tv_excess=stats.max_tv_excess if cand is not None else None,
                max_tv_where=stats.max_tv_where if cand is not None else None,
                mde_tv=stats.mde_tv,
            )
        # rejections of each tooth in this config's cells and trie nodes (white-box tests are
        # run-level: the teeth table has the verdicts)
        parts = []
        for t in teeth:
            ts = next((cs for cs in t.by_config if cs.config_id == cid), None)
            if ts is not None:
                parts.append(f"{t.arm.removeprefix('mutant:')} {ts.rejections}")
        row["teeth"] = ", ".join(parts)
        configs.append(row)
    return {
        "kind": kind,
        "name": name,
        "protocol_hash": protocol_hash,
        "run_dir": str(run_dir),
        "has_candidate": cand is not None,
        "verdict": verdict.to_dict(),
        "configs": configs,
        "teeth": [
            {
                "arm": c.arm,
                "role": c.role,
                "expect": c.expect,
                "rejected": c.rejected,
                "rejections": c.rejections,
                "label": tooth_v[c.arm].label,
                "sound": tooth_v[c.arm].sound,
                # an ε arm's / mutant's size: its largest per-cell-position TV (tooth_size)
                **(
                    {"size_tv": c.size_tv, "size_exact": c.size_exact, "size_where": c.size_where}
                    if c.expect == "fail"
                    else {}
                ),
            }
            for c in teeth
        ],
        "comparisons": [_comparison_dict(c) for c in comparisons],
        **dict(extra),
    }


def _comparison_dict(c: Comparison) -> dict[str, Any]:
    return {
        "arm": c.arm,
        "role": c.role,
        "expect": c.expect,
        "rejected": c.rejected,
        "cells_tested": c.cells_tested,
        "rejections": c.rejections,
        "min_qvalue": c.min_qvalue,
        "mde_tv": c.mde_tv,
        "failing": list(c.failing[:MAX_FAILING_LISTED]),
        "by_config": [vars(cs).copy() for cs in c.by_config],
    }


def json_safe(obj: Any) -> Any:
    """NaN / inf → None, numpy scalars → Python, recursively (summary.json is strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def verdict_lines(verdict: dict[str, Any]) -> list[str]:
    """The verdict as printed: the headline (decision, exit code, the claim), what was tested,
    at what resolution, then every reason. Falls back to the decision word for summaries
    written before headlines existed."""
    headline = verdict.get("headline") or (
        f"{verdict['decision'].upper()} (exit {verdict['exit_code']})"
    )
    lines = [headline]
    scope = verdict.get("scope") or {}
    for key in ("tested", "resolution"):
        if scope.get(key):
            lines.append(f"  {scope[key]}")
    lines += [f"  - {r}" for r in verdict["reasons"]]
    return lines
