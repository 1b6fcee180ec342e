"""Engine programs shipped with spectest: standalone scripts that speak the ``spectest-jsonl/1``
line protocol of the ``command`` engine, each run under its engine's own pinned interpreter. They
import only the standard library, their engine and the sibling ``_jsonl`` (never spectest; the
examples ``builtin_engine.py`` and its kin run spectest's own loops under spectest's python), so
nothing in spectest imports them. Protocols name them as ``{programs}/NAME.py``."""
