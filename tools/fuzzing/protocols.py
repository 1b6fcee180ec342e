"""The ``protocol`` generator: a tiny toy protocol (or a shipped one, copied with its prompts and
shrunk by ``--seeds`` / ``--positions`` / ``--set``) mutated field by field — wrong types, huge /
negative / NaN / inf numbers, unknown keys, unicode, deep nesting, YAML tags and aliases,
missing sections, renamed keys, raw scalars such as a 5000-digit integer —, as text (bytes
flipped, lines duplicated, BOM, NUL, invalid UTF-8, CRLF, truncation, padding past the size
limit, two documents), through ``--set`` overrides and CLI options, and through its prompts file.
Every run gets ``--set limits.max_tokens=MAX_TOKENS`` last, so a mutated plan is tiny or refused
(a big valid plan is legitimately slow, not hostile). Knows nothing about running a case.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import yaml

from fuzzing.common import (
    KERNEL_OK,
    MAX_TOKENS,
    PROTOCOLS,
    TOY_D,
    TOY_T,
    VERDICTS,
    file_bytes,
    file_entry,
    hostile_value,
    mutate_bytes,
    nested_list,
    nested_map,
    new_case,
    raw_yaml,
    rng_for,
    toy_prompts,
    toy_protocol,
)

SHIPPED = ("ci", "top_p", "top_k", "combined", "sglang-eagle", "vllm-rlt-187", "openinfer-512")


VALID_VALUES: dict[str, list[Any]] = {
    "version": [1, 2],
    "name": ["fz", "a.b-c_d", "x" * 128, "x" * 129, "Z9"],
    "description": ["", "ünïcödé [/] :x: \x1b[31m <script>", "x" * 3000],
    "models.target": [
        TOY_T.format(V=16),
        "toy:V=16,order=1,scale=0,seed=0",
        "toy:V=16,order=3,scale=5.0,seed=1",
        "toy:V=8,order=2,scale=2.0,seed=3",
        "toy:V=16,order=2,scale=2.0,seed=3,extra=1",
        "toy:V=5000,order=3",
        "toy:V=1,order=1",
        "toy:V=16,order=0",
        "toy:V=-1",
        "toy:",
        "toy:V=abc",
        "bundled:target",
        "hf-local:/nonexistent",
        "hf-local:.",
        "derived:noised",
        "fixture:nope/target",
        "hf-preset:nope",
        "nope:x",
    ],
    "models.draft": [
        TOY_D.format(V=16),
        TOY_T.format(V=16),
        "toy:V=16,order=1,scale=9,seed=2",
        "toy:V=8,order=2,scale=1.0,seed=4",
        "derived:noised,noise=0.1",
        "derived:first_layers,layers=2",
        "derived:noised,noise=-1",
        "bundled:draft",
    ],
    "models.dtype": ["float32", "float64", "bfloat16", "float16", "int8", "float"],
    "models.device": ["cpu", "cuda", "mps", "cpu:0"],
    "drafter.kind": ["onehot", "sampled", "greedy"],
    "drafter.k": [1, 2, 3, 4, 64, 65, 0],
    "drafter.q": ["processed", "temperature", "raw", "exact"],
    "configs.a.temperature": [0.01, 1e-300, 5.0, 100.0, 1, 0, 2**70],
    "configs.a.top_k": [0, 1, 15, 16, 17, 1000, 2**40, -1, 1.0],
    "configs.a.top_p": [1e-9, 0.5, 1.0, 1, 0.999999, 0, 1.0000001],
    "configs.a.min_p": [0, 0.5, 0.999, 1.0, 1],
    "seeds.per_arm": [2, 3, 20, 40, 1, 10**6],
    "seeds.start": [0, 10**15, 2**62, 2**63 - 100, -1],
    "seeds.key": ["k", "ü", "x" * 1000, ""],
    "seeds.teeth_per_arm": [2, 20, 1],
    "seeds.max_per_arm": [40, 80, 10],
    "seeds.spending": ["equal", "proportional", "pocock"],
    "seeds.reference_per_arm": [2, 40, 1],
    "positions": [1, 2, 3, 0, 4096, 4097],
    "candidate": [
        "exact",
        "always_accept",
        "eps_biased:0.1",
        "eps_biased:1e300",
        "eps_biased:-1",
        "eps_biased:nan",
        "raw_q",
        "residual_from_p",
        "greedy_verify",
        "bonus_wrong_row",
        "commit_on_telemetry",
        "bf16_ratio",
        "swapped_filter_order",
        "acceptor:missing.py:f",
        "acceptor:kernel.py:accept",
        "acceptor:os:system",
        "acceptor:",
        "nope",
    ],
    "tests.alpha": [0.5, 1e-12, 0.05, 0.5000001],
    "tests.multiplicity": ["bh", "by", "maxT", "BH", "holm"],
    "tests.min_expected": [0.001, 1000, 5, 1000.5],
    "tests.trie.depth": [0, 1, 2, 3, 64, 65],
    "tests.trie.min_count": [1, 5, 200, 0],
    "tests.whitebox": [True, False],
    "tests.null_permutations": [0, 1, 10, 20_000, 20_001],
    "tests.sequence": [True, False],
    "tests.power.max_mde_tv": [1, 0.01, 0.5, 1.0000001],
    "teeth.null_arm": [True, False],
    "teeth.epsilons": [[0.5], [0.1, 0.5], [1e-300], [1e300], [0.5, 0.5], []],
    "teeth.mutants": [
        ["always_accept"],
        ["raw_q"],
        ["exact"],
        ["always_accept"] * 2,
        [],
        ["eps_biased:0.5"],
        ["nope"],
    ],
    "teeth.size_budget": [0, 1, 64, 2048],
    "output": ["results", "", "/", "a/b"],
    "batch_size": [7, 64, 2**20, 2**20 + 1, 0],
    "limits.max_tokens": [1, 10, 10**12],
    "prompts.limit": [1, 0, 100, -1],
    "engines.reference": ["builtin", "hf-generate", "nope", {"name": "builtin", "x": 1}],
    "engines.candidate": [
        "builtin",
        {"name": "acceptor", "kernel": "kernel.py:accept"},
        {"name": "command", "command": ["/nonexistent/program"], "timeout_s": 1},
        {"name": "command", "command": "{python} -c 'print(1)'", "startup_timeout_s": 2},
        {"name": "http", "url": "http://127.0.0.1:1", "timeout_s": 1, "retries": 0},
        {"name": "http", "url": "http://example.com:80"},
        {"name": "http", "url": "ftp://127.0.0.1"},
        {"name": "fast"},
    ],
    "engine.candidate": ["builtin", "hf-assisted", "acceptor"],
    "engine.assistant_confidence_threshold": [0.0, 0.5, 1.0],
}
ALL_PATHS = sorted(VALID_VALUES)
ALT_CONFIGS: list[Any] = [
    {"b": {"temperature": 1.0, "top_k": 5}},
    {"a": {}},
    {"a": None},
    {"t": {"temperature": 0.0}},
    {"a": {"temperature": 0.8, "top_k": 3, "top_p": 0.9, "min_p": 0.05}},
    {"a": {"temperature": 0.8}, "b": {"temperature": 0.8}},
    {"a/b": {"temperature": 0.8}},
    {"[/]": {"temperature": 0.8}},
    {"a\n": {"temperature": 0.8}},
    {f"c{i}": {"temperature": 0.5 + i / 100} for i in range(40)},
]
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


def paths_of(obj: Any, prefix: str = "") -> list[str]:
    """Every dotted path of a nested mapping (mappings only; list items are leaves)."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{prefix}.{k}" if prefix else str(k)
            out.append(p)
            out.extend(paths_of(v, p))
    return out


