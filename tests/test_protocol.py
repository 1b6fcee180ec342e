"""Protocol loading, validation messages, overrides, hashing and the plan (no models, no I/O
beyond a temporary directory). Deterministic: no randomness."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from spectest.errors import ConfigError, ExitCode
from spectest.plan import make_plan
from spectest.prompts import prompts_jsonl
from spectest.protocol import load_protocol, protocol_from_dict, to_raw

REPO = Path(__file__).resolve().parents[1]

BASE = {
    "version": 1,
    "name": "tiny",
    "models": {
        "target": "toy:V=16,order=2,scale=2.0,seed=3",
        "draft": "toy:V=16,order=2,scale=1.0,seed=4",
    },
    "drafter": {"kind": "onehot", "k": 3},
    "prompts": {"file": "p.jsonl"},
    "configs": {"a": {"temperature": 0.8, "top_p": 0.95}, "b": {"temperature": 1.0, "top_k": 5}},
    "seeds": {"per_arm": 64},
    "positions": 4,
    "teeth": {"null_arm": True, "epsilons": [0.5], "mutants": ["always_accept"]},
}


def write(tmp_path: Path, body: dict | str, name: str = "proto.yaml") -> Path:
    (tmp_path / "p.jsonl").write_text(
        '{"id": "p0", "ids": [1, 2, 3]}\n{"id": "p1", "text": "hi"}\n'
    )
    f = tmp_path / name
    f.write_text(body if isinstance(body, str) else yaml.safe_dump(body))
    return f


def with_(path: str, value, base: dict = BASE) -> dict:
    """A deep copy of ``base`` with the dotted ``path`` set to ``value``."""
    d = yaml.safe_load(yaml.safe_dump(base))
    node = d
    parts = path.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return d


def test_loads_defaults_and_plan(tmp_path: Path) -> None:
    p = load_protocol(write(tmp_path, BASE))
    assert p.positions == 4 and p.candidate == "exact" and p.tests.multiplicity == "bh"
    assert [pr.id for pr in p.prompts.items] == ["p0", "p1"]
    assert p.prompts.items[0].ids == (1, 2, 3) and p.prompts.items[1].text == "hi"
    assert p.seeds.key == "tiny" and p.seeds.teeth_per_arm == 64
    plan = make_plan(p)
    names = [a.name for a in plan.arms]
    assert names == ["reference", "candidate", "null", "eps=0.5", "mutant:always_accept"]
    assert [a.variant for a in plan.arms] == [
        None,
        "exact",
        "exact",
        "eps_biased:0.5",
        "always_accept",
    ]
    # disjoint, consecutive, collision-free seed ranges
    ranges = [(a.seeds.start, a.seeds.stop) for a in plan.arms]
    assert ranges == [(0, 64), (64, 128), (128, 192), (192, 256), (256, 320)]
    assert plan.cells == (("p0", "a"), ("p0", "b"), ("p1", "a"), ("p1", "b"))
    assert len(plan.shards) == 5 * 2
    assert len({s.key for s in plan.shards}) == len(plan.shards)
    assert all("/" not in s.key and ":" not in s.key for s in plan.shards)


def test_teeth_only_plan_keeps_each_arms_seeds(tmp_path: Path) -> None:
    p = load_protocol(write(tmp_path, BASE))
    full = {a.name: a.seeds for a in make_plan(p).arms}
    teeth = make_plan(p, teeth_only=True)
    assert "candidate" not in [a.name for a in teeth.arms]
    assert all(full[a.name] == a.seeds for a in teeth.arms)


def test_overrides_are_validated_like_yaml(tmp_path: Path) -> None:
    f = write(tmp_path, BASE)
    p = load_protocol(
        f,
        overrides={"seeds.per_arm": 10, "positions": None},
        sets=["tests.alpha=0.01", "configs.a.top_k=7"],
    )
    assert p.seeds.per_arm == 10 and p.positions == 4 and p.tests.alpha == 0.01
    assert p.config_map["a"].top_k == 7
    # names that hold dots (config ids such as t0.8-p0.95) are matched whole
    dotted = with_("configs", {"t0.8-p0.95": {"temperature": 0.8, "top_p": 0.95}})
    q = load_protocol(write(tmp_path, dotted, "dot.yaml"), sets=["configs.t0.8-p0.95.top_p=0.9"])
    assert q.config_map["t0.8-p0.95"].top_p == 0.9 and len(q.configs) == 1
    with pytest.raises(ConfigError, match=r"override positions.x: positions is not a mapping"):
        load_protocol(f, sets=["positions.x=1"])
    with pytest.raises(ConfigError, match=r"tests\.alpha.*'x'"):
        load_protocol(f, sets=["tests.alpha=x"])
    with pytest.raises(ConfigError, match=r"--set: expected key=value, got 'oops'"):
        load_protocol(f, sets=["oops"])


def test_hash_is_canonical_and_sensitive(tmp_path: Path) -> None:
    f = write(tmp_path, BASE)
    p = load_protocol(f)
    # same content, different key order and an explicit default → same hash
    reordered = dict(reversed(list(BASE.items())))
    reordered = with_("tests.alpha", 0.05, reordered)
    assert load_protocol(write(tmp_path, reordered, "b.yaml")).hash == p.hash
    # output dir does not enter the hash; anything that changes samples or decisions does
    assert load_protocol(write(tmp_path, with_("output", "elsewhere"), "c.yaml")).hash == p.hash
    for path, value in [
        ("positions", 5),
        ("seeds.per_arm", 65),
        ("configs.a.top_p", 0.9),
        ("tests.alpha", 0.01),
    ]:
        assert load_protocol(write(tmp_path, with_(path, value), "d.yaml")).hash != p.hash, path
    # a changed prompt *text* changes the hash even with the same file name
    (tmp_path / "p.jsonl").write_text(
        '{"id": "p0", "ids": [1, 2, 4]}\n{"id": "p1", "text": "hi"}\n'
    )
    assert protocol_from_dict(BASE, source="x", base_dir=tmp_path).hash != p.hash


def test_round_trip_through_to_raw(tmp_path: Path) -> None:
    p = load_protocol(write(tmp_path, BASE))
    (tmp_path / "copy.jsonl").write_text(prompts_jsonl(p))
    raw = yaml.safe_load(yaml.safe_dump(to_raw(p, prompts_file="copy.jsonl")))
    q = protocol_from_dict(raw, source="copy", base_dir=tmp_path)
    assert q.hash == p.hash and q == protocol_from_dict(raw, source="copy", base_dir=tmp_path)


@pytest.mark.parametrize(
    ("path", "value", "pattern"),
    [
        ("version", 3, r"version: unsupported protocol version 3 \(this spectest reads 1, 2\)"),
        ("positions", 0, r"positions: expected an integer in \[1, 4096\], got 0"),
        ("positions", "32", r"positions: expected an integer.*'32'"),
        ("drafter.kind", "greedy", r"drafter\.kind: expected one of onehot, sampled, got 'greedy'"),
        ("drafter.k", 0, r"drafter\.k: .*got 0"),
        ("drafter.q", "raw", r"drafter\.q: only meaningful for a sampled drafter"),
        ("configs.a.temperature", -1, r"configs\.a: temperature must be .*-1"),
        ("configs.a.top_p", 1.5, r"configs\.a: top_p must be in \(0, 1\], got 1\.5"),
        ("configs.a.temperature", 0, r"configs\.a\.temperature: temperature 0"),
        ("configs.a.typo", 1, r"configs\.a\.typo: unknown key 'typo'"),
        ("seeds.per_arm", 1, r"seeds\.per_arm: .*got 1"),
        ("tests.alpha", 1.0, r"tests\.alpha: expected a number in \(0, 0\.5\], got 1\.0"),
        (
            "tests.multiplicity",
            "holm",
            r"tests\.multiplicity: expected one of bh, by, maxT, got 'holm'",
        ),
        ("tests.whitebox", "yes", r"tests\.whitebox: expected true or false, got 'yes'"),
        ("teeth.epsilons", [0.1, 0.1], r"teeth\.epsilons: duplicate entry 0\.1"),
        ("teeth.mutants", "always_accept", r"teeth\.mutants: expected a list"),
        ("teeth.null", True, r"teeth\.None: unknown key None"),  # YAML's bare null key
        ("models.target", "gpt2", r"models\.target: expected a zoo spec .* got 'gpt2'"),
        (
            "models.draft",
            "hf-local:/no/such/dir",
            r"models\.draft: no such model directory 'hf-local:/no/such/dir'",
        ),
        ("models.device", "tpu", r"models\.device: expected one of cpu, cuda, got 'tpu'"),
        ("prompts.file", "missing.jsonl", r"prompts\.file: no such prompt file 'missing\.jsonl'"),
        ("surprise", 1, r"surprise: unknown key 'surprise'"),
        ("name", "has space", r"name: expected a name .*'has space'"),
    ],
)
def test_bad_values_name_file_field_and_value(
    tmp_path: Path, path: str, value, pattern: str
) -> None:
    if path == "teeth.null":
        body = yaml.safe_dump(BASE).replace("null_arm: true", "null: true")
        f = write(tmp_path, body)
    else:
        f = write(tmp_path, with_(path, value))
    with pytest.raises(ConfigError, match=pattern) as info:
        load_protocol(f)
    msg = str(info.value)
    assert msg.startswith(str(f)) and "\n" not in msg
    assert info.value.exit_code == ExitCode.BAD_INPUT


def test_missing_required_and_malformed_yaml(tmp_path: Path) -> None:
    d = dict(BASE)
    del d["positions"]
    with pytest.raises(ConfigError, match=r"positions: required field is missing"):
        load_protocol(write(tmp_path, d))
    with pytest.raises(ConfigError, match=r"malformed YAML at line 2, column 8: mapping values"):
        load_protocol(write(tmp_path, "version: 1\nname: x: y\n"))
    with pytest.raises(ConfigError, match=r"<top>: expected a mapping, got \[1, 2\]"):
        load_protocol(write(tmp_path, "[1, 2]\n"))
    with pytest.raises(ConfigError, match=r"no such protocol file"):
        load_protocol(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("line", "pattern"),
    [
        ("not json", r"line 1: not valid JSON"),
        ('{"id": "p0"}', r"line 1: give exactly one of 'text' or 'ids'"),
        ('{"id": "p0", "ids": [-1]}', r"line 1: ids must be .*\[-1\]"),
        ('{"id": "a b", "text": "x"}', r"line 1: id must be .*'a b'"),
        ('{"id": "p0", "text": "x", "extra": 1}', r"line 1: expected"),
        (
            '{"id": "p0", "text": "x"}\n{"id": "p0", "text": "y"}',
            r"line 2: duplicate prompt id 'p0'",
        ),
    ],
)
def test_bad_prompt_files(tmp_path: Path, line: str, pattern: str) -> None:
    f = write(tmp_path, BASE)
    (tmp_path / "p.jsonl").write_text(line + "\n")
    with pytest.raises(ConfigError, match=pattern) as info:
        load_protocol(f)
    assert "p.jsonl" in str(info.value)


def test_prompt_limit_and_string_form(tmp_path: Path) -> None:
    p = load_protocol(write(tmp_path, with_("prompts", {"file": "p.jsonl", "limit": 1})))
    assert [pr.id for pr in p.prompts.items] == ["p0"]
    p2 = load_protocol(write(tmp_path, with_("prompts", "p.jsonl"), "s.yaml"))
    assert len(p2.prompts.items) == 2


@pytest.mark.parametrize("name", sorted(f.name for f in (REPO / "protocols").glob("*.yaml")))
def test_shipped_protocols_validate(name: str) -> None:
    """Every shipped protocol is valid and its plan has disjoint seeds (needs its prompt file)."""
    f = REPO / "protocols" / name
    raw = yaml.safe_load(f.read_text())
    prompt_file = (f.parent / raw["prompts"]["file"]) if isinstance(raw["prompts"], dict) else None
    if prompt_file is not None and not prompt_file.is_file():
        pytest.skip(f"prompt set {prompt_file.name} not landed yet")
    p = load_protocol(f)
    plan = make_plan(p)
    assert plan.arms[0].name == "reference" and plan.arms[1].name == "candidate"
