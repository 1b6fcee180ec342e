"""Where P1's wall time goes outside the run's own phases (issue 32): the CLI run in this
process with timestamps around it.

Prints (stderr, one line each, seconds since this interpreter's start): ``imports`` (the CLI's
modules loaded), ``main returned`` (the run done and its result printed; the exit code), then
the garbage collector's collections and their seconds per generation, and exits with that code.
``P1_WALL_GC=off``: the collector disabled for the whole run (an upper bound of its cost).
Run it under ``date +%s.%N`` stamps: the shell's wall minus the last stamp is the
interpreter's exit (atexit handlers, daemon children, CUDA teardown). The stamps are printed
from ``spectest.cli.leave`` (the CLI ends the process there since session 24), so the exit
measured is the CLI's own; ``SPECTEST_FULL_EXIT=1``: the interpreter's full exit instead.

    PYTHONPATH=. python tools/gpu/p1_wall.py run --config protocols/openinfer-512.yaml ...
"""

from __future__ import annotations

import gc
import os
import sys
import time

T0 = time.perf_counter()
GC: dict[int, list[float]] = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}
_started = [0.0]


def _gc_timer(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
    else:
        GC[info["generation"]][0] += 1
        GC[info["generation"]][1] += time.perf_counter() - _started[0]


gc.callbacks.append(_gc_timer)
if os.environ.get("P1_WALL_GC") == "off":
    gc.disable()


def _stamps(code: int | str | None) -> None:
    print(f"p1_wall: main returned {time.perf_counter() - T0:.2f} s, exit {code}",
          file=sys.stderr, flush=True)  # fmt: skip
    per_gen = ", ".join(f"gen{g} {n:.0f} in {t:.2f} s" for g, (n, t) in GC.items())
    print(f"p1_wall: collections {per_gen}", file=sys.stderr, flush=True)


def main() -> int:
    import spectest.cli as cli

    print(f"p1_wall: imports {time.perf_counter() - T0:.2f} s", file=sys.stderr, flush=True)
    sys.argv = ["spectest", *sys.argv[1:]]
    leave = cli.leave
    cli.leave = lambda code: (_stamps(code), leave(code))[1]  # type: ignore[func-returns-value]
    code: int | str | None = 0
    try:
        cli.main()
    except SystemExit as e:  # the CLI did not end the process itself (SPECTEST_FULL_EXIT ...)
        code = e.code
    return code if isinstance(code, int) else 1


if __name__ == "__main__":
    sys.exit(main())
