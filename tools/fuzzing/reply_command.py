"""The ``reply`` generator's command program: the script a replay program plays for one job —
its hello, its result lines mutated field by field and byte by byte, stray lines, exits, stalls,
closed pipes — and the program itself (``REPLAY``). ``fuzzing.replies`` builds the cases; this
module knows nothing about running one.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fuzzing.common import mutate_bytes, nested_list

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


Change = Callable[[random.Random, dict[str, Any], int, list[str]], str]


def _field(r: random.Random, res: dict[str, Any], T: int, notes: list[str]) -> str:
    key = r.choice(["type", "id", "seed", "tokens", "rounds"])
    res[key] = copy.deepcopy(r.choice(JSON_HOSTILE))
    notes.append(f"result.{key} = {res[key]!r:.60}")
    return json.dumps(res, allow_nan=True)


def _drop(r: random.Random, res: dict[str, Any], T: int, notes: list[str]) -> str:
    key = r.choice(["type", "id", "seed", "tokens"])
    res.pop(key, None)
    notes.append(f"result without {key}")
    return json.dumps(res, allow_nan=True)


def _extra(r: random.Random, res: dict[str, Any], T: int, notes: list[str]) -> str:
    res[r.choice(["extra", "TOKENS", ""])] = r.choice(JSON_HOSTILE)
    notes.append("result with an extra key (benign)")
    return json.dumps(res, allow_nan=True)


def _raw(r: random.Random, res: dict[str, Any], T: int, notes: list[str]) -> str:
    key = r.choice(["id", "seed", "tokens", "rounds"])
    raw = r.choice(RAW_JSON)
    res[key] = "ZZRAWZZ"
    notes.append(f"result.{key} = raw {raw[:40]!r}")
    return json.dumps(res).replace('"ZZRAWZZ"', raw)


def _set_one(r: random.Random, toks: list[Any], value: Any) -> list[Any]:
    toks[r.randrange(len(toks))] = value
    return toks


# a change of the token list: (random, tokens) -> the new tokens
TOKEN_CHANGES: dict[str, Callable[[random.Random, list[Any]], Any]] = {
    "empty": lambda r, t: [],
    "long": lambda r, t: t + [0] * r.choice([1, 1000]),
    "oov": lambda r, t: _set_one(r, t, r.choice([16, 17, 2**31 - 1, 2**31, 2**40])),
    "neg": lambda r, t: _set_one(r, t, r.choice([-1, -2, -(2**63)])),
    "bool": lambda r, t: _set_one(r, t, True),
    "float": lambda r, t: _set_one(r, t, 1.0),
    "early": lambda r, t: t[: max(1, len(t) - 1)],
    "str": lambda r, t: " ".join(map(str, t)),
    "nested": lambda r, t: [t],
}


def _tokens(r: random.Random, res: dict[str, Any], T: int, notes: list[str]) -> str:
    how = r.choice(list(TOKEN_CHANGES))
    res["tokens"] = TOKEN_CHANGES[how](r, res["tokens"])
    if how == "early":
        notes.append("result tokens: ended early (benign)")
        return json.dumps(res)
    notes.append(f"result tokens: {how}")
    return json.dumps(res, allow_nan=True)


_ABSENT = object()
# a change of the rounds field: T -> its new value (``_ABSENT``: no such key)
ROUNDS_CHANGES: dict[str, Callable[[int], Any]] = {
    "null": lambda T: None,
    "absent": lambda T: _ABSENT,
    "many": lambda T: [{"drafted": 1, "accepted": 1, "emitted": 1}] * (T + 1),
    "neg": lambda T: [{"drafted": -1, "accepted": 0, "emitted": 1}],
    "str": lambda T: [{"drafted": "3", "accepted": 1, "emitted": 2}],
    "big": lambda T: [{"drafted": 2**31, "accepted": 1, "emitted": 2}],
    "missing": lambda T: [{"drafted": 3, "accepted": 1}],
    "obj": lambda T: {"drafted": 3},
    "int": lambda T: 5,
}


def _rounds(r: random.Random, res: dict[str, Any], T: int, notes: list[str]) -> str:
    how = r.choice(list(ROUNDS_CHANGES))
    if (value := ROUNDS_CHANGES[how](T)) is _ABSENT:
        res.pop("rounds", None)
    else:
        res["rounds"] = value
    if how in ("null", "absent"):
        notes.append(f"result rounds {how} (benign)")
        return json.dumps(res)
    notes.append(f"result rounds {how}")
    return json.dumps(res, allow_nan=True)


def _type(r: random.Random, res: dict[str, Any], T: int, notes: list[str]) -> str:
    res["type"] = r.choice(["Result", "log", "error", "hello", "job", 1, None])
    notes.append(f"result.type = {res['type']!r}")
    return json.dumps(res, allow_nan=True)


def _id(r: random.Random, res: dict[str, Any], T: int, notes: list[str]) -> str:
    res["id"] = r.choice([res["id"] + 1, -1, 2**63])
    notes.append(f"result.id = {res['id']}")
    return json.dumps(res, allow_nan=True)


def _seed(r: random.Random, res: dict[str, Any], T: int, notes: list[str]) -> str:
    res["seed"] = r.choice([res["seed"] + 1000, -1, 2**63 - 1])
    notes.append(f"result.seed = {res['seed']}")
    return json.dumps(res, allow_nan=True)


def _text(r: random.Random, res: dict[str, Any], T: int, notes: list[str]) -> str:
    data = mutate_bytes(r, json.dumps(res).encode(), notes)
    return data.decode("utf-8", "surrogateescape")


def _benign(r: random.Random, res: dict[str, Any], T: int, notes: list[str]) -> str:
    notes.append("result keys reordered (benign)")
    return json.dumps(dict(reversed(list(res.items()))))


# the changes of one valid result object, drawn from in this order by one random choice
RESULT_CHANGES: dict[str, Change] = {
    "field": _field,
    "drop": _drop,
    "extra": _extra,
    "raw": _raw,
    "tokens": _tokens,
    "rounds": _rounds,
    "type": _type,
    "id": _id,
    "seed": _seed,
    "text": _text,
    "benign": _benign,
}


def mutate_result(r: random.Random, res: dict[str, Any], T: int, notes: list[str]) -> str:
    """One change of a valid result object; the line text."""
    op = r.choice(list(RESULT_CHANGES))
    return RESULT_CHANGES[op](r, copy.deepcopy(res), T, notes)


# a changed hello: how -> (random -> the program's first step)
HELLO_CHANGES: dict[str, Callable[[random.Random], dict[str, Any]]] = {
    "proto": lambda r: {
        "raw": json.dumps({**HELLO, "protocol": r.choice(["spectest-jsonl/2", "", 1])})
    },
    "type": lambda r: {"raw": json.dumps({**HELLO, "type": "result"})},
    "missing": lambda r: {"raw": json.dumps({k: v for k, v in HELLO.items() if k != "protocol"})},
    "notjson": lambda r: {"raw": "hello"},
    "long": lambda r: {"raw": json.dumps({**HELLO, "pad": "x" * 20_000})},
    "engine": lambda r: {"raw": json.dumps({**HELLO, "engine": r.choice(["x" * 201, 5, None])})},
    "none": lambda r: {"sleep": 30},
    "extra": lambda r: {"raw": json.dumps({**HELLO, "extra": {"k": [1, 2]}})},
}


def _opening(r: random.Random, notes: list[str]) -> tuple[list[dict[str, Any]], bool]:
    """The hello (maybe changed) and the read of the job (maybe never); (steps, benign)."""
    benign = True
    if r.random() < 0.12:
        how = r.choice(list(HELLO_CHANGES))
        steps = [HELLO_CHANGES[how](r)]
        benign = how == "extra"
        notes.append(f"hello {how}")
    else:
        steps = [{"raw": json.dumps(HELLO)}]
    if r.random() < 0.08:
        steps.append({"noread": True})
        notes.append("program never reads its stdin")
        benign = False
    else:
        steps.append({"wait_job": True})
    return steps, benign


def _results(r: random.Random, T: int, seeds: list[int], V: int) -> list[dict[str, Any]]:
    """One valid result per seed (some ended early, half with rounds), shuffled."""
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
    return results


# a line a ``line`` change inserts before line k (given the lines and k)
def _stray_lines(lines: list[str], k: int) -> list[str]:
    return [
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


@dataclass
class _Lines:
    """The program's result lines being changed, with what a change draws on."""

    r: random.Random
    lines: list[str]
    results: list[dict[str, Any]]
    T: int
    notes: list[str]


