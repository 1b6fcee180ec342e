"""Test-session set-up shared by every test module.

pytest-xdist's workers (README's test command runs `-n auto`) start with ``COLUMNS=80`` in their
environment, which no user's shell or CI log has unless they set it. spectest's console follows
``COLUMNS`` when it is set (a narrow terminal gets the narrow table), so the workers would print
every table at 80 columns and tests written for a plain (120-column) pipe would see other line
breaks than under a plain `pytest`. The variable is dropped here; a test that wants a width sets
it for its own subprocess (tests/test_small_ones.py).

The order in which ``--dist loadfile`` hands out files (longest first). xdist's default
(``--loadscope-reorder``) sorts files by their number of tests, most first: the slowest files of
this suite have 1 to 5 tests each (one wheel installed and every shipped protocol run, two bf16
runs of the bundled pair), so they were handed out last and the suite ended with one worker on a
5-minute file while the other had nothing left. Here the workers' collection lists the files in
``HEAVY`` first, slowest first (longest-processing-time-first: the tail is then made of the
short files), the others after them by their number of tests as before; xdist keeps that order
(its re-sort is switched off). Only the order changes, never which tests run; a plain `pytest`
without ``-n`` keeps the file order. ``HEAVY`` holds CI seconds measured on the full suite
(results/LOG.md, "h70 (session 10)", two of them lowered by "h80 (session 11)", one by "h85
(session 11)"); a stale figure costs balance, not correctness.
"""

import os
from collections import Counter

import pytest

os.environ.pop("COLUMNS", None)

HEAVY = {  # file name -> its CI seconds (about half the loaded full-suite run's), slowest first
    "test_wheel_protocols.py": 290,
    "test_hostile_boundary.py": 210,
    "test_fuzz.py": 170,
    "test_engine_command.py": 140,  # its two 200-seed runs: now test_wheel_protocols's (h80)
    "test_scaleout.py": 135,
    "test_numerics_bf16.py": 125,  # one bf16 run serves both tests (h80, session 11)
    "test_kill_resume.py": 120,
    "test_stats_calibration.py": 115,
    "test_stats_whitebox_two_sample.py": 115,
    "test_engine_llamacpp.py": 90,
    "test_reported_p.py": 90,
    "test_numerics_run.py": 65,  # its bf16 exact case: test_numerics_bf16's run (h85)
}


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist present: keep our order
        config.option.loadscopereorder = False


def file_order(files: list[str]) -> list[str]:
    """``files`` (test files' paths, each once) in the order the workers hand them out: the
    ``HEAVY`` ones slowest first, then the rest by number of tests, most first (ties in the
    given order) — what xdist's own re-sort did; ``files`` may repeat a path once per test."""
    count = Counter(files)
    unique = list(dict.fromkeys(files))
    return sorted(unique, key=lambda f: (-HEAVY.get(os.path.basename(f), 0), -count[f]))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # only an xdist worker's collection
        return
    paths = [str(item.path) for item in items]
    rank = {f: i for i, f in enumerate(file_order(paths))}
    items.sort(key=lambda item: rank[str(item.path)])  # stable: a file's own order is kept
