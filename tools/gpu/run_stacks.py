"""A ``spectest`` command that may hang, with every thread's Python stack printed if it has not
ended after ``SECONDS`` (``faulthandler``; the process then exits with status 1). With
``RUN_STACKS_REPEAT=1`` in the environment the stacks are printed every ``SECONDS`` instead and
the process is left running (to tell a wait from slow progress; end it with ``timeout``).

    python tools/gpu/run_stacks.py 100 run --config protocols/openinfer-512.yaml --fast \\
        --set models.target=realistic:qwen3-0.6b --device cuda --set seeds.per_arm=32 --out /tmp/w

Run it from a file, not from standard input: the run's spawned processes re-import ``__main__``
from its path (``multiprocessing``'s spawn), which ``<stdin>`` does not have.
"""

import faulthandler
import os
import runpy
import sys

if __name__ == "__main__":
    seconds, args = int(sys.argv[1]), sys.argv[2:]
    repeat = os.environ.get("RUN_STACKS_REPEAT") == "1"
    faulthandler.dump_traceback_later(seconds, repeat=repeat, exit=not repeat)
    sys.argv = ["spectest", *args]
    runpy.run_module("spectest", run_name="__main__")
