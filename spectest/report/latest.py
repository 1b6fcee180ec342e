"""Which stored run a reviewer opens by default: the newest completed run under a results
folder (runs are written to ``results/<name>-<hash10>``, ``runner.run_protocol``).

Owns: ``latest_run``. Reads directory entries and manifest times only.
"""

from __future__ import annotations

import os
from pathlib import Path

from spectest.errors import ConfigError
from spectest.store import MANIFEST


def latest_run(root: str | os.PathLike[str] = "results") -> Path:
    """The run directory under ``root`` (or ``root`` itself) whose ``manifest.json`` is the
    newest: a completed run (the manifest is written last). One ``ConfigError`` line naming
    ``root`` when it holds none."""
    base = Path(root)
    if (base / MANIFEST).is_file():
        return base
    runs = [p for p in base.iterdir() if (p / MANIFEST).is_file()] if base.is_dir() else []
    if not runs:
        raise ConfigError(
            f"{base}: no completed run here (a run directory holds {MANIFEST}); "
            "set SPECTEST_RUN_DIR to one"
        )
    return max(runs, key=lambda p: ((p / MANIFEST).stat().st_mtime_ns, p.name))
