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
from typing import Any

import yaml

from fuzzing.common import (
    BAD_INPUT,
    MAX_TOKENS,
    RUN_BOUND_S,
    VERDICTS,
    file_entry,
    mutate_bytes,
    nested_list,
    new_case,
    rng_for,
    toy_prompts,
    toy_protocol,
)

HELLO = {"type": "hello", "protocol": "spectest-jsonl/1", "engine": "fuzz", "version": "1"}
JSON_HOSTILE = [
    True,
    False,
    None,
    1.0,
    -1,
    16,
    2**31,
    2**63,
    2**64,
    -(2**63) - 1,
    "1",
    "",
    [],
    {},
    [1],
    [[1]],
    {"a": 1},
    1e300,
    -0.0,
    "x" * 20_000,
]
RAW_JSON = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e400",
    "9" * 5000,
    "-" + "9" * 5000,
    "1.0",
    "01",
    "0x1",
    "true",
    "null",
    '"\\ud800"',
    '"\\u0000"',
    nested_list(3000),
]


def mutate_result(r: random.Random, res: dict[str, Any], T: int, notes: list[str]) -> str:
    """One change of a valid result object; the line text."""
    op = r.choice(
        [
            "field",
            "drop",
            "extra",
            "raw",
            "tokens",
            "rounds",
            "type",
            "id",
            "seed",
            "text",
            "benign",
        ]
    )
    res = copy.deepcopy(res)
    if op == "field":
        key = r.choice(["type", "id", "seed", "tokens", "rounds"])
        res[key] = copy.deepcopy(r.choice(JSON_HOSTILE))
        notes.append(f"result.{key} = {res[key]!r:.60}")
    elif op == "drop":
        key = r.choice(["type", "id", "seed", "tokens"])
        res.pop(key, None)
        notes.append(f"result without {key}")
    elif op == "extra":
        res[r.choice(["extra", "TOKENS", ""])] = r.choice(JSON_HOSTILE)
        notes.append("result with an extra key (benign)")
        return json.dumps(res, allow_nan=True)
    elif op == "raw":
        key = r.choice(["id", "seed", "tokens", "rounds"])
        raw = r.choice(RAW_JSON)
        res[key] = "ZZRAWZZ"
        notes.append(f"result.{key} = raw {raw[:40]!r}")
        return json.dumps(res).replace('"ZZRAWZZ"', raw)
    elif op == "tokens":
        toks = res["tokens"]
        how = r.choice(["empty", "long", "oov", "neg", "bool", "float", "early", "str", "nested"])
        if how == "empty":
            res["tokens"] = []
        elif how == "long":
            res["tokens"] = toks + [0] * r.choice([1, 1000])
        elif how == "oov":
            toks[r.randrange(len(toks))] = r.choice([16, 17, 2**31 - 1, 2**31, 2**40])
        elif how == "neg":
            toks[r.randrange(len(toks))] = r.choice([-1, -2, -(2**63)])
        elif how == "bool":
            toks[r.randrange(len(toks))] = True
        elif how == "float":
            toks[r.randrange(len(toks))] = 1.0
        elif how == "early":
            res["tokens"] = toks[: max(1, len(toks) - 1)]
            notes.append("result tokens: ended early (benign)")
            return json.dumps(res)
        elif how == "str":
            res["tokens"] = " ".join(map(str, toks))
        else:
            res["tokens"] = [toks]
        notes.append(f"result tokens: {how}")
    elif op == "rounds":
        how = r.choice(["null", "absent", "many", "neg", "str", "big", "missing", "obj", "int"])
        if how == "null":
            res["rounds"] = None
        elif how == "absent":
            res.pop("rounds", None)
        elif how == "many":
            res["rounds"] = [{"drafted": 1, "accepted": 1, "emitted": 1}] * (T + 1)
        elif how == "neg":
            res["rounds"] = [{"drafted": -1, "accepted": 0, "emitted": 1}]
        elif how == "str":
            res["rounds"] = [{"drafted": "3", "accepted": 1, "emitted": 2}]
        elif how == "big":
            res["rounds"] = [{"drafted": 2**31, "accepted": 1, "emitted": 2}]
        elif how == "missing":
            res["rounds"] = [{"drafted": 3, "accepted": 1}]
        elif how == "obj":
            res["rounds"] = {"drafted": 3}
        else:
            res["rounds"] = 5
        if how in ("null", "absent"):
            notes.append(f"result rounds {how} (benign)")
            return json.dumps(res)
        notes.append(f"result rounds {how}")
    elif op == "type":
        res["type"] = r.choice(["Result", "log", "error", "hello", "job", 1, None])
        notes.append(f"result.type = {res['type']!r}")
    elif op == "id":
        res["id"] = r.choice([res["id"] + 1, -1, 2**63])
        notes.append(f"result.id = {res['id']}")
    elif op == "seed":
        res["seed"] = r.choice([res["seed"] + 1000, -1, 2**63 - 1])
        notes.append(f"result.seed = {res['seed']}")
    elif op == "text":
        line = json.dumps(res)
        data = mutate_bytes(r, line.encode(), notes)
        return data.decode("utf-8", "surrogateescape")
    else:
        notes.append("result keys reordered (benign)")
        return json.dumps(dict(reversed(list(res.items()))))
    return json.dumps(res, allow_nan=True)


