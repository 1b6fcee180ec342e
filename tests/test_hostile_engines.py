"""Hostile engines (issue 19, items 3-4 and the engine situations of 4-7): every malformed
reply, hang, redirect and signal that was tried against the ``command`` and ``http`` engines, as
a test with its exact input, plus property-based tests of the reply schemas (hypothesis).

What must hold, for every case: one line naming the engine, the arm, the job or row, the seed,
the field and the value; exit 2 when the engine's output breaks the contract (shape and
vocabulary alike), 4 when the process or server dies or times out, never 1, never a traceback;
a sequence that stops early is a shorter sequence, not an error; a write to a program that does
not read, and a server that does not answer, end within the documented bound; a redirect is
never followed; SIGTERM to ``spectest run`` leaves no child behind.

Real parts only: the programs are small Python scripts run as subprocesses, the servers are real
loopback HTTP servers (a thread of this process, or ``tests/fake_completion_server.py``), the
runs are real ``spectest run`` processes on the toy model pair. All checks are exact (no
statistics): the two end-to-end verdicts use fixed seeds; the timing bounds have > 2 s of slack.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spectest.engines import children, command, http_exchange, line_process, replies
from spectest.engines.base import ArmJob, DrafterSpec, Models, RowSpec
from spectest.engines.command import CommandEngine, EngineProcessError, check_job_line
from spectest.engines.http import HTTPEngine
from spectest.engines.replies import ReplyError
from spectest.errors import EngineError
from spectest.models.zoo import load_model
from spectest.sampling.params import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_completion_server.py"
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    "OMP_NUM_THREADS": "1",
    "SPECTEST_NO_PROGRESS": "1",
}
V = 16
TOY_TARGET = "toy:V=16,order=1,scale=2.0,seed=3"
HELLO = {"type": "hello", "protocol": "spectest-jsonl/1", "engine": "t"}
PROPERTY = settings(
    derandomize=True,  # the same examples on every run: CI is deterministic
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def models() -> Models:
    return Models(load_model(TOY_TARGET), None)


def _job(n: int = 3, T: int = 4, arm: str = "candidate") -> ArmJob:
    sp = SamplingParams(temperature=0.8, top_p=0.9)
    return ArmJob(
        arm=arm, role="candidate", variant=None, prompt_id="p0", prompt_ids=(1, 2),
        rows=tuple(RowSpec("c", 400 + i, sp) for i in range(n)), num_positions=T, run_key=5,
        batch_size=16, drafter=DrafterSpec(onehot=False, k=3),
    )  # fmt: skip


def _one_line(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text and "Traceback" not in text, text
    return text


# ----------------------------------------------------------------------------- command replies
REPLAY = r"""
import json, sys
reply = open(sys.argv[1], "rb").read()  # the reply line(s); $ID and $SEED: the first job's
hello = open(sys.argv[2], "rb").read() if len(sys.argv) > 2 else None
sys.stdout.buffer.write((hello or json.dumps(HELLO).encode()) + b"\n")
sys.stdout.flush()
for line in sys.stdin:
    job = json.loads(line)
    out = reply.replace(b"$ID", str(job["id"]).encode())
    out = out.replace(b"$SEED", str(job["seeds"][0]).encode())
    sys.stdout.buffer.write(out + b"\n")
    sys.stdout.flush()
