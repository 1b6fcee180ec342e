"""The run directory: atomic writes, provenance metadata, manifest-last completeness, resume
guards, corrupt files, and the bring-your-own samples reader. Deterministic, no models."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from spectest import schema
from spectest.byo import read_samples_file
from spectest.errors import ConfigError, ExitCode, InputError
from spectest.files import make_provenance, read_provenance, read_table
from spectest.store import HISTOGRAMS, MANIFEST, SAMPLES, TESTS, RunDir
from spectest.stored import load_run


def samples_df(n_seeds: int = 3, positions: int = 2, arm: str = "reference") -> pd.DataFrame:
    rows = [
        {
            "prompt_id": "p0",
            "config_id": "c",
            "arm": arm,
            "seed": s,
            "position": t,
            "token_id": (s + t) % 5,
        }
        for s in range(n_seeds)
        for t in range(positions)
    ]
    return pd.DataFrame(rows)


PROV = {"protocol_hash": "abc", "device": "cpu"}


def test_shard_write_read_and_provenance(tmp_path: Path) -> None:
    rd = RunDir.open(tmp_path / "run", {"kind": "run", "protocol_hash": "abc"})
    assert not rd.shard_done("reference__p0")
    rd.write_shard("reference__p0", samples_df(), None, PROV)
    assert rd.shard_done("reference__p0")
    assert rd.completed_shards(["reference__p0", "candidate__p0"]) == ["reference__p0"]
    back, rounds = rd.read_shard("reference__p0")
    assert rounds is None
    pd.testing.assert_frame_equal(back, samples_df().astype(back.dtypes.to_dict()))
    assert str(back["position"].dtype) == "int32" and str(back["token_id"].dtype) == "int64"
    f = tmp_path / "run" / "shards" / "reference__p0.samples.parquet"
    assert read_provenance(f) == PROV
    assert not list((tmp_path / "run" / "shards").glob(".*tmp"))  # no temporaries left
    mask = os.umask(0)
    os.umask(mask)
    assert f.stat().st_mode & 0o777 == 0o666 & ~mask  # an ordinary file, not mkstemp's 0600


def test_manifest_last_and_incomplete_runs_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    rd = RunDir.open(
        run, {"kind": "run", "protocol_hash": "abc"}, protocol_yaml="version: 1\n", prompts=""
    )
    with pytest.raises(InputError, match=r"no manifest\.json: the run is incomplete") as info:
        load_run(run)
    assert info.value.exit_code == ExitCode.BAD_INPUT
    prov = make_provenance(
        protocol_hash="abc", device="cpu", seed_ranges={"reference": [0, 3]}, kind="run"
    )
    assert {"git_sha", "packages", "device", "seed_ranges", "protocol_hash"} <= set(prov)
    manifest = rd.write_final(
        tables={
            SAMPLES: (samples_df(), schema.SAMPLES_SCHEMA),
            HISTOGRAMS: (pd.DataFrame({"count": [6]}), None),  # every run has these two
            TESTS: (pd.DataFrame({"pvalue": [0.5]}), None),
        },
        summary={"decision": "equivalent"},
        texts={"report.md": "# r\n"},
        provenance=prov,
    )
    assert set(manifest["files"]) >= {SAMPLES, "summary.json", "report.md", "run.json"}
    stored = load_run(run)
    assert stored.summary == {
        "decision": "equivalent",
        "complete": True,
        "data_files": [HISTOGRAMS, SAMPLES, TESTS],  # the tables written (report.md: a view)
    }
    assert len(stored.table(SAMPLES)) == 6
    assert read_provenance(run / SAMPLES)["seed_ranges"] == {"reference": [0, 3]}
    # reopening (resume / re-analysis) removes the manifest first: never half-complete
    RunDir.open(run, {"kind": "run", "protocol_hash": "abc"})
    assert not (run / MANIFEST).exists()


def test_other_protocol_or_foreign_dir_refused(tmp_path: Path) -> None:
    RunDir.open(tmp_path / "run", {"kind": "run", "protocol_hash": "abc"})
    with pytest.raises(ConfigError, match=r"holds a 'run' run of protocol hash 'abc', not 'xyz'"):
        RunDir.open(tmp_path / "run", {"kind": "run", "protocol_hash": "xyz"})
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "thesis.tex").write_text("x")
    with pytest.raises(ConfigError, match=r"non-empty directory that is not a spectest run"):
        RunDir.open(tmp_path / "foreign", {"kind": "run", "protocol_hash": "abc"})


def test_corrupt_and_modified_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(InputError, match=r"bad\.parquet: not a readable Parquet file") as info:
        read_table(bad)
    assert "\n" not in str(info.value)
    run = tmp_path / "run"
    rd = RunDir.open(run, {"kind": "run", "protocol_hash": "abc"})
    rd.write_final(tables={SAMPLES: (samples_df(), None)}, summary={}, texts={}, provenance=PROV)
    (run / SAMPLES).write_bytes(b"garbage")
    with pytest.raises(InputError, match=r"samples\.parquet: size differs from manifest\.json"):
        load_run(run)


def write_byo(tmp_path: Path, df: pd.DataFrame, fmt: str) -> Path:
    f = tmp_path / f"s.{fmt}"
    if fmt == "csv":
        df.to_csv(f, index=False)
    else:
        df.to_parquet(f, index=False)
    return f


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_byo_reads_both_formats(tmp_path: Path, fmt: str) -> None:
    df = samples_df().drop(columns=["arm"])
    df["prompt_id"] = "7"  # numeric-looking ids stay strings
    got = read_samples_file(write_byo(tmp_path, df, fmt))
    assert list(got.columns) == [f.name for f in schema.BYO_SCHEMA]
    assert got["prompt_id"].tolist() == ["7"] * 6
    assert (
        str(got["position"].dtype) == "int32"
        and got["token_id"].tolist() == df["token_id"].tolist()
    )


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
@pytest.mark.parametrize(
    ("mutate", "pattern"),
    [
        (
            lambda d: d.drop(columns=["position"]),
            r"missing column\(s\) position \(expected prompt_id",
        ),
        (
            lambda d: d.assign(token_id=["x"] * len(d)),
            r"column token_id: expected integers, got 'x' at row 0",
        ),
        (
            lambda d: d.assign(seed=[0.5] * len(d)),
            r"column seed: expected integers, got 0\.5 at row 0",
        ),
        (
            lambda d: d.assign(position=[-1] * len(d)),
            r"column position: expected integers >= 0, got -1",
        ),
        (lambda d: pd.concat([d, d.iloc[:1]]), r"duplicate row for .* = \('p0', 'c', 0, 0\)"),
        (lambda d: d.iloc[:0], r"holds no samples"),
    ],
)
def test_byo_bad_files_are_one_line(tmp_path: Path, fmt: str, mutate, pattern: str) -> None:
    f = write_byo(tmp_path, mutate(samples_df().drop(columns=["arm"])), fmt)
    with pytest.raises(InputError, match=pattern) as info:
        read_samples_file(f)
    assert str(info.value).startswith(str(f)) and "\n" not in str(info.value)


def test_byo_missing_and_unparsable(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"no such samples file"):
        read_samples_file(tmp_path / "nope.csv")
    f = tmp_path / "x.parquet"
    f.write_text("not parquet")
    with pytest.raises(InputError, match=r"x\.parquet: not a readable Parquet file"):
        read_samples_file(f)


def test_analysis_schemas_match_the_analysis_columns() -> None:
    """tests/trie/whitebox.parquet are written with explicit schemas: keep them in step with the
    columns ``stats.battery`` produces (plus the ``comparison`` column the runner adds)."""
    from spectest import schema
    from spectest.stats.battery import CELL_COLUMNS, SEQUENCE_COLUMNS, TRIE_COLUMNS
    from spectest.stats.whitebox import WHITEBOX_COLUMNS

    assert schema.TESTS_SCHEMA.names == [*CELL_COLUMNS, schema.COMPARISON]
    assert schema.TRIE_SCHEMA.names == [*TRIE_COLUMNS, schema.COMPARISON]
    assert schema.SEQUENCE_SCHEMA.names == [*SEQUENCE_COLUMNS, schema.COMPARISON]
    assert schema.WHITEBOX_TESTS_SCHEMA.names == [
        *WHITEBOX_COLUMNS,
        "p_adj",
        "reject",
        schema.COMPARISON,
    ]


# ------------------------------------------------------ bring-your-own: positions (issue 9)
def byo_df(n_seeds: int = 3, positions: int = 4) -> pd.DataFrame:
    return samples_df(n_seeds, positions).drop(columns=["arm"])


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_byo_position_beyond_int32_is_refused_not_wrapped(tmp_path: Path, fmt: str) -> None:
    """The issue's exact input: 2**32 + 100 used to become position 100."""
    df = byo_df()
    df.loc[5, "position"] = 2**32 + 100
    f = write_byo(tmp_path, df, fmt)
    with pytest.raises(InputError) as info:
        read_samples_file(f)
    msg = str(info.value)
    assert msg == (
        f"{f}: column position: expected integers <= 2147483647 (the position column is "
        f"32-bit), got {2**32 + 100} at row 5"
    )
    assert info.value.exit_code == ExitCode.BAD_INPUT


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_byo_negative_position_is_refused(tmp_path: Path, fmt: str) -> None:
    df = byo_df()
    df.loc[2, "position"] = -3
    f = write_byo(tmp_path, df, fmt)
    with pytest.raises(InputError) as info:
        read_samples_file(f)
    assert str(info.value) == f"{f}: column position: expected integers >= 0, got -3 at row 2"


