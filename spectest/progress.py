"""Progress: the callback every long phase reports to, and the silent one.

Owns: ``ProgressFn`` (``(task label, completed, total)``; the CLI draws bars from it) and
``no_progress``. Knows nothing about what reports it.
"""

from __future__ import annotations

from collections.abc import Callable

ProgressFn = Callable[[str, int, int], None]  # (task label, completed, total)


def no_progress(task: str, done: int, total: int) -> None:
    return None
