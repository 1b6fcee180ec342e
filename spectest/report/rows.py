"""The rows of the report's tables and its one-line accounts, as plain strings, and how a number
is printed (``fmt``). Computes no statistic; knows no format.

The why and the details: docs/internals.md "spectest/report/rows.py".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from spectest.store import SAMPLES, TOOTH_SIZES, WHITEBOX
from spectest.stored import StoredRun

N_DECODED = 3  # decoded samples shown per arm


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "—"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def config_rows(summary: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = [
        "config",
        "cells tested",
        "rejections in this config",
        "max TV excess",
        "where",
        "MDE (TV)",
        "teeth rejections",
    ]
    rows = [
        [
            r["config_id"],
            *config_counts(r),
            _fmt(r.get("max_tv_excess")),
            _fmt(r.get("max_tv_where")),
            _fmt(r.get("mde_tv")),
            r.get("teeth", ""),
        ]
        for r in summary.get("configs", [])
    ]
    return header, rows


def config_counts(r: dict[str, Any]) -> tuple[str, str]:
    """A config row's "cells tested" (with the untestable) and "rejections" (by family)."""
    by = r.get("rejections_by_family")
    return (
        f"{r.get('cells_tested', '—')}"
        + (f" (+{r['cells_untestable']} untestable)" if r.get("cells_untestable") else ""),
        _fmt(r.get("rejections"))
        + (" (" + ", ".join(f"{k} {n}" for k, n in by.items()) + ")" if by else ""),
    )


def teeth_rows(summary: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Each tooth: what it must do, its rejections, its smallest adjusted cell p-value against
    the cell family's α (the kill margin in decades: log10(α_cells / min p adj), negative for a
    tooth that passed, as it must), its size against the run's resolution, and its verdict."""
    header = ["arm", "must", "rejections", "min p adj (cells)", "margin", "size vs MDE", "verdict"]
    comps = {c["arm"]: c for c in summary.get("comparisons", [])}
    details = summary.get("details") or {}
    mde = (summary.get("verdict") or {}).get("mde_tv")
    rows = []
    for t in summary.get("teeth", []):
        c = comps.get(t["arm"], {})
        q = c.get("min_qvalue")
        a = (details.get(t["arm"]) or {}).get("alpha_cells")
        margin = "—"
        if q is not None and a:
            margin = f"{math.log10(a / max(q, 1e-300)):+.1f} decades"
        size = t.get("size_tv")
        vs = "—"
        if size is not None:
            vs = f"{size:.3g}" + (f" = {size / mde:.1f} × MDE {mde:.3g}" if mde else "")
        rows.append(
            [
                t["arm"],
                ("pass" + (f" ({t['null']})" if t.get("null") else ""))
                if t["expect"] == "pass"
                else "be killed",
                str(t["rejections"]),
                "—" if q is None else f"{q:.2g}",
                margin,
                vs,
                t["label"],
            ]
        )
    return header, rows


def arms_line(summary: dict[str, Any]) -> str:
    """Each arm's engine and drafter (``summary.arm_engines``), else the older header's."""
    arms = summary.get("arms_engines")
    if arms:
        first = ("reference", "candidate", "null", "teeth")
        order = [*first, *[k for k in arms if k not in first]]
        return "Arms: " + "; ".join(f"{r} on {arms[r]}" for r in order if r in arms) + "."
    eng = summary.get("engines") or {}
    return "Engines: " + ", ".join(f"{r} {e.get('name')}" for r, e in eng.items()) + "."


def tooth_size_rows(stored: StoredRun) -> tuple[list[str], list[list[str]]]:
    """The bug sizes that matter beside the resolution: each tooth's exact (or bounded) TV per
    cell-position from ``tooth_sizes.parquet`` (smallest, median, largest) against the
    candidate's per-cell MDE (median, worst) from the summary."""
    header = ["tooth", "size TV: min", "median", "max", "exact", "run's MDE (median, worst)"]
    ts = stored.table(TOOTH_SIZES)
    if ts is None or len(ts) == 0:
        return header, []
    v = stored.summary.get("verdict") or {}
    scope = v.get("scope") or {}
    res = f"{_fmt(v.get('mde_tv'), 3)}, {_fmt(scope.get('mde_tv_max'), 3)}"
    rows = []
    for arm, g in ts.groupby("arm", sort=False):
        tv = g["tv"].astype(float)
        rows.append(
            [
                str(arm),
                _fmt(float(tv.min()), 3),
                _fmt(float(tv.median()), 3),
                _fmt(float(tv.max()), 3),
                "yes" if (g["status"] == "exact").all() else "upper bound",
                res,
            ]
        )
    return header, rows