"""


def _replayer(tmp_path: Path, reply: bytes, hello: bytes | None = None) -> list[str]:
    prog = tmp_path / "replay.py"
    prog.write_text(f"HELLO = {HELLO!r}\n" + REPLAY)
    (tmp_path / "reply.txt").write_bytes(reply)
    argv = [sys.executable, str(prog), str(tmp_path / "reply.txt")]
    if hello is not None:
        (tmp_path / "hello.txt").write_bytes(hello)
        argv.append(str(tmp_path / "hello.txt"))
    return argv


def _command(argv: list[str], models: Models, **opts: float) -> CommandEngine:
    options = CommandEngine.parse_options({"command": argv, **opts}, "t.yaml: engines.candidate")
    return CommandEngine(options, models)


def _result(tokens: str = "[1, 2, 3, 4]", extra: str = "") -> bytes:
    return f'{{"type": "result", "id": $ID, "seed": $SEED, "tokens": {tokens}{extra}}}'.encode()


CTX = r"engine command \(arm candidate, job 0, seed 400\): "
CASES: list[tuple[str, bytes, str]] = [
    # the cases: huge ints, a list as the seed, rounds: 5, true as token 1
    (
        "huge int token",
        _result("[1, 123456789012345678901234567890, 2, 3]"),
        CTX + r"field 'tokens\[1\]': expected an int token id in \[0, 15\], "
        r"got 123456789012345678901234567890",
    ),
    (
        "huge int seed",
        b'{"type": "result", "id": $ID, "seed": 100000000000000000000000, "tokens": [1]}',
        r"engine command \(arm candidate, job 0, seed 100000000000000000000000\): field 'seed': "
        r"expected an int seed in \[-9223372036854775808, 9223372036854775807\], "
        r"got 100000000000000000000000",
    ),
    (
        "list as the seed",
        b'{"type": "result", "id": $ID, "seed": [400], "tokens": [1]}',
        r"engine command \(arm candidate, job 0\): field 'seed': expected an int seed .*, "
        r"got \[400\]",
    ),
    (
        "rounds: 5",
        _result(extra=', "rounds": 5'),
        CTX + r"field 'rounds': expected null or a list of at most 4 rounds, got 5",
    ),
    (
        "true as token 1",
        _result("[1, 2, 3, true]"),
        CTX + r"field 'tokens\[3\]': expected an int token id in \[0, 15\], got True",
    ),
    # the same code for out-of-vocabulary ids and for shape violations
    ("out of vocabulary", _result("[1, 16]"), CTX + r"field 'tokens\[1\]': .*, got 16"),
    ("negative id", _result("[1, -1]"), CTX + r"field 'tokens\[1\]': .*, got -1"),
    (
        "too many tokens",
        _result("[1, 2, 3, 4, 5]"),
        CTX + r"field 'tokens': expected a list of 1 to 4 int token ids .*, got \[1, 2, 3, 4, 5\]",
    ),
    (
        "no token at all",
        _result("[]"),
        CTX + r"field 'tokens': expected a list of 1 to 4 .*got \[\]",
    ),
    ("tokens a string", _result('"1 2 3"'), CTX + r"field 'tokens': .*got '1 2 3'"),
    ("float token", _result("[1.0]"), CTX + r"field 'tokens\[0\]': .*got 1\.0"),
    ("NaN token", _result("[NaN]"), CTX + r"field 'tokens\[0\]': .*got nan"),
    (
        "tokens missing",
        b'{"type": "result", "id": $ID, "seed": $SEED}',
        CTX + r"field 'tokens': .*got nothing \(the key is missing\)",
    ),
    (
        "bad rounds entry",
        _result(extra=', "rounds": [{"drafted": "3", "accepted": 1, "emitted": 2}]'),
        CTX + r"field 'rounds\[0\].drafted': expected an int in \[0, 2147483647\], got '3'",
    ),
    (
        "huge rounds count",
        _result(extra=', "rounds": [{"drafted": 3, "accepted": 1, "emitted": 99999999999}]'),
        CTX + r"field 'rounds\[0\].emitted': .*got 99999999999",
    ),
    (
        "unknown line type",
        b'{"type": "reslt", "id": $ID}',
        r"engine command \(arm candidate, job 0\): field 'type': expected one of 'result', "
        r"'error', got 'reslt'",
    ),
    ("a list", b"[1, 2]", r"engine command \(arm candidate\): the reply: expected a JSON object"),
    ("null", b"null", r"engine command \(arm candidate\): the reply: .*got None"),
    ("not JSON", b'{"type": "result", ', r"printed a line that is not JSON: '\{\"type\""),
    ("not UTF-8", b'{"type": "\xff\xfe"}', r"printed a line that is not UTF-8: b'"),
    ("nested too deep", b"[" * 100_000 + b"]" * 100_000, r"printed a line that is not JSON"),
    ("5000-digit int", _result("[" + "9" * 5000 + "]"), r"printed a line that is not JSON"),
    (
        "error message not a string",
        b'{"type": "error", "id": $ID, "message": {"why": 1}}',
        r"engine command \(arm candidate, job 0\): field 'message': expected a string",
    ),
    (
        "unknown seed",
        b'{"type": "result", "id": $ID, "seed": 7, "tokens": [1]}',
        r"engine command \(arm candidate, job 0, seed 7\): answered a job and seed that are "
        r"not pending",
    ),
    (
        "answered twice",
        _result("[1]") + b"\n" + _result("[1]"),
        CTX + r"answered a job and seed that are not pending \(unknown, or answered twice\)",
    ),
]


@pytest.mark.parametrize(("name", "reply", "pattern"), CASES, ids=[c[0] for c in CASES])
def test_malformed_result_is_one_line_exit_2(
    tmp_path: Path, models: Models, name: str, reply: bytes, pattern: str
) -> None:
    eng = _command(_replayer(tmp_path, reply), models, timeout_s=20)
    try:
        with pytest.raises(ReplyError) as info:
            eng.generate(_job())
        assert eng.proc is not None and eng.proc.proc.poll() is not None  # stopped, no orphan
    finally:
        eng.close()
    line = _one_line(info.value)
    assert info.value.exit_code == 2
    assert re.search(pattern, line), line
    assert len(line) < 400, line  # the value is cut, never the whole reply


@pytest.mark.parametrize(
    ("hello", "pattern"),
    [
        (b'{"type": "hello", "protocol": "spectest-jsonl/2"}', r"field 'protocol': expected "
         r"'spectest-jsonl/1', got 'spectest-jsonl/2'"),
        (b'{"type": "hello", "protocol": "spectest-jsonl/1", "engine": 5}',
         r"field 'engine': expected a string of at most 200 characters, got 5"),
        (b'{"type": "result", "protocol": "spectest-jsonl/1"}', r"field 'type': expected 'hello'"),
        (b'"hello"', r"the reply: expected a JSON object .*got 'hello'"),
        (b'{"type": "hello", "protocol": "spectest-jsonl/1", "blob": "' + b"x" * 20_000 + b'"}',
         r"the reply: expected at most 10000 characters, got \{'type': 'hello'.*… \(\d+ chars\)"),
    ],
)  # fmt: skip
def test_bad_hello_is_one_line_exit_2(
    tmp_path: Path, models: Models, hello: bytes, pattern: str
) -> None:
    eng = _command(_replayer(tmp_path, _result(), hello), models)
    try:
        with pytest.raises(ReplyError, match=r"^engine command \(arm candidate\): did not start "
                           r"with a hello line for 'spectest-jsonl/1': " + pattern):  # fmt: skip
            eng.generate(_job())
    finally:
        eng.close()


def test_a_line_longer_than_the_limit_is_refused(
    tmp_path: Path, models: Models, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(line_process, "MAX_LINE_BYTES", 10_000)
    eng = _command(_replayer(tmp_path, _result("[" + "1, " * 20_000 + "1]")), models)
    try:
        with pytest.raises(ReplyError, match=r"printed a line longer than 10000 bytes"):
            eng.generate(_job())
    finally:
        eng.close()


def test_error_line_is_exit_2_with_the_message(tmp_path: Path, models: Models) -> None:
    reply = b'{"type": "error", "id": $ID, "message": "top_k\\nunsupported ' + b"x" * 1000 + b'"}'
    eng = _command(_replayer(tmp_path, reply), models)
    try:
        with pytest.raises(EngineError) as info:
            eng.generate(_job())
    finally:
        eng.close()
    line = _one_line(info.value)
    assert line.startswith("engine command (arm candidate, job 0): the program refused the job: ")
    assert "'top_k\\nunsupported xxx" in line and len(line) < 400  # escaped and cut


# ----------------------------------------------------------------------------- early stops
SHORT = r"""
import json, sys
print(json.dumps(HELLO), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    for s in job["seeds"]:
        n = 1 + s % job["max_tokens"]  # 1 .. max_tokens tokens: early stops
        print(json.dumps({"type": "result", "id": job["id"], "seed": s,
                          "tokens": [(s * 7 + t) % 16 for t in range(n)]}))
    sys.stdout.flush()
"""


def test_early_stop_is_a_shorter_sequence_of_the_samples_table(
    tmp_path: Path, models: Models
) -> None:
    from spectest.engines.base import check_output, samples_frame

    prog = tmp_path / "short.py"
    prog.write_text(f"HELLO = {HELLO!r}\n" + SHORT)
    eng = _command([sys.executable, str(prog)], models)
    job = _job(n=6, T=4)
    try:
        out = eng.generate(job)
    finally:
        eng.close()
    check_output(out, job, V, "command")
    df = samples_frame(out.tokens, job.prompt_id, job.rows, job.arm)
    lengths = df.groupby("seed").size().to_dict()
    assert lengths == {400 + i: 1 + (400 + i) % 4 for i in range(6)}
    assert (df["token_id"] >= 0).all()
    wb = pd.DataFrame({"wb_x": np.arange(6 * 4)})  # aligned with (row, position) before the drop
    with_wb = samples_frame(out.tokens, job.prompt_id, job.rows, job.arm, wb)
    assert list(with_wb["wb_x"]) == [r * 4 + t for r in range(6) for t in range(lengths[400 + r])]


TOY_RUN = """
version: 2
name: hostile
models: {{target: "{target}", draft: "toy:V=16,order=1,scale=2.0,seed=4"}}
drafter: {{kind: sampled, k: 2}}
prompts: {{file: prompts.jsonl}}
configs: {{t1: {{temperature: 1.0}}}}
seeds: {{per_arm: {seeds}}}
positions: 3
tests: {{whitebox: {whitebox}, null_permutations: 20}}
teeth: {{null_arm: false}}
engines:
  candidate: {{name: command, command: ["{{python}}", "{prog}"{args}], timeout_s: {timeout}}}
"""


def _toy_run(
    tmp_path: Path, prog: Path, *, seeds: int = 40, whitebox: bool = False, args: str = "",
    timeout: float = 30,
) -> Path:  # fmt: skip
    (tmp_path / "prompts.jsonl").write_text('{"id": "p0", "ids": [1, 2]}\n')
    p = tmp_path / "p.yaml"
    p.write_text(
        TOY_RUN.format(
            target=TOY_TARGET,
            seeds=seeds,
            whitebox=str(whitebox).lower(),
            prog=prog,
            args=args,
            timeout=timeout,
        )
    )
    return p


def _spectest(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spectest", *map(str, args)],
        capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600,
    )  # fmt: skip


@pytest.mark.parametrize("whitebox", [False, True])
def test_early_stop_through_spectest_run_and_resume(tmp_path: Path, whitebox: bool) -> None:
    """The issue's case: a run whose command program stops early used to fail with "samples:
    column 'token_id' must be >= 0, got -1" (exit 2, no file named) after marking the poisoned
    shard complete, so every resume failed the same way. Now the shard holds the shorter
    sequences, the length family sees them (exit 1: this program's lengths are not the
    reference's), and a resume of the same directory gives the same verdict. With white-box
    tests on (teacher mode) the shared teacher forces the shorter sequences too."""
    prog = tmp_path / "short.py"
    prog.write_text(f"HELLO = {HELLO!r}\n" + SHORT)
    cfg = _toy_run(tmp_path, prog, whitebox=whitebox)
    out = tmp_path / "run"
    r = _spectest("run", "--config", cfg, "--out", out)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "sequence lengths p0/t1" in r.stdout
    shard = next((out / "shards").glob("candidate__*.samples.parquet"))
    df = pd.read_parquet(shard)
    assert (df["token_id"] >= 0).all()
    assert df.groupby("seed").size().to_dict() == {s: 1 + s % 3 for s in df["seed"].unique()}
    if whitebox:
        assert df.filter(like="wb_").notna().all().all() and df.filter(like="wb_").shape[1] > 0
    again = _spectest("run", "--config", cfg, "--out", out)
    assert again.returncode == 1, again.stdout + again.stderr


def test_true_as_a_token_through_spectest_run_is_exit_2_and_nothing_written(
    tmp_path: Path,
) -> None:
    prog = tmp_path / "true.py"
    prog.write_text(textwrap.dedent(f"""
        import json, sys
        print(json.dumps({HELLO!r}), flush=True)
        for line in sys.stdin:
            job = json.loads(line)
            for s in job["seeds"]:
                print(json.dumps({{"type": "result", "id": job["id"], "seed": s,
                                  "tokens": [True] * job["max_tokens"]}}))
            sys.stdout.flush()
    """))  # fmt: skip
    out = tmp_path / "run"
    r = _spectest("run", "--config", _toy_run(tmp_path, prog), "--out", out)
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "engine command (arm candidate, job 0, seed " in errors[0]
    assert "field 'tokens[0]': expected an int token id in [0, 15], got True" in errors[0]
    assert not list((out / "shards").glob("candidate__*.samples.parquet"))


# ----------------------------------------------------------------------------- command hangs
def test_program_that_never_reads_times_out_at_timeout_s(tmp_path: Path, models: Models) -> None:
    """The issue's case: hello, then never reading stdin, with 20 000 seeds (a 515 KB job line)
    blocked past ``timeout_s: 5`` (killed from outside at 150 s). The job line is written by a
    thread, so the silence bound applies: killed at ~5 s, exit 4."""
    prog = tmp_path / "deaf.py"
    prog.write_text(
        f"import json, time\nprint(json.dumps({HELLO!r}), flush=True)\ntime.sleep(600)\n"
    )
    eng = _command([sys.executable, str(prog)], models, timeout_s=5)
    job = _job(n=20_000, T=8)
    line = command.job_lines(job, 0)[0]
    line.pop("_rows")
    assert len(json.dumps(line, separators=(",", ":"))) > 500_000
    t0 = time.monotonic()
    try:
        with pytest.raises(EngineProcessError, match=r"sent nothing for 5 s while 20000 results"):
            eng.generate(job)
        elapsed = time.monotonic() - t0
        assert eng.proc is not None and eng.proc.proc.poll() is not None
    finally:
        eng.close()
    assert 4.5 < elapsed < 9.0, elapsed  # measured 5.2 s (was > 150 s)
    assert EngineProcessError.exit_code == 4


def test_program_flooding_log_lines_is_still_bounded(tmp_path: Path, models: Models) -> None:
    prog = tmp_path / "chatty.py"
    prog.write_text(
        f"import json\nprint(json.dumps({HELLO!r}), flush=True)\n"
        'while True:\n    print(\'{"type": "log", "message": "working"}\', flush=True)\n'
    )
    eng = _command([sys.executable, str(prog)], models, timeout_s=2)
    t0 = time.monotonic()
    try:
        with pytest.raises(EngineProcessError, match=r"sent only log lines for 2 s"):
            eng.generate(_job())
    finally:
        eng.close()
    assert time.monotonic() - t0 < 8.0


# ----------------------------------------------------------------------------- http replies
class _Server:
    """A loopback HTTP server in a thread: ``reply(handler, body)`` answers each POST."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.reply: Callable[[BaseHTTPRequestHandler, dict[str, Any]], None] = _ok
        self.get: Callable[[BaseHTTPRequestHandler], None] = lambda h: _send(h, 200, b"{}")
        self.posts = self.gets = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                return

            def do_GET(self) -> None:
                outer.gets += 1
                outer.get(self)

            def do_POST(self) -> None:
                outer.posts += 1
                n = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(n)) if n else {}
                try:
                    outer.reply(self, body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _send(h: BaseHTTPRequestHandler, code: int, data: bytes, headers: dict | None = None) -> None:
    h.send_response(code)
    for k, v in (headers or {"Content-Type": "application/json"}).items():
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def _tokens(body: dict[str, Any]) -> list[int]:
    n = body.get("n_predict", body.get("max_tokens"))
    return [(body["seed"] + t) % V for t in range(n)]


def _ok(h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
    if "n_predict" in body:
        echo = {k: body[k] for k in ("temperature", "top_k", "top_p", "min_p", "seed")}
        reply = {"tokens": _tokens(body), "generation_settings": echo}
    else:
        reply = {"choices": [{"token_ids": _tokens(body)}]}
    _send(h, 200, json.dumps(reply).encode())


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    yield s
    s.close()


def _http(url: str, models: Models, api: str = "llamacpp", **opts: Any) -> HTTPEngine:
    raw = {"api": api, "url": url, "check_seeds": False, **opts}
    return HTTPEngine(HTTPEngine.parse_options(raw, "t.yaml: engines.candidate"), models)


HCTX = r"^engine http \(api {api}, arm candidate, prompt p0, row 0, seed 400\): "
HTTP_CASES: list[tuple[str, str, Any, str]] = [
    (
        "a list",
        "llamacpp",
        [1, 2],
        r"the reply: expected a JSON object with 'tokens', got \[1, 2\]",
    ),
    ("null", "llamacpp", None, r"the reply: expected a JSON object with 'tokens', got None"),
    (
        "bad echo",
        "llamacpp",
        {"tokens": [1], "generation_settings": {"temperature": "hot"}},
        r"field 'generation_settings.temperature': expected a finite number, got 'hot'",
    ),
    (
        "echo a list",
        "llamacpp",
        {"tokens": [1], "generation_settings": [0.8]},
        r"field 'generation_settings': expected null or a JSON object, got \[0.8\]",
    ),
    (
        "echo of ignore_eos as 1",
        "llamacpp",
        {"tokens": [1], "generation_settings": {"ignore_eos": 1}},
        r"field 'generation_settings.ignore_eos': expected true or false, got 1",
    ),
    (
        "bad timings",
        "llamacpp",
        {"tokens": [1], "timings": "fast"},
        r"field 'timings': expected null or a JSON object, got 'fast'",
    ),
    (
        "bad timings count",
        "llamacpp",
        {"tokens": [1], "timings": {"draft_n": 1e300, "draft_n_accepted": 2}},
        r"field 'timings.draft_n': expected null or an int count in \[0, 2147483647\], got 1e\+300",
    ),
    (
        "tokens dropped",
        "llamacpp",
        {"content": "hi"},
        r"field 'tokens': .*got nothing \(the key is missing\) \(return_tokens dropped\?\)",
    ),
    ("true as token", "llamacpp", {"tokens": [True]}, r"field 'tokens\[0\]': .*got True"),
    ("out of vocabulary", "llamacpp", {"tokens": [1, 99]}, r"field 'tokens\[1\]': .*got 99"),
    (
        "a string for choices",
        "openai",
        {"choices": "abc"},
        r"field 'choices': expected a list of exactly 1 choice, got 'abc'",
    ),
    ("no choice", "openai", {"choices": []}, r"field 'choices': expected a list of exactly 1"),
    (
        "choice without ids",
        "openai",
        {"choices": [{"text": "x"}]},
        r"field 'choices\[0\].token_ids': .*\(the server ignored return_token_ids\?\)",
    ),
    (
        "huge int id",
        "openai",
        {"choices": [{"token_ids": [10**30]}]},
        r"field 'choices\[0\].token_ids\[0\]': .*got 1000000000000000000000000000000",
    ),
]


@pytest.mark.parametrize(
    ("name", "api", "reply", "pattern"), HTTP_CASES, ids=[c[0] for c in HTTP_CASES]
)
def test_malformed_http_reply_is_one_line_exit_2(
    server: _Server, models: Models, name: str, api: str, reply: Any, pattern: str
) -> None:
    server.reply = lambda h, body: _send(h, 200, json.dumps(reply).encode())
    eng = _http(server.url, models, api=api, concurrency=1)
    with pytest.raises(ReplyError) as info:
        eng.generate(_job(n=1))
    line = _one_line(info.value)
    assert info.value.exit_code == 2
    assert re.search(HCTX.format(api=api) + pattern, line), line


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        (b"<html>oops</html>", r"the reply of http://127.0.0.1:\d+/completion is not JSON: "
         r"b'<html>oops</html>'"),
        (b'{"tokens": [\xff]}', r"is not JSON"),
        (b"[" * 100_000, r"is not JSON"),
    ],
)  # fmt: skip
def test_http_reply_that_is_not_json(
    server: _Server, models: Models, data: bytes, pattern: str
) -> None:
    server.reply = lambda h, body: _send(h, 200, data)
    with pytest.raises(ReplyError, match=pattern):
        _http(server.url, models).generate(_job(n=1))
    assert server.posts == 1  # a contract violation is not retried


def test_http_reply_longer_than_the_limit(
    server: _Server, models: Models, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http_exchange, "MAX_REPLY_BYTES", 1000)
    server.reply = lambda h, body: _send(h, 200, json.dumps({"tokens": [1] * 5000}).encode())
    with pytest.raises(ReplyError, match=r"is longer than 1000 bytes"):
        _http(server.url, models).generate(_job(n=1))


# ----------------------------------------------------------------------------- http redirects
def test_redirect_to_a_host_outside_the_allow_list_is_not_followed(models: Models) -> None:
    """The issue's case: the http engine followed a 302 to a host outside its allow-list.
    127.0.0.2 answers on this machine but is not in the allow-list (a url naming it is
    refused); a 302 pointing there is refused too, and it never sees a request."""
    from spectest.errors import ConfigError

    outside, main = _Server("127.0.0.2"), _Server()
    try:
        with pytest.raises(ConfigError, match="is not a loopback address"):
            HTTPEngine.parse_options({"url": outside.url}, "t.yaml: engines.candidate")
        main.reply = lambda h, body: _send(h, 302, b"", {"Location": outside.url + "/completion"})
        main.get = lambda h: _send(h, 302, b"", {"Location": outside.url + h.path})
        eng = _http(main.url, models)
        with pytest.raises(EngineError) as info:
            eng.generate(_job(n=2))
        line = _one_line(info.value)
        assert info.value.exit_code == 2
        assert f"answered HTTP 302, a redirect to '{outside.url}/completion'" in line
        assert "does not follow redirects" in line
        assert outside.posts == 0
        assert eng._info() == {} and main.gets == 2  # GET /props, /version: not followed either
        assert outside.posts == outside.gets == 0
    finally:
        outside.close()
        main.close()


# ----------------------------------------------------------------------------- http hangs
def test_hanging_server_fails_fast_not_per_queued_request(server: _Server, models: Models) -> None:
    """The issue's case: ``timeout_s 2, retries 1, concurrency 2`` against a server that stops
    answering was reported after 240 s, every queued request timing out in turn. Now the first
    request to exhaust its retries ends the job: (retries + 1) × timeout_s + 0.5 s of backoff =
    4.5 s."""
    stop = threading.Event()
    server.reply = lambda h, body: stop.wait(60)
    eng = _http(server.url, models, timeout_s=2, retries=1, concurrency=2)
    t0 = time.monotonic()
    try:
        with pytest.raises(EngineProcessError, match=r"failed 2 times; last: TimeoutError"):
            eng.generate(_job(n=100))
    finally:
        stop.set()
    elapsed = time.monotonic() - t0
    assert 4.0 < elapsed < 7.5, elapsed  # measured 4.5 s (was 4.5 s per queued pair: 225 s)
    assert server.posts <= 2 * 2 + 2  # the queued rows never started (at most one per worker
    # slipped in before the cancellation, and was cut off at once)


def test_trickling_server_is_bounded_per_attempt(server: _Server, models: Models) -> None:
    """A server that sends one byte every 0.5 s never trips a per-read timeout; the deadline
    is for the whole exchange."""

    def trickle(h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "1000")
        h.end_headers()
        for _ in range(1000):
            h.wfile.write(b" ")
            h.wfile.flush()
            time.sleep(0.5)

    server.reply = trickle
    eng = _http(server.url, models, timeout_s=2, retries=1, concurrency=1)
    t0 = time.monotonic()
    with pytest.raises(EngineProcessError, match=r"no complete reply within 2 s"):
        eng.generate(_job(n=3))
    assert time.monotonic() - t0 < 7.5


def test_reply_cut_short_is_a_connection_failure_not_a_reply(
    server: _Server, models: Models
) -> None:
    """A server that announces a body and closes before sending it (a crash mid-reply) is a
    failed exchange, retried and then an infrastructure error naming it, never an empty reply
    taken for the engine's answer (which would be a contract violation, exit 2)."""

    def cut(h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "100")
        h.end_headers()
        h.wfile.write(b'{"tokens": [1')
        h.wfile.flush()
        h.close_connection = True

    server.reply = cut
    eng = _http(server.url, models, retries=1, concurrency=1)
    with pytest.raises(EngineProcessError, match=r"IncompleteRead") as info:
        eng.generate(_job(n=1))
    assert info.value.exit_code == 4
    assert server.posts == 2  # retried once


def test_dead_url_fails_fast(models: Models) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    eng = _http(f"http://127.0.0.1:{port}", models, timeout_s=2, retries=1, concurrency=2)
    t0 = time.monotonic()
    with pytest.raises(EngineProcessError, match=r"failed 2 times; last: ConnectionRefusedError"):
        eng.generate(_job(n=50))
    assert time.monotonic() - t0 < 3.0


# ----------------------------------------------------------------------------- SIGTERM
def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait(cond: Callable[[], bool], seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def test_sigterm_stops_the_command_engines_child(tmp_path: Path) -> None:
    """The issue's case: SIGTERM to ``spectest run`` left the command engine's child running
    (its own session: the signal never reached it, and Python's default SIGTERM skips every
    ``finally``). Now the child is gone and the run ends as interrupted (never 0 or 1)."""
    prog = tmp_path / "sleepy.py"
    prog.write_text(
        f"import json, os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\n"
        f"print(json.dumps({HELLO!r}), flush=True)\ntime.sleep(600)\n"
    )
    pidfile = tmp_path / "child.pid"
    cfg = _toy_run(tmp_path, prog, args=f', "{pidfile}"', timeout=300)
    proc = subprocess.Popen(
        [sys.executable, "-m", "spectest", "run", "--config", str(cfg), "--out",
         str(tmp_path / "run")],
        env=ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert _wait(lambda: pidfile.is_file() and pidfile.read_text() != "", 120)
        child = int(pidfile.read_text())
        time.sleep(1.0)  # spectest is waiting for results
        assert _alive(child)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out  # 128 + SIGTERM, the shell's convention
    assert "interrupted" in out, out
    assert _wait(lambda: not _alive(child), 10), f"child {child} still running"


SERVER_RUN = """
version: 2
name: term-server
models: {{target: "toy:V=16,order=1,scale=2.0,seed=3", draft: "toy:V=16,order=1,scale=2.0,seed=4"}}
drafter: {{kind: sampled, k: 2}}
prompts: {{file: prompts.jsonl}}
configs: {{t1: {{temperature: 1.0}}}}
seeds: {{per_arm: 50}}
positions: 3
tests: {{whitebox: false, null_permutations: 20}}
teeth: {{null_arm: false}}
engines:
  reference: {{name: http, concurrency: 1,
              server: ["{{python}}", "{fake}", --port, "{{port}}", --delay, "0.5", --tag, "{tag}"]}}
"""


def test_sigterm_stops_the_managed_server(tmp_path: Path) -> None:
    tag = f"sigterm-{os.getpid()}-{time.monotonic_ns()}"
    (tmp_path / "prompts.jsonl").write_text('{"id": "p0", "ids": [1, 2]}\n')
    (tmp_path / "p.yaml").write_text(SERVER_RUN.format(fake=FAKE, tag=tag))

    def servers() -> list[int]:
        pids = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if tag in (d / "cmdline").read_bytes().decode(errors="replace"):
                        pids.append(int(d.name))
                except OSError:
                    continue
        return [p for p in pids if _alive(p)]

    proc = subprocess.Popen(
        [sys.executable, "-m", "spectest", "run", "--config", str(tmp_path / "p.yaml"), "--out",
         str(tmp_path / "run")],
        env=ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert _wait(lambda: bool(servers()), 120), "the managed server never started"
        time.sleep(2.0)  # requests in flight
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out  # 128 + SIGTERM
    assert _wait(lambda: not servers(), 10), servers()


def test_sigterm_handler_is_installed_only_while_children_live(
    tmp_path: Path, models: Models
) -> None:
    """From SIG_DFL: spectest's handler while a child lives, SIG_DFL again after. The worker
    may hold another library's handler left by an earlier test file (``ray.init`` in
    tests/test_scaleout.py installs one, and spectest leaves a host's handler alone, by
    design): the test starts from SIG_DFL and puts that handler back."""
    if children.live():
        pytest.skip("another test left an engine child running")
    host = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        prog = tmp_path / "echo.py"
        prog.write_text(
            f"import json, sys\nprint(json.dumps({HELLO!r}), flush=True)\nsys.stdin.read()\n"
        )
        eng = _command([sys.executable, str(prog)], models)
        lp = eng._start("candidate")
        assert signal.getsignal(signal.SIGTERM) is children._on_sigterm
        assert lp in children.live()
        eng.close()
        assert lp.proc.poll() is not None
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and not children.live()
    finally:
        signal.signal(signal.SIGTERM, host)


# ----------------------------------------------------------------------------- properties
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.integers(min_value=-3, max_value=20)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)  # fmt: skip
TOKENS = st.lists(st.integers(min_value=-2, max_value=V + 1) | st.booleans(), max_size=6)
T_MAX = 4
I64 = 2**63 - 1


def _is_int(v: Any, lo: int, hi: int) -> bool:
    """Slow reference of ``replies.Int``: a plain int (not a bool) in [lo, hi]."""
    return type(v) is int and lo <= v <= hi


def _valid_tokens(v: Any) -> bool:
    return isinstance(v, list) and 1 <= len(v) <= T_MAX and all(_is_int(t, 0, V - 1) for t in v)


def _valid_rounds(v: Any) -> bool:
    if v is None:
        return True
    keys = ("drafted", "accepted", "emitted")
    return isinstance(v, list) and len(v) <= T_MAX and all(
        isinstance(r, dict) and all(k in r and _is_int(r[k], 0, 2**31 - 1) for k in keys)
        for r in v
    )  # fmt: skip


RESULT_FIELDS: dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], bool]]] = {
    "type": (JSON | st.sampled_from(["result", "error", "log", "hello"]), lambda v: v == "result"),
    "id": (JSON, lambda v: _is_int(v, 0, I64)),
    "seed": (JSON, lambda v: _is_int(v, -I64 - 1, I64)),
    "tokens": (JSON | TOKENS, _valid_tokens),
    "rounds": (
        JSON | st.lists(st.fixed_dictionaries(
            {"drafted": JSON | st.integers(0, 9), "accepted": st.integers(0, 9),
             "emitted": st.integers(-1, 9)}), max_size=5),
        _valid_rounds,
    ),
}  # fmt: skip


