"""The ``protocol`` generator: a tiny toy protocol (or a shipped one, copied with its prompts and
shrunk by ``--seeds`` / ``--positions`` / ``--set``) mutated field by field — wrong types, huge /
negative / NaN / inf numbers, unknown keys, unicode, deep nesting, YAML tags and aliases,
missing sections, renamed keys, raw scalars such as a 5000-digit integer —, as text (bytes
flipped, lines duplicated, BOM, NUL, invalid UTF-8, CRLF, truncation, padding past the size
limit, two documents), through ``--set`` overrides and CLI options, and through its prompts file.
Every run gets ``--set limits.max_tokens=MAX_TOKENS`` last, so a mutated plan is tiny or refused
(a big valid plan is legitimately slow, not hostile). The mapping's changes live in
``fuzzing.protocol_map``. Knows nothing about running a case.
"""

from __future__ import annotations

import json
import random
from typing import Any

import yaml

from fuzzing.common import (
    KERNEL_OK,
    MAX_TOKENS,
    PROTOCOLS,
    VERDICTS,
    file_bytes,
    file_entry,
    hostile_value,
    mutate_bytes,
    nested_list,
    new_case,
    raw_yaml,
    rng_for,
    toy_prompts,
    toy_protocol,
)
from fuzzing.protocol_map import ALL_PATHS, VALID_VALUES, dump_yaml, mutate_mapping

SHIPPED = ("ci", "top_p", "top_k", "combined", "sglang-eagle", "vllm-rlt-187", "openinfer-512")


PROMPT_LINES: list[str] = [
    '{"id": "p9", "ids": [1, 2, 99]}',
    '{"id": "p9", "ids": [-1]}',
    '{"id": "p9", "ids": []}',
    '{"id": "p9", "ids": [1.5]}',
    '{"id": "p9", "ids": [true]}',
    '{"id": "p9", "ids": "12"}',
    '{"id": "p9", "ids": [' + "9" * 5000 + "]}",
    '{"id": "p9", "ids": [18446744073709551617]}',
    '{"id": "p9", "text": "ab"}',
    '{"id": "p9", "text": "\\ud800"}',
    '{"id": "p9", "text": ""}',
    '{"id": "p9", "text": "' + "a" * 200_000 + '"}',
    '{"id": "p9"}',
    '{"ids": [1]}',
    '{"id": "p0", "ids": [1]}',
    '{"id": "", "ids": [1]}',
    '{"id": "a/b", "ids": [1]}',
    '{"id": "p\\n", "ids": [1]}',
    '{"id": "[/]", "ids": [1]}',
    '{"id": 5, "ids": [1]}',
    '{"id": "p9", "ids": [1], "extra": 1}',
    '{"id": "p9", "ids": [1], "text": "a"}',
    "[1, 2]",
    "null",
    "{",
    "",
    " ",
    "\x00",
    '\ufeff{"id": "p9", "ids": [1]}',
    '{"id": "p9", "ids": ' + nested_list(5000) + "}",
    '{"id": "p9", "ids": [NaN]}',
    '{"id": "p9", "ids": [1e400]}',
    '{"id": "' + "x" * 300 + '", "ids": [1]}',
]


def mutate_prompts(r: random.Random, text: str, notes: list[str]) -> bytes:
    lines = text.splitlines()
    op = r.choice(["add", "replace", "empty", "bytes", "crlf", "limit_dup", "huge"])
    if op == "add":
        new = r.choice(PROMPT_LINES)
        lines.insert(r.randrange(len(lines) + 1), new)
        notes.append(f"prompts: insert line {new[:60]!r}")
    elif op == "replace":
        new = r.choice(PROMPT_LINES)
        lines[r.randrange(len(lines))] = new
        notes.append(f"prompts: replace a line by {new[:60]!r}")
    elif op == "empty":
        notes.append("prompts: empty file")
        return b""
    elif op == "crlf":
        notes.append("prompts: CRLF line ends")
        return ("\r\n".join(lines) + "\r\n").encode()
    elif op == "limit_dup":
        lines = lines + lines
        notes.append("prompts: every line twice")
    elif op == "huge":
        notes.append("prompts: 3 MB of prompt lines")
        lines = lines + [json.dumps({"id": f"q{i}", "ids": [1] * 50}) for i in range(50_000)]
    data = ("\n".join(lines) + "\n").encode()
    if op == "bytes":
        data = mutate_bytes(r, data, notes)
    return data


def set_overrides(r: random.Random, notes: list[str]) -> list[str]:
    out: list[str] = []
    for _ in range(r.choice([1, 1, 2])):
        roll = r.random()
        key = (
            r.choice(ALL_PATHS)
            if roll < 0.8
            else r.choice(
                [
                    "",
                    ".",
                    "a..b",
                    "seeds.",
                    ".seeds",
                    "ü",
                    "x" * 3000,
                    "seeds.per_arm.x",
                    "configs.a.temperature.x",
                    "tests.trie",
                    "=",
                    "models.target=x",
                ]
            )
        )
        r2 = r.random()
        if r2 < 0.45:
            value = json.dumps(r.choice(VALID_VALUES.get(key) or [1]), allow_nan=True)
        elif r2 < 0.75:
            value = raw_yaml(r)
        else:
            value = json.dumps(hostile_value(r), allow_nan=True)
        item = f"{key}={value}" if r.random() > 0.05 else key  # sometimes no "="
        out += ["--set", item]
        notes.append(f"--set {item[:80]!r}")
    return out


