"""A self-contained ``report.html`` of a stored run: the markdown report's content as HTML plus
the figures inline as base64 PNG (no external file, no script, no network).

Owns: the HTML layout of the verdict and of each section of ``report.sections.SECTIONS``.
Reads the stored run; computes no statistic.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from spectest.decision.summary import verdict_lines
from spectest.report import plots
from spectest.stored import StoredRun

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222}
table{border-collapse:collapse;margin:0.6em 0}
th,td{border:1px solid #ccc;padding:3px 8px;font-size:0.9em}
th{background:#f3f3f3}.equivalent,.sound{color:#17803d}.different{color:#b3261e}.inconclusive{color:#a15c00}
code{background:#f4f4f4;padding:0 3px}img{max-width:100%}.small{font-size:0.85em;color:#555}
"""


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _img(fig: Any, alt: str) -> str:
    if fig is None:
        return ""
    data = plots.to_base64_png(fig)
    return f'<p><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></p>'


def _html_block(block: Any) -> str:
    from spectest.report.sections import Figure, Table

    if isinstance(block, Table):
        return _table(block.header, block.rows)
    if isinstance(block, Figure):
        return _img(block.draw(), block.alt)
    cls = " class='small'" if block.small else ""
    return f"<p{cls}>{html.escape(block.text.replace('**', ''))}</p>"


def render_html(stored: StoredRun, sections: Sequence[Any] | None = None) -> str:
    """The full self-contained report.html of a run: title, verdict, then every section of
    ``report.sections.SECTIONS`` (``sections``: those already built of ``stored``)."""
    from spectest.report.sections import build

    s = stored.summary
    v = s["verdict"]
    name, kind, dec = (
        html.escape(str(x)) for x in (s.get("name", ""), s.get("kind", "run"), v["decision"])
    )
    head, *rest = verdict_lines(v)
    scope = [ln for ln in rest if not ln.startswith("  - ")]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>spectest {name}</title><style>{_CSS}</style></head><body>",
        f"<h1>spectest {kind}: {name}</h1>",
        f"<h2 class='{dec}'>{html.escape(head)}</h2>",
        *[f"<p class='small'>{html.escape(ln.strip())}</p>" for ln in scope],
        "<ul>" + "".join(f"<li>{html.escape(r)}</li>" for r in v["reasons"]) + "</ul>",
    ]
    for sec in build(stored) if sections is None else sections:
        parts.append(f"<h2>{html.escape(sec.title)}</h2>")
        parts += [_html_block(b) for b in sec.blocks]
    parts.append("</body></html>")
    return "\n".join(parts)
