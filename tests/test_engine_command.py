"""The ``command`` engine: real subprocesses over the spectest-jsonl/1 line protocol.

Failure paths with small inline programs: a program that dies mid-shard (one line, exit status
and stderr tail, exit code not 1, no shard marked complete), one that stays silent (killed after
``timeout_s``), one without a hello line, and an ``error`` reply.

End to end through ``spectest run`` — the shipped correct example program (exact speculative
sampling) against built-in plain sampling is EQUIVALENT (exit 0), the buggy example (top-p
before temperature) DIFFERENT (exit 1), both at 200 seeds — is checked once, from the installed
wheel, in tests/test_wheel_protocols.py (``DOCUMENTED``: the same protocols, seeds, options,
exit codes and verdict words these tests asserted from the checkout, which ran the same two
runs a second time)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from spectest.engines.base import ArmJob, DrafterSpec, Models, RowSpec
from spectest.engines.command import CommandEngine, EngineProcessError
from spectest.engines.replies import ReplyError
from spectest.errors import ConfigError, EngineError
from spectest.sampling.params import SamplingParams

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-m", "spectest", *args], capture_output=True, text=True, env=env, cwd=cwd
    )


# ----------------------------------------------------------------------------- failure paths
HELLO = 'print(json.dumps({"type": "hello", "protocol": "spectest-jsonl/1", "engine": "t"}))'


def _program(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "prog.py"
    p.write_text("import json, sys, time\n" + textwrap.dedent(body))
    return p


def _job(n_seeds: int = 3, T: int = 4) -> ArmJob:
    sp = SamplingParams(temperature=0.8, top_p=0.9)
    return ArmJob(
        arm="candidate", role="candidate", variant=None, prompt_id="p0", prompt_ids=(1, 2),
        rows=tuple(RowSpec("c", 10 + i, sp) for i in range(n_seeds)), num_positions=T,
        run_key=5, batch_size=16, drafter=DrafterSpec(onehot=False, k=3),
    )  # fmt: skip


def _engine(prog: Path, **opts: float) -> CommandEngine:
    options = CommandEngine.parse_options(
        {"command": [sys.executable, str(prog)], **opts}, "t.yaml: engines.candidate"
    )
    return CommandEngine(options, Models(None, None))


ECHO = (
    HELLO
    + """
sys.stdout.flush()
for line in sys.stdin:
    job = json.loads(line)
    for s in reversed(job["seeds"]):  # any order is allowed
        r = {"type": "result", "id": job["id"], "seed": s, "tokens": [s % 7] * job["max_tokens"],
             "rounds": [{"drafted": 3, "accepted": 1, "emitted": 2}]}
        print(json.dumps(r))
    sys.stdout.flush()
"""
)


def test_results_are_matched_by_seed_and_rounds_kept(tmp_path: Path) -> None:
    eng = _engine(_program(tmp_path, ECHO))
    try:
        out = eng.generate(_job())
    finally:
        eng.close()
    np.testing.assert_array_equal(out.tokens[:, 0], [10 % 7, 11 % 7, 12 % 7])
    assert out.tokens.dtype == np.int64 and out.tokens.shape == (3, 4)
    assert out.rounds is not None and list(out.rounds["row"]) == [2, 1, 0]
    assert not out.rounds_tested
    assert eng.provenance()["hello"]["engine"] == "t"


def test_program_dying_mid_job_names_status_and_stderr(tmp_path: Path) -> None:
    prog = _program(tmp_path, HELLO + """
