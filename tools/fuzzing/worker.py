"""The fuzzer's worker process (``python -m fuzzing.worker``, ``tools`` on the path): runs cases
in-process, many per process, so torch imports once.

Owns: writing a case's files (``materialize``), running a command-line case through typer's
``CliRunner`` on ``spectest.cli:app`` (the real boundary, in this process), running an engine
case through the real ``command`` / ``http`` engine (a real replay program; a real loopback HTTP
server in a thread of this process) and the same checks the runner applies to an engine's
output (``check_output``, the samples table, ``validate_samples``), with the boundary applied —
and reporting what happened (exit code, stdout, stderr, any exception that escaped, wall time).
Judges nothing: ``tools/fuzz.py`` does, from the report and the files left behind.

The line protocol with ``tools/fuzz.py``: one JSON request per line on the descriptor given as
``--requests-fd`` (``{"case": ..., "dir": ...}``), one JSON report per line on
``--reports-fd``; this process's own stdin is /dev/null and its stdout / stderr a log file, so
nothing a case prints (or a child it starts) can reach either channel.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import threading
import time
import traceback
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from fuzzing.common import file_bytes

TOY = "toy:V=16,order=1,scale=2.0,seed=3"
RUN_KEY = 5
_models: Any = None


def materialize(case: dict[str, Any], d: Path) -> None:
    """Write the case's files, directories, FIFOs and symlinks under ``d`` (created)."""
    d.mkdir(parents=True, exist_ok=False)
    for rel in case["dirs"]:
        (d / rel).mkdir(parents=True, exist_ok=True)
    for rel, entry in case["files"].items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(file_bytes(entry))
    for rel in case["fifos"]:
        os.mkfifo(d / rel)
    for rel, target in case["symlinks"].items():
        os.symlink(target, d / rel)


def expand(argv: list[str], d: Path) -> list[str]:
    return [a.replace("{dir}", str(d)) for a in argv]


@contextlib.contextmanager
def in_dir(d: Path) -> Any:
    cwd = os.getcwd()
    os.chdir(d)
    try:
        yield
    finally:
        os.chdir(cwd)


def run_cli(case: dict[str, Any], d: Path) -> dict[str, Any]:
    """The case's command line through ``CliRunner`` (stdout and stderr apart)."""
    from typer.testing import CliRunner

    from spectest.cli import app

    t0 = time.monotonic()
    with in_dir(d):
        res = CliRunner().invoke(app, expand(case["argv"], d), catch_exceptions=True)
    exc = None
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        exc = "".join(traceback.format_exception(*res.exc_info))  # type: ignore[misc]
    return {
        "exit": res.exit_code,
        "stdout": res.stdout,
        "stderr": res.stderr,
        "exception": exc,
        "wall": time.monotonic() - t0,
    }


# ----------------------------------------------------------------------------- engines
def _toy_models() -> Any:
    global _models
    if _models is None:
        from spectest.engines.base import Models
        from spectest.models.zoo import load_model

        _models = Models(load_model(TOY), None)
    return _models


def _arm_job(spec: dict[str, Any]) -> Any:
    from spectest.engines.base import ArmJob, DrafterSpec, RowSpec
    from spectest.sampling.params import SamplingParams

    sp = SamplingParams(temperature=0.8, top_p=0.9)
    return ArmJob(
        arm=spec["arm"],
        role=spec["arm"],
        variant=None,
        prompt_id="p0",
        prompt_ids=tuple(spec["prompt"]),
        rows=tuple(RowSpec("c", s, sp) for s in spec["seeds"]),
        num_positions=spec["T"],
        run_key=RUN_KEY,
        batch_size=16,
        drafter=DrafterSpec(onehot=False, k=3),
    )


def check_like_the_runner(out: Any, job: Any, engine: str) -> None:
    """What the runner does with an engine's output before a shard is written: the contract
    check, the samples and rounds tables, the analysis' own validation."""
    from spectest.engines.base import check_output, rounds_frame, samples_frame
    from spectest.errors import EngineError, InputError
    from spectest.stats.histograms import validate_samples

    check_output(out, job, 16, engine)
    samples = samples_frame(out.tokens, job.prompt_id, job.rows, job.arm)
    if out.rounds is not None:
        rounds_frame(out.rounds, job.prompt_id, job.rows, job.arm)
    try:
        validate_samples(samples)
    except InputError as err:
        raise EngineError(f"engine {engine}: the shard's samples are not valid: {err}") from None


def _with_boundary(fn: Any) -> tuple[int, str, str | None]:
    """``fn`` under the CLI's error boundary: (exit code, stderr, escaped exception)."""
    import click
    import typer

    from spectest.cli.common import boundary

    err = io.StringIO()
    out = io.StringIO()
    code, exc = 0, None
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            boundary(fn)()
        except (typer.Exit, click.exceptions.Exit, SystemExit) as e:
            code = int(getattr(e, "exit_code", getattr(e, "code", 1)) or 0)
        except BaseException:
            code, exc = 1, traceback.format_exc()
    return code, err.getvalue(), exc