@PROPERTY
@given(
    field=st.sampled_from(sorted(RESULT_FIELDS)),
    data=st.data(),
    drop=st.booleans(),
)
def test_property_command_result_fields(field: str, data: st.DataObject, drop: bool) -> None:
    """Any JSON value in any field of a result line (or the field missing): accepted exactly
    when the slow reference says the field is well-formed, else one ``ReplyError`` line that
    names the field; never another exception."""
    strategy, valid = RESULT_FIELDS[field]
    value = data.draw(strategy)
    line: dict[str, Any] = {"type": "result", "id": 3, "seed": 400, "tokens": [1, 2]}
    if drop:
        line.pop(field, None)
        ok = field == "rounds"  # the only optional field
    else:
        line[field] = value
        ok = valid(value)
    if field == "type" and not drop and value == "error":
        ok = False  # an error line needs a message
    schema = replies.result_line(T_MAX, V)
    try:
        where = check_job_line(line, schema, "candidate")
    except ReplyError as err:
        assert not ok, (line, err)
        text = _one_line(err)
        assert text.startswith("engine command (arm candidate")
        assert f"field {field!r}" in text or f"field '{field}[" in text or f"field '{field}." in (
            text
        ) or (field == "type" and "field 'message'" in text), text  # fmt: skip
        assert len(text) < 400
    else:
        assert ok, line
        assert where.startswith("engine command (arm candidate")


