"""Engine programs shipped with spectest: standalone scripts that speak the ``spectest-jsonl/1``
line protocol of the ``command`` engine (``spectest/engines/command.py``), each run under its
engine's own pinned interpreter (``spectest.setup``). They import only the standard library,
their engine and the sibling ``_jsonl`` (never spectest), so this package is data to spectest:
nothing in spectest imports these modules except the tests."""