def set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    cur = obj
    for part in parts[:-1]:
        nxt = cur.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            cur[part] = nxt
        cur = nxt
    cur[parts[-1]] = value


def del_path(obj: dict[str, Any], path: str) -> None:
    parts = path.split(".")
    cur: Any = obj
    for part in parts[:-1]:
        cur = cur.get(part) if isinstance(cur, dict) else None
    if isinstance(cur, dict):
        cur.pop(parts[-1], None)


class Raw:
    """A raw YAML scalar placed where a value goes (written into the text as it is)."""

    def __init__(self, text: str) -> None:
        self.text = text


def dump_yaml(r: random.Random, obj: Any) -> str:
    """YAML text of ``obj`` with ``Raw`` values substituted as they are."""
    raws: list[str] = []

    def strip(o: Any) -> Any:
        if isinstance(o, Raw):
            raws.append(o.text)
            return f"ZZRAW{len(raws) - 1}ZZ"
        if isinstance(o, dict):
            return {strip(k) if isinstance(k, Raw) else k: strip(v) for k, v in o.items()}
        if isinstance(o, list):
            return [strip(v) for v in o]
        return o

    plain = strip(obj)
    style = r.choice([None, None, True, False])
    text = yaml.safe_dump(
        plain,
        sort_keys=False,
        allow_unicode=r.random() < 0.5,
        default_flow_style=style,
        width=r.choice([80, 10**6]),
    )
    for i, raw in enumerate(raws):
        text = text.replace(f"ZZRAW{i}ZZ", raw)
    return text


