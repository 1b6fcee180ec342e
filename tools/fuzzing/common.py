"""What every generator of the fuzzer shares: what a case is, the hostile values, byte-level
mutations of a text file, the tiny toy protocol every run is built on.

Owns: a case's JSON form (``new_case``: the files to write — text, or base64 for bytes that are
not UTF-8 —, the directories, FIFOs and symlinks, the command line or the engine harness to run,
the bound on its wall time, the exit codes it must end with where that is known, the log of the
mutations that made it), the seeded random source of a case (``rng_for``), the pools of hostile
values (Python values and raw YAML scalars: huge, negative, NaN, inf, unicode, control
characters, tags, aliases, deep nesting, 5000-digit integers), ``mutate_bytes`` and the toy
protocol (``toy_protocol``, ``toy_prompts``: a run of seconds on the analytic toy pair).

Knows nothing about spectest's modules: it imports none.

Determinism: every random choice comes from ``random.Random(f"{seed}/{kind}/{index}")`` (string
seeds are hashed with SHA-512 by CPython, the same on every run and platform), numpy draws from a
``Generator`` seeded by it, so a case is regenerated exactly from its triple.
"""

from __future__ import annotations

import base64
import copy
import json
import random
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
PROTOCOLS = ROOT / "protocols"
KINDS = ("protocol", "byo", "reply", "plugin", "plugin_death", "plugin_hang", "resume", "claim")
VERDICTS = [0, 1, 3]  # a verdict: the run completed (0 equivalent, 1 different, 3 inconclusive)
BAD_INPUT = [2]
MAX_TOKENS = 5_000  # --set limits.max_tokens on every run: a mutated plan stays tiny or is refused
RUN_BOUND_S = 150.0  # a whole tiny run (models, arms, tests, reports) on a loaded machine
TOY_T = "toy:V={V},order=2,scale=2.0,seed=3"
TOY_D = "toy:V={V},order=2,scale=1.0,seed=4"
PLUGIN_MARK = "FUZZ-PLUGIN-SAYS"  # what a kernel prints: not spectest's, excluded from line counts


# ----------------------------------------------------------------------------- helpers
def rng_for(seed: int, kind: str, index: int) -> random.Random:
    return random.Random(f"{seed}/{kind}/{index}")


def np_rng(r: random.Random) -> np.random.Generator:
    return np.random.default_rng(r.getrandbits(63))


def file_entry(data: bytes | str) -> dict[str, str]:
    """A file's content as JSON: text when it is UTF-8 without surrogates, else base64."""
    if isinstance(data, str):
        try:
            data.encode("utf-8")
            return {"text": data}
        except UnicodeEncodeError:
            return {"b64": base64.b64encode(data.encode("utf-8", "surrogatepass")).decode()}
    try:
        return {"text": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(data).decode()}


def file_bytes(entry: dict[str, str]) -> bytes:
    if "text" in entry:
        return entry["text"].encode("utf-8")
    return base64.b64decode(entry["b64"])


def new_case(kind: str, index: int, seed: int, mode: str = "cli") -> dict[str, Any]:
    return {
        "id": f"{kind}-{index:05d}",
        "kind": kind,
        "seed": seed,
        "index": index,
        "mode": mode,
        "files": {},
        "fifos": [],
        "dirs": [],
        "symlinks": {},
        "argv": [],
        "out": "run",
        "bound_s": RUN_BOUND_S,
        "expect": None,
        "nondeterministic": False,
        "notes": [],
    }


# ----------------------------------------------------------------------------- hostile values
# Python values (dumped by yaml / json) and raw YAML scalars (written as they are)
HOSTILE_VALUES: list[Any] = [
    0,
    1,
    -1,
    2,
    3,
    7,
    2**31 - 1,
    2**31,
    2**32 + 100,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64,
    -(2**63) - 1,
    10**30,
    -(10**30),
    0.0,
    -0.0,
    0.5,
    1.5,
    1e-300,
    5e-324,
    1e308,
    -1e308,
    float("nan"),
    float("inf"),
    float("-inf"),
    True,
    False,
    None,
    "",
    " ",
    "a",
    "x" * 5000,
    "ü",
    "😀",
    "\u202e",
    "\u200b",
    "\x00",
    "\x1b[31m",
    "\n",
    "a\nb",
    "[/]",
    ":x:",
    "a/b",
    "..",
    "-",
    "{python}",
    "%s%n",
    "${HOME}",
    "toy:V=16",
    "exact",
    "null",
    "1",
    "0.5",
    [],
    {},
    [1],
    [None],
    [[]],
    {"a": 1},
    {"": None},
    [1, "a", None],
    list(range(300)),
]
RAW_YAML: list[str] = [
    ".nan",
    ".inf",
    "-.inf",
    ".NaN",
    "1.0e+400",
    "-1.0e+400",
    "0x1F",
    "0o17",
    "0b101",
    "1_000",
    "12:30:00",
    "190:20:30",
    "2026-12-01",
    "2026-12-01T10:00:00Z",
    "!!binary aGVsbG8=",
    "!!set {a, b}",
    "!!omap [a: 1, b: 2]",
    "!!pairs [a: 1]",
    "!!python/object:os.system {}",
    "!!python/name:os.system",
    "!!python/tuple [1, 2]",
    "!foo bar",
    "!!str 1",
    "!!int '3'",
    "!!float '1'",
    "!!bool yes",
    "!!null ''",
    "~",
    '"\\0"',
    '"\\ud800"',
    '"\\U0001F600"',
    '"\\e[31m"',
    '"\\u2028"',
    '"\\x7f"',
    "yes",
    "no",
    "on",
    "off",
    "NULL",
    "True",
    "0.",
    ".5",
    "+1",
    "1e-5",
    "9" * 5000,
    "-" + "9" * 5000,
    "1." + "0" * 5000,
    "0." + "0" * 400 + "1",
    "&anchor 1",
    "*anchor",
    "[&a 1, *a]",
    "{<<: {temperature: 0.5}}",
    "[1, [2, [3, [4]]]]",
    "'" + "'" * 3,
    '"unterminated',
    "[1, 2",
    "{a: 1",
    "- x",
    "|\n  block",
    "? [1, 2]",
    "{? [a, b]: 1}",
    "{1: 2}",
    "{null: 1}",
    "{true: 1}",
    "{[1]: 2}",
]