@PROPERTY
@given(line=JSON)
def test_property_any_json_line(line: Any) -> None:
    """A whole line of arbitrary JSON: accepted only as a well-formed result or error."""
    schema = replies.result_line(T_MAX, V)
    try:
        check_job_line(line, schema, "candidate")
    except ReplyError as err:
        _one_line(err)
    else:
        assert isinstance(line, dict) and line["type"] in ("result", "error", "log")


ECHO_KEYS = ("temperature", "top_k", "top_p", "min_p", "seed", "samplers", "ignore_eos")
LLAMA_FIELDS = {
    "tokens": JSON | TOKENS,
    "generation_settings": JSON
    | st.fixed_dictionaries({}, optional={k: JSON for k in ECHO_KEYS}),
    "timings": JSON
    | st.fixed_dictionaries({}, optional={"draft_n": JSON, "draft_n_accepted": JSON}),
}  # fmt: skip


def _valid_echo(v: Any, body: dict[str, Any]) -> bool:
    """Slow reference of the echo rule: types as sent, values equal to what was sent."""
    if v is None:
        return True
    if not isinstance(v, dict):
        return False
    for k, used in v.items():
        if k not in ECHO_KEYS:
            continue
        sent = body[k]
        if isinstance(sent, float):
            if type(used) not in (int, float) or not math.isfinite(used):
                return False
            if abs(used - sent) > 1e-6 * max(1.0, abs(sent)):
                return False
        elif isinstance(sent, list):
            if used != sent or not all(type(s) is str for s in used):
                return False
        elif type(used) is not type(sent) or used != sent:
            return False
    return True