def mutate_mapping(r: random.Random, proto: dict[str, Any], notes: list[str]) -> None:
    """One structure-aware change of the protocol mapping."""
    op = r.choices(
        ["valid", "hostile", "raw", "delete", "unknown", "wrap", "nest", "section", "key"],
        [30, 20, 14, 8, 6, 6, 5, 6, 5],
    )[0]
    existing = paths_of(proto)
    if op == "valid":
        path = r.choice(ALL_PATHS)
        value = copy.deepcopy(r.choice(VALID_VALUES[path]))
        if path == "configs.a.temperature" and r.random() < 0.3:
            proto["configs"] = copy.deepcopy(r.choice(ALT_CONFIGS))
            notes.append(f"configs = {str(proto['configs'])[:80]}")
            return
        set_path(proto, path, value)
        notes.append(f"{path} = {value!r:.80}")
    elif op == "hostile":
        path = r.choice(existing + ALL_PATHS)
        value = hostile_value(r)
        set_path(proto, path, value)
        notes.append(f"{path} = {value!r:.80}")
    elif op == "raw":
        path = r.choice(existing + ALL_PATHS)
        raw = raw_yaml(r)
        set_path(proto, path, Raw(raw))
        notes.append(f"{path} = raw {raw[:60]!r} ({len(raw)} chars)")
    elif op == "delete":
        path = r.choice(existing)
        del_path(proto, path)
        notes.append(f"delete {path}")
    elif op == "unknown":
        base = r.choice(["", *[p for p in existing if isinstance(_get(proto, p), dict)]])
        key = r.choice(["extra", "Name", "null", "ü", "a.b", " ", "__class__", "x" * 300])
        set_path(proto, f"{base}.{key}" if base else key, hostile_value(r))
        notes.append(f"unknown key {key!r:.40} under {base or '<top>'}")
    elif op == "wrap":
        path = r.choice(existing)
        v = _get(proto, path)
        w = r.choice([[v], {"value": v}, str(v), [v, v]])
        set_path(proto, path, w)
        notes.append(f"{path} wrapped: {w!r:.80}")
    elif op == "nest":
        path = r.choice(existing)
        depth = r.choice([10, 100, 500, 2000, 50_000])
        text = nested_list(depth) if r.random() < 0.5 else nested_map(depth)
        set_path(proto, path, Raw(text))  # as text: nested Python objects would recurse here
        notes.append(f"{path} nested {depth} deep")
    elif op == "section":
        top = r.choice(list(proto) or ["x"])
        proto[top] = r.choice([None, [], {}, "", 1, [proto.get(top)]])
        notes.append(f"section {top} = {proto[top]!r:.60}")
    elif op == "key":
        path = r.choice(existing)
        parts = path.split(".")
        parent: Any = proto if len(parts) == 1 else _get(proto, ".".join(parts[:-1]))
        if isinstance(parent, dict) and parts[-1] in parent:
            v = parent.pop(parts[-1])
            newkey = r.choice([Raw(raw_yaml(r)), 1, True, None, 1.5, parts[-1].upper()])
            parent[newkey] = v  # type: ignore[index]
            shown = newkey.text[:40] if isinstance(newkey, Raw) else repr(newkey)
            notes.append(f"key {path} renamed to {shown}")


def _get(obj: Any, path: str) -> Any:
    cur = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


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


def protocol_case(seed: int, index: int) -> dict[str, Any]:
    r = rng_for(seed, "protocol", index)
    case = new_case("protocol", index, seed)
    notes = case["notes"]
    shrink: list[str] = []
    if r.random() < 0.9:
        V = 16
        proto = toy_protocol(r, V)
        prompts = toy_prompts(r, V)
        case["files"]["prompts.jsonl"] = file_entry(prompts)
        notes.append(f"base toy v{proto['version']}")
    else:
        name = r.choice(SHIPPED)
        text = (PROTOCOLS / f"{name}.yaml").read_text()
        proto = yaml.safe_load(text)
        pfile = proto["prompts"]["file"]
        prompts = (PROTOCOLS / pfile).read_text()
        case["files"][pfile] = file_entry(prompts)
        shrink = [
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
        notes.append(f"base shipped {name}")
    # helper files some mutations point at
    case["files"]["kernel.py"] = file_entry(KERNEL_OK)
    case["files"]["afile"] = file_entry("not a directory\n")
    case["dirs"].append("adir")
    text_ops = 0
    n = r.choices([0, 1, 2, 3], [10, 45, 30, 15])[0]
    sets: list[str] = []
    cli: list[str] = []
    prompts_mutated = False
    for _ in range(n):
        kind = r.choices(["map", "text", "set", "cli", "prompts"], [55, 14, 14, 10, 7])[0]
        if kind == "map":
            mutate_mapping(r, proto, notes)
        elif kind == "text":
            text_ops += 1
        elif kind == "set":
            sets += set_overrides(r, notes)
        elif kind == "cli":
            cli += cli_options(r, notes)
        elif not prompts_mutated:
            prompts_mutated = True
            pfile = next(k for k in case["files"] if k.endswith(".jsonl"))
            case["files"][pfile] = file_entry(
                mutate_prompts(r, file_bytes(case["files"][pfile]).decode(), notes)
            )
    data = dump_yaml(r, proto).encode("utf-8", "surrogatepass")
    for _ in range(text_ops):
        data = mutate_bytes(r, data, notes)
    case["files"]["proto.yaml"] = file_entry(data)
    argv = [
        "run",
        "--config",
        "proto.yaml",
        "--out",
        "run",
        "--no-progress",
        *shrink,
        *sets,
        *cli,
        "--set",
        f"limits.max_tokens={MAX_TOKENS}",
    ]
    if cli and cli[0] == "--out":
        case["out"] = cli[1]
    case["argv"] = argv
    if n == 0:
        case["expect"] = VERDICTS
    return case