def run_command_engine(case: dict[str, Any], d: Path) -> dict[str, Any]:
    from spectest.engines.command import CommandEngine

    spec = case["engine"]
    job = _arm_job(spec["job"])

    def body() -> None:
        opts = CommandEngine.parse_options(
            spec["options"], "fuzz.yaml: engines.candidate", base_dir=d
        )
        engine = CommandEngine(opts, _toy_models())
        try:
            out = engine.generate(job)
            check_like_the_runner(out, job, "command")
        finally:
            engine.close()

    t0 = time.monotonic()
    with in_dir(d):
        code, err, exc = _with_boundary(body)
    return {
        "exit": code,
        "stdout": "",
        "stderr": err,
        "exception": exc,
        "wall": time.monotonic() - t0,
    }


class _Script:
    """What the loopback server answers: the case's rules applied to a correct reply."""

    def __init__(self, spec: dict[str, Any], seeds_to_rows: dict[int, int]) -> None:
        self.api = spec["options"]["api"]
        self.rules = spec["rules"]
        self.rows = seeds_to_rows
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.attempts: dict[int, int] = {}

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        seed = body.get("seed")
        T = body.get("n_predict", body.get("max_tokens", 1))
        rng = random.Random(seed)
        toks = [rng.randrange(16) for _ in range(T)]
        if self.api == "llamacpp":
            echo = {
                k: body[k]
                for k in (
                    "temperature",
                    "top_k",
                    "top_p",
                    "min_p",
                    "seed",
                    "samplers",
                    "ignore_eos",
                )
                if k in body
            }
            return {
                "tokens": toks,
                "generation_settings": echo,
                "timings": {"draft_n": 0, "draft_n_accepted": 0},
            }
        return {"choices": [{"token_ids": toks, "text": ""}]}

    def rules_for(self, seed: Any) -> tuple[list[dict[str, Any]], int]:
        row = self.rows.get(seed, -1)
        with self.lock:
            self.attempts[row] = n = self.attempts.get(row, 0) + 1
        return [r for r in self.rules if r["row"] is None or r["row"] == row], n


def _set_field(rule: dict[str, Any], reply: dict[str, Any], script: _Script) -> None:
    if rule["key"] == "token_ids" and "choices" in reply:
        reply["choices"][0]["token_ids"] = rule["value"]
    else:
        reply[rule["key"]] = rule["value"]


def _echo(rule: dict[str, Any], reply: dict[str, Any], script: _Script) -> None:
    if "generation_settings" in reply:
        reply["generation_settings"][rule["key"]] = rule["value"]


def _end_early(rule: dict[str, Any], reply: dict[str, Any], script: _Script) -> None:
    toks = reply.get("tokens") or reply["choices"][0]["token_ids"]
    del toks[max(1, len(toks) - 1) :]


# the rules that edit the reply before it is sent (or wait): op -> edit(rule, reply, script)
REPLY_EDITS: dict[str, Callable[[dict[str, Any], dict[str, Any], _Script], Any]] = {
    "field": _set_field,
    "delay": lambda rule, reply, script: script.stop.wait(rule["delay"]),
    "echo": _echo,
    "timings": lambda rule, reply, script: reply.__setitem__("timings", rule["value"]),
    "early": _end_early,
    "extra": lambda rule, reply, script: reply.__setitem__("fuzz_extra", {"nested": [1, None]}),
}


