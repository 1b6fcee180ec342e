"""The engine registry: engine name → engine class, resolved lazily.

Owns ``BUILTIN`` (spectest's own engines, name → ``"module:Class"``), the entry-point group
``spectest.engines`` through which a third-party distribution adds one, and the resolution of a
name to its ``Engine`` subclass (a plug-in's methods marked as plug-in calls under a supervisor:
``spectest.supervise``). Imports no engine and no torch until one is asked for. Knows nothing
about what an engine does or about protocols. A plug-in: docs/engines.md "Adding an engine".
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from spectest.contain import contained, escape_reason
from spectest.errors import ConfigError
from spectest.supervise import heartbeat, plugin_call, watching

if TYPE_CHECKING:
    from spectest.engines.base import Engine

GROUP = "spectest.engines"
BUILTIN: dict[str, str] = {
    "builtin": "spectest.engines.builtin:BuiltinEngine",
    "hf-generate": "spectest.engines.hf.engines:HFGenerateEngine",
    "hf-assisted": "spectest.engines.hf.engines:HFAssistedEngine",
    "acceptor": "spectest.engines.acceptor:AcceptorEngine",
    "fast": "spectest.engines.fast:FastEngine",
    "fast-acceptor": "spectest.engines.fast:FastAcceptorEngine",
    "command": "spectest.engines.command:CommandEngine",
    "http": "spectest.engines.http:HTTPEngine",
}


def _entry_points() -> dict[str, str]:
    """Third-party engines: entry-point name → ``"module:Class"`` (spectest's own names win)."""
    return {ep.name: ep.value for ep in entry_points(group=GROUP) if ep.name not in BUILTIN}


def names() -> list[str]:
    """Every engine name this installation knows: spectest's, then the entry points'."""
    return [*BUILTIN, *sorted(_entry_points())]


def target_of(name: str) -> str:
    """The ``"module:Class"`` a name resolves to; ``ConfigError`` listing the known names."""
    target = BUILTIN.get(name) or _entry_points().get(name)
    if target is None:
        raise ConfigError(f"unknown engine {name!r} (known: {', '.join(names())})")
    return target


def engine_class(name: str) -> type[Engine]:
    """Import and return the ``Engine`` subclass registered as ``name``."""
    from spectest.engines.base import Engine

    target = target_of(name)
    module, _, attr = target.partition(":")

    def load() -> Any:
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise ConfigError(f"engine {name!r}: cannot load {target!r} ({err})") from None

    # NOTE: an entry point's module is a plug-in: a sys.exit, an argparse or any exception at
    # its import is one line naming it (spectest.contain), never the process's exit code
    who = f"engine {name!r} ({target})"
    cls = contained(
        lambda err: f"engine {name!r}: importing {target!r} {escape_reason(err)}",
        load,
        hold_output=True,
        watch=(who, "importing it"),
    )
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        raise ConfigError(f"engine {name!r}: {target!r} is not a spectest Engine subclass")
    if cls.name != name:
        raise ConfigError(f"engine {name!r}: {target!r} calls itself {cls.name!r}")
    return cls if name in BUILTIN or not watching() else _watched(cls, who)


_WATCHED: dict[type, type] = {}


def _watched(cls: type[Engine], who: str) -> type[Engine]:
    """Under a supervisor (``spectest.supervise``): a subclass of a plug-in engine whose every
    method the plug-in defines (not spectest's ``Engine`` base) is marked as a plug-in call, and
    whose ``generate`` restarts the call's clock each time the engine reports progress."""
    if cls in _WATCHED:
        return _WATCHED[cls]
    ns: dict[str, Any] = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] == "spectest" or klass is object:
            continue
        for attr, value in vars(klass).items():
            if attr in ns or (attr.startswith("__") and attr != "__init__"):
                continue
            what = "constructing it" if attr == "__init__" else f"calling its {attr}"
            if isinstance(value, (classmethod, staticmethod)):
                ns[attr] = type(value)(_marked(value.__func__, who, what))
            elif inspect.isfunction(value):
                ns[attr] = _marked(value, who, what, progress=attr == "generate")
    _WATCHED[cls] = wrapped = type(cls.__name__, (cls,), ns)
    return wrapped


def _marked(fn: Any, who: str, what: str, progress: bool = False) -> Any:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if progress and len(args) == 2 and hasattr(args[1], "progress"):
            job = args[1]  # generate(self, job): each progress report is an answer
            tick = job.progress

            def beat(done: int) -> None:
                heartbeat()
                if tick is not None:  # a job without a progress callback (spectest bench)
                    tick(done)

            args = (args[0], dataclasses.replace(job, progress=beat))
        with plugin_call(who, what):
            return fn(*args, **kwargs)

    return call
