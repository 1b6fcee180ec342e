"""The run summary: what ``summary.json`` stores (``build_summary``, ``json_safe``) and how
the CLI and the reports print its verdict (``verdict_lines``, ``rejections_account``).
The details: docs/internals.md "spectest/decision/summary.py".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spectest.decision.comparison import Comparison, pick
from spectest.decision.header import Header
from spectest.decision.verdict import Verdict

MAX_FAILING_LISTED = 20


def build_summary(
    header: Header,
    *,
    run_dir: Path,
    comparisons: Sequence[Comparison],
    verdict: Verdict,
    details: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``summary.json``: everything the CLI, the reports and the JUnit file print (``details``:
    each analysis's own summary, by arm, when the run has its analyses)."""
    cand = verdict.candidate
    teeth = [c for c in comparisons if c.is_tooth]
    return {
        "kind": header.kind,
        "name": header.name,
        "protocol_hash": header.protocol_hash,
        "run_dir": str(run_dir),
        "has_candidate": cand is not None,
        "verdict": verdict.to_dict(),
        "configs": _config_rows(comparisons, cand, teeth),
        "teeth": [
            {
                **pick(c, "arm role expect rejected rejections label sound"),
                # a plain null: what it compared (the reference engine against itself)
                **({"null": c.null_words} if c.null_engine is not None else {}),
                # an ε arm's / mutant's size: its largest per-cell-position TV (tooth_size)
                **(pick(c, "size_tv size_exact size_where") if c.expect == "fail" else {}),
            }
            for c in teeth
        ],
        "comparisons": [_comparison_dict(c) for c in comparisons],
        "notes": list(header.notes),
        "analysis": None if header.analysis is None else dict(header.analysis),
        **header.setup,
        **({} if details is None else {"details": dict(details)}),
    }


def _config_rows(
    comparisons: Sequence[Comparison], cand: Comparison | None, teeth: Sequence[Comparison]
) -> list[dict[str, Any]]:
    """One row per config id (in first-seen order): the main comparison's (the candidate, else
    the first tooth) cells, rejections and MDE, and each tooth's rejections in its cells and trie
    nodes (white-box tests are run-level: the teeth table has those)."""
    config_ids = list(dict.fromkeys(cs.config_id for c in comparisons for cs in c.by_config))
    main = cand or (teeth[0] if teeth else None)
    configs = []
    for cid in config_ids:
        row: dict[str, Any] = {"config_id": cid}
        stats = next((cs for cs in main.by_config if cs.config_id == cid), None) if main else None
        if stats is not None:
            row.update(
                cells_tested=stats.cells_tested,
                cells_untestable=stats.cells_untestable,
                rejections=stats.rejections if cand is not None else None,
                rejections_by_family=dict(stats.rejections_by_family) if cand is not None else {},
                max_tv_excess=stats.max_tv_excess if cand is not None else None,
                max_tv_where=stats.max_tv_where if cand is not None else None,
                mde_tv=stats.mde_tv,
            )
        parts = []
        for t in teeth:
            ts = next((cs for cs in t.by_config if cs.config_id == cid), None)
            if ts is not None:
                parts.append(f"{t.arm.removeprefix('mutant:')} {ts.rejections}")
        row["teeth"] = ", ".join(parts)
        configs.append(row)
    return configs


def _comparison_dict(c: Comparison) -> dict[str, Any]:
    return {
        **pick(c, "arm role expect rejected cells_tested rejections"),
        "rejections_by_family": dict(c.rejections_by_family),
        **pick(c, "min_qvalue mde_tv"),
        "failing": list(c.failing[:MAX_FAILING_LISTED]),
        "by_config": [
            {**vars(cs), "rejections_by_family": dict(cs.rejections_by_family)}
            for cs in c.by_config
        ],
    }


def rejections_account(summary: Mapping[str, Any]) -> str:
    """How the candidate's rejections add up: per family, those counted in the per-config
    table (families whose tests belong to a config) and the run-level rest, to the headline's
    total. Empty without a candidate (or for a summary written before the counts existed)."""
    cand = next((c for c in summary.get("comparisons", []) if c.get("role") == "candidate"), None)
    if cand is None or "rejections_by_family" not in cand:
        return ""
    in_table: dict[str, int] = {}
    for row in summary.get("configs", []):
        for label, n in (row.get("rejections_by_family") or {}).items():
            in_table[label] = in_table.get(label, 0) + int(n)
    by_family = cand["rejections_by_family"]
    run_level = {k: int(n) - in_table.get(k, 0) for k, n in by_family.items()}
    table_part = " + ".join(f"{k} {n}" for k, n in in_table.items() if n) or "none"
    rest = " + ".join(f"{k} {n}" for k, n in run_level.items() if n) or "none"
    return (
        f"candidate rejections: {cand['rejections']} in all = in the per-config table "
        f"{sum(in_table.values())} ({table_part}) + run-level, in no config "
        f"{sum(run_level.values())} ({rest})"
    )


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
    at what resolution, any family's line of its own, then every reason. Falls back to the
    decision word for summaries written before headlines existed."""
    headline = verdict.get("headline") or (
        f"{verdict['decision'].upper()} (exit {verdict['exit_code']})"
    )
    lines = [headline]
    scope = verdict.get("scope") or {}
    for key in ("tested", "resolution"):
        if scope.get(key):
            lines.append(f"  {scope[key]}")
    # the two claims of matched numerics mode, then a family's line of its own
    # (``FamilyScope.verdict_line``)
    lines += [f"  {c}" for c in scope.get("claims", ())]
    lines += [f"  {f['verdict_line']}" for f in scope.get("families", ()) if f.get("verdict_line")]
    lines += [f"  - {r}" for r in verdict["reasons"]]
    return lines
