"""Test-session set-up shared by every test module.

pytest-xdist's workers (README's test command runs `-n auto`) start with ``COLUMNS=80`` in their
environment, which no user's shell or CI log has unless they set it. spectest's console follows
``COLUMNS`` when it is set (a narrow terminal gets the narrow table), so the workers would print
every table at 80 columns and tests written for a plain (120-column) pipe would see other line
breaks than under a plain `pytest`. The variable is dropped here; a test that wants a width sets
it for its own subprocess (tests/test_small_ones.py).
"""

import os

os.environ.pop("COLUMNS", None)
