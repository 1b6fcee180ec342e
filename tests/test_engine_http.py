"""The ``http`` engine and engine-managed servers, against a real loopback server.

``tests/fake_completion_server.py`` is a real HTTP server (stdlib, 127.0.0.1) whose tokens are a
pure function of (prompt, seed): it lets these tests make a server misbehave on purpose (ignore
seeds, drop a parameter, answer 503 while loading, crash) and check that spectest says so in one
line, and hold a port before a managed server starts (refused: its replies would pass for the
server's). llama.cpp's real server end to end is in tests/test_engine_llamacpp.py. All checks
here are exact (no statistics).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

from spectest.engines.base import ArmJob, DrafterSpec, Models, RowSpec
from spectest.engines.command import EngineProcessError
from spectest.engines.http import SEED_MOD, HTTPEngine
from spectest.errors import ConfigError, EngineError
from spectest.sampling.params import SamplingParams
from spectest.seeding import row_key

FAKE = Path(__file__).resolve().parent / "fake_completion_server.py"
WHERE = "t.yaml: engines.candidate"


def _job(n: int = 6, T: int = 5) -> ArmJob:
    sp = SamplingParams(temperature=0.8, top_p=0.9)
    return ArmJob(
        arm="candidate", role="candidate", variant=None, prompt_id="p0", prompt_ids=(1, 2, 3),
        rows=tuple(RowSpec("c", 100 + i, sp) for i in range(n)), num_positions=T, run_key=9,
        batch_size=16, drafter=DrafterSpec(onehot=False, k=3),
    )  # fmt: skip


def _managed(*flags: str, api: str = "llamacpp", **opts: object) -> HTTPEngine:
    raw = {"api": api, "server": ["{python}", str(FAKE), "--port", "{port}", *flags], **opts}
    return HTTPEngine(HTTPEngine.parse_options(raw, WHERE), Models(None, None))


@pytest.mark.parametrize("api", ["llamacpp", "openai"])
def test_managed_server_rows_and_seeds(api: str) -> None:
    sys.path.insert(0, str(FAKE.parent))
    from fake_completion_server import tokens

    eng = _managed(api=api)
    job = _job()
    try:
        out = eng.generate(job)
        prov = eng.provenance()
        proc = eng.server.proc
    finally:
        eng.close()
    for i, r in enumerate(job.rows):
        seed = row_key(9, "p0", "c", r.seed) % SEED_MOD
        np.testing.assert_array_equal(out.tokens[i], tokens([1, 2, 3], seed, 5))
    assert out.rounds is not None if api == "llamacpp" else out.rounds is None
    if api == "llamacpp":
        assert set(out.rounds["drafted"]) == {6} and set(out.rounds["accepted"]) == {4}
        assert prov["server_info"]["/props"]["build_info"] == "fake-1"
    assert "--port" in prov["command"]
    assert proc.poll() is not None  # stopped


def test_server_ignoring_seeds_is_an_error() -> None:
    eng = _managed("--ignore-seed")
    try:
        with pytest.raises(EngineError, match="does not honour seeds"):
            eng.generate(_job())
    finally:
        eng.close()


def test_silently_dropped_parameter_is_an_error() -> None:
    eng = _managed("--drop", "temperature")
    try:
        with pytest.raises(EngineError, match=r"silently changed 'temperature': sent 0.8"):
            eng.generate(_job())
    finally:
        eng.close()


def test_retries_with_backoff_then_success() -> None:
    eng = _managed("--fail-first", "2", retries=3)
    try:
        out = eng.generate(_job(n=2))
    finally:
        eng.close()
    assert (out.tokens >= 0).all()


def test_refused_parameter_is_not_retried() -> None:
    eng = _managed()
    try:
        eng._ensure_server()
        body = eng.request_body([1], SamplingParams(top_k=5000), 1, 2)
        with pytest.raises(EngineError, match=r"refused the request \(HTTP 400\).*top_k too large"):
            eng._post(body)
    finally:
        eng.close()


def test_server_crash_names_the_log() -> None:
    eng = _managed("--die-after", "3", retries=1)
    try:
        with pytest.raises(EngineProcessError, match="simulated crash"):
            eng.generate(_job(n=8))
        assert EngineProcessError.exit_code == 4  # infrastructure, never the statistical 1
    finally:
        eng.close()


def test_server_that_never_starts() -> None:
    raw = {"server": ["{python}", "-c", "import sys; print('no model file'); sys.exit(5)"]}
    eng = HTTPEngine(HTTPEngine.parse_options(raw, WHERE), Models(None, None))
    with pytest.raises(EngineProcessError, match=r"exited with status 5.*no model file"):
        eng.generate(_job())
    eng.close()


def test_a_port_another_process_answers_is_refused_before_the_start() -> None:
    """A real loopback server already holds the port: the managed server (which would never
    bind it) is not started, and its readiness probe is never fooled by the other's replies."""
    import http.server
    import threading

    from spectest.engines import server

    other = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    port = int(other.server_address[1])
    argv = (sys.executable, "-c", "import time; time.sleep(30)")
    s = server.ManagedServer(argv, {}, f"http://127.0.0.1:{port}/", 10.0, "candidate")
    try:
        with pytest.raises(EngineProcessError, match=f"127.0.0.1:{port} already accepts"):
            s.start()
        assert s.proc is None  # nothing was started
    finally:
        s.stop()
        other.shutdown()
        other.server_close()
    fixture, _ = server.expand_command(("{python}", "--port", "{port}"), None)
    assert fixture == (sys.executable, "--port", "{port}")  # the port is picked after the rest
    assert server.expand_command(fixture, 8123)[0] == (sys.executable, "--port", "8123")


