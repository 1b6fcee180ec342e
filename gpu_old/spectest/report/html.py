"""A self-contained ``report.html`` of a stored run: the markdown report's content as HTML plus
the figures inline as base64 PNG (no external file, no script, no network).

Owns: the HTML layout. Reads the stored run; computes no statistic (figures come from
``report.plots``, tables and text from ``report.markdown``).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from spectest.report import plots
from spectest.report.markdown import (
    config_rows,
    decoded_samples,
    failing_rows,
    sequential_rows,
    teeth_rows,
    whitebox_rows,
)
from spectest.store import ROUNDS, TESTS, StoredRun
from spectest.summary import verdict_lines

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


def render_html(stored: StoredRun) -> str:
    """The full self-contained report.html of a run."""
    s = stored.summary
    v = s["verdict"]
    tests = stored.table(TESTS)
    rounds = stored.table(ROUNDS)
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
    seq_line, h, rows = sequential_rows(s)
    if rows:
        parts += [
            "<h2>Path of the evidence (sequential looks)</h2>",
            f"<p>{html.escape(seq_line.replace('**', ''))}</p>",
            _table(h, rows),
        ]
    h, rows = config_rows(s)
    parts += ["<h2>Summary per config</h2>", _table(h, rows)]
    if s.get("teeth"):
        h, rows = teeth_rows(s)
        parts += ["<h2>Teeth</h2>", _table(h, rows)]
    fails = failing_rows(s)
    if fails:
        parts += (
            ["<h2>Failing cells (candidate)</h2><ul>"]
            + [f"<li>{html.escape(f[2:])}</li>" for f in fails]
            + ["</ul>"]
        )
    h, rows = whitebox_rows(stored)
    if rows:
        parts += [
            "<h2>White-box tests</h2><p class='small'>teacher-forced target p_t; "
            "the reference rows are the control</p>",
            _table(h, rows),
        ]
    if tests is not None and len(tests):
        comps = [c["arm"] for c in s.get("comparisons", [])]
        main = "candidate" if "candidate" in comps else (comps[0] if comps else "candidate")
        parts += ["<h2>Plots</h2>", _img(plots.tv_by_position(tests, main), "TV per position")]
        parts.append(_img(plots.pvalue_plots(tests, comps), "p-values"))
    parts.append(_img(plots.acceptance_by_position(rounds), "acceptance rate"))
    decoded = decoded_samples(stored)
    if decoded:
        parts += [
            "<h2>A few samples</h2>",
            _table(
                ["arm", "prompt", "config", "seed", "text"],
                [[d["arm"], d["prompt_id"], d["config_id"], d["seed"], d["text"]] for d in decoded],
            ),
        ]
    prov = stored.provenance
    if prov:
        parts += [
            "<h2>Provenance</h2><p class='small'>",
            html.escape(
                f"protocol hash {s.get('protocol_hash')} · git {prov.get('git_sha')} · "
                f"device {prov.get('device')} · spectest {prov.get('spectest_version')} · "
                f"seed ranges {prov.get('seed_ranges')} · "
                + ", ".join(f"{k} {x}" for k, x in sorted((prov.get("packages") or {}).items()))
            ),
            "</p>",
        ]
    parts.append("</body></html>")
    return "\n".join(parts)
