"""Engine programs shipped with spectest: standalone scripts that speak the ``spectest-jsonl/1``
line protocol of the ``command`` engine (``spectest/engines/command.py``), each run under its
engine's own pinned interpreter (``spectest.setup``). They import only the standard library,
their engine and the sibling ``_jsonl`` (never spectest), so this package is data to spectest:
nothing in spectest imports these modules except the tests.

Two are examples of the protocol rather than engines: ``builtin_engine.py`` (correct: it
answers with spectest's own loops, so it imports spectest and runs under spectest's python)
and ``topp_before_temperature.py`` (the same with a filter-order bug). Protocols name them as
``{programs}/NAME.py`` (``spectest.engines.command.expand``), which resolves from the package."""
