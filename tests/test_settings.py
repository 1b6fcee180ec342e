"""The one test-settings type (issue 30): every form of a test setting derived from its field,
the run-level decisions made once on the plan, the dtype rule and the one model loader.

All deterministic (no sampling): exact checks.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml
from toy_protocol import TOY, write_toy

from spectest.byo_compare import FLAGS, byo_tests
from spectest.errors import ConfigError, ModelError
from spectest.plan import make_plan, stages
from spectest.protocol import load_protocol, protocol_from_dict, to_raw
from spectest.sequential import look_alphas
from spectest.stats.options import AnalysisOptions, options, yaml_paths

# a value each protocol setting refuses, and one it takes that is not its default
BAD = {
    "alpha": 0.9,
    "multiplicity": "holm",
    "min_expected": -1.0,
    "trie_depth": 65,
    "trie_min_count": 0,
    "whitebox": "yes",
    "null_permutations": -1,
    "max_mde_tv": 2.0,
    "sequence": "no",
    "numerics": "fast",
    "numerics_floor": "none",
    "numerics_margin": 1.5,
    "numerics_sequences": 1,
    "numerics_floor_sequences": 2.5,
    "left_out_max": 1.5,
}
GOOD = {
    "alpha": 0.01,
    "multiplicity": "by",
    "min_expected": 2.0,
    "trie_depth": 1,
    "trie_min_count": 50,
    "whitebox": False,
    "null_permutations": 99,
    "max_mde_tv": 0.2,
    "sequence": False,
    "numerics": "exact",
    "numerics_floor": "batch",
    "numerics_margin": 0.01,
    "numerics_sequences": 64,
    "numerics_floor_sequences": 256,
    "left_out_max": 0.1,
}


def _raw_with(path: str, value: object) -> dict:
    raw = yaml.safe_load(yaml.safe_dump(TOY))
    node = raw
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return raw


def test_every_protocol_setting_is_a_field_with_a_path() -> None:
    """The parser's fields are the settings' YAML paths (nothing else knows them)."""
    assert set(yaml_paths()) == set(BAD) == set(GOOD)
    assert yaml_paths()["trie_depth"] == "tests.trie.depth"
    assert yaml_paths()["max_mde_tv"] == "tests.power.max_mde_tv"
    assert FLAGS == {
        "alpha": "--alpha",
        "multiplicity": "--multiplicity",
        "max_mde_tv": "--max-mde-tv",
    }


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_is_refused_at_its_yaml_path(tmp_path: Path, name: str) -> None:
    write_toy(tmp_path)  # the prompts file
    path = yaml_paths()[name]
    with pytest.raises(ConfigError, match=re.escape(f"p.yaml: {path}: ")):
        protocol_from_dict(_raw_with(path, BAD[name]), source="p.yaml", base_dir=tmp_path)


@pytest.mark.parametrize("name", sorted(GOOD))
def test_a_set_value_reaches_the_settings_and_round_trips(tmp_path: Path, name: str) -> None:
    """YAML → settings → protocol.yaml → the same settings and hash; the hashed form reads back
    (``from_canonical``) to the same settings."""
    write_toy(tmp_path)
    p = protocol_from_dict(_raw_with(yaml_paths()[name], GOOD[name]), base_dir=tmp_path)
    assert getattr(p.tests, name) == GOOD[name]
    (tmp_path / "again.yaml").write_text(yaml.safe_dump(to_raw(p, prompts_file="prompts.jsonl")))
    again = load_protocol(tmp_path / "again.yaml")
    assert again.tests == p.tests and again.hash == p.hash
    assert AnalysisOptions.from_canonical(p.tests.canonical()) == p.tests


def test_an_option_hashed_when_not_default_leaves_the_hash_alone() -> None:
    """'non-default' options are absent from the hashed form at their default, present else."""
    d = AnalysisOptions()
    later = [n for n, o in options() if o.hashed == "non-default"]
    assert later and not set(later) & set(d.canonical())
    for n in later:  # (numerics_floor has one value today: it cannot be set to another)
        if GOOD[n] != getattr(d, n):
            assert n in dataclasses.replace(d, **{n: GOOD[n]}).canonical()
    assert set(d.canonical()) == {
        "alpha",
        "multiplicity",
        "min_expected",
        "trie",
        "whitebox",
        "null_permutations",
        "max_mde_tv",
    }


def test_compare_names_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"^--max-mde-tv: expected a number in \(0, 1\]"):
        byo_tests(max_mde_tv=0.0)
    assert byo_tests(alpha=0.01).alpha == 0.01 and not byo_tests().whitebox


def test_the_plan_resolves_the_run_level_settings_once(tmp_path: Path) -> None:
    """White-box mode, the look's α, readout arms, sized teeth and claim (b)'s α on the plan."""
    p = load_protocol(write_toy(tmp_path))
    s = make_plan(p).settings
    assert s.options == dataclasses.replace(p.tests, whitebox_mode="exact")
    assert s.key == p.seeds.key and s.run_alpha == p.tests.alpha and not s.matched
    eps, mutant = ("eps=0.5", "eps_biased:0.5"), ("mutant:always_accept", "always_accept")
    assert s.sized_teeth == (eps, mutant)
    seq = load_protocol(write_toy(tmp_path, "s.yaml", seeds={"per_arm": 50, "max_per_arm": 200}))
    alphas = look_alphas(seq.tests.alpha, stages(seq), seq.seeds.spending)
    for k, a in enumerate(alphas):
        st = make_plan(seq, stage=k).settings
        assert st.options.alpha == a and st.run_alpha == seq.tests.alpha
    assert make_plan(seq, teeth_only=True).settings.options.alpha == seq.tests.alpha


def test_one_dtype_rule() -> None:
    """The protocol, the loader and bench take the same names; bench refuses a bad one before
    loading anything (it used to reach the loader)."""
    import torch

    from spectest.bench import BenchConfig
    from spectest.models.dtypes import DTYPES, dtype_name
    from spectest.models.hf import _resolve_dtype
    from spectest.protocol import DTYPES as PROTOCOL_DTYPES

    assert PROTOCOL_DTYPES is DTYPES
    for name in DTYPES:  # every dtype a protocol admits, the HF loader loads (float64 was refused)
        assert _resolve_dtype(name, torch.device("cpu")) == getattr(torch, name)
    assert _resolve_dtype(None, torch.device("cuda")) == torch.bfloat16
    assert dtype_name("bf16") == "bfloat16" and dtype_name(None, "cuda:0") == "bfloat16"
    with pytest.raises(ConfigError, match=r"^--dtype: expected one of float32, .*got 'fp8'"):
        BenchConfig(dtype="fp8")


def test_conformance_loads_a_protocol_through_the_one_loader(tmp_path: Path) -> None:
    """A draft whose vocabulary differs from the target's is named by the protocol's field, as
    a run names it (``spectest conformance --config`` loaded the pair apart before)."""
    from spectest.conformance import check_arm

    models = {"target": "toy:V=16,seed=3", "draft": "toy:V=17,seed=4"}
    path = write_toy(tmp_path, models=models)
    with pytest.raises(ModelError, match=r"toy\.yaml: models\.draft: "):
        check_arm(path)
