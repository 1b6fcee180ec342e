"""Column names and Arrow schemas of the tables that flow between engines, store and stats.

Owns: the *shape* of data (names, types, meaning). Knows nothing about how tables are produced
(engines), written (store) or tested (stats).

Samples (long table, one row per generated token)
-------------------------------------------------
``prompt_id`` string · ``config_id`` string · ``arm`` string · ``seed`` int64 ·
``position`` int32 (0 = first generated token) · ``token_id`` int64.
Optional white-box columns, computed by teacher forcing the local target (and draft) along
each emitted sequence under the *same* sampling pipeline (post temperature/top-k/top-p/min-p):

- ``wb_p`` float64: p_t(x_t), the target's probability of the emitted token;
- ``wb_cdf_lo`` float64: F_t(x_t^-), the target mass of tokens strictly before x_t in an order
  that depends only on the prefix (by p/q descending, ties by id; by p when q is unknown);
- ``wb_p_a`` float64: p_t(A_t) with A_t = {v : q_t(v) > p_t(v)} (0 when q is unknown);
- ``wb_in_a`` bool: x_t in A_t;
- ``wb_overlap`` float64: sum_v min(p_t(v), q_t(v)) (the one-step acceptance probability; NaN
  when q is unknown).

The bring-your-own schema of ``spectest compare`` is the samples table without ``arm``.

Rounds (speculative telemetry, one row per row-round)
-----------------------------------------------------
``prompt_id``, ``config_id``, ``arm``, ``seed``, ``round`` int32, ``position`` int32 (first
position this round emits), ``drafted`` int32, ``accepted`` int32 (length of the accepted
prefix), ``emitted`` int32 (tokens committed this round, accepted + 1 recovered/bonus, capped
by the remaining budget).
"""

from __future__ import annotations

import pyarrow as pa

PROMPT_ID = "prompt_id"
CONFIG_ID = "config_id"
ARM = "arm"
SEED = "seed"
POSITION = "position"
TOKEN_ID = "token_id"
CELL = (PROMPT_ID, CONFIG_ID)

WB_P = "wb_p"
WB_CDF_LO = "wb_cdf_lo"
WB_P_A = "wb_p_a"
WB_IN_A = "wb_in_a"
WB_OVERLAP = "wb_overlap"
WHITEBOX_COLUMNS = (WB_P, WB_CDF_LO, WB_P_A, WB_IN_A, WB_OVERLAP)

# Arm names used by the built-in plan. Teeth arms are named "null", "eps=<value>", "mutant:<name>".
REFERENCE = "reference"
CANDIDATE = "candidate"

SAMPLES_SCHEMA = pa.schema(
    [
        pa.field(PROMPT_ID, pa.string(), nullable=False),
        pa.field(CONFIG_ID, pa.string(), nullable=False),
        pa.field(ARM, pa.string(), nullable=False),
        pa.field(SEED, pa.int64(), nullable=False),
        pa.field(POSITION, pa.int32(), nullable=False),
        pa.field(TOKEN_ID, pa.int64(), nullable=False),
    ]
)
WHITEBOX_FIELDS = [
    pa.field(WB_P, pa.float64()),
    pa.field(WB_CDF_LO, pa.float64()),
    pa.field(WB_P_A, pa.float64()),
    pa.field(WB_IN_A, pa.bool_()),
    pa.field(WB_OVERLAP, pa.float64()),
]
SAMPLES_WB_SCHEMA = pa.schema(list(SAMPLES_SCHEMA) + WHITEBOX_FIELDS)
BYO_SCHEMA = pa.schema([f for f in SAMPLES_SCHEMA if f.name != ARM])

ROUNDS_SCHEMA = pa.schema(
    [
        pa.field(PROMPT_ID, pa.string(), nullable=False),
        pa.field(CONFIG_ID, pa.string(), nullable=False),
        pa.field(ARM, pa.string(), nullable=False),
        pa.field(SEED, pa.int64(), nullable=False),
        pa.field("round", pa.int32(), nullable=False),
        pa.field(POSITION, pa.int32(), nullable=False),
        pa.field("drafted", pa.int32(), nullable=False),
        pa.field("accepted", pa.int32(), nullable=False),
        pa.field("emitted", pa.int32(), nullable=False),
    ]
)