def _valid_timings(v: Any) -> bool:
    if v is None:
        return True
    return isinstance(v, dict) and all(
        v.get(k) is None or _is_int(v[k], 0, 2**31 - 1) for k in ("draft_n", "draft_n_accepted")
    )


@PROPERTY
@given(field=st.sampled_from(sorted(LLAMA_FIELDS)), data=st.data(), whole=JSON)
def test_property_llamacpp_reply_fields(
    models: Models, field: str, data: st.DataObject, whole: Any
) -> None:
    """Any JSON value in any field of a llama.cpp reply, and any JSON value as the whole
    reply: accepted exactly when well-formed, else one line (``ReplyError`` for the schema, an
    ``EngineError`` for a silently changed parameter), exit 2; never another exception."""
    eng = _http("http://127.0.0.1:1", models)
    sp = SamplingParams(temperature=0.8, top_p=0.9)
    body = eng.request_body([1, 2], sp, 400, T_MAX)
    value = data.draw(LLAMA_FIELDS[field])
    reply: dict[str, Any] = {"tokens": [1, 2], field: value}
    ok = {
        "tokens": _valid_tokens,
        "generation_settings": lambda v: _valid_echo(v, body),
        "timings": _valid_timings,
    }[field](value)
    for candidate, expect in ((reply, ok), (whole, None)):
        try:
            rep = eng.parse_reply(candidate, body, T_MAX, "engine http (api llamacpp, row 0)")
        except EngineError as err:
            assert expect is not True, (candidate, err)
            assert err.exit_code == 2
            text = _one_line(err)
            assert text.startswith("engine http (api llamacpp, row 0): ") and len(text) < 400
        else:
            assert expect is not False, candidate
            assert isinstance(candidate, dict) and rep.tokens == candidate["tokens"]