def test_byo_seed_and_token_beyond_int64_are_refused(tmp_path: Path) -> None:
    """Values beyond int64 (CSV keeps them as text) are named exactly, never wrapped."""
    for col in ("seed", "token_id"):
        df = byo_df().astype({col: object})
        df.loc[1, col] = 2**64 + 5
        f = write_byo(tmp_path, df, "csv")
        with pytest.raises(InputError, match=rf"column {col}: expected integers <= {2**63 - 1}"):
            read_samples_file(f)
    df = byo_df().astype({"seed": "uint64"})
    df.loc[0, "seed"] = 2**63  # a Parquet uint64 column beyond int64
    f = write_byo(tmp_path, df, "parquet")
    with pytest.raises(InputError, match=rf"column seed: .* got {2**63} at row 0"):
        read_samples_file(f)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_byo_gap_in_positions_is_refused(tmp_path: Path, fmt: str) -> None:
    """A sequence with positions 0, 1, 3 (2 missing) is a gap: exit 2 naming the sequence."""
    df = byo_df(n_seeds=3, positions=4)
    df = df[~((df["seed"] == 1) & (df["position"] == 2))].reset_index(drop=True)
    f = write_byo(tmp_path, df, fmt)
    with pytest.raises(InputError) as info:
        read_samples_file(f)
    assert str(info.value) == (
        f"{f}: column position: sequence (prompt_id, config_id, seed) = ('p0', 'c', 1) has "
        "position 3 but not 2: a gap (1 sequence(s) with gaps; positions must run 0, 1, ..., n-1)"
    )
    # a sequence that does not start at 0 has a gap too
    df = byo_df(n_seeds=2, positions=3)
    df = df[~((df["seed"] == 0) & (df["position"] == 0))]
    with pytest.raises(InputError, match=r"\('p0', 'c', 0\) has position 1 but not 0: a gap"):
        read_samples_file(write_byo(tmp_path, df, fmt))


def test_byo_sequences_that_stop_early_are_not_gaps(tmp_path: Path) -> None:
    """Positions 0..5 of 0..31 is a shorter sequence (EOS), read as it is: its length is part
    of the law and tested as such, not a malformed file."""
    df = byo_df(n_seeds=4, positions=32)
    short = df[(df["seed"] != 2) | (df["position"] <= 5)]
    got = read_samples_file(write_byo(tmp_path, short, "parquet"))
    lengths = got.groupby("seed")["position"].size().to_dict()
    assert lengths == {0: 32, 1: 32, 2: 6, 3: 32}