# Analysis tables (one row per test; ``comparison`` names the arm compared with the reference).
# Columns follow ``stats.analyze.CELL_COLUMNS`` / ``TRIE_COLUMNS`` / ``stats.whitebox``; a test
# (tests/test_store.py) keeps them in step.
COMPARISON = "comparison"
_f64, _i64 = pa.float64(), pa.int64()
TESTS_SCHEMA = pa.schema(
    [
        pa.field(PROMPT_ID, pa.string()),
        pa.field(CONFIG_ID, pa.string()),
        pa.field(POSITION, pa.int32()),
        *(pa.field(n, _f64) for n in ("statistic", "pvalue", "p_adj")),
        pa.field("reject", pa.bool_()),
        *(pa.field(n, _i64) for n in ("dof", "n_ref", "n_cand", "n_bins", "pooled_tokens")),
        *(
            pa.field(n, _f64)
            for n in (
                "min_expected",
                "tv",
                "tv_null_mean",
                "tv_null_q95",
                "tv_excess",
                "tv_pvalue",
                "mde_tv",
            )
        ),
        pa.field("status", pa.string()),
        pa.field("pvalue_asymptotic", _f64),
        pa.field("pvalue_permutation", _f64),
        pa.field(COMPARISON, pa.string()),
    ]
)
TRIE_SCHEMA = pa.schema(
    [
        pa.field(PROMPT_ID, pa.string()),
        pa.field(CONFIG_ID, pa.string()),
        pa.field("kind", pa.string()),
        pa.field("depth", _i64),
        pa.field("prefix", pa.string()),
        *(pa.field(n, _f64) for n in ("statistic", "pvalue", "p_adj")),
        pa.field("reject", pa.bool_()),
        *(pa.field(n, _i64) for n in ("dof", "n_ref", "n_cand", "n_bins")),
        pa.field("status", pa.string()),
        pa.field(COMPARISON, pa.string()),
    ]
)
# The sequence family (stats.sequence): pooled rows (prompt_id = config_id = "*") decide,
# per-cell rows locate. Written as sequence.parquet (store.SEQUENCE).
SEQUENCE_SCHEMA = pa.schema(
    [
        pa.field(PROMPT_ID, pa.string()),
        pa.field(CONFIG_ID, pa.string()),
        pa.field("test", pa.string()),
        pa.field("scope", pa.string()),
        *(pa.field(n, _f64) for n in ("statistic", "z", "pvalue", "p_adj")),
        pa.field("reject", pa.bool_()),
        *(pa.field(n, _f64) for n in ("null_mean", "null_sd")),
        *(pa.field(n, _i64) for n in ("n_ref", "n_cand")),
        pa.field("mde", _f64),
        pa.field("unit", pa.string()),
        pa.field(COMPARISON, pa.string()),
    ]
)
# the size of each ε arm / mutant per cell-position (spectest.tooth_size.SIZE_COLUMNS): its TV from
# plain sampling there, ``slack`` the part that bounds what was not computed, ``status`` exact /
# bound / unknown (``tv`` NaN)
TOOTH_SIZES_SCHEMA = pa.schema(
    [
        pa.field(ARM, pa.string()),
        pa.field("variant", pa.string()),
        pa.field(PROMPT_ID, pa.string()),
        pa.field(CONFIG_ID, pa.string()),
        pa.field(POSITION, _i64),
        pa.field("tv", _f64),
        pa.field("slack", _f64),
        pa.field("status", pa.string()),
    ]
)
WHITEBOX_TESTS_SCHEMA = pa.schema(
    [
        pa.field(ARM, pa.string()),
        pa.field("test", pa.string()),
        *(pa.field(n, _f64) for n in ("statistic", "pvalue", "pvalue_one_sided")),
        pa.field("n", _i64),
        pa.field("mde", _f64),
        pa.field("detail", pa.string()),
        pa.field("p_adj", _f64),
        pa.field("reject", pa.bool_()),
        pa.field(COMPARISON, pa.string()),
    ]
)
