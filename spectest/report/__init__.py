"""Reports of a stored run (report.md, report.html, JUnit XML, the CI step summary):
``write_reports`` and ``write_ci_outputs``; ``prefetch`` imports the renderers early. Computes
nothing new.

The why and the details: docs/internals.md "spectest/report/__init__.py".
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def prefetch() -> None:
    """Import the renderers' modules (the figures': matplotlib) on a daemon thread, so that the
    report a run writes at its end finds them imported. The runner calls it once generation is
    done, when the rest of the run mostly waits on the device or on another process. An import
    that fails here is left to ``write_reports``, which raises it."""
    import threading

    def load() -> None:
        try:
            import spectest.report.html  # noqa: F401  (report.plots: matplotlib, Agg)
        except Exception:
            pass  # ``write_reports`` imports it again and raises, with its message

    threading.Thread(target=load, name="spectest-report-imports", daemon=True).start()


def write_reports(
    run_dir: str | os.PathLike[str],
    *,
    junit: str | os.PathLike[str] | None = None,
    summary_md: str | os.PathLike[str] | None = None,
    require_complete: bool = True,
) -> list[Path]:
    """Render report.md and report.html into ``run_dir`` (and JUnit / summary markdown where
    asked).

    On a completed run (``spectest report``) the data files are verified against the manifest
    first (``stored.load_run``: an edit, or an entry deleted beside it, is refused before
    anything is written), under the directory's lock; afterwards only the entries of the two
    views are updated in the manifest (``stored.update_manifest_entries``): no data file's hash,
    no provenance and no ``completed`` time is ever rewritten. ``require_complete=False`` is the
    runner rendering before it writes the manifest.
    """
    from spectest.errors import InfrastructureError, os_error_line
    from spectest.files import lock_dir
    from spectest.store import RENDERED
    from spectest.stored import load_run, update_manifest_entries

    lock = None
    if require_complete:
        p = Path(run_dir)
        if not p.is_dir():
            load_run(p)  # its one line for a directory that is not there
        try:
            lock = lock_dir(p)
        except OSError as err:
            raise InfrastructureError(os_error_line(err, "run directory")) from None
    try:
        stored = load_run(run_dir, require_manifest=require_complete)  # verified under the lock
        written = _write_views(stored)
        written += write_ci_outputs(stored.summary, junit=junit, summary_md=summary_md)
        if require_complete:
            update_manifest_entries(stored.path, RENDERED)
    finally:
        if lock is not None:
            lock.release()
    return written


def _write_views(stored: Any) -> list[Path]:
    from spectest.files import atomic_write_text
    from spectest.report.html import render_html
    from spectest.report.markdown import render_markdown
    from spectest.report.sections import build
    from spectest.store import REPORT_HTML, REPORT_MD

    sections = build(stored)  # once for both views: each section reads its stored tables
    written = []
    views = ((REPORT_MD, render_markdown), (REPORT_HTML, render_html))
    for name, render in views:
        text = render(stored, sections)
        atomic_write_text(stored.path / name, text)
        written.append(stored.path / name)
    return written


def write_ci_outputs(
    summary: dict[str, Any],
    *,
    junit: str | os.PathLike[str] | None = None,
    summary_md: str | os.PathLike[str] | None = None,
) -> list[Path]:
    """The JUnit file and the markdown step summary of ``summary``, where asked (each written
    atomically; a refused write is one line naming the file, exit 4)."""
    from spectest.files import atomic_write_text
    from spectest.report.junit import render_junit
    from spectest.report.markdown import render_summary_md

    written = []
    prompt_set = Path(str(summary.get("prompt_set", "prompts"))).stem
    if junit is not None:
        atomic_write_text(Path(junit), render_junit(summary, prompt_set))
        written.append(Path(junit))
    if summary_md is not None:
        atomic_write_text(Path(summary_md), render_summary_md(summary))
        written.append(Path(summary_md))
    return written