def nested_list(depth: int) -> str:
    return "[" * depth + "]" * depth


def nested_map(depth: int) -> str:
    return "{a: " * depth + "1" + "}" * depth


def raw_yaml(r: random.Random) -> str:
    roll = r.random()
    if roll < 0.12:
        return nested_list(r.choice([50, 200, 999, 1000, 3000, 20_000]))
    if roll < 0.2:
        return nested_map(r.choice([50, 200, 999, 1000, 3000, 20_000]))
    return r.choice(RAW_YAML)


def hostile_value(r: random.Random) -> Any:
    return copy.deepcopy(r.choice(HOSTILE_VALUES))


# the exact acceptor's body (tests/test_plugin_supervision.py builds kernels from it too)
EXACT_ACCEPT = """\
B, K = draft_token_ids.shape
rows, x = torch.arange(B), draft_token_ids[..., None]
p = target_probs[:, :K].gather(2, x)[..., 0]
q = draft_probs.gather(2, x)[..., 0]
ok = (p > 0) & (uniforms[:, :K] * q <= p)
emitted = ok.long().cumprod(1).sum(1)
q_pad = torch.cat([draft_probs, torch.zeros_like(draft_probs[:, :1])], 1)
w = (target_probs[rows, emitted] - q_pad[rows, emitted]).clamp_min(0)
w = torch.where(w.sum(1, keepdim=True) > 0, w, target_probs[rows, emitted])
cdf = w.double().cumsum(1)
final = torch.searchsorted(cdf, (uniforms[:, K] * cdf[:, -1])[:, None], right=True)[:, 0]
pos = torch.arange(K + 1)[None, :]
drafts = torch.cat([draft_token_ids, draft_token_ids[:, :1]], 1)
out = torch.where(pos < emitted[:, None], drafts, -1)
out = torch.where(pos == emitted[:, None], final.clamp_max(w.shape[1] - 1)[:, None], out)
return out, ok.long().sum(1), emitted
"""
KERNEL_OK = (
    "import torch\n\n\ndef accept(draft_probs, draft_token_ids, uniforms, target_probs):\n"
    + textwrap.indent(EXACT_ACCEPT, "    ")
)


# a line a byte mutation may insert into a YAML text
YAML_LINES = [
    b"\tfoo: 1\n",
    b"- x\n",
    b"&a\n",
    b"%YAML 1.2\n",
    b"---\n",
    b"...\n",
    b"%TAG ! tag:x,2000:\n",
    b"zz: *a\n",
    b"? [1, 2]\n: 3\n",
    b"{\n",
    b"'\n",
    b"<<: {x: 1}\n",
    b"\xff\xfe\n",
    b"\x00\n",
    b"!!python/object\n",
]


def _flip(r: random.Random, b: bytearray, notes: list[str]) -> bytearray:
    if b:
        i = r.randrange(len(b))
        b[i] = r.randrange(256)
        notes.append(f"bytes: byte {i} -> 0x{b[i]:02x}")
    return b


def _delete(r: random.Random, b: bytearray, notes: list[str]) -> bytearray:
    if b:
        i = r.randrange(len(b))
        j = min(len(b), i + r.randint(1, 40))
        del b[i:j]
        notes.append(f"bytes: delete [{i}, {j})")
    return b


def _dup_line(r: random.Random, b: bytearray, notes: list[str]) -> bytearray:
    lines = bytes(b).split(b"\n")
    k = r.randrange(len(lines))
    lines.insert(k, lines[k])
    notes.append(f"bytes: line {k + 1} twice")
    return bytearray(b"\n".join(lines))