def _op_result(s: _Lines, k: int) -> bool:
    before = len(s.notes)
    s.lines[k] = mutate_result(s.r, s.results[k], s.T, s.notes)
    return "(benign)" in " ".join(s.notes[before:])


def _op_line(s: _Lines, k: int) -> bool:
    raw = s.r.choice(_stray_lines(s.lines, k))
    s.lines.insert(k, raw)
    s.notes.append(f"line inserted {raw[:40]!r}")
    return raw.startswith('{"type": "log"')


def _op_behave(s: _Lines, k: int) -> bool:
    how = s.r.choice(["exit0", "exit3", "sleep", "stderr", "close", "partial", "slow"])
    s.lines.insert(k, how.upper())  # REPLAY's markers: EXIT0, EXIT3, SLEEP, STDERR, ...
    s.notes.append(f"program {how} at line {k}")
    return how in ("stderr", "slow")


def _op_log(s: _Lines, k: int) -> bool:
    s.lines.insert(k, json.dumps({"type": "log", "message": s.r.choice(["x", "ü", 5, None])}))
    s.notes.append("a log line (benign)")
    return True


def _op_error(s: _Lines, k: int) -> bool:
    err = {
        "type": "error",
        "id": s.r.choice([0, None, "0", 5]),
        "message": s.r.choice(["top_k unsupported", "x" * 20_000, 5, "\x1b[31m[/]"]),
    }
    s.lines.insert(k, json.dumps(err))
    s.notes.append(f"an error line {json.dumps(err)[:60]}")
    return False


