"""Validation, encoding and tidy histograms (spectest.stats.histograms)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_stats_sim import samples_frame

from spectest.errors import ConfigError, InputError
from spectest.stats import histograms as h


def _frame(rng, n=30, length=3):
    return samples_frame(
        {
            ("p1", "c1", "reference"): rng.integers(0, 4, size=(n, length)),
            ("p1", "c1", "candidate"): rng.integers(0, 4, size=(n + 5, length)),
            ("p0", "c2", "reference"): rng.integers(0, 4, size=(n, length)),
            ("p0", "c2", "candidate"): rng.integers(0, 4, size=(n, length)),
            ("p0", "c2", "null"): rng.integers(0, 4, size=(n, length)),
        }
    )


@pytest.mark.parametrize(
    "column", ["prompt_id", "config_id", "arm", "seed", "position", "token_id"]
)
def test_missing_column_names_the_column(column):
    df = _frame(np.random.default_rng(0)).drop(columns=[column])
    with pytest.raises(InputError, match=f"missing column '{column}'"):
        h.encode_samples(df, ["reference", "candidate"])


def test_bad_values_raise_one_clear_line():
    df = _frame(np.random.default_rng(0))
    with pytest.raises(InputError, match="'token_id' must hold integers"):
        h.validate_samples(df.assign(token_id=df["token_id"].astype(float)))
    with pytest.raises(InputError, match="'position' must be >= 0, got -1"):
        h.validate_samples(df.assign(position=df["position"] - 1))
    with pytest.raises(InputError, match="arm 'cand' not found"):
        h.encode_samples(df, ["reference", "cand"])
    dup = pd.concat([df, df.iloc[[3]]], ignore_index=True)
    with pytest.raises(InputError, match=r"duplicated row for prompt_id='p1'.*position="):
        h.encode_samples(dup, ["reference", "candidate"])
    with pytest.raises(ConfigError, match="distinct"):
        h.encode_samples(df, ["reference", "reference"])
    with pytest.raises(InputError, match="DataFrame"):
        h.validate_samples([1, 2, 3])
    empty = df.iloc[:0]
    with pytest.raises(InputError, match="arm 'reference' not found"):
        h.encode_samples(empty, ["reference", "candidate"])


def test_encoding_orders_cells_arms_seeds_and_fills_the_token_matrix():
    rng = np.random.default_rng(1)
    df = _frame(rng).sample(frac=1.0, random_state=0)  # row order must not matter
    enc = h.encode_samples(df, ["reference", "candidate"])
    assert list(enc.cells["prompt_id"]) == ["p0", "p1"] and list(enc.cells["config_id"]) == [
        "c2",
        "c1",
    ]
    assert enc.tokens.shape == (30 + 30 + 30 + 35, 3)
    np.testing.assert_array_equal(enc.cell_start, [0, 60, 125])
    np.testing.assert_array_equal(enc.arm_sizes(1), [30, 35])
    # within a cell: reference sequences first, seeds ascending
    assert (np.diff(enc.seq_arm[:60]) >= 0).all() and (np.diff(enc.seq_seed[:30]) > 0).all()
    # every encoded token equals its row; the "null" arm is ignored
    sub = df[df["arm"] != "null"]
    assert len(enc.row_index) == len(sub)
    got = enc.tokens[enc.row_seq, df["position"].to_numpy()[enc.row_index]]
    np.testing.assert_array_equal(got, df["token_id"].to_numpy()[enc.row_index])


def test_categorical_and_string_columns_encode_alike():
    df = _frame(np.random.default_rng(2))
    cat = df.astype({"prompt_id": "category", "config_id": "category", "arm": "category"})
    a, b = (
        h.encode_samples(df, ["reference", "candidate"]),
        h.encode_samples(cat, ["reference", "candidate"]),
    )
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert a.cells.equals(b.cells)


def test_position_counts_equal_a_pandas_groupby():
    df = _frame(np.random.default_rng(3))
    got = h.position_counts(df)
    want = df.groupby(["prompt_id", "config_id", "position", "arm", "token_id"]).size()
    assert got["count"].sum() == len(df)
    got_idx = got.set_index(["prompt_id", "config_id", "position", "arm", "token_id"])["count"]
    assert got_idx.sort_index().to_dict() == want.sort_index().to_dict()
    only = h.position_counts(df, ["null"])
    assert set(only["arm"]) == {"null"}


def test_trie_counts_are_next_token_counts_under_each_kept_prefix():
    rng = np.random.default_rng(4)
    df = _frame(rng, n=200, length=3)
    got = h.trie_counts(df, depth=2, min_count=20, arms=["reference", "candidate"])
    assert set(got["depth"]) <= {0, 1, 2}
    wide = df.pivot_table(
        index=["prompt_id", "config_id", "arm", "seed"], columns="position", values="token_id"
    )
    for (prompt, config, depth, prefix, arm), grp in got.groupby(
        ["prompt_id", "config_id", "depth", "prefix", "arm"]
    ):
        rows = wide.loc[(prompt, config, arm)]
        toks = [int(t) for t in prefix.split(",")] if prefix else []
        mask = np.ones(len(rows), bool)
        for d, t in enumerate(toks):
            mask &= rows[d].to_numpy() == t
        want = pd.Series(rows[depth].to_numpy()[mask]).value_counts().to_dict()
        assert dict(zip(grp["token_id"], grp["count"], strict=True)) == want
        assert mask.sum() >= 20  # every arm has >= min_count sequences through the node
    with pytest.raises(ConfigError, match="min_count"):
        h.trie_counts(df, depth=1, min_count=0)
