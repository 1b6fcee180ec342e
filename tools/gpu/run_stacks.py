"""A ``spectest`` command that may hang, with every thread's Python stack printed if it has not
ended after ``SECONDS`` (``faulthandler``; the process then exits with status 1). With
``RUN_STACKS_REPEAT=1`` in the environment the stacks are printed every ``SECONDS`` instead and
the process is left running (to tell a wait from slow progress; end it with ``timeout``), and
every ``SECONDS / 3`` a line ``mem`` gives the CUDA caching allocator's state (allocated and
reserved GiB, ``cudaMalloc`` retries after freeing its cache, out-of-memory count: a run that
thrashes its memory shows retries climbing).

    python tools/gpu/run_stacks.py 100 run --config protocols/openinfer-512.yaml --fast \\
        --set models.target=realistic:qwen3-0.6b --device cuda --set seeds.per_arm=32 --out /tmp/w

Run it from a file, not from standard input: the run's spawned processes re-import ``__main__``
from its path (``multiprocessing``'s spawn), which ``<stdin>`` does not have.
"""

import faulthandler
import os
import runpy
import sys
import threading
import time


def _memory(every: float) -> None:
    """Print the allocator's state every ``every`` s once CUDA is initialised (stats only: no
    device synchronisation)."""
    start = time.monotonic()
    while True:
        time.sleep(every)
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            continue
        s = torch.cuda.memory_stats()
        gib = 2.0**30
        print(
            f"mem {time.monotonic() - start:6.1f}s allocated "
            f"{s.get('allocated_bytes.all.current', 0) / gib:.1f} GiB reserved "
            f"{s.get('reserved_bytes.all.current', 0) / gib:.1f} GiB retries "
            f"{s.get('num_alloc_retries', 0)} ooms {s.get('num_ooms', 0)}",
            file=sys.stderr,
            flush=True,
        )


if __name__ == "__main__":
    seconds, args = int(sys.argv[1]), sys.argv[2:]
    repeat = os.environ.get("RUN_STACKS_REPEAT") == "1"
    faulthandler.dump_traceback_later(seconds, repeat=repeat, exit=not repeat)
    if repeat:
        threading.Thread(target=_memory, args=(seconds / 3,), daemon=True).start()
    sys.argv = ["spectest", *args]
    runpy.run_module("spectest", run_name="__main__")