class _Handler(BaseHTTPRequestHandler):
    """The fuzz server: the script's reply to each POST, shaped by the rules for its row."""

    protocol_version = "HTTP/1.0"
    script: _Script

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._send(404, b"{}")

    def _send(
        self,
        status: int,
        data: bytes,
        headers: dict[str, str] | None = None,
        length: int | None = None,
    ) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data) if length is None else length))
        self.end_headers()
        self.wfile.write(data)

    def _refused(self, rule: dict[str, Any], attempt: int) -> bool:
        """Answer instead of the reply (a status, a first failure, a closed connection)."""
        if rule["op"] == "status":
            headers = {} if rule.get("location") is None else {"Location": rule["location"]}
            self._send(rule["status"], b'{"error": "fuzz"}', headers)
        elif rule["op"] == "first_fail" and attempt == 1:
            self._send(503, b'{"error": "busy"}')
        elif rule["op"] == "close":
            self.close_connection = True
        else:
            return False
        return True

    def _trickle(self, data: bytes, pause_s: float) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        for i in range(len(data)):
            if self.script.stop.wait(pause_s):
                return
            self.wfile.write(data[i : i + 1])
            self.wfile.flush()

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(n))
        except ValueError:
            body = {}
        rules, attempt = self.script.rules_for(body.get("seed"))
        reply = self.script.reply(body)
        raw: bytes | None = None
        for rule in rules:
            if self._refused(rule, attempt):
                return
            if rule["op"] == "body":
                raw = rule["body"].encode("utf-8", "surrogateescape")
            elif rule["op"] in REPLY_EDITS:
                REPLY_EDITS[rule["op"]](rule, reply, self.script)
        data = raw if raw is not None else json.dumps(reply).encode()
        for rule in rules:
            if rule["op"] == "length":
                return self._send(200, data[: len(data) // 2], length=len(data))
            if rule["op"] == "trickle":
                return self._trickle(data, rule["trickle"])
        self._send(200, data)


def _make_handler(script: _Script) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (_Handler,), {"script": script})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up (broken pipe) is the point of the case


def run_http_engine(case: dict[str, Any], d: Path) -> dict[str, Any]:
    from spectest.engines.http import SEED_MOD, HTTPEngine
    from spectest.seeding import row_key

    spec = case["engine"]
    job = _arm_job(spec["job"])
    seeds = {
        row_key(RUN_KEY, job.prompt_id, r.config_id, r.seed) % SEED_MOD: i
        for i, r in enumerate(job.rows)
    }
    script = _Script(spec, seeds)
    server = _Server(("127.0.0.1", 0), _make_handler(script))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"

    def body() -> None:
        opts = HTTPEngine.parse_options({**spec["options"], "url": url}, "fuzz.yaml: engines.c")
        engine = HTTPEngine(opts, _toy_models())
        try:
            out = engine.generate(job)
            check_like_the_runner(out, job, "http")
        finally:
            engine.close()

    t0 = time.monotonic()
    try:
        code, err, exc = _with_boundary(body)
    finally:
        wall = time.monotonic() - t0
        script.stop.set()
        server.shutdown()
        server.server_close()
    return {"exit": code, "stdout": "", "stderr": err, "exception": exc, "wall": wall}


def _edit_run(edit: dict[str, Any], d: Path, run: Path) -> str:
    """Apply a ``resume`` case's edit between its two runs; the shard file it touched ("")."""
    for rel, text in edit["files"].items():
        (d / rel).write_text(text)
    shards = sorted((run / "shards").glob("candidate__*.samples.parquet"))
    if not shards or edit["op"] not in ("tamper_shard", "truncate_shard", "drop_digest"):
        return ""
    f = shards[0]
    if edit["op"] == "drop_digest":
        f.with_name(f.name.replace(".samples.parquet", ".digest.json")).unlink(missing_ok=True)
    elif edit["op"] == "truncate_shard":
        f.write_bytes(f.read_bytes()[:-7])
    else:  # one token changed, a valid Parquet file again
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pq.read_table(f)
        df = table.to_pandas()
        df.loc[0, "token_id"] = (int(df.loc[0, "token_id"]) + 1) % 16
        pq.write_table(pa.Table.from_pandas(df, schema=table.schema, preserve_index=False), f)
    return f.name


def run_resume(case: dict[str, Any], d: Path) -> dict[str, Any]:
    """A ``resume`` case: the command, the case's edit, the same command again (reported)."""
    first = run_cli(case, d)
    touched = _edit_run(case["edit"], d, d / case["out"])
    second = run_cli(case, d)
    second["first_exit"], second["touched"] = first["exit"], touched
    second["wall"] += first["wall"]
    if first.get("exception") and not second.get("exception"):
        second["exception"] = first["exception"]
    return second


def execute(case: dict[str, Any], d: Path) -> dict[str, Any]:
    materialize(case, d)
    mode = case["mode"]
    if mode == "cli":
        return run_cli(case, d)
    if mode == "resume":
        return run_resume(case, d)
    if mode == "command":
        return run_command_engine(case, d)
    if mode == "http":
        return run_http_engine(case, d)
    raise ValueError(f"unknown mode {mode!r}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests-fd", type=int, required=True)
    ap.add_argument("--reports-fd", type=int, required=True)
    ap.add_argument("--log", required=True)
    a = ap.parse_args()
    requests = os.fdopen(a.requests_fd, "r", encoding="utf-8")
    reports = os.fdopen(a.reports_fd, "w", encoding="utf-8", buffering=1)
    log = os.open(a.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    import spectest.cli  # noqa: F401  (the imports once, before the first case)

    _toy_models()
    reports.write(json.dumps({"ready": True}) + "\n")
    for line in requests:
        req = json.loads(line)
        try:
            report = execute(req["case"], Path(req["dir"]))
        except BaseException:  # the harness's own failure, reported, never hidden
            report = {
                "exit": None,
                "stdout": "",
                "stderr": "",
                "wall": 0.0,
                "exception": None,
                "harness_error": traceback.format_exc(),
            }
        reports.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
