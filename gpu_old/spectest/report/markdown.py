"""Markdown renderings of a stored run: the full ``report.md`` and the short CI step summary.

Owns: the text of the report (verdict, reasons, the path of a sequential run's looks, per-config
summary table, teeth, failing cells, provenance, a few decoded samples). Reads ``summary.json``
and the stored tables; computes no statistic. Knows nothing about how they were produced.

Every value that is not spectest's own wording goes through ``report.escape`` (``md_text``,
``md_code``, every table cell): ids, names, notes, failing lines and reasons render as the
literal text, never as HTML, a link, an image or a table break — a step summary is rendered by
the CI system, so a config id ``<script>`` must stay text there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from spectest.report.escape import md_code, md_text
from spectest.store import SAMPLES, WHITEBOX, StoredRun
from spectest.summary import verdict_lines

N_DECODED = 3  # decoded samples shown per arm


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "—"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GFM table; every cell is text (``md_text``: one line, no markup of its own)."""
    esc = [[md_text(" ".join(str(c).split("\n"))) for c in r] for r in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in esc]
    return "\n".join(lines)


def config_rows(summary: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = [
        "config",
        "cells tested",
        "rejections",
        "max TV excess",
        "where",
        "MDE (TV)",
        "teeth rejections",
    ]
    rows = [
        [
            r["config_id"],
            f"{r.get('cells_tested', '—')}"
            + (f" (+{r['cells_untestable']} untestable)" if r.get("cells_untestable") else ""),
            _fmt(r.get("rejections")),
            _fmt(r.get("max_tv_excess")),
            _fmt(r.get("max_tv_where")),
            _fmt(r.get("mde_tv")),
            r.get("teeth", ""),
        ]
        for r in summary.get("configs", [])
    ]
    return header, rows


def teeth_rows(summary: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["arm", "must", "rejections", "verdict"]
    rows = [
        [
            t["arm"],
            "pass" if t["expect"] == "pass" else "be killed",
            str(t["rejections"]),
            t["label"],
        ]
        for t in summary.get("teeth", [])
    ]
    return header, rows


def decoded_samples(stored: StoredRun, n: int = N_DECODED) -> list[dict[str, Any]]:
    """A few emitted sequences per arm (first cell, first seeds) decoded to text when the model
    pair is the bundled byte-level pair; token ids otherwise."""
    samples = stored.table(SAMPLES)
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


def whitebox_rows(stored: StoredRun) -> tuple[list[str], list[list[str]]]:
    """The stored white-box tests of the main comparison (candidate, else the first), both arms:
    the reference arm's rows are the control on spectest's own p_t."""
    wb = stored.table(WHITEBOX)
    header = ["arm", "test", "statistic", "p-value", "p adj", "rejected", "detail"]
    if wb is None or len(wb) == 0:
        return header, []
    comps = list(dict.fromkeys(wb["comparison"]))
    main = "candidate" if "candidate" in comps else comps[0]
    sub = wb[wb["comparison"] == main]
    rows = [
        [str(r.arm), str(r.test), _fmt(float(r.statistic)), _fmt(float(r.pvalue)),
         _fmt(float(r.p_adj)), "yes" if bool(r.reject) else "no", str(r.detail)]
        for r in sub.itertuples(index=False)
    ]  # fmt: skip
    return header, rows


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


def failing_rows(summary: dict[str, Any]) -> list[str]:
    out = []
    for c in summary.get("comparisons", []):
        if c["role"] == "candidate" and c["failing"]:
            out += [f"- {md_text(f)}" for f in c["failing"]]
    return out


def verdict_md(verdict: dict[str, Any]) -> list[str]:
    """The verdict as markdown: the headline in bold, what was tested and the resolution, then
    the reasons as a list (``spectest.summary.verdict_lines``, the console's wording)."""
    head, *rest = verdict_lines(verdict)
    scope = [md_text(ln.strip()) for ln in rest if not ln.startswith("  - ")]
    reasons = [f"- {md_text(ln.strip()[2:])}" for ln in rest if ln.startswith("  - ")]
    return [f"**{md_text(head)}**", "", *[f"*{ln}*  " for ln in scope], "", *reasons]


def render_markdown(stored: StoredRun) -> str:
    """The full report.md of a run."""
    s = stored.summary
    v = s["verdict"]
    prov = stored.provenance
    title = f"# spectest {md_text(s.get('kind', 'run'))}: {md_text(s.get('name', ''))}"
    lines = [title, "", *verdict_md(v), ""]
    if s.get("models"):
        m, d = s["models"], s.get("drafter", {})
        lines += [
            f"Models: target {md_code(m.get('target'))}, draft {md_code(m.get('draft'))} "
            f"({md_text(m.get('dtype'))}, {md_text(m.get('device'))}); "
            f"drafter {md_text(d.get('kind'))} K={md_text(d.get('k'))}"
            + (f" q={md_text(d.get('q'))}" if d.get("kind") == "sampled" else "")
            + f"; candidate sampler {md_code(s.get('candidate'))}; "
            f"{md_text(s.get('positions'))} positions; "
            f"{md_text(s.get('seeds_per_arm'))} seeds per arm.",
            "",
        ]
    a = s.get("analysis") or {}
    if a:
        trie = a.get("trie") or {}
        lines += [
            md_text(
                f"Tests: α = {a.get('alpha')}, multiplicity {a.get('multiplicity')}, pooled χ² "
                f"with minimum expected count {a.get('min_expected')}, "
                f"trie depth {trie.get('depth')} (nodes ≥ {trie.get('min_count')}), "
                f"white-box {'on' if a.get('whitebox') else 'off'}, "
                f"{a.get('null_permutations')} permutations for the TV null."
            ),
            "",
        ]
    seq_line, h, rows = sequential_rows(s)
    if rows:
        lines += ["## Path of the evidence (sequential looks)", "", seq_line, "", md_table(h, rows)]
        lines += [""]
    h, rows = config_rows(s)
    lines += ["## Summary per config", "", md_table(h, rows), ""]
    if s.get("teeth"):
        h, rows = teeth_rows(s)
        lines += ["## Teeth", "", md_table(h, rows), ""]
    fails = failing_rows(s)
    if fails:
        lines += ["## Failing cells (candidate)", "", *fails, ""]
    h, rows = whitebox_rows(stored)
    if rows:
        lines += [
            "## White-box tests (teacher-forced target p_t; reference rows are the control)",
            "",
            md_table(h, rows),
            "",
        ]
    dec = decoded_samples(stored)
    if dec:
        lines += ["## A few samples", ""]
        lines += [
            md_table(
                ["arm", "prompt", "config", "seed", "text"],
                [
                    [d["arm"], d["prompt_id"], d["config_id"], d["seed"], repr(d["text"])]
                    for d in dec
                ],
            ),
            "",
        ]
    if prov:
        lines += [
            "## Provenance",
            "",
            f"protocol hash {md_code(s.get('protocol_hash'))} · "
            f"git {md_code(prov.get('git_sha'))} · "
            + md_text(
                f"device {prov.get('device')} · spectest {prov.get('spectest_version')} · "
                + ", ".join(f"{k} {v}" for k, v in sorted((prov.get("packages") or {}).items()))
            ),
            "",
            f"Seed ranges per arm: {md_text(prov.get('seed_ranges'))}",
            "",
        ]
    return "\n".join(lines)


def render_summary_md(summary: dict[str, Any]) -> str:
    """A short markdown summary for a CI step summary (``--summary-md``)."""
    v = summary["verdict"]
    icon = {"equivalent": "✅", "sound": "✅", "different": "❌"}.get(v["decision"], "⚠️")
    lines = [
        f"### {icon} spectest {md_text(summary.get('name', ''))}: {md_text(v['decision'])} "
        f"(exit {v['exit_code']})",
        "",
        *verdict_md(v),
        "",
    ]
    seq_line, _, seq_rows = sequential_rows(summary)
    if seq_rows:
        lines += [seq_line, ""]
    h, rows = config_rows(summary)
    lines += [md_table(h, rows), ""]
    if summary.get("teeth"):
        h, rows = teeth_rows(summary)
        lines += [md_table(h, rows), ""]
    return "\n".join(lines)


def frame_to_md(df: pd.DataFrame, max_rows: int = 30) -> str:
    return md_table(list(map(str, df.columns)), df.head(max_rows).astype(str).to_numpy().tolist())
