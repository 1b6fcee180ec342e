"""The ``reply`` generator: a foreign engine that answers one job. Most cases drive the engine
directly (``fuzzing.worker``): a ``command`` program — a real subprocess replaying a script of
lines, stalls, exits, closed pipes, a line without its end — or an ``http`` server — a real
loopback server replaying statuses, redirects, bodies, delays, trickled or truncated replies —,
valid replies mutated field by field and byte by byte; a few run end to end through ``spectest
run`` with the command engine as the candidate. Each case's bound is the documented timeout
bound of its engine. Knows nothing about running a case.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from typing import Any

import yaml

from fuzzing.common import (
    BAD_INPUT,
    MAX_TOKENS,
    RUN_BOUND_S,
    VERDICTS,
    file_entry,
    nested_list,
    new_case,
    rng_for,
    toy_prompts,
    toy_protocol,
)
from fuzzing.reply_command import JSON_HOSTILE, REPLAY, command_script


def reply_case(seed: int, index: int) -> dict[str, Any]:
    r = rng_for(seed, "reply", index)
    roll = r.random()
    if roll < 0.08:
        return _reply_e2e(r, seed, index)
    if roll < 0.55:
        return _reply_command(r, seed, index)
    return _reply_http(r, seed, index)


def _job(r: random.Random) -> dict[str, Any]:
    B, T = r.randint(1, 4), r.randint(1, 4)
    start = r.choice([0, 400, 2**40])
    return {
        "B": B,
        "T": T,
        "seeds": [start + i for i in range(B)],
        "V": 16,
        "arm": r.choice(["candidate", "reference"]),
        "prompt": [1, 2],
    }


def _reply_command(r: random.Random, seed: int, index: int) -> dict[str, Any]:
    case = new_case("reply", index, seed, mode="command")
    job = _job(r)
    steps, benign = command_script(r, job["B"], job["T"], job["seeds"], job["V"], case["notes"])
    timeout_s = r.choice([0.5, 1.0, 2.0])
    startup = 10.0
    case["files"]["replay.py"] = file_entry(REPLAY)
    case["files"]["steps.json"] = file_entry(json.dumps(steps))
    case["engine"] = {
        "name": "command",
        "options": {
            "command": ["{python}", "replay.py", "steps.json"],
            "timeout_s": timeout_s,
            "startup_timeout_s": startup,
        },
        "job": job,
    }
    # the stated bounds: hello within startup_timeout_s, then no silence longer than timeout_s
    # while results are pending; a program that closed its output gets EXIT_GRACE_S (5 s); a
    # kill waits at most 5 s for the reap; slow steps 0.05 s each
    case["bound_s"] = startup + timeout_s + 5 + 5 + 0.05 * len(steps) + 5
    case["expect"] = [0] if benign else None
    case["out"] = None
    case["nondeterministic"] = True  # timing: a stall may end as a timeout or a broken pipe
    return case


HTTP_HOSTILE_BODIES = [
    "not json",
    "[]",
    "null",
    '"s"',
    "1",
    "{}",
    '{"tokens": "1 2"}',
    '{"choices": "x"}',
    '{"choices": []}',
    '{"tokens": [true]}',
    '{"tokens": [NaN]}',
    '{"tokens": [' + "9" * 5000 + "]}",
    nested_list(100_000),
    "\xff\xfe",
    '{"content": "hi"}',
]


def _rule_status(
    r: random.Random, rule: dict[str, Any], api: str, timeout_s: float, retries: int
) -> bool:
    rule["status"] = r.choice([301, 302, 307, 400, 404, 429, 500, 503, 204, 199, 600])
    rule["location"] = r.choice(["http://example.com/x", "/other", "", None])
    return False


def _rule_body(
    r: random.Random, rule: dict[str, Any], api: str, timeout_s: float, retries: int
) -> bool:
    rule["body"] = r.choice(HTTP_HOSTILE_BODIES)
    return False


def _rule_field(
    r: random.Random, rule: dict[str, Any], api: str, timeout_s: float, retries: int
) -> bool:
    rule["key"] = r.choice(["tokens", "generation_settings", "timings", "choices", "token_ids"])
    rule["value"] = copy.deepcopy(r.choice(JSON_HOSTILE))
    return False


def _rule_delay(
    r: random.Random, rule: dict[str, Any], api: str, timeout_s: float, retries: int
) -> bool:
    rule["delay"] = r.choice([timeout_s * 2, 30.0])
    return False


def _rule_trickle(
    r: random.Random, rule: dict[str, Any], api: str, timeout_s: float, retries: int
) -> bool:
    rule["trickle"] = r.choice([0.2, 0.5])
    return False


def _rule_broken(
    r: random.Random, rule: dict[str, Any], api: str, timeout_s: float, retries: int
) -> bool:
    return False  # the connection closed, or a Content-Length that lies


def _rule_echo(
    r: random.Random, rule: dict[str, Any], api: str, timeout_s: float, retries: int
) -> bool:
    keys = ["temperature", "top_k", "top_p", "min_p", "seed", "samplers", "ignore_eos"]
    rule["key"] = r.choice(keys)
    rule["value"] = r.choice([0.123, 7, [], "x", None, True])
    return api != "llamacpp"


TIMINGS = [
    {"draft_n": 3, "draft_n_accepted": 2},
    {"draft_n": -1},
    {"draft_n": "3"},
    {"draft_n": 1.5},
    {"draft_n": None},
    [],
    "x",
]


def _timings_ok(v: Any) -> bool:
    """Whether llama.cpp's adapter accepts ``timings``: a map whose draft_n is null or ≥ 0."""
    if not isinstance(v, dict) or "draft_n" not in v:
        return False
    n = v["draft_n"]
    return n is None or (isinstance(n, int) and n >= 0)


