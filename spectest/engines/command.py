"""The ``command`` engine: any program that speaks spectest's JSON-lines protocol on stdin/stdout.

Owns the protocol's job lines, the check of every line read (``engines.replies``), the program's
start and hello line, and ``ForeignEngine`` (what ``command`` and ``http`` share). Knows nothing
about how the program samples, nor about files: the runner writes a shard only after
``check_output`` passed. The protocol: docs/engines-command.md "The spectest-jsonl/1 protocol".
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spectest.engines import replies
from spectest.engines.base import (
    PLACEHOLDER_TOKEN_ID,
    ArmJob,
    ArmOutput,
    Engine,
    SeedsKind,
    options_dict,
    rounds_from_tuples,
)
from spectest.engines.line_process import (
    EXIT_GRACE_S,
    EngineProcessError,
    LineProcess,
)
from spectest.errors import ConfigError, EngineError

PROTOCOL = replies.PROTOCOL
SAMPLER_ORDER = ("temperature", "top_k", "top_p", "min_p")
HELLO_MAX_CHARS = 10_000  # the hello is stored in every file's provenance


def parse_argv(value: Any, where: str, base_dir: Path | None = None) -> tuple[str, ...]:
    """A command as a YAML list of strings or one shell-quoted string; ``{protocol_dir}`` is
    replaced now (the protocol file's directory), ``{python}`` and the other placeholders of
    ``expand`` when the program starts."""
    if isinstance(value, str) and value.strip():
        argv = tuple(shlex.split(value))
    elif isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        argv = tuple(value)
    else:
        raise ConfigError(
            f"{where}: expected a non-empty list of strings or a string, got {value!r}"
        )
    pdir = str((base_dir or Path.cwd()).resolve())
    return tuple(a.replace("{protocol_dir}", pdir) for a in argv)


def programs_dir() -> Path:
    """The engine programs shipped inside the package (``spectest/engines/programs``): what
    ``{programs}`` stands for, in a checkout and in an installed wheel alike."""
    return Path(__file__).resolve().parent / "programs"


def expand(argv: tuple[str, ...]) -> tuple[str, ...]:
    """Placeholders resolved when a program starts: ``{python}`` = spectest's interpreter,
    ``{programs}`` = ``programs_dir()``. Resolved late, so a protocol that names a shipped
    program hashes the same from any checkout or install location (``{protocol_dir}``, resolved
    when the file is read, does not)."""
    import sys

    progs = str(programs_dir())
    return tuple(a.replace("{python}", sys.executable).replace("{programs}", progs) for a in argv)


def parse_env(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    """``{NAME: value}`` or the canonical ``[[NAME, value], ...]`` (what a stored run's
    protocol.yaml holds) → sorted pairs."""
    if value is None:
        return ()
    if isinstance(value, (list, tuple)) and all(
        isinstance(p, (list, tuple)) and len(p) == 2 for p in value
    ):
        value = {k: v for k, v in value}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ConfigError(f"{where}: expected a mapping of NAME: value, got {value!r}")
    return tuple(sorted((k, str(v)) for k, v in value.items()))


def job_lines(job: ArmJob, first_id: int) -> list[dict[str, Any]]:
    """The protocol's job objects of an ``ArmJob``: one per sampling config, rows in order."""
    from spectest.seeding import row_key

    by_config: dict[str, list[int]] = {}
    for i, r in enumerate(job.rows):
        by_config.setdefault(r.config_id, []).append(i)
    out = []
    for n, (cid, idx) in enumerate(by_config.items()):
        sp = job.rows[idx[0]].params
        out.append(
            {
                "type": "job",
                "id": first_id + n,
                "arm": job.arm,
                "role": job.role,
                "prompt_id": job.prompt_id,
                "prompt": list(job.prompt_ids),
                "config_id": cid,
                "sampling": {
                    "temperature": float(sp.temperature),
                    "top_k": int(sp.top_k),
                    "top_p": float(sp.top_p),
                    "min_p": float(sp.min_p),
                    "order": list(SAMPLER_ORDER),
                },
                "max_tokens": job.num_positions,
                "seeds": [job.rows[i].seed for i in idx],
                "row_keys": [
                    row_key(job.run_key, job.prompt_id, cid, job.rows[i].seed) for i in idx
                ],
                "run_key": job.run_key,
                "drafter": {
                    "kind": "onehot" if job.drafter.onehot else "sampled",
                    "k": job.drafter.k,
                    "q": job.drafter.q_mode,
                },
                "_rows": idx,  # stripped before sending
            }
        )
    return out


def check_job_line(obj: Any, result_schema: replies.Schema, arm: str) -> str:
    """A line read while results are pending, checked field by field: a ``result`` against
    ``result_schema`` (``replies.result_line``) or an ``error``; the context of its messages
    (``engine command (arm A, job N, seed S)``). ``ReplyError`` (exit 2) otherwise."""
    ids = obj if isinstance(obj, dict) else {}
    job_id, seed = replies.known_int(ids.get("id")), replies.known_int(ids.get("seed"))
    where = replies.where("command", arm=arm, job=job_id, seed=seed)
    try:
        replies.check(replies.JOB_LINE_TYPE, obj)
        replies.check(replies.ERROR_LINE if obj["type"] == "error" else result_schema, obj)
        if obj["type"] == "result":
            replies.check_probs(obj)
    except replies.Violation as v:
        raise replies.ReplyError(f"{where}: {v} (the program was stopped)") from None
    return where


class ForeignEngine(Engine):
    """What the ``command`` and ``http`` engines share: tokens only (teacher mode with
    ``tests.whitebox``: ``generation.whitebox_mode``), rounds a readout, no sampler variant."""

    needs = "none"
    whitebox = "tokens"
    rounds = "readout"
    uses_variant = False

    @classmethod
    def check_keys(cls, raw: Mapping[str, Any], where: str) -> None:
        """``ConfigError`` for a key of ``raw`` that is no field of ``cls.Options``."""
        allowed = ", ".join(f.name for f in dataclasses.fields(cls.Options))
        for key in raw:
            if key not in cls.Options.__dataclass_fields__:
                raise ConfigError(f"{where}.{key}: unknown key {key!r} (allowed: name, {allowed})")

    def _vocab_size(self) -> int | None:
        target = getattr(self.models, "target", None)
        return None if target is None else int(target.vocab_size)


class CommandEngine(ForeignEngine):
    """Runs an arm with an external program over the ``spectest-jsonl/1`` line protocol; its
    options: docs/real-engines.md "The `command` engine and its line protocol"."""

    name = "command"

    @dataclass(frozen=True)
    class Options:
        command: tuple[str, ...] = ()
        env: tuple[tuple[str, str], ...] = ()
        cwd: str = ""
        timeout_s: float = 60.0
        startup_timeout_s: float = 120.0

    @classmethod
    def parse_options(cls, raw: Mapping[str, Any], where: str, base_dir: Path | None = None) -> Any:
        cls.check_keys(raw, where)
        if "command" not in raw:
            raise ConfigError(f"{where}.command: required (the program to run)")
        argv = parse_argv(raw["command"], f"{where}.command", base_dir)
        cwd = str(raw.get("cwd", "") or "")
        out = {}
        for key, default in (("timeout_s", 60.0), ("startup_timeout_s", 120.0)):
            v = raw.get(key, default)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ConfigError(f"{where}.{key}: expected a number of seconds > 0, got {v!r}")
            out[key] = float(v)
        return cls.Options(
            command=argv, env=parse_env(raw.get("env"), f"{where}.env"), cwd=cwd, **out
        )

    def __init__(self, options: Any, models: Any) -> None:
        super().__init__(options, models)
        self.proc: LineProcess | None = None
        self.hello: dict[str, Any] = {}
        self.next_id = 0

    def _start(self, arm: str) -> LineProcess:
        if self.proc is not None and self.proc.proc.poll() is None:
            return self.proc
        if self.proc is not None:  # it exited between jobs: reap it before starting anew
            self.proc.kill()
        o = self.options
        self.proc = LineProcess(expand(o.command), dict(o.env), o.cwd or None, "engine command")
        where = replies.where("command", arm=arm)
        hello = self.proc.read(o.startup_timeout_s, "starting (no hello line)", where)
        try:
            replies.check(replies.HELLO, hello)
            if len(json.dumps(hello)) > HELLO_MAX_CHARS:
                raise replies.Violation("", f"at most {HELLO_MAX_CHARS} characters", hello)
        except replies.Violation as v:
            raise self.proc.violation(
                where, f"did not start with a hello line for {PROTOCOL!r}: {v}"
            ) from None
        self.hello = hello
        return self.proc

    def generate(self, job: ArmJob) -> ArmOutput:
        proc = self._start(job.arm)
        B, T = len(job.rows), job.num_positions
        result_schema = replies.result_line(T, self._vocab_size())
        tokens = np.full((B, T), PLACEHOLDER_TOKEN_ID, dtype=np.int64)  # [B, T]
        lines = job_lines(job, self.next_id)
        self.next_id += len(lines)
        pending: dict[tuple[int, int], int] = {}  # (job id, seed) -> row
        for line in lines:
            rows = line.pop("_rows")
            for r in rows:
                pending[(line["id"], job.rows[r].seed)] = r
            proc.send(line)  # queued: the writer thread feeds the program
        rounds: list[tuple[int, int, int, int, int, int]] = []
        reported = np.full((B, T, 2), np.nan)  # [B, T, (p, cdf_lo)]: engine-reported
        done = with_probs = 0
        while pending:
            obj = proc.read(
                self.options.timeout_s,
                f"{len(pending)} results were pending",
                replies.where("command", arm=job.arm),
            )
            try:
                where = check_job_line(obj, result_schema, job.arm)
            except replies.ReplyError:
                proc.kill()
                raise
            if obj["type"] == "error":
                proc.close(timeout_s=EXIT_GRACE_S)
                raise EngineError(
                    f"{where}: the program refused the job: {replies.short(obj['message'], 300)}"
                )
            key = (obj["id"], obj["seed"])
            if key not in pending:
                raise proc.violation(
                    where,
                    "answered a job and seed that are not pending (unknown, or answered twice)",
                )
            row = pending.pop(key)
            toks = obj["tokens"]
            tokens[row, : len(toks)] = toks
            if obj.get("probs") is not None:
                with_probs += 1
                for t, pr in enumerate(obj["probs"]):
                    lo = pr.get("cdf_lo")
                    reported[row, t] = (pr["p"], np.nan if lo is None else lo)
            pos = 0
            for i, rd in enumerate(obj.get("rounds") or []):
                rounds.append((row, i, pos, rd["drafted"], rd["accepted"], rd["emitted"]))
                pos += rd["emitted"]
            done += 1
            job.tick(done)
        if 0 < with_probs < done:
            raise replies.ReplyError(
                f"{replies.where('command', arm=job.arm)}: field 'probs': reported by "
                f"{with_probs} of {done} results; an engine reports them in every result or none"
            )
        return ArmOutput(
            tokens, rounds_from_tuples(rounds), False, None, reported if with_probs else None
        )

    def seeds_claim(self) -> SeedsKind:
        """``"ignored"`` when the program's hello line says so (``"seeds": "ignored..."`` or
        ``"reproducible": false``, as the mistral.rs program does), else ``"per row"``."""
        said = self.hello.get("seeds")
        if (isinstance(said, str) and said.startswith("ignored")) or (
            self.hello.get("reproducible") is False
        ):
            return "ignored"
        return self.seeds

    def provenance(self) -> dict[str, Any]:
        hello = {k: v for k, v in self.hello.items() if k != "type"}
        return {"name": self.name, "options": options_dict(self.options), "hello": hello}

    def close(self) -> None:
        if self.proc is not None:
            self.proc.close()
            self.proc = None


__all__ = [
    "PROTOCOL",
    "CommandEngine",
    "EngineProcessError",
    "LineProcess",
    "check_job_line",
    "job_lines",
]
