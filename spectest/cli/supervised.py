"""Commands that load plug-in code, run under a supervisor (``spectest.supervise``): which
plug-ins a command loads (``protocol_plugins``, ``engine_plugins``), ``--plugin-timeout`` and
``supervise_or_continue``.

The why and the details: docs/internals.md "spectest/cli/supervised.py".
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from spectest.cli.common import err_console, error_line
from spectest.supervise import (
    DEFAULT_TIMEOUT_S,
    check_timeout,
    is_supervised_child,
    run_supervised,
)

ENTRY = {"standalone": False}  # cli.main() sets it: this process is the command line itself
ACCEPTOR_PREFIX = "acceptor:"  # the protocol's shorthand (spectest.protocol.spec, not imported)
MAX_SCAN_BYTES = 1 << 20

PluginTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--plugin-timeout",
        help="Seconds one call into a plug-in (an acceptor kernel, an entry-point engine's method; "
        "an engine's generate between two progress reports) may take before it is stopped: "
        "exit 2 naming it.",
    ),
]


def engine_plugins(value: Any) -> list[str]:
    """The plug-in an engine entry (``NAME`` or ``{name: NAME, ...}``) names, if any."""
    from spectest.engines.registry import BUILTIN

    name = value.get("name") if isinstance(value, Mapping) else value
    if not isinstance(name, str):
        return []
    if name == "acceptor":
        kernel = value.get("kernel") if isinstance(value, Mapping) else None
        return [f"acceptor {kernel}" if isinstance(kernel, str) else "acceptor"]
    return [] if name in BUILTIN else [f"engine {name!r}"]


def engines_only(plugins: Sequence[str]) -> list[str]:
    """The entry-point engines of ``plugins`` (a command that parses a protocol imports them
    and calls their option parsers; it imports no kernel)."""
    return [p for p in plugins if p.startswith("engine ")]


def bench_plugins(arms: str, options: Mapping[str, Any]) -> list[str]:
    """The plug-ins of ``spectest bench --arms`` (labels ``NAME[:mode]`` or the aliases
    ``fast-plain`` ... of spectest's own engines) with ``--engine-options``."""
    from spectest.engines.registry import BUILTIN

    out = []
    for label in (a.strip() for a in arms.split(",") if a.strip()):
        name = label.partition(":")[0]
        base, _, mode = name.rpartition("-")
        if name not in BUILTIN and base in BUILTIN and mode in ("plain", "spec"):
            continue
        out += engine_plugins({"name": name, **dict(options.get(name) or {})})
    return out


def raw_plugins(raw: Any) -> list[str]:
    """The plug-ins a protocol's raw mapping names (versions 1 and 2)."""
    if not isinstance(raw, Mapping):
        return []
    out = []
    cand = raw.get("candidate")
    if isinstance(cand, str) and cand.startswith(ACCEPTOR_PREFIX):
        out.append(f"acceptor {cand[len(ACCEPTOR_PREFIX) :]}")
    for section in ("engines", "engine"):
        engines = raw.get(section)
        if isinstance(engines, Mapping):
            for role in ("reference", "candidate"):
                out += engine_plugins(engines.get(role))
    return out


def _set(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        nxt = node.get(part)
        if not isinstance(nxt, dict):
            nxt = node[part] = {} if not isinstance(nxt, str) else {"name": nxt}
        node = nxt
    node[parts[-1]] = value


def protocol_plugins(config: str | Path, sets: Sequence[str] = ()) -> list[str]:
    """The plug-ins the protocol ``config`` (a file or a shipped name) with ``--set`` overrides
    names; ``[]`` when it cannot be read (the command then reports that itself)."""
    from spectest.shipped import resolve_protocol_file

    try:
        path, _ = resolve_protocol_file(config)
        with open(path, "rb") as f:
            raw = yaml.safe_load(f.read(MAX_SCAN_BYTES))
        if not isinstance(raw, dict):
            return []
        for item in sets:
            key, sep, text = item.partition("=")
            if sep and key.strip().split(".")[0] in ("candidate", "engines", "engine"):
                _set(raw, key.strip(), yaml.safe_load(text))
    except Exception:
        return []
    return raw_plugins(raw)


def supervise_or_continue(plugins: Sequence[str], timeout_s: float, *, verdict: bool) -> None:
    """Validate ``timeout_s``; with ``plugins`` in the command line's own process, run this
    command line again under the supervisor and exit with its outcome (never returns); else
    return and let the command run here. ``verdict``: the command's exit 0, 1 or 3 is a verdict
    (it stands only with the ``summary.json`` that stores it)."""
    timeout_s = check_timeout(timeout_s)
    if not plugins or not ENTRY["standalone"] or is_supervised_child() or not sys.executable:
        return
    argv = [sys.executable, *sys.orig_argv[1:]]
    out = run_supervised(argv, list(dict.fromkeys(plugins)), timeout_s, verdict=verdict)
    if out.line is not None:
        if out.interrupted:
            err_console().print(out.line, markup=False)
        else:
            error_line(out.line)
    raise typer.Exit(out.code)


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ENTRY",
    "PluginTimeoutOpt",
    "bench_plugins",
    "engine_plugins",
    "engines_only",
    "protocol_plugins",
    "raw_plugins",
    "supervise_or_continue",
]