CLI_INTS = [
    "0",
    "1",
    "2",
    "-1",
    "20",
    "abc",
    "1.5",
    "",
    "99999999999999999999",
    "1e3",
    "0x10",
    "4097",
    " 3",
    "٣",
]


def cli_options(r: random.Random, notes: list[str]) -> list[str]:
    op = r.choice(
        [
            "seeds",
            "positions",
            "device",
            "threads",
            "out",
            "junit",
            "summary",
            "fast",
            "devices",
            "unknown",
            "config",
        ]
    )
    if op == "seeds":
        v = r.choice(CLI_INTS)
        out = ["--seeds", v]
    elif op == "positions":
        v = r.choice(CLI_INTS)
        out = ["--positions", v]
    elif op == "device":
        out = ["--device", r.choice(["cpu", "cuda", "gpu", "", "cpu;rm"])]
    elif op == "threads":
        out = ["--threads", r.choice(["1", "0", "-1", "abc"])]
    elif op == "out":
        out = ["--out", r.choice(["afile/run", "afile", "", ".", "adir"])]
    elif op == "junit":
        out = ["--junit", r.choice(["afile/j.xml", "adir", "j.xml", ""])]
    elif op == "summary":
        out = ["--summary-md", r.choice(["afile/s.md", "adir", "s.md"])]
    elif op == "fast":
        out = ["--fast"]
    elif op == "devices":
        out = ["--devices", r.choice(["cpu", "cpu,cpu", ",", "cuda:0", "cpu,"])]
    elif op == "unknown":
        out = [r.choice(["--nope", "-x", "--seeds", "--set"])]
    else:
        out = ["--config", r.choice(["missing.yaml", "adir", "afile", "ci", "top_p.yaml", ""])]
    notes.append("cli " + " ".join(out))
    return out


# the shrinking options of a shipped protocol: a run of it stays tiny
SHRINK = [
    "--seeds",
    "20",
    "--positions",
    "2",
    "--set",
    "teeth.size_budget=64",
    "--set",
    "tests.null_permutations=10",
    "--set",
    "seeds.teeth_per_arm=20",
    "--set",
    "prompts.limit=1",
]


def _base(r: random.Random, case: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The protocol to mutate — a toy one, or 1 in 10 a shipped one — and its shrinking options;
    its prompts file goes into the case."""
    if r.random() < 0.9:
        V = 16
        proto = toy_protocol(r, V)
        case["files"]["prompts.jsonl"] = file_entry(toy_prompts(r, V))
        case["notes"].append(f"base toy v{proto['version']}")
        return proto, []
    name = r.choice(SHIPPED)
    proto = yaml.safe_load((PROTOCOLS / f"{name}.yaml").read_text())
    pfile = proto["prompts"]["file"]
    case["files"][pfile] = file_entry((PROTOCOLS / pfile).read_text())
    case["notes"].append(f"base shipped {name}")
    return proto, list(SHRINK)


def _mutate_prompts_file(r: random.Random, case: dict[str, Any]) -> None:
    pfile = next(k for k in case["files"] if k.endswith(".jsonl"))
    text = file_bytes(case["files"][pfile]).decode()
    case["files"][pfile] = file_entry(mutate_prompts(r, text, case["notes"]))


def _mutations(
    r: random.Random, case: dict[str, Any], proto: dict[str, Any], n: int
) -> tuple[int, list[str], list[str]]:
    """``n`` changes of the mapping, the text, ``--set``, the CLI or the prompts (once);
    (text changes still to make, --set options, CLI options)."""
    text_ops, sets, cli = 0, [], []
    prompts_mutated = False
    for _ in range(n):
        kind = r.choices(["map", "text", "set", "cli", "prompts"], [55, 14, 14, 10, 7])[0]
        if kind == "map":
            mutate_mapping(r, proto, case["notes"])
        elif kind == "text":
            text_ops += 1
        elif kind == "set":
            sets += set_overrides(r, case["notes"])
        elif kind == "cli":
            cli += cli_options(r, case["notes"])
        elif not prompts_mutated:
            prompts_mutated = True
            _mutate_prompts_file(r, case)
    return text_ops, sets, cli


def protocol_case(seed: int, index: int) -> dict[str, Any]:
    r = rng_for(seed, "protocol", index)
    case = new_case("protocol", index, seed)
    proto, shrink = _base(r, case)
    # helper files some mutations point at
    case["files"]["kernel.py"] = file_entry(KERNEL_OK)
    case["files"]["afile"] = file_entry("not a directory\n")
    case["dirs"].append("adir")
    n = r.choices([0, 1, 2, 3], [10, 45, 30, 15])[0]
    text_ops, sets, cli = _mutations(r, case, proto, n)
    data = dump_yaml(r, proto).encode("utf-8", "surrogatepass")
    for _ in range(text_ops):
        data = mutate_bytes(r, data, case["notes"])
    case["files"]["proto.yaml"] = file_entry(data)
    case["argv"] = ["run", "--config", "proto.yaml", "--out", "run", "--no-progress"]
    case["argv"] += [*shrink, *sets, *cli, "--set", f"limits.max_tokens={MAX_TOKENS}"]
    if cli and cli[0] == "--out":
        case["out"] = cli[1]
    if n == 0:
        case["expect"] = VERDICTS
    return case