def decoded_samples(stored: StoredRun, n: int = N_DECODED) -> list[dict[str, Any]]:
    """A few emitted sequences per arm (first cell, first seeds) decoded to text when the model
    pair is the bundled byte-level pair; token ids otherwise."""
    # the six columns read, not the white-box ones: P1's 983 040 rows, 0.24 → 0.07 s
    columns = ("prompt_id", "config_id", "arm", "seed", "position", "token_id")
    samples = stored.table(SAMPLES, columns)
    if samples is None or len(samples) == 0:
        return []
    models = stored.summary.get("models") or {}
    byte_level = str(models.get("target", "")).startswith("bundled:")
    first = samples.iloc[0]
    cell = samples[
        (samples["prompt_id"] == first["prompt_id"]) & (samples["config_id"] == first["config_id"])
    ]
    out = []
    for arm, g in cell.groupby("arm", sort=False):
        for seed in list(dict.fromkeys(g["seed"]))[:n]:
            toks = g[g["seed"] == seed].sort_values("position")["token_id"].tolist()
            if byte_level:
                from spectest.models import bytetok

                text = bytetok.decode(toks, specials="show")
            else:
                text = " ".join(map(str, toks))
            out.append(
                {
                    "arm": arm,
                    "prompt_id": first["prompt_id"],
                    "config_id": first["config_id"],
                    "seed": int(seed),
                    "text": text,
                }
            )
    return out


def whitebox_heading(stored: StoredRun) -> str:
    """The white-box section's heading, true to how p_t was had: recorded at generation (the
    laws the tokens were drawn from, ``whitebox_mode`` exact) or teacher-forced."""
    details = stored.summary.get("details") or {}
    modes = {str(d.get("whitebox_mode")) for d in details.values() if d.get("whitebox_mode")}
    how = (
        "teacher-forced target p_t along the emitted tokens"
        if modes == {"teacher"}
        else "target p_t recorded at generation"
        if modes <= {"exact"}
        else "p_t " + " / ".join(sorted(modes))
    )
    return f"White-box tests ({how}; the reference column is the control on spectest's own p_t)"


def whitebox_rows(stored: StoredRun) -> tuple[list[str], list[list[str]]]:
    """The stored white-box tests, one row per test, one column per arm (adjusted p-value, ✗
    where rejected): the reference arm's rows of the main comparison are the control, then the
    candidate and every tooth, each from its own comparison."""
    wb = stored.table(WHITEBOX)
    if wb is None or len(wb) == 0:
        return ["test"], []
    comps = list(dict.fromkeys(wb["comparison"]))
    main = "candidate" if "candidate" in comps else comps[0]
    cols = [("reference (control)", wb[(wb["comparison"] == main) & (wb["arm"] == "reference")])]
    cols += [(c, wb[(wb["comparison"] == c) & (wb["arm"] == c)]) for c in comps]
    tests = list(dict.fromkeys(wb["test"]))
    header = ["test", *[name for name, _ in cols]]
    rows = []
    for test in tests:
        row = [str(test)]
        for _, sub in cols:
            hit = sub[sub["test"] == test]
            if len(hit) == 0:
                row.append("—")
                continue
            r = hit.iloc[0]
            row.append(f"{float(r['p_adj']):.2g}" + (" ✗" if bool(r["reject"]) else ""))
        rows.append(row)
    return header, rows