def command_script(
    r: random.Random, B: int, T: int, seeds: list[int], V: int, notes: list[str]
) -> tuple[list[dict[str, Any]], bool]:
    """The replay program's script for one job with id 0; (steps, expected to be accepted)."""
    benign = True
    steps: list[dict[str, Any]] = []
    hello = dict(HELLO)
    if r.random() < 0.12:
        how = r.choice(["proto", "type", "missing", "notjson", "long", "engine", "none", "extra"])
        if how == "proto":
            hello["protocol"] = r.choice(["spectest-jsonl/2", "", 1])
        elif how == "type":
            hello["type"] = "result"
        elif how == "missing":
            hello.pop("protocol")
        elif how == "engine":
            hello["engine"] = r.choice(["x" * 201, 5, None])
        elif how == "extra":
            hello["extra"] = {"k": [1, 2]}
        if how == "notjson":
            steps.append({"raw": "hello"})
        elif how == "long":
            steps.append({"raw": json.dumps({**HELLO, "pad": "x" * 20_000})})
        elif how == "none":
            steps.append({"sleep": 30})
        else:
            steps.append({"raw": json.dumps(hello)})
        benign = how == "extra"
        notes.append(f"hello {how}")
    else:
        steps.append({"raw": json.dumps(hello)})
    if r.random() < 0.08:
        steps.append({"noread": True})
        notes.append("program never reads its stdin")
        benign = False
    else:
        steps.append({"wait_job": True})
    results = []
    for s in seeds:
        n = T if r.random() < 0.8 else r.randint(1, T)
        res: dict[str, Any] = {
            "type": "result",
            "id": 0,
            "seed": s,
            "tokens": [r.randrange(V) for _ in range(n)],
        }
        if r.random() < 0.5:
            res["rounds"] = [{"drafted": 2, "accepted": 1, "emitted": 2}] * r.randint(0, T)
        results.append(res)
    r.shuffle(results)
    lines = [json.dumps(x) for x in results]
    nmut = r.choices([0, 1, 2], [35, 50, 15])[0]
    ops = [
        r.choices(
            ["result", "line", "behave", "log", "error", "dupe", "missing"],
            [45, 12, 15, 8, 6, 7, 7],
        )[0]
        for _ in range(nmut)
    ]
    ops.sort(key=lambda o: o != "result")  # results first: their lines are still in step
    for op in ops:
        if not lines:
            break
        k = r.randrange(len(lines))
        if op == "result":
            before = len(notes)
            lines[k] = mutate_result(r, results[k], T, notes)
            benign = benign and "(benign)" in " ".join(notes[before:])
        elif op == "line":
            raw = r.choice(
                [
                    "",
                    " ",
                    "[]",
                    "null",
                    "1",
                    '"s"',
                    "{}",
                    '{"type": "result"}',
                    "\ufeff" + lines[k],
                    lines[k] + " trailing",
                    lines[k] + lines[k],
                    nested_list(100_000),
                    '{"type": "log", "x": 1}',
                ]
            )
            lines.insert(k, raw)
            benign = benign and raw.startswith('{"type": "log"')
            notes.append(f"line inserted {raw[:40]!r}")
        elif op == "behave":
            how = r.choice(["exit0", "exit3", "sleep", "stderr", "close", "partial", "slow"])
            if how == "exit0":
                lines.insert(k, "EXIT0")
            elif how == "exit3":
                lines.insert(k, "EXIT3")
            elif how == "sleep":
                lines.insert(k, "SLEEP")
            elif how == "stderr":
                lines.insert(k, "STDERR")
            elif how == "close":
                lines.insert(k, "CLOSE")
            elif how == "partial":
                lines.insert(k, "PARTIAL")
            else:
                lines.insert(k, "SLOW")
            benign = benign and how in ("stderr", "slow")
            notes.append(f"program {how} at line {k}")
        elif op == "log":
            lines.insert(k, json.dumps({"type": "log", "message": r.choice(["x", "ü", 5, None])}))
            notes.append("a log line (benign)")
        elif op == "error":
            err = {
                "type": "error",
                "id": r.choice([0, None, "0", 5]),
                "message": r.choice(["top_k unsupported", "x" * 20_000, 5, "\x1b[31m[/]"]),
            }
            lines.insert(k, json.dumps(err))
            benign = False
            notes.append(f"an error line {json.dumps(err)[:60]}")
        elif op == "dupe":
            lines.insert(k, lines[k])
            benign = False
            notes.append("a result twice")
        elif op == "missing":
            del lines[k]
            benign = False
            notes.append("a result missing")
    steps += [{"line": ln} for ln in lines]
    steps.append({"end": True})
    return steps, benign