@PROPERTY
@given(choices=JSON | st.lists(st.fixed_dictionaries({"token_ids": JSON | TOKENS}), max_size=2))
def test_property_openai_choices(choices: Any) -> None:
    eng = _http("http://127.0.0.1:1", Models(None, None), api="openai")
    body = eng.request_body([1, 2], SamplingParams(), 400, T_MAX)
    ok = (
        isinstance(choices, list)
        and len(choices) == 1
        and isinstance(choices[0], dict)
        and "token_ids" in choices[0]
        and isinstance(choices[0]["token_ids"], list)
        and 1 <= len(choices[0]["token_ids"]) <= T_MAX
        and all(_is_int(t, 0, 2**31 - 1) for t in choices[0]["token_ids"])
    )
    try:
        rep = eng.parse_reply({"choices": choices}, body, T_MAX, "engine http (api openai)")
    except ReplyError as err:
        assert not ok, choices
        assert "field 'choices" in _one_line(err)
    else:
        assert ok, choices
        assert rep.tokens == choices[0]["token_ids"]


@PROPERTY
@given(
    tokens=st.lists(st.lists(st.integers(-3, V + 2), min_size=3, max_size=3), min_size=2,
                    max_size=2),
)  # fmt: skip
def test_property_check_output_tokens(tokens: list[list[int]]) -> None:
    """``check_output`` against a slow reference of the token rule: ids in [0, V), every row
    starting with a token, -1 only as a suffix."""
    from spectest.engines.base import ArmOutput, check_output

    arr = np.array(tokens, dtype=np.int64)

    def row_ok(r: list[int]) -> bool:
        n = next((i for i, t in enumerate(r) if t == -1), len(r))
        return n >= 1 and all(0 <= t < V for t in r[:n]) and all(t == -1 for t in r[n:])

    ok = all(row_ok(r) for r in tokens)
    job = _job(n=2, T=3)
    try:
        check_output(ArmOutput(arr), job, V, "e")
    except ReplyError as err:
        assert not ok, tokens
        assert _one_line(err).startswith("engine e (arm candidate, prompt p0, row ")
    else:
        assert ok, tokens