def _insert(r: random.Random, b: bytearray, notes: list[str]) -> bytearray:
    ins = r.choice(YAML_LINES)
    lines = bytes(b).split(b"\n")
    k = r.randrange(len(lines) + 1)
    lines.insert(k, ins.rstrip(b"\n"))
    notes.append(f"bytes: insert line {k + 1} {ins!r}")
    return bytearray(b"\n".join(lines))


def _truncate(r: random.Random, b: bytearray, notes: list[str]) -> bytearray:
    if b:
        k = r.randrange(len(b))
        del b[k:]
        notes.append(f"bytes: truncate at {k}")
    return b


def _bom(r: random.Random, b: bytearray, notes: list[str]) -> bytearray:
    notes.append("bytes: UTF-8 BOM")
    return bytearray(b"\xef\xbb\xbf" + b)


def _nul(r: random.Random, b: bytearray, notes: list[str]) -> bytearray:
    k = r.randrange(len(b) + 1)
    b[k:k] = b"\x00"
    notes.append(f"bytes: NUL at {k}")
    return b


def _utf8(r: random.Random, b: bytearray, notes: list[str]) -> bytearray:
    k = r.randrange(len(b) + 1)
    b[k:k] = r.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"])
    notes.append(f"bytes: invalid UTF-8 at {k}")
    return b


def _crlf(r: random.Random, b: bytearray, notes: list[str]) -> bytearray:
    notes.append("bytes: CRLF")
    return bytearray(bytes(b).replace(b"\n", b"\r\n"))


def _tabs(r: random.Random, b: bytearray, notes: list[str]) -> bytearray:
    notes.append("bytes: tabs for indentation")
    return bytearray(bytes(b).replace(b"  ", b"\t"))


def _pad(r: random.Random, b: bytearray, notes: list[str]) -> bytearray:
    size = r.choice([2**18 - 10, 2**18 + 1, 2**20])
    notes.append(f"bytes: padded to {size} bytes")
    return b + b"#" + b"x" * max(0, size - len(b) - 2) + b"\n"


def _docs(r: random.Random, b: bytearray, notes: list[str]) -> bytearray:
    notes.append("bytes: two YAML documents")
    return bytearray(b"---\n" + bytes(b) + b"\n---\nname: other\n")


def _directive(r: random.Random, b: bytearray, notes: list[str]) -> bytearray:
    notes.append("bytes: a directive")
    return bytearray(r.choice([b"%YAML 1.1\n---\n", b"%YAML 9.9\n---\n", b"%FOO bar\n---\n"]) + b)


# the byte mutations of a text file, drawn from in this order by one random choice
BYTE_MUTATIONS = {
    "flip": _flip,
    "delete": _delete,
    "dup_line": _dup_line,
    "insert": _insert,
    "truncate": _truncate,
    "bom": _bom,
    "nul": _nul,
    "utf8": _utf8,
    "crlf": _crlf,
    "tabs": _tabs,
    "pad": _pad,
    "docs": _docs,
    "directive": _directive,
}


def mutate_bytes(r: random.Random, data: bytes, notes: list[str]) -> bytes:
    """One byte-level change of a text file."""
    op = r.choice(list(BYTE_MUTATIONS))
    return bytes(BYTE_MUTATIONS[op](r, bytearray(data), notes))


# ----------------------------------------------------------------------------- the toy protocol
def toy_protocol(r: random.Random, V: int = 16) -> dict[str, Any]:
    """A tiny valid protocol on the toy pair: seconds to run, with teeth or without."""
    teeth = r.choice(
        [{"null_arm": False, "epsilons": [], "mutants": []}] * 6
        + [
            {"null_arm": True, "epsilons": [], "mutants": ["always_accept"]},
            {"null_arm": True, "epsilons": [0.5], "mutants": []},
        ]
    )
    configs: dict[str, Any] = {"a": {"temperature": 0.8, "top_p": 0.95}}
    if r.random() < 0.3:
        configs["b"] = {"temperature": 1.0, "top_k": 5}
    proto: dict[str, Any] = {
        "version": r.choice([1, 2]),
        "name": "fz",
        "models": {"target": TOY_T.format(V=V), "draft": TOY_D.format(V=V)},
        "drafter": {"kind": r.choice(["onehot", "sampled"]), "k": r.choice([1, 2, 3])},
        "prompts": {"file": "prompts.jsonl"},
        "configs": configs,
        "seeds": {"per_arm": r.choice([4, 20])},
        "positions": r.choice([1, 2, 2, 3]),
        "tests": {
            "null_permutations": r.choice([0, 10]),
            "trie": {"depth": r.choice([0, 1, 2]), "min_count": 5},
            "whitebox": r.random() < 0.25,
        },
        "teeth": teeth,
        "batch_size": 64,
    }
    if teeth["mutants"] or teeth["epsilons"]:
        proto["teeth"]["size_budget"] = 64
    return proto


def toy_prompts(r: random.Random, V: int = 16) -> str:
    n = r.choice([1, 1, 2])
    lines = [
        json.dumps({"id": f"p{i}", "ids": [r.randrange(V) for _ in range(r.randint(1, 4))]})
        for i in range(n)
    ]
    return "\n".join(lines) + "\n"
