"""A ``spectest`` command that may hang, with every thread's Python stack printed if it has not
ended after ``SECONDS`` (``faulthandler``; the process then exits with status 1).

    python tools/gpu/run_stacks.py 100 run --config protocols/openinfer-512.yaml --fast \\
        --set models.target=realistic:qwen3-0.6b --device cuda --set seeds.per_arm=32 --out /tmp/w

Run it from a file, not from standard input: the run's spawned processes re-import ``__main__``
from its path (``multiprocessing``'s spawn), which ``<stdin>`` does not have.
"""

import faulthandler
import runpy
import sys

if __name__ == "__main__":
    seconds, args = int(sys.argv[1]), sys.argv[2:]
    faulthandler.dump_traceback_later(seconds, exit=True)
    sys.argv = ["spectest", *args]
    runpy.run_module("spectest", run_name="__main__")
