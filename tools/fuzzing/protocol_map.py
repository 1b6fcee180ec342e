"""The ``protocol`` generator's structure-aware changes of a protocol mapping: the valid values
per dotted path (``VALID_VALUES``), paths and their setters, raw YAML scalars (``Raw``) and their
writer (``dump_yaml``), and ``mutate_mapping`` — a valid value, a hostile one, a raw scalar, a
deleted, unknown, wrapped, deeply nested or renamed key, a replaced section. ``fuzzing.protocols``
builds the cases; this module knows nothing about running one.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import yaml

from fuzzing.common import TOY_D, TOY_T, hostile_value, nested_list, nested_map, raw_yaml

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


def _get(obj: Any, path: str) -> Any:
    cur = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def _valid(r: random.Random, proto: dict[str, Any], existing: list[str], notes: list[str]) -> None:
    path = r.choice(ALL_PATHS)
    value = copy.deepcopy(r.choice(VALID_VALUES[path]))
    if path == "configs.a.temperature" and r.random() < 0.3:
        proto["configs"] = copy.deepcopy(r.choice(ALT_CONFIGS))
        notes.append(f"configs = {str(proto['configs'])[:80]}")
        return
    set_path(proto, path, value)
    notes.append(f"{path} = {value!r:.80}")


def _hostile(
    r: random.Random, proto: dict[str, Any], existing: list[str], notes: list[str]
) -> None:
    path = r.choice(existing + ALL_PATHS)
    value = hostile_value(r)
    set_path(proto, path, value)
    notes.append(f"{path} = {value!r:.80}")


def _raw(r: random.Random, proto: dict[str, Any], existing: list[str], notes: list[str]) -> None:
    path = r.choice(existing + ALL_PATHS)
    raw = raw_yaml(r)
    set_path(proto, path, Raw(raw))
    notes.append(f"{path} = raw {raw[:60]!r} ({len(raw)} chars)")


def _delete(r: random.Random, proto: dict[str, Any], existing: list[str], notes: list[str]) -> None:
    path = r.choice(existing)
    del_path(proto, path)
    notes.append(f"delete {path}")


def _unknown(
    r: random.Random, proto: dict[str, Any], existing: list[str], notes: list[str]
) -> None:
    base = r.choice(["", *[p for p in existing if isinstance(_get(proto, p), dict)]])
    key = r.choice(["extra", "Name", "null", "ü", "a.b", " ", "__class__", "x" * 300])
    set_path(proto, f"{base}.{key}" if base else key, hostile_value(r))
    notes.append(f"unknown key {key!r:.40} under {base or '<top>'}")


def _wrap(r: random.Random, proto: dict[str, Any], existing: list[str], notes: list[str]) -> None:
    path = r.choice(existing)
    v = _get(proto, path)
    w = r.choice([[v], {"value": v}, str(v), [v, v]])
    set_path(proto, path, w)
    notes.append(f"{path} wrapped: {w!r:.80}")


def _nest(r: random.Random, proto: dict[str, Any], existing: list[str], notes: list[str]) -> None:
    path = r.choice(existing)
    depth = r.choice([10, 100, 500, 2000, 50_000])
    text = nested_list(depth) if r.random() < 0.5 else nested_map(depth)
    set_path(proto, path, Raw(text))  # as text: nested Python objects would recurse here
    notes.append(f"{path} nested {depth} deep")


def _section(
    r: random.Random, proto: dict[str, Any], existing: list[str], notes: list[str]
) -> None:
    top = r.choice(list(proto) or ["x"])
    proto[top] = r.choice([None, [], {}, "", 1, [proto.get(top)]])
    notes.append(f"section {top} = {proto[top]!r:.60}")


def _key(r: random.Random, proto: dict[str, Any], existing: list[str], notes: list[str]) -> None:
    path = r.choice(existing)
    parts = path.split(".")
    parent: Any = proto if len(parts) == 1 else _get(proto, ".".join(parts[:-1]))
    if isinstance(parent, dict) and parts[-1] in parent:
        v = parent.pop(parts[-1])
        newkey = r.choice([Raw(raw_yaml(r)), 1, True, None, 1.5, parts[-1].upper()])
        parent[newkey] = v
        shown = newkey.text[:40] if isinstance(newkey, Raw) else repr(newkey)
        notes.append(f"key {path} renamed to {shown}")


# the structure-aware changes: name -> (change, weight), drawn from by one weighted choice
MAP_CHANGES: dict[str, tuple[Callable[..., None], int]] = {
    "valid": (_valid, 30),
    "hostile": (_hostile, 20),
    "raw": (_raw, 14),
    "delete": (_delete, 8),
    "unknown": (_unknown, 6),
    "wrap": (_wrap, 6),
    "nest": (_nest, 5),
    "section": (_section, 6),
    "key": (_key, 5),
}


def mutate_mapping(r: random.Random, proto: dict[str, Any], notes: list[str]) -> None:
    """One structure-aware change of the protocol mapping."""
    op = r.choices(list(MAP_CHANGES), [w for _, w in MAP_CHANGES.values()])[0]
    MAP_CHANGES[op][0](r, proto, paths_of(proto), notes)
