"""Progress: ``ProgressFn``, ``no_progress``, the shard counter's label and ``PlainProgress``
(plain lines where stderr is not a terminal).

The why and the details: docs/internals.md "spectest/progress.py".
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TextIO

ProgressFn = Callable[[str, int, int], None]  # (task label, completed, total)
INTERVAL_ENV = "SPECTEST_PROGRESS_INTERVAL"  # seconds between plain progress lines (default 10)
DEFAULT_INTERVAL = 10.0
SHARDS = "shards"


def no_progress(task: str, done: int, total: int) -> None:
    return None


def shards_label(arm: str) -> str:
    """The label of the shard counter while ``arm`` is generated (``split_label``)."""
    return f"{SHARDS}|{arm}"


def split_label(task: str) -> tuple[str, str]:
    """``("shards", ARM)`` for ``shards_label(ARM)``; ``(task, "")`` for any other label."""
    name, _, detail = task.partition("|")
    return (name, detail) if name == SHARDS else (task, "")


def interval_from_env() -> float:
    """``INTERVAL_ENV`` in seconds (a positive number), else ``DEFAULT_INTERVAL``."""
    try:
        value = float(os.environ.get(INTERVAL_ENV, ""))
    except ValueError:
        return DEFAULT_INTERVAL
    return value if value > 0 else DEFAULT_INTERVAL


class PlainProgress:
    """A ``ProgressFn`` that prints, from a daemon thread, one line every ``interval`` seconds
    while ``start``-ed: ``progress 40 s: generate · arm candidate · shards 3/10 · 1200/4000 ·
    ETA 25 s`` (the ETA from the phase's own rate since it began). ``say`` prints a line now."""

    def __init__(self, stream: TextIO, interval: float) -> None:
        self.stream, self.interval = stream, interval
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.phase, self.arm, self.shards = "starting", "", (0, 0)
        self.done, self.total, self.first, self.since = 0, 0, 0, self.t0
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._tick, name="spectest-progress", daemon=True)

    def __call__(self, task: str, done: int, total: int) -> None:
        name, detail = split_label(task)
        with self.lock:
            if name == SHARDS:
                self.arm, self.shards = detail, (done, total)
                return
            if name != self.phase:
                self.phase, self.first, self.since = name, done, time.monotonic()
            self.done, self.total = done, total

    def line(self) -> str:
        with self.lock:
            now = time.monotonic()
            parts = [f"progress {now - self.t0:.0f} s: {self.phase}"]
            if self.phase == "generate" and self.arm:
                parts.append(f"arm {self.arm}")
            if self.shards[1]:
                parts.append(f"shards {self.shards[0]}/{self.shards[1]}")
            if self.total:
                parts.append(f"{self.done}/{self.total}")
                rate = (self.done - self.first) / max(now - self.since, 1e-9)
                left = self.total - self.done
                parts.append(
                    "done" if left <= 0 else f"ETA {left / rate:.0f} s" if rate > 0 else "ETA —"
                )
        return " · ".join(parts)

    def say(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def _tick(self) -> None:
        while not self.stop_event.wait(self.interval):
            try:
                self.say(self.line())
            except (OSError, ValueError):  # a closed stream: progress is not worth an error
                return

    def start(self) -> PlainProgress:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread.is_alive():
            self.thread.join()
