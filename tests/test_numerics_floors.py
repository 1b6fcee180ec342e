"""Issue 31 item 5: claim (b)'s floors beyond the batch floor — the prefix-cache prefill floor
(position 0 measured instead of 0 by construction), the dtype floor, and ``auto`` moving on from
a floor that is identically 0 (bit-identical) and saying so."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from toy_protocol import TOY, write_toy

from spectest import schema
from spectest.engines.base import DecodeRequest, DrafterSpec, RowSpec, rounds_frame, samples_frame
from spectest.engines.builtin import speculative_decode
from spectest.errors import ConfigError
from spectest.models.zoo import load_model
from spectest.numerics.decode import decode_logits
from spectest.numerics.floors import complete_floors, floor_column
from spectest.numerics.table import drift_table
from spectest.protocol import load_protocol
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams
from spectest.stats.drift import decide_drift, select_floor

PLAIN = "toy:V=16,order=2,scale=2.0,seed=3"
NUM_TARGET = PLAIN + ",numerics=0.02"
SP = SamplingParams(temperature=0.8, top_p=0.95)
PROMPT = [1, 2, 3]


def _matched(target, n=16, T=6, K=3):
    draft = load_model("toy:V=16,order=2,scale=1.0,seed=4")
    rows = [RowSpec("a", s, SP) for s in range(n)]
    out = speculative_decode(
        target,
        draft,
        DecodeRequest(
            PROMPT, rows, num_positions=T, run_key=7, prompt_id="p0", batch_size=n, whitebox=True
        ),
        drafter=DrafterSpec(onehot=True, k=K),
        variant=get_variant("exact"),
    )
    s = samples_frame(np.asarray(out.tokens), "p0", rows, "matched", out.whitebox)
    return s, rounds_frame(out.rounds, "p0", rows, "matched")


def _drift(target, floor_rows=4):
    s, r = _matched(target)
    t = drift_table(
        target, s, r, {"p0": PROMPT}, [("a", SP)], arm="matched", K=3, batch_size=16,
        positions=6, rows_per_cell=16, floor_rows_per_cell=floor_rows,
    )  # fmt: skip
    return s, t


def _measure(target, s, t, f32=None):
    def measure(kind):
        return floor_column(
            kind, t, target, s, {"p0": PROMPT}, [("a", SP)], arm="matched", batch_size=16,
            positions=6, float32_target=f32,
        )  # fmt: skip

    return measure


# ----------------------------------------------------------------------------- measurement
def test_prefix_cache_split_changes_the_law_only_through_numerics() -> None:
    toks = torch.randint(0, 16, (4, 6), generator=torch.Generator().manual_seed(1))
    keep, prompt = torch.arange(4), torch.tensor(PROMPT)
    plain = load_model(PLAIN)  # no numerics: the split is exact, bit for bit
    a, b = (
        decode_logits(plain, prompt, toks, keep),
        decode_logits(plain, prompt, toks, keep, split=2),
    )
    assert torch.equal(a, b)
    m = load_model(NUM_TARGET)  # width-dependent numerics: position 0 differs, and what follows
    a, b = decode_logits(m, prompt, toks, keep), decode_logits(m, prompt, toks, keep, split=2)
    assert not torch.equal(a[:, 0], b[:, 0])


def test_prefill_floor_on_every_drift_sequence_and_nan_without_a_split() -> None:
    target = load_model(NUM_TARGET)
    s, t = _drift(target)
    col = _measure(target, s, t)("prefill")
    assert col.shape == (len(t),) and np.isfinite(col).all() and (col > 0).any()
    one = floor_column(
        "prefill", t.assign(prompt_id="p0"), target, s, {"p0": [1]}, [("a", SP)],
        arm="matched", batch_size=16, positions=6,
    )  # fmt: skip
    assert np.isnan(one).all()  # a one-token prompt has no prefix-cache split: not measured


def test_dtype_floor_needs_and_uses_the_float32_target() -> None:
    target = load_model(NUM_TARGET)
    s, t = _drift(target)
    with pytest.raises(ValueError, match="float32"):
        _measure(target, s, t)("dtype")
    col = _measure(target, s, t, lambda: load_model(PLAIN))("dtype")  # "float32": σ = 0
    assert np.isfinite(col).all() and (col > 0).any()
    same = _measure(target, s, t, lambda: load_model(NUM_TARGET))("dtype")
    assert (same == 0).all()  # the same model in both: identically 0


# ----------------------------------------------------------------------------- auto
def test_auto_stops_at_a_batch_floor_that_measures_something() -> None:
    target = load_model(NUM_TARGET)
    s, t = _drift(target)
    out = complete_floors(t, "auto", _measure(target, s, t))
    assert "floor_prefill_tv" not in out.columns  # nothing more measured
    kind, tab, note = select_floor(out, "auto")
    assert (kind, note) == ("batch", "") and tab["floor_tv"].equals(t["floor_tv"])


def test_auto_moves_on_from_identically_zero_floors_and_says_so() -> None:
    target = load_model(PLAIN)  # no numerics: every floor bit-identical
    s, t = _drift(target)
    out = complete_floors(t, "auto", _measure(target, s, t, lambda: load_model(PLAIN)))
    assert {"floor_prefill_tv", "floor_dtype_tv"} <= set(out.columns)
    kind, _, note = select_floor(out, "auto")
    assert kind == "dtype" and "every floor measured identically 0" in note
    r = decide_drift(
        select_floor(out, "auto")[1], margin=0.002, alpha=0.05, rng=np.random.default_rng(0),
        floor_kind=kind, floor_note=note,
    )  # fmt: skip
    assert r is not None and "measures nothing" in r.line and "measures nothing" in str(r.to_dict())


def _tab(batch: float, prefill: float | None) -> pd.DataFrame:
    n = 6
    d = {
        schema.PROMPT_ID: "p0", schema.CONFIG_ID: "a", schema.SEED: np.arange(n),
        schema.POSITION: 0, "tv": np.linspace(0.001, 0.003, n), "flip": False,
        "floor_tv": np.full(n, batch),
    }  # fmt: skip
    if prefill is not None:
        d["floor_prefill_tv"] = np.linspace(0.0, 2 * prefill, n)
    return pd.DataFrame(d)


def test_select_floor_names_what_it_passed_over() -> None:
    kind, tab, note = select_floor(_tab(0.0, 0.001), "auto")
    assert (kind, note) == ("prefill", "auto: batch identically 0, skipped")
    assert tab["floor_tv"].tolist() == _tab(0.0, 0.001)["floor_prefill_tv"].tolist()
    assert "floor_prefill_tv" not in tab.columns
    kind, tab, note = select_floor(_tab(0.0, 0.001), "batch")  # asked for: kept, and said
    assert kind == "batch" and (tab["floor_tv"] == 0).all() and "measures nothing" in note
    r = decide_drift(tab, margin=0.002, alpha=0.05, rng=np.random.default_rng(0),
                     floor_kind=kind, floor_note=note)  # fmt: skip
    assert r is not None and "floor (batch; identically 0: bit-identical" in r.line
    kind, _, note = select_floor(_tab(0.0, None), "auto")  # an old table: batch only
    assert kind == "batch" and "measures nothing" in note
    kind, _, note = select_floor(_tab(0.0005, 0.001), "auto")
    assert (kind, note) == ("batch", "")
    kind, tab, _ = select_floor(_tab(0.0005, None), "prefill")  # asked for, not measured
    assert kind == "prefill" and tab["floor_tv"].isna().all()


# ----------------------------------------------------------------------------- protocol
def test_floor_settings_parse_and_hash(tmp_path: Path) -> None:
    def proto(name: str, **tests: object):
        return load_protocol(write_toy(tmp_path / name, tests={**TOY["tests"], **tests}))

    base = proto("a")
    assert base.tests.numerics_floor == "auto"
    assert proto("b", numerics_floor="auto").hash == base.hash
    for kind in ("batch", "prefill", "dtype"):
        p = proto(kind, numerics_floor=kind)
        assert p.hash != base.hash and p.tests.canonical()["numerics_floor"] == kind
    with pytest.raises(ConfigError, match=r"tests\.numerics_floor"):
        proto("bad", numerics_floor="alone")
    assert math.isfinite(base.tests.numerics_margin)


def test_numerics_parquet_keeps_every_floor_measured(tmp_path: Path) -> None:
    """numerics.parquet holds the extra floors' columns (``spectest analyze`` re-decides with
    the floor the run used); a table with the batch floor only is written as before."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spectest.schema import NUMERICS_SCHEMA, numerics_schema

    t = _tab(0.0, 0.001)
    t["floor_dtype_tv"] = 0.002
    path = tmp_path / "numerics.parquet"
    pq.write_table(pa.Table.from_pandas(t, schema=numerics_schema(t.columns)), path)
    back = pd.read_parquet(path)
    assert {"floor_prefill_tv", "floor_dtype_tv"} <= set(back.columns)
    assert select_floor(back, "auto")[:1] == ("prefill",)
    assert numerics_schema(_tab(0.0, None).columns) == NUMERICS_SCHEMA
