"""Reports of a stored run: ``report.md``, a self-contained ``report.html``, JUnit XML and a short
markdown summary for CI. Every renderer reads stored results and computes nothing new.

``write_reports`` is the one function the runner and ``spectest report`` call.
"""

from __future__ import annotations

import os
from pathlib import Path

from spectest.store import REPORT_HTML, REPORT_MD, atomic_write_text, load_run, rewrite_manifest


def write_reports(
    run_dir: str | os.PathLike[str],
    *,
    junit: str | os.PathLike[str] | None = None,
    summary_md: str | os.PathLike[str] | None = None,
    require_complete: bool = True,
) -> list[Path]:
    """Render report.md and report.html into ``run_dir`` (and JUnit / summary markdown where
    asked). On a completed run the manifest is re-listed afterwards so it stays true;
    ``require_complete=False`` is the runner rendering before it writes the manifest."""
    from spectest.report.html import render_html
    from spectest.report.junit import render_junit
    from spectest.report.markdown import render_markdown, render_summary_md

    stored = load_run(run_dir, require_manifest=require_complete)
    written = []
    for name, text in ((REPORT_MD, render_markdown(stored)), (REPORT_HTML, render_html(stored))):
        atomic_write_text(stored.path / name, text)
        written.append(stored.path / name)
    prompt_set = Path(str(stored.summary.get("prompt_set", "prompts"))).stem
    if junit is not None:
        atomic_write_text(Path(junit), render_junit(stored.summary, prompt_set))
        written.append(Path(junit))
    if summary_md is not None:
        atomic_write_text(Path(summary_md), render_summary_md(stored.summary))
        written.append(Path(summary_md))
    if require_complete:
        rewrite_manifest(stored.path)
    return written
