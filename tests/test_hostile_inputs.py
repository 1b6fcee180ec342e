"""Hostile inputs refused before any work (issue 19, "Refused before work starts" and "Late or
wrong codes"): each situation with its exact input, its exit code and its one line naming the
file, the field and the value.

The blow-ups the issue measured (``seeds.per_arm: 10**12`` unbounded, a 1 MB prompt at 8.8 GB, a
2 GB all-NUL CSV at 6.6 GB, a 9-level YAML alias nest at 240 s / 6.5 GB) are bounded here by
construction: each is refused at load or at the first block read, before any model runs or any
file is parsed whole (which the tests check: no run directory, no shard). Their time and peak
RSS before and after are in results/LOG.md (2026-12-01, h16).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from toy_protocol import TOY, write_toy
from typer.testing import CliRunner

from spectest.cli import app
from spectest.errors import ConfigError, ExitCode
from spectest.prompts import MAX_PROMPT_TOKENS, prompt_token_ids
from spectest.protocol import (
    DEFAULT_MAX_TOKENS,
    load_protocol,
    plan_size,
    protocol_from_dict,
    to_raw,
)
from spectest.shipped import list_shipped

ROOT = Path(__file__).resolve().parents[1]
BAD, INFRA = int(ExitCode.BAD_INPUT), int(ExitCode.INFRASTRUCTURE)
runner = CliRunner()


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def err_line(result) -> str:
    """The one error line on stderr (no traceback, no usage text)."""
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and len(lines[0]) < 1000, lines[0][:300]
    return lines[0]


def refused(result, code: int, *parts: str) -> str:
    line = err_line(result)
    assert result.exit_code == code, result.output
    for part in parts:
        assert part in line, (part, line)
    return line


def ci_run(tmp_path: Path, *args: object):
    """``spectest run --config ci ... --out tmp/out``; the refusal must leave no run directory."""
    out = tmp_path / "out"
    r = invoke("run", "--config", "ci", "--out", out, "--no-progress", *args)
    assert not out.exists(), "refused before work, yet a run directory was created"
    return r


# ----------------------------------------------------------------------------- YAML aliases
def alias_nest(levels: int) -> str:
    """The issue's bomb: ``levels`` nested lists of ten aliases each, as the description."""
    parts = ['&l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    parts += [f"&l{i} [{','.join([f'*l{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


@pytest.mark.parametrize("levels", [6, 9])
def test_yaml_alias_nest_is_refused_at_load(tmp_path: Path, levels: int) -> None:
    body = (ROOT / "protocols" / "ci.yaml").read_text()
    body = body.replace("prompts/english-2.jsonl", str(ROOT / "protocols/prompts/english-2.jsonl"))
    body = body.replace(
        '"fast gate: 1 prompt, t=0.8 top_k=20 top_p=0.95, 4 positions"', alias_nest(levels)
    )
    f = tmp_path / f"alias{levels}.yaml"
    f.write_text(body)
    out = tmp_path / "out"
    r = invoke("run", "--config", f, "--out", out, "--no-progress")
    # before: 6 levels gave exit 2 with a 4.3 MB line, 9 levels 240 s, 6.5 GB and a traceback
    refused(r, BAD, str(f), "line 5, column 87", "YAML alias *l0 is not allowed")
    assert not out.exists()


def test_aliases_are_refused_in_set_values_and_anchors_alone_are_inert(tmp_path: Path) -> None:
    f = write_toy(tmp_path)
    with pytest.raises(ConfigError, match=r"--set description: line 1, column 8: YAML alias \*a"):
        load_protocol(f, sets=["description=[&a x, *a]"])
    assert load_protocol(f, sets=["description=&a lone-anchor"]).description == "lone-anchor"
    body = f.read_text().replace("batch_size: 400", "batch_size: &b 400\noutput: *b")
    g = tmp_path / "merge.yaml"
    g.write_text(body)
    with pytest.raises(ConfigError, match=r"merge\.yaml: line \d+, column 9: YAML alias \*b"):
        load_protocol(g)


def test_a_huge_value_is_named_in_a_short_line(tmp_path: Path) -> None:
    """Without aliases a value is at most the file's size; its repr is still cut to one line."""
    f = write_toy(tmp_path, description=["x" * 50] * 2000)
    with pytest.raises(ConfigError, match=r"description: expected a string") as info:
        load_protocol(f)
    assert len(str(info.value)) < 700 and "characters)" in str(info.value)


def test_a_protocol_file_over_256_kib_is_refused_unread(tmp_path: Path) -> None:
    f = tmp_path / "huge.yaml"
    f.write_text("# " + "x" * 2**18 + "\n")
    r = invoke("run", "--config", f, "--no-progress")
    refused(r, BAD, str(f), "larger than 262144 bytes")


# ----------------------------------------------------------------------------- plan budget
def test_seeds_per_arm_10_to_the_12_is_refused_with_its_size_and_the_knob(tmp_path: Path) -> None:
    r = ci_run(tmp_path, "--seeds", str(10**12))  # before: unbounded, 6.3 GB at 300 s
    line = refused(
        r,
        BAD,
        "protocols/ci.yaml: limits.max_tokens: the plan is 4,000,000,000,000 rows",
        "= 16,000,000,000,000 tokens",
        f"over the budget of {DEFAULT_MAX_TOKENS:,} tokens",
        "--set limits.max_tokens=16000000000000",
    )
    assert "PB of memory" in line  # the estimate


def test_the_budget_is_a_knob_not_hashed_and_kept_through_to_raw(tmp_path: Path) -> None:
    f = write_toy(tmp_path)
    base = load_protocol(f)
    tokens = plan_size(base).tokens  # 5 arms × 2 prompts × 2 configs × 200 seeds × 4 positions
    assert tokens == 5 * 2 * 2 * 200 * 4
    with pytest.raises(ConfigError, match=rf"the plan is .* = {tokens:,} tokens .* budget of 100"):
        load_protocol(f, sets=["limits.max_tokens=100"])
    load_protocol(f, sets=[f"limits.max_tokens={tokens}"])  # exactly at the budget: fine
    big = load_protocol(f, sets=["seeds.per_arm=10000000", "limits.max_tokens=10000000000"])
    assert big.limits.max_tokens == 10**10
    roomy = load_protocol(f, sets=["limits.max_tokens=10000000000"])
    assert roomy.hash == base.hash  # the budget changes no sample and no decision
    (tmp_path / "copy.jsonl").write_text((tmp_path / "prompts.jsonl").read_text())
    raw = yaml.safe_load(yaml.safe_dump(to_raw(big, prompts_file="copy.jsonl")))
    again = protocol_from_dict(raw, source="copy", base_dir=tmp_path)  # as analyze re-loads it
    assert again.limits == big.limits and again.hash == big.hash
    with pytest.raises(ConfigError, match=r"limits\.max_tokens: expected an integer >= 1, got 0"):
        load_protocol(f, sets=["limits.max_tokens=0"])


def test_sequential_plans_count_their_last_stage(tmp_path: Path) -> None:
    f = write_toy(tmp_path, seeds={"per_arm": 200, "max_per_arm": 10**9})
    with pytest.raises(ConfigError, match=r"limits\.max_tokens: the plan is"):
        load_protocol(f)


def test_every_shipped_protocol_fits_the_default_budget_with_room() -> None:
    for s in list_shipped():
        p = load_protocol(s.file)
        assert plan_size(p).tokens * 100 <= DEFAULT_MAX_TOKENS, s.name
        dumped = yaml.safe_dump(to_raw(p, prompts_file="prompts.jsonl"), sort_keys=False)
        assert "&id" not in dumped and "*id" not in dumped, s.name  # the store's copy re-loads
    # the GPU work the default must allow: openinfer-512 at Qwen3 shape, batch 768, 4000 seeds
    p = load_protocol(
        "openinfer-512",
        overrides={"seeds.per_arm": 4000},
        sets=[
            "batch_size=768",
            "models.target=hf-preset:qwen3-0.6b",
            "models.draft=hf-preset:qwen3-0.6b",
        ],
    )
    assert plan_size(p).tokens == 4 * 8 * 3 * 4000 * 32 < DEFAULT_MAX_TOKENS / 8


def test_batch_size_has_an_upper_bound(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"batch_size: expected an integer in \[1, 1048576\]"):
        load_protocol(write_toy(tmp_path), sets=["batch_size=1000000000000"])


# ----------------------------------------------------------------------------- analysis options
@pytest.mark.parametrize(
    ("setting", "field", "message"),
    [
        ("tests.null_permutations=10000000", "tests.null_permutations",
         "expected an integer in [0, 20000], got 10000000"),
        ("tests.alpha=0.999", "tests.alpha", "expected a number in (0, 0.5], got 0.999"),
        ("tests.min_expected=1000000.0", "tests.min_expected",
         "expected a number in (0, 1000], got 1000000.0"),
        ("tests.trie.depth=65", "tests.trie.depth", "expected an integer in [0, 64], got 65"),
        ("tests.trie.min_count=0", "tests.trie.min_count", "expected an integer >= 1, got 0"),
    ],
)  # fmt: skip
def test_analysis_options_are_refused_at_load(
    tmp_path: Path, setting: str, field: str, message: str
) -> None:
    # before: load passed, generation ran (~13 s on ci), then "analysis option ...", no file
    r = ci_run(tmp_path, "--set", setting)
    refused(r, BAD, f"protocols/ci.yaml: {field}: {message}")


def test_cross_field_analysis_rules_are_checked_at_load_too(tmp_path: Path) -> None:
    f = write_toy(tmp_path)
    with pytest.raises(
        ConfigError,
        match=r"toy\.yaml: tests\.null_permutations: expected an integer >= 1 with "
        r"multiplicity 'maxT', got 0",
    ):
        load_protocol(f, sets=["tests.multiplicity=maxT", "tests.null_permutations=0"])


def test_compare_options_are_refused_before_any_file_is_read(tmp_path: Path) -> None:
    nope = tmp_path / "nope.csv"
    r = invoke("compare", "--reference", nope, "--candidate", nope, "--alpha", "0.999")
    refused(r, BAD, "--alpha: expected a number in (0, 0.5], got 0.999")
    r = invoke("compare", "--reference", nope, "--candidate", nope, "--multiplicity", "holm")
    refused(r, BAD, "--multiplicity: expected one of bh, by, maxT, got 'holm'")


# ----------------------------------------------------------------------------- prompts
def test_invalid_utf8_in_a_prompt_file_names_the_file_and_line(tmp_path: Path) -> None:
    pf = tmp_path / "bad.jsonl"
    pf.write_bytes(b'{"id": "p0", "text": "ok"}\n{"id": "p1", "text": "hello \xff\xfe world"}\n')
    r = ci_run(tmp_path, "--set", f"prompts.file={pf}")  # before: exit 4 "internal error"
    refused(r, BAD, f"{pf}: line 2: not UTF-8 text (byte 0xff at column 29")


def test_a_lone_surrogate_escape_is_refused_at_load(tmp_path: Path) -> None:
    pf = tmp_path / "sur.jsonl"
    pf.write_text('{"id": "p0", "text": "a\\ud800b"}\n')
    r = ci_run(tmp_path, "--set", f"prompts.file={pf}")
    refused(r, BAD, f"{pf}: line 1: text of prompt 'p0' is not valid Unicode")


def test_invalid_utf8_in_a_protocol_names_the_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_bytes(b"version: 1\nname: ci\ndescription: caf\xe9\n")
    r = invoke("run", "--config", f, "--no-progress")
    refused(r, BAD, f"{f}: line 3: not UTF-8 text (byte 0xe9")


def test_a_1_mb_prompt_is_refused_by_its_length_before_any_model(tmp_path: Path) -> None:
    pf = tmp_path / "big.jsonl"
    pf.write_text(json.dumps({"id": "big", "text": "a" * 1_000_000}) + "\n")
    r = ci_run(tmp_path, "--set", f"prompts.file={pf}")  # before: 8.8 GB, then exit 4
    refused(
        r, BAD, f"{pf}: line 1: prompt 'big' is 1000001 tokens long",
        f"at most {MAX_PROMPT_TOKENS}",
    )  # fmt: skip


def test_a_line_without_end_is_read_bounded(tmp_path: Path) -> None:
    pf = tmp_path / "endless.jsonl"
    pf.write_bytes(b'{"id": "p0", "text": "' + b"a" * (9 * 2**20))
    r = ci_run(tmp_path, "--set", f"prompts.file={pf}")
    refused(r, BAD, f"{pf}: line 1: longer than 8388608 bytes")


def test_a_prompt_longer_than_the_models_context_is_refused_before_generation(
    tmp_path: Path,
) -> None:
    """The bundled pair's context is 256: 253 bytes + BOS + 4 positions is 2 over."""
    pf = tmp_path / "long.jsonl"
    pf.write_text(json.dumps({"id": "long", "text": "a" * 253}) + "\n")
    out = tmp_path / "out"
    ci = ROOT / "protocols" / "ci.yaml"
    r = invoke("run", "--config", ci, "--set", f"prompts.file={pf}", "--out", out, "--no-progress")
    refused(
        r, BAD, f"{pf}: prompt 'long' is 254 tokens long, longer than the models take: at most 252",
        "context 256 - 4 generated positions",
    )  # fmt: skip
    shards = out / "shards"
    assert not shards.exists() or not any(shards.iterdir())  # nothing was generated


def test_context_limit_of_prompt_token_ids_on_a_real_model(tmp_path: Path) -> None:
    from spectest.models.zoo import load_model

    model = load_model("hf-preset:llama-tiny")  # max_position_embeddings 1024
    pf = tmp_path / "p.jsonl"
    pf.write_text('{"id": "a", "ids": [1, 2, 3]}\n')
    f = write_toy(tmp_path, prompts={"file": str(pf)})
    p = load_protocol(f, sets=["positions=1021"])
    assert prompt_token_ids(p, model.vocab_size, (model, None)) == {"a": [1, 2, 3]}
    p = load_protocol(f, sets=["positions=1022"])
    with pytest.raises(ConfigError, match=r"prompt 'a' is 3 tokens long, .* at most 2 \("):
        prompt_token_ids(p, model.vocab_size, (model, None))
    toy = load_model("toy:V=16,order=2")  # states no context: any length
    assert prompt_token_ids(p, 16, (toy,)) == {"a": [1, 2, 3]}


# ----------------------------------------------------------------------------- names and ids
@pytest.mark.parametrize("bad", ["ci\n", "ci\r", "c\x1bi", "a/b", "..", "x" * 129])
def test_names_with_a_trailing_newline_control_char_or_separator_are_refused(
    tmp_path: Path, bad: str
) -> None:
    r = ci_run(tmp_path, "--set", f"name={json.dumps(bad)}")  # before: run dir "ci\n-aab05bc6d4"
    refused(r, BAD, "protocols/ci.yaml: name: expected a name of letters", repr(bad)[:60])


def test_config_and_prompt_ids_follow_the_same_rule(tmp_path: Path) -> None:
    f = write_toy(tmp_path, configs={"a\n": {"temperature": 0.8}})
    with pytest.raises(ConfigError, match=r"toy\.yaml: configs: expected a name .*'a\\n'"):
        load_protocol(f)
    (tmp_path / "ids.jsonl").write_text('{"id": "p0\\n", "ids": [1]}\n')
    f = write_toy(tmp_path, prompts={"file": "ids.jsonl"})
    with pytest.raises(ConfigError, match=r"ids\.jsonl: line 1: id must be a name .*'p0\\n'"):
        load_protocol(f)
    (tmp_path / "ok.jsonl").write_text('{"id": "p0", "ids": [1]}\n')
    raw = {**TOY, "name": "x" * 128, "prompts": {"file": "ok.jsonl"}}
    assert protocol_from_dict(raw, base_dir=tmp_path).name == "x" * 128


# ----------------------------------------------------------------------------- BYO files
COLS = ["prompt_id", "config_id", "seed", "position", "token_id"]


def byo(n: int = 300, *, seed0: int = 0, tok0: int = 0, rng_seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(rng_seed)
    rows = [
        ("p0", "c0", seed0 + s, t, tok0 + int(rng.integers(0, 5))) for s in range(n) for t in (0, 1)
    ]
    return pd.DataFrame(rows, columns=COLS)


def test_byo_ids_up_to_int64_are_compared_like_small_ones(tmp_path: Path) -> None:
    """seed and token_id are int64 (schema): 2**40 is fine, and relabelling the tokens by a
    constant changes no statistic (before: "samples: column 'token_id' must be < 2**31")."""
    small = (byo(rng_seed=1), byo(rng_seed=2))
    big = tuple(df.assign(seed=df.seed + 2**40, token_id=df.token_id + 2**40) for df in small)
    out = {}
    for tag, pair in (("small", small), ("big", big)):
        ref, cand = tmp_path / f"{tag}-ref.csv", tmp_path / f"{tag}-cand.csv"
        pair[0].to_csv(ref, index=False)
        pair[1].to_csv(cand, index=False)
        r = invoke("compare", "--reference", ref, "--candidate", cand, "--max-mde-tv", "1",
                   "--out", tmp_path / tag, "--no-progress")  # fmt: skip
        assert r.exit_code == 0, r.output
        out[tag] = tmp_path / tag
    tests = [pd.read_parquet(out[t] / "tests.parquet") for t in ("small", "big")]
    pd.testing.assert_frame_equal(tests[0], tests[1])
    h = [pd.read_parquet(out[t] / "histograms.parquet") for t in ("small", "big")]
    assert (h[1].token_id - h[0].token_id == 2**40).all() and h[1]["count"].equals(h[0]["count"])


def test_int64_token_ids_report_their_ids_in_counts_and_trie_prefixes() -> None:
    from spectest.stats.histograms import position_counts, trie_counts

    df = pd.concat([byo(rng_seed=1).assign(arm="reference"), byo(rng_seed=2).assign(arm="x")])
    shifted = df.assign(token_id=df.token_id + 2**40)
    a, b = position_counts(df), position_counts(shifted)
    assert (b.token_id - a.token_id == 2**40).all() and b["count"].equals(a["count"])
    ta = trie_counts(df, depth=1, min_count=10)
    tb = trie_counts(shifted, depth=1, min_count=10)
    assert len(ta) and (tb.token_id - ta.token_id == 2**40).all()
    deep = ta.depth == 1
    assert (tb.prefix[deep].astype(np.int64) - ta.prefix[deep].astype(np.int64) == 2**40).all()


def test_byo_values_beyond_their_type_name_the_file_and_column(tmp_path: Path) -> None:
    f = tmp_path / "pos.csv"
    byo().assign(position=lambda d: d.position + 2**31).to_csv(f, index=False)
    r = invoke("compare", "--reference", f, "--candidate", f)
    refused(r, BAD, f"{f}: column position: expected integers <= 2147483647")
    f = tmp_path / "tok.csv"
    byo().assign(token_id=lambda d: d.token_id.astype(object)).to_csv(f, index=False)
    text = f.read_text().replace(",0\n", f",{2**63}\n", 1)
    f.write_text(text)
    r = invoke("compare", "--reference", f, "--candidate", f)
    refused(r, BAD, f"{f}: column token_id: expected integers <= {2**63 - 1}")


@pytest.mark.parametrize("bad", ["p0\n", "p\x1b0", "a/b", "[/]", "a\\b", "\u2028"])
def test_byo_ids_with_control_chars_or_separators_are_refused(tmp_path: Path, bad: str) -> None:
    f = tmp_path / "ids.parquet"
    byo().assign(prompt_id=bad).to_parquet(f, index=False)
    r = invoke("compare", "--reference", f, "--candidate", f)
    refused(r, BAD, f"{f}: column prompt_id: the id", "holds a control character or a path")


def test_a_2_gb_all_nul_csv_is_refused_at_its_first_byte(tmp_path: Path) -> None:
    f = tmp_path / "nul.csv"
    subprocess.run(["truncate", "-s", "2G", str(f)], check=True)  # sparse: no disk used
    try:
        r = invoke("compare", "--reference", f, "--candidate", f)  # before: 6.6 GB, then OOM
        refused(r, BAD, f"{f}: line 1: NUL byte at byte 0: not a CSV text file")
    finally:
        f.unlink()


def test_nul_bytes_and_endless_lines_after_a_good_header_are_refused_by_line(
    tmp_path: Path,
) -> None:
    good = tmp_path / "good.csv"
    byo().to_csv(good, index=False)
    text = good.read_bytes()
    f = tmp_path / "nul-later.csv"
    f.write_bytes(text + b"\0" * (3 * 2**20))  # past the first block too
    r = invoke("compare", "--reference", f, "--candidate", good)
    refused(r, BAD, f"{f}: line 602: NUL byte at byte {len(text)}")
    f = tmp_path / "long.csv"
    f.write_bytes(text + b"p0," * 40_000)
    r = invoke("compare", "--reference", f, "--candidate", good)
    refused(r, BAD, f"{f}: line 602: longer than 65536 bytes")
    f = tmp_path / "header.csv"
    f.write_bytes(b"a,b,c\n" + b"1,2,3\n" * 10)
    r = invoke("compare", "--reference", f, "--candidate", good)
    refused(r, BAD, f"{f}: missing column(s) prompt_id, config_id, seed, position, token_id")


# ----------------------------------------------------------------------------- unreadable files
def test_unreadable_protocol_files_are_exit_4_naming_them(tmp_path: Path) -> None:
    d = tmp_path / "dir.yaml"
    d.mkdir()
    r = invoke("run", "--config", d, "--no-progress")
    refused(r, INFRA, f"{d}: cannot read the protocol file: is a directory")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # no writer: an open() for reading would block for ever
    r = invoke("run", "--config", fifo, "--no-progress")
    refused(r, INFRA, f"{fifo}: cannot read the protocol file: is a FIFO")
    r = invoke("run", "--config", "/proc/self/mem", "--no-progress")  # read(2) is EIO
    refused(r, INFRA, "/proc/self/mem: cannot read the protocol file: Input/output error")


def test_unreadable_prompt_and_samples_files_are_exit_4_naming_them(tmp_path: Path) -> None:
    fifo = tmp_path / "prompts.fifo"
    os.mkfifo(fifo)
    r = ci_run(tmp_path, "--set", f"prompts.file={fifo}")
    refused(r, INFRA, f"{fifo}: cannot read the prompt file: is a FIFO")
    good = tmp_path / "good.csv"
    byo().to_csv(good, index=False)
    d = tmp_path / "samples.csv"
    d.mkdir()
    r = invoke("compare", "--reference", d, "--candidate", good)
    refused(r, INFRA, f"{d}: cannot read the samples file: is a directory")


SETPRIV = shutil.which("setpriv")


@pytest.mark.skipif(
    os.geteuid() != 0 or SETPRIV is None, reason="drops root's DAC capabilities with setpriv"
)
def test_permission_denied_is_exit_4_not_clicks_usage_error(tmp_path: Path) -> None:
    """Root reads any file, so the CLI runs with CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH
    dropped from its bounding set (still uid 0): mode 000 is then Permission denied, as for a
    user. Before: click's "path ... is not readable", exit 2."""
    locked = tmp_path / "locked.yaml"
    shutil.copy(ROOT / "protocols" / "ci.yaml", locked)
    locked.chmod(0)
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    shutil.copy(ROOT / "protocols" / "ci.yaml", hidden / "ci.yaml")
    hidden.chmod(0o600)  # not searchable
    good = tmp_path / "good.csv"
    byo().to_csv(good, index=False)
    locked_csv = tmp_path / "locked.csv"
    shutil.copy(good, locked_csv)
    locked_csv.chmod(0)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPECTEST_NO_PROGRESS": "1"}
    cases = [
        (["run", "--config", locked], f"{locked}: cannot read the protocol file"),
        (["run", "--config", hidden / "ci.yaml"], f"{hidden / 'ci.yaml'}: cannot read the proto"),
        (["compare", "--reference", locked_csv, "--candidate", good], f"{locked_csv}: cannot"),
    ]
    try:
        for args, part in cases:
            cmd = [SETPRIV, "--bounding-set=-dac_override,-dac_read_search", sys.executable,
                   "-m", "spectest", *map(str, args)]  # fmt: skip
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
            lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
            assert p.returncode == INFRA and len(lines) == 1, p.stderr
            assert part in lines[0] and "Permission denied" in lines[0], lines[0]
    finally:
        hidden.chmod(0o700)


def test_toy_protocol_still_loads_with_every_rule() -> None:
    assert (
        protocol_from_dict(
            {**TOY, "prompts": {"file": "ids-tiny.jsonl"}}, base_dir=ROOT / "protocols" / "prompts"
        ).name
        == "toy"
    )