def _rule_timings(
    r: random.Random, rule: dict[str, Any], api: str, timeout_s: float, retries: int
) -> bool:
    rule["value"] = r.choice(TIMINGS)
    return api != "llamacpp" or _timings_ok(rule["value"])


def _rule_benign(
    r: random.Random, rule: dict[str, Any], api: str, timeout_s: float, retries: int
) -> bool:
    return True  # fewer tokens than asked (the sequence ended), or extra keys in the reply


def _rule_first_fail(
    r: random.Random, rule: dict[str, Any], api: str, timeout_s: float, retries: int
) -> bool:
    rule["status"] = 503  # the first attempt of a row fails, the retry answers
    return retries >= 1


# the server's behaviours for a row, drawn from in this order by one random choice; each fills
# its rule and returns whether the job still ends accepted
HTTP_RULES: dict[str, Callable[[random.Random, dict[str, Any], str, float, int], bool]] = {
    "status": _rule_status,
    "body": _rule_body,
    "field": _rule_field,
    "delay": _rule_delay,
    "trickle": _rule_trickle,
    "close": _rule_broken,
    "length": _rule_broken,
    "echo": _rule_echo,
    "timings": _rule_timings,
    "early": _rule_benign,
    "extra": _rule_benign,
    "first_fail": _rule_first_fail,
}