def family_table_rows(
    df: pd.DataFrame | None, comparison: str, columns: Sequence[str], max_rows: int = 12
) -> tuple[list[str], list[list[str]], int]:
    """One family's stored table for one comparison, most significant first: ``columns`` that
    exist, at most ``max_rows`` rows, and how many rows there were in all."""
    if df is None or len(df) == 0:
        return [], [], 0
    sub = df[df["comparison"] == comparison] if "comparison" in df.columns else df
    cols = [c for c in columns if c in sub.columns]
    if "p_adj" in sub.columns:
        sub = sub.sort_values("p_adj", na_position="last")
    pcols = {i for i, c in enumerate(cols) if c in ("pvalue", "p_adj")}

    def cell(i: int, v: Any) -> str:
        if isinstance(v, float) and v == v and i in pcols:
            return f"{v:.2g}"
        return _fmt(v, 3) if isinstance(v, float) else _fmt(v)

    rows = [
        [cell(i, v) for i, v in enumerate(r)]
        for r in sub[cols].head(max_rows).itertuples(index=False)
    ]
    return cols, rows, len(sub)


def sequential_rows(summary: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
    """The path of the evidence of a sequential run (``summary["sequential"]``, written by the
    runner from ``spectest.sequential.path_dict``): a one-line account (plan, spending, where it
    stopped and why, seeds used) and one row per look. Empty for a single-stage run."""
    seq = summary.get("sequential") or {}
    looks = seq.get("looks") or []
    header = [
        "look",
        "seeds per arm",
        "α of the look",
        "α spent",
        "rejected",
        "resolution (median per-cell TV)",
        "power claim",
        "required",
        "decision",
    ]
    if not looks:
        return "", header, []
    why = {
        "reject": "the candidate was rejected",
        "resolved": "the resolution asked for was reached",
        "budget": "the seed budget was spent before the resolution asked for was reached",
        "continue": "it was interrupted after a look that asked for more seeds",
    }
    stages = seq.get("stages") or []
    last = looks[-1]
    req = last.get("required_mde_tv")
    line = (
        f"Sequential run: stages {stages} seeds per arm, α = {seq.get('alpha')} spent "
        f"{seq.get('spending')}ly over {len(stages)} looks (Bonferroni: a false alarm at any "
        f"look has probability ≤ α). Stopped after look {last['stage'] + 1} of {len(stages)} "
        "because "
        f"{why.get(str(seq.get('stopped')), str(seq.get('stopped')))}: "
        f"**{seq.get('seeds_used_per_arm')} of {stages[-1] if stages else '?'} seeds per arm "
        "used**"
        + (
            f"; required resolution TV ≤ {req:g} ({last.get('requirement')})"
            + (f", power claim {last['claim']}." if last.get("claim") else ".")
            if req is not None
            else "; no resolution required."
        )
    )
    rows = [
        [
            str(int(lk["stage"]) + 1),
            str(lk["per_arm"]),
            f"{lk['alpha']:.4g}",
            f"{lk['alpha_spent']:.4g}",
            "yes" if lk["rejected"] else "no",
            _fmt(lk.get("mde_tv"), 3),
            _fmt(lk.get("claim_tv", lk.get("mde_tv")), 3),
            "—" if lk.get("required_mde_tv") is None else f"≤ {lk['required_mde_tv']:g}",
            str(lk["decision"]),
        ]
        for lk in looks
    ]
    return line, header, rows


def token_text(stored: StoredRun) -> Callable[[int], str]:
    """A token id as the reader sees it: decoded with the run's tokenizer where one exists
    (the bundled byte-level pair; a local transformers tokenizer of the target, files only),
    else the id itself. Control characters come back visible (``printable`` at render)."""
    target = str((stored.summary.get("models") or {}).get("target", ""))
    if target.startswith("bundled:"):
        from spectest.models import bytetok

        return lambda t: _visible(bytetok.decode([int(t)], specials="show"))
    if target and Path(target).is_dir():
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(
                target, local_files_only=True, trust_remote_code=False
            )
            return lambda t: _visible(str(tok.decode([int(t)]))) or f"#{int(t)}"
        except Exception:  # no tokenizer there (or transformers absent): ids, said as ids
            pass
    return lambda t: f"#{int(t)}"


def _visible(text: str) -> str:
    """A token's text with its whitespace shown (a space as ␣, a newline as \\n)."""
    return repr(text)[1:-1].replace(" ", "␣")