def test_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="not a loopback address"):
        HTTPEngine.parse_options({"url": "http://10.1.2.3:8080"}, WHERE)
    with pytest.raises(ConfigError, match="exactly one of url"):
        HTTPEngine.parse_options({}, WHERE)
    with pytest.raises(ConfigError, match=r"samplers: expected a list"):
        HTTPEngine.parse_options({"url": "http://127.0.0.1:1", "samplers": ["top_q"]}, WHERE)
    with pytest.raises(ConfigError, match=r"api: expected one of"):
        HTTPEngine.parse_options({"url": "http://127.0.0.1:1", "api": "grpc"}, WHERE)
    with pytest.raises(
        ConfigError, match=r"\.urll: unknown key 'urll' \(allowed: name, api, url, "
    ):
        HTTPEngine.parse_options({"urll": "http://127.0.0.1:1"}, WHERE)
    o = HTTPEngine.parse_options(
        {"url": "http://localhost:1/", "samplers": ["top_p", "temperature"]}, WHERE
    )
    assert o.url == "http://localhost:1" and o.samplers == ("top_p", "temperature")
    hash(o)  # an EngineChoice key


@pytest.mark.parametrize(
    "name",
    [
        "llamacpp-spec.yaml",
        "llamacpp-spec-greedy.yaml",
        "llamacpp-misordered.yaml",
        "vllm-cpu-spec.yaml",
        "command-example.yaml",
    ],
)
def test_engine_options_round_trip_through_a_run_directory(name: str, tmp_path: Path) -> None:
    """A run directory's protocol.yaml (the canonical options) reads back to the same hash, so
    ``spectest analyze`` accepts it (env as pairs, extra as JSON, default samplers)."""
    import yaml

    from spectest.prompts import prompts_jsonl
    from spectest.protocol import load_protocol, to_raw

    p = load_protocol(Path(__file__).resolve().parents[1] / "protocols" / name)
    (tmp_path / "prompts.jsonl").write_text(prompts_jsonl(p))
    (tmp_path / "protocol.yaml").write_text(yaml.safe_dump(to_raw(p, prompts_file="prompts.jsonl")))
    assert load_protocol(tmp_path / "protocol.yaml").hash == p.hash


def command_lines() -> list[str]:
    """The command line of every process (from /proc: ``ps`` may truncate long lines)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out.append((d / "cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
    return out


CTRL_C_PROTOCOL = """
version: 2
name: ctrl-c
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
              server: ["{{python}}", "{fake}", --port, "{{port}}", --delay, "0.5"]}}
"""


def test_ctrl_c_stops_the_managed_server(tmp_path: Path) -> None:
    """SIGINT to ``spectest run`` while a managed server is serving: the run stops and no server
    process is left (the runner's ``finally`` closes every engine)."""
    import os
    import signal
    import subprocess

    (tmp_path / "prompts.jsonl").write_text('{"id": "p0", "ids": [1, 2]}\n')
    (tmp_path / "p.yaml").write_text(CTRL_C_PROTOCOL.format(fake=FAKE))
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "spectest", "run", "--config", str(tmp_path / "p.yaml"),
         "--out", str(tmp_path / "run")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # SIGINT as a terminal's foreground process has it, even under a background test runner
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip

    def servers() -> list[str]:
        return [c for c in command_lines() if str(FAKE) in c and "--delay" in c]

    for _ in range(1200):
        if servers():
            break
        time.sleep(0.1)
    time.sleep(3.0)  # a few requests in flight (0.5 s each)
    assert servers(), "the managed server never started"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0, out
    for _ in range(50):
        if not servers():
            break
        time.sleep(0.1)
    assert not servers(), servers()
