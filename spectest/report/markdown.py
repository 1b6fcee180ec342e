"""The markdown forms of a stored run: ``report.md`` and the CI step summary, every user value
escaped (``report.escape``). Computes no statistic.

The why and the details: docs/internals.md "spectest/report/markdown.py".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spectest.decision.summary import rejections_account, verdict_lines
from spectest.report.escape import md_text
from spectest.report.rows import (  # noqa: F401  (re-exported: the notebook and the CLI read them)
    config_rows,
    decoded_samples,
    sequential_rows,
    teeth_rows,
    whitebox_rows,
)
from spectest.stored import StoredRun


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GFM table; every cell is text (``md_text``: one line, no markup of its own)."""
    esc = [[md_text(" ".join(str(c).split("\n"))) for c in r] for r in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in esc]
    return "\n".join(lines)


def verdict_md(verdict: dict[str, Any]) -> list[str]:
    """The verdict as markdown: the headline in bold, what was tested and the resolution, then
    the reasons as a list (``spectest.decision.summary.verdict_lines``, the console's wording)."""
    head, *rest = verdict_lines(verdict)
    scope = [md_text(ln.strip()) for ln in rest if not ln.startswith("  - ")]
    reasons = [f"- {md_text(ln.strip()[2:])}" for ln in rest if ln.startswith("  - ")]
    return [f"**{md_text(head)}**", "", *[f"*{ln}*  " for ln in scope], "", *reasons]


def _md_block(block: Any) -> list[str]:
    from spectest.report.sections import Figure, Table

    if isinstance(block, Table):
        return [md_table(block.header, block.rows), ""]
    if isinstance(block, Figure):
        return [f"*(figure in report.html: {md_text(block.alt)})*", ""]
    # ``**`` marks the sections' own emphasis (e.g. the seeds used); every piece is escaped
    text = "**".join(md_text(piece) for piece in block.text.split("**"))
    return [f"*{text}*" if block.small else text, ""]


def render_markdown(stored: StoredRun, sections: Sequence[Any] | None = None) -> str:
    """The full report.md of a run: title, verdict, then every section of
    ``report.sections.SECTIONS`` (figures are named, drawn only in report.html);
    ``sections``: those already built of ``stored`` (``report.sections.build``)."""
    from spectest.report.sections import build

    s = stored.summary
    title = f"# spectest {md_text(s.get('kind', 'run'))}: {md_text(s.get('name', ''))}"
    lines = [title, "", *verdict_md(s["verdict"]), ""]
    for sec in build(stored) if sections is None else sections:
        lines += [f"## {md_text(sec.title)}", ""]
        for block in sec.blocks:
            lines += _md_block(block)
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
    if account := rejections_account(summary):
        lines += [md_text(account), ""]
    if summary.get("teeth"):
        h, rows = teeth_rows(summary)
        lines += [md_table(h, rows), ""]
    return "\n".join(lines)