def _op_dupe(s: _Lines, k: int) -> bool:
    s.lines.insert(k, s.lines[k])
    s.notes.append("a result twice")
    return False


def _op_missing(s: _Lines, k: int) -> bool:
    del s.lines[k]
    s.notes.append("a result missing")
    return False


# the changes of the program's result lines: name -> (change, weight); each returns whether
# the job still ends accepted
LINE_CHANGES: dict[str, tuple[Callable[[_Lines, int], bool], int]] = {
    "result": (_op_result, 45),
    "line": (_op_line, 12),
    "behave": (_op_behave, 15),
    "log": (_op_log, 8),
    "error": (_op_error, 6),
    "dupe": (_op_dupe, 7),
    "missing": (_op_missing, 7),
}


def command_script(
    r: random.Random, B: int, T: int, seeds: list[int], V: int, notes: list[str]
) -> tuple[list[dict[str, Any]], bool]:
    """The replay program's script for one job with id 0; (steps, expected to be accepted)."""
    steps, benign = _opening(r, notes)
    results = _results(r, T, seeds, V)
    lines = [json.dumps(x) for x in results]
    names, weights = list(LINE_CHANGES), [w for _, w in LINE_CHANGES.values()]
    ops = [r.choices(names, weights)[0] for _ in range(r.choices([0, 1, 2], [35, 50, 15])[0])]
    ops.sort(key=lambda o: o != "result")  # results first: their lines are still in step
    for op in ops:
        if not lines:
            break
        k = r.randrange(len(lines))
        ok = LINE_CHANGES[op][0](_Lines(r, lines, results, T, notes), k)
        benign = benign and ok
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
