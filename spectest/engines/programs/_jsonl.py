"""The engine programs' side of the ``spectest-jsonl/1`` line protocol (docs/engines-command.md).

Owns the hello line, the job loop (one result line per seed, one error line per job it cannot
run), the checks on a job's sampling config (``filters``) and the result line; a program hands
``serve`` its ``decode(job)``. Imported as a sibling file (``import _jsonl``) under an engine's
own venv: it must never import spectest, numpy or anything outside the standard library.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, Any

PROTOCOL = "spectest-jsonl/1"
Rounds = list[dict[str, int]] | None
Decoded = Iterator[tuple[int, list[int], Rounds]]


class JobRefused(Exception):
    """A job this engine cannot run as asked: answered with an error line (spectest stops with
    the message, exit 2)."""


def filters(sampling: Mapping[str, Any]) -> dict[str, float]:
    """The active filters of a job's sampling config: ``{"top_k": 50}``, ``{}`` for none.

    ``top_k = 0``, ``top_p = 1``, ``min_p = 0`` mean off (the protocol's convention)."""
    out: dict[str, float] = {}
    if int(sampling.get("top_k", 0)) > 0:
        out["top_k"] = int(sampling["top_k"])
    if float(sampling.get("top_p", 1.0)) < 1.0:
        out["top_p"] = float(sampling["top_p"])
    if float(sampling.get("min_p", 0.0)) > 0.0:
        out["min_p"] = float(sampling["min_p"])
    return out


def single_filter(sampling: Mapping[str, Any], engine: str) -> dict[str, float]:
    """``filters`` for an engine whose filter order cannot be set: more than one active filter
    is refused, since the engine's order need not be spectest's (``sampling.order``) and the
    two orders keep different token sets."""
    f = filters(sampling)
    if len(f) > 1:
        order = " -> ".join(sampling.get("order", ()))
        raise JobRefused(
            f"{engine} applies its filters in its own order, which cannot be set to spectest's "
            f"({order}); use one filter per config (got {', '.join(f)})"
        )
    if float(sampling.get("temperature", 1.0)) <= 0.0:
        raise JobRefused(f"{engine}: temperature must be > 0 (this program samples)")
    return f


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """``["repetition_penalty=1.5", ...]`` → ``{"repetition_penalty": 1.5}`` (values parsed as
    JSON where they parse, else kept as strings)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--override {item!r}: expected FIELD=VALUE")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def result_line(job_id: Any, seed: int, tokens: list[int], rounds: Rounds) -> dict[str, Any]:
    res: dict[str, Any] = {"type": "result", "id": job_id, "seed": seed, "tokens": tokens}
    if rounds is not None:
        res["rounds"] = rounds
    return res


def add_override(ap: argparse.ArgumentParser, help: str) -> None:
    """The ``--override FIELD=VALUE`` option (repeatable; ``parse_overrides`` reads it)."""
    ap.add_argument("--override", action="append", default=[], metavar="FIELD=VALUE", help=help)


def run(ap: argparse.ArgumentParser, build: Callable[[Any], Any], argv: list[str] | None) -> int:
    """A program's ``main``: parse ``argv``, keep stdout for the protocol before the engine loads
    (``protocol_stdout``), ``build(args) -> (runner, hello)`` and ``serve`` ``runner.decode``."""
    args = ap.parse_args(argv)
    out = protocol_stdout()
    runner, hello = build(args)
    return serve(hello, runner.decode, stdout=out)


def protocol_stdout() -> IO[str]:
    """Keep the protocol's stdout for this program alone: a private duplicate of file
    descriptor 1 becomes the protocol stream, and descriptor 1 itself is pointed at stderr, so
    whatever the engine's native code prints to stdout (mistral.rs logs there) lands in stderr
    instead of breaking the line protocol. Call before the engine is imported."""
    sys.stdout.flush()
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", buffering=1, encoding="utf-8")


def serve(
    hello: Mapping[str, Any],
    decode: Callable[[dict[str, Any]], Decoded],
    stdin: IO[str] | None = None,
    stdout: IO[str] | None = None,
) -> int:
    """Print ``hello`` (``type`` and ``protocol`` added), then answer every job line until
    ``stdin`` closes; returns the exit status (0).

    ``decode`` may be a generator: each seed's result line is sent as soon as it is yielded, so
    a long job is never silent for the command engine's ``timeout_s``. A job whose ``decode``
    raises ``JobRefused`` or any other exception (before or after some of its results) is
    answered with an error line naming it (the traceback goes to stderr, whose tail spectest
    shows); the program goes on reading, since spectest decides what to do with the error.
    """
    inp = sys.stdin if stdin is None else stdin
    out = sys.stdout if stdout is None else stdout

    def send(obj: Mapping[str, Any]) -> None:
        out.write(json.dumps(obj, separators=(",", ":")) + "\n")
        out.flush()

    send({"type": "hello", "protocol": PROTOCOL, **hello})
    for line in inp:
        if not line.strip():
            continue
        try:
            job = json.loads(line)
        except json.JSONDecodeError:
            send({"type": "error", "id": None, "message": f"not a JSON line: {line[:80]!r}"})
            continue
        if not isinstance(job, dict) or job.get("type") != "job":
            continue  # the protocol defines no other input; ignore, do not guess
        try:
            for seed, tokens, rounds in decode(job):  # streamed: each seed as it is done
                send(result_line(job["id"], seed, tokens, rounds))
        except JobRefused as err:
            send({"type": "error", "id": job.get("id"), "message": str(err)})
        except Exception as err:
            traceback.print_exc(file=sys.stderr)
            msg = f"{type(err).__name__}: {err}".replace("\n", " ")
            send({"type": "error", "id": job.get("id"), "message": msg[:500]})
    return 0