def _reply_http(r: random.Random, seed: int, index: int) -> dict[str, Any]:
    case = new_case("reply", index, seed, mode="http")
    job = _job(r)
    api = r.choice(["llamacpp", "openai"])
    timeout_s = r.choice([0.5, 1.0])
    retries = r.choice([0, 1, 2])
    concurrency = r.choice([1, 2, 4])
    options = {
        "api": api,
        "timeout_s": timeout_s,
        "retries": retries,
        "concurrency": concurrency,
        "check_seeds": r.random() < 0.6,
    }
    # the behaviour of the server for one row (by its position in the job), or every row
    rules: list[dict[str, Any]] = []
    benign = True
    for _ in range(r.choices([0, 1, 2], [35, 50, 15])[0]):
        rule: dict[str, Any] = {"row": r.choice([None, r.randrange(job["B"])])}
        rule["op"] = op = r.choice(list(HTTP_RULES))
        ok = HTTP_RULES[op](r, rule, api, timeout_s, retries)
        benign = benign and ok
        case["notes"].append(f"http rule {json.dumps(rule)[:100]}")
        rules.append(rule)
    case["engine"] = {"name": "http", "options": options, "job": job, "rules": rules}
    per_request = (retries + 1) * timeout_s + 0.5 * (2**retries - 1)
    # the documented bound: a hanging server is reported within (retries + 1) × timeout_s +
    # 0.5 × (2^retries − 1) s per exchange chain; the seed check (two requests) bounded the same
    # way, each; trickling is cut at timeout_s
    case["bound_s"] = 3 * per_request + 5 + 0.2 * job["B"]
    case["expect"] = [0] if benign else None
    case["out"] = None
    case["nondeterministic"] = True
    return case


def _reply_e2e(r: random.Random, seed: int, index: int) -> dict[str, Any]:
    """``spectest run`` with the command engine as the candidate (the program answers every
    job of the run with its own tokens, mutated the same way)."""
    case = new_case("reply", index, seed)
    notes = case["notes"]
    proto = toy_protocol(r)
    proto["version"] = 2
    proto["teeth"] = {"null_arm": False, "epsilons": [], "mutants": []}
    proto["tests"]["whitebox"] = r.random() < 0.5
    timeout_s = r.choice([1.0, 2.0])
    mode = r.choice(["ok", "ok", "early", "oov", "bool", "stall", "exit", "error", "garbage"])
    proto["engines"] = {
        "candidate": {
            "name": "command",
            "command": ["{python}", "e2e.py", mode],
            "timeout_s": timeout_s,
            "startup_timeout_s": 20,
        }
    }
    notes.append(f"e2e command program mode {mode}")
    case["files"]["e2e.py"] = file_entry(E2E_PROGRAM)
    case["files"]["prompts.jsonl"] = file_entry(toy_prompts(r))
    case["files"]["proto.yaml"] = file_entry(yaml.safe_dump(proto, sort_keys=False))
    case["argv"] = [
        "run",
        "--config",
        "proto.yaml",
        "--out",
        "run",
        "--no-progress",
        "--set",
        f"limits.max_tokens={MAX_TOKENS}",
    ]
    case["expect"] = {
        "ok": VERDICTS,
        "early": VERDICTS,
        "oov": BAD_INPUT,
        "bool": BAD_INPUT,
        "stall": [4],
        "exit": [4],
        "error": BAD_INPUT,
        "garbage": BAD_INPUT,
    }[mode]
    case["bound_s"] = RUN_BOUND_S + 20 + timeout_s
    return case


E2E_PROGRAM = r"""
import json, random, sys, time
mode = sys.argv[1]
HELLO = {"type": "hello", "protocol": "spectest-jsonl/1", "engine": "fuzz-e2e"}
print(json.dumps(HELLO), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    T = job["max_tokens"]
    for i, s in enumerate(job["seeds"]):
        rng = random.Random(job["row_keys"][i])
        toks = [rng.randrange(16) for _ in range(T)]
        if mode == "early" and i % 3 == 0:
            toks = toks[: max(1, T - 1)]
        if mode == "oov" and i == 1:
            toks[0] = 16
        if mode == "bool" and i == 1:
            toks[0] = True
        if mode == "stall" and i == 1:
            time.sleep(60)
        if mode == "exit" and i == 1:
            sys.exit(5)
        if mode == "error" and i == 1:
            err = {"type": "error", "id": job["id"], "message": "no [/] :x:"}
            print(json.dumps(err), flush=True)
            continue
        if mode == "garbage" and i == 1:
            print("garbage", flush=True)
            continue
        res = {"type": "result", "id": job["id"], "seed": s, "tokens": toks}
        print(json.dumps(res), flush=True)
"""