REPLAY = r"""
import json, sys, time, os
steps = json.load(open(sys.argv[1]))
out = sys.stdout.buffer
job = None
def write(text):
    out.write(text.encode("utf-8", "surrogateescape") + b"\n")
    out.flush()
for st in steps:
    if "raw" in st:
        write(st["raw"])
    elif "sleep" in st:
        time.sleep(st["sleep"])
    elif st.get("wait_job"):
        line = sys.stdin.readline()
        if not line:
            sys.exit(0)
    elif st.get("noread"):
        time.sleep(0.01)
    elif "line" in st:
        ln = st["line"]
        if ln == "EXIT0":
            sys.exit(0)
        elif ln == "EXIT3":
            sys.stderr.write("fuzz program: exit 3\n")
            sys.exit(3)
        elif ln == "SLEEP":
            time.sleep(30)
        elif ln == "STDERR":
            sys.stderr.write("noise\n" * 1000)
        elif ln == "CLOSE":
            os.close(1)
            time.sleep(30)
        elif ln == "PARTIAL":
            out.write(b'{"type": "res')
            out.flush()
            time.sleep(30)
        elif ln == "SLOW":
            time.sleep(0.05)
        else:
            write(ln)
    elif st.get("end"):
        sys.stdin.read()
"""


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


def _reply_http(r: random.Random, seed: int, index: int) -> dict[str, Any]:
    case = new_case("reply", index, seed, mode="http")
    notes = case["notes"]
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
        op = r.choice(
            [
                "status",
                "body",
                "field",
                "delay",
                "trickle",
                "close",
                "length",
                "echo",
                "timings",
                "early",
                "extra",
                "first_fail",
            ]
        )
        rule["op"] = op
        if op == "status":
            rule["status"] = r.choice([301, 302, 307, 400, 404, 429, 500, 503, 204, 199, 600])
            rule["location"] = r.choice(["http://example.com/x", "/other", "", None])
            benign = False
        elif op == "body":
            rule["body"] = r.choice(HTTP_HOSTILE_BODIES)
            benign = False
        elif op == "field":
            key = r.choice(["tokens", "generation_settings", "timings", "choices", "token_ids"])
            rule["key"] = key
            rule["value"] = copy.deepcopy(r.choice(JSON_HOSTILE))
            benign = False
        elif op == "delay":
            rule["delay"] = r.choice([timeout_s * 2, 30.0])
            benign = False
        elif op == "trickle":
            rule["trickle"] = r.choice([0.2, 0.5])
            benign = False
        elif op == "close":
            benign = False
        elif op == "length":
            benign = False
        elif op == "echo":
            rule["key"] = r.choice(
                ["temperature", "top_k", "top_p", "min_p", "seed", "samplers", "ignore_eos"]
            )
            rule["value"] = r.choice([0.123, 7, [], "x", None, True])
            benign = benign and api != "llamacpp"
        elif op == "timings":
            rule["value"] = r.choice(
                [
                    {"draft_n": 3, "draft_n_accepted": 2},
                    {"draft_n": -1},
                    {"draft_n": "3"},
                    {"draft_n": 1.5},
                    {"draft_n": None},
                    [],
                    "x",
                ]
            )
            v = rule["value"]
            benign = benign and (
                api != "llamacpp"
                or (
                    isinstance(v, dict)
                    and (
                        v.get("draft_n", 0) is None
                        or (isinstance(v.get("draft_n"), int) and v.get("draft_n", 0) >= 0)
                    )
                )
            )
        elif op == "early":
            pass  # fewer tokens than asked: the sequence ended (benign)
        elif op == "extra":
            pass  # extra keys in the reply (benign)
        elif op == "first_fail":
            rule["status"] = 503  # the first attempt of a row fails, the retry answers
            benign = benign and retries >= 1
        notes.append(f"http rule {json.dumps(rule)[:100]}")
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