sys.stdout.flush()
job = json.loads(sys.stdin.readline())
print(json.dumps({"type": "result", "id": job["id"], "seed": job["seeds"][0], "tokens": [1]}))
sys.stdout.flush()
print("segfault in kernel 42", file=sys.stderr)
sys.exit(7)
""")  # fmt: skip
    eng = _engine(prog)
    with pytest.raises(EngineProcessError, match=r"exit status 7.*segfault in kernel 42"):
        eng.generate(_job())
    assert EngineProcessError.exit_code == 4  # infrastructure, never the statistical 1
    eng.close()


def test_silent_program_is_killed_after_timeout(tmp_path: Path) -> None:
    prog = _program(tmp_path, HELLO + "\nsys.stdout.flush()\ntime.sleep(600)\n")
    eng = _engine(prog, timeout_s=1.0)
    with pytest.raises(EngineProcessError, match=r"sent nothing for 1 s.*killed by spectest"):
        eng.generate(_job())
    assert eng.proc is not None and eng.proc.proc.poll() is not None  # no orphan left behind
    eng.close()


def test_program_without_hello_is_refused(tmp_path: Path) -> None:
    eng = _engine(_program(tmp_path, 'print("ready")\n'))
    with pytest.raises(ReplyError, match="not JSON: 'ready'") as info:
        eng.generate(_job())
    assert info.value.exit_code == 2  # the engine broke the protocol: bad input, not the machine
    eng.close()


def test_error_reply_is_reported(tmp_path: Path) -> None:
    prog = _program(tmp_path, HELLO + """
sys.stdout.flush()
job = json.loads(sys.stdin.readline())
print(json.dumps({"type": "error", "id": job["id"], "message": "top_k unsupported"}))
sys.stdout.flush()
""")  # fmt: skip
    eng = _engine(prog)
    with pytest.raises(EngineError, match="top_k unsupported"):
        eng.generate(_job())
    eng.close()


def test_options_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"engines.candidate.command: required"):
        CommandEngine.parse_options({}, "t.yaml: engines.candidate")
    with pytest.raises(ConfigError, match=r"engines.candidate.timeout_s: expected a number"):
        CommandEngine.parse_options({"command": "x", "timeout_s": -1}, "t.yaml: engines.candidate")
    allowed = r"\(allowed: name, command, env, cwd, timeout_s, startup_timeout_s\)$"
    with pytest.raises(ConfigError, match=r"candidate\.cmd: unknown key 'cmd' " + allowed):
        CommandEngine.parse_options({"cmd": "x"}, "t.yaml: engines.candidate")


TOY_PROTOCOL = """
version: 2
name: dying
models: {{target: "toy:V=16,order=1,scale=2.0,seed=3", draft: "toy:V=16,order=1,scale=2.0,seed=4"}}
drafter: {{kind: sampled, k: 2}}
prompts: {{file: prompts.jsonl}}
configs: {{t1: {{temperature: 1.0}}}}
seeds: {{per_arm: 20}}
positions: 3
tests: {{whitebox: false, null_permutations: 20}}
teeth: {{null_arm: false}}
engines:
  candidate: {{name: command, command: ["{python}", "{prog}"], timeout_s: 30}}
"""


def test_dying_program_through_spectest_run_leaves_no_complete_shard(tmp_path: Path) -> None:
    prog = _program(tmp_path, HELLO + """
sys.stdout.flush()
sys.stdin.readline()
print("out of memory", file=sys.stderr)
sys.exit(3)
""")  # fmt: skip
    (tmp_path / "prompts.jsonl").write_text('{"id": "p0", "ids": [1, 2]}\n')
    (tmp_path / "p.yaml").write_text(TOY_PROTOCOL.format(python=sys.executable, prog=prog))
    r = _run("run", "--config", str(tmp_path / "p.yaml"), "--out", str(tmp_path / "run"))
    assert r.returncode == 4, r.stdout + r.stderr
    err = (r.stdout + r.stderr).strip().splitlines()
    assert any("exit status 3" in line and "out of memory" in line for line in err), err
    shards = tmp_path / "run" / "shards"
    assert not list(shards.glob("candidate__*.samples.parquet"))  # never marked complete
    assert list(shards.glob("reference__*.samples.parquet"))  # the reference shard was
