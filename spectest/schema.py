"""Column names and Arrow schemas of the tables that flow between engines, store and stats.

Owns the *shape* of data (names, types); not how tables are produced (engines), written (store)
or tested (stats). What each column means: docs/run-directory.md "The tables (spectest/schema.py)".
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

# Values that cross every layer (engines, sampling, protocol), defined here once:
PLACEHOLDER_TOKEN_ID = -1  # no token: past a sequence's end, or after a round's last emitted token
DRAFTER_KINDS = ("onehot", "sampled")  # a drafter proposes its argmax, or samples from q
Q_MODES = ("processed", "temperature", "raw")  # how a drafter's q is built from its logits

WB_P = "wb_p"
WB_CDF_LO = "wb_cdf_lo"
WB_P_A = "wb_p_a"
WB_IN_A = "wb_in_a"
WB_OVERLAP = "wb_overlap"
WHITEBOX_COLUMNS = (WB_P, WB_CDF_LO, WB_P_A, WB_IN_A, WB_OVERLAP)
WB_ROLE = "wb_role"
WB_SLOT = "wb_slot"
WB_ROLE_P = "wb_role_p"
WB_ROLE_CDF_LO = "wb_role_cdf_lo"
WB_ROLE_RATIO = "wb_role_ratio"
WB_ROLE_BEYOND = "wb_role_beyond"
WB_ROLE_TAIL = "wb_role_tail"
ROLE_COLUMNS = (
    WB_ROLE,
    WB_SLOT,
    WB_ROLE_P,
    WB_ROLE_CDF_LO,
    WB_ROLE_RATIO,
    WB_ROLE_BEYOND,
    WB_ROLE_TAIL,
)
REP_P = "rep_p"
REP_CDF_LO = "rep_cdf_lo"
REP_MASS = "rep_mass"
REPORTED_COLUMNS = (REP_P, REP_CDF_LO, REP_MASS)
ROLES = ("plain", "accepted", "recovered", "bonus")  # an emitted token's role; code = index

# Arm names used by the built-in plan. Teeth arms are named "null", "eps=<value>", "mutant:<name>".
REFERENCE = "reference"
CANDIDATE = "candidate"

_ROW_KEY = [  # a generated row's key, first in the samples and the rounds
    pa.field(PROMPT_ID, pa.string(), nullable=False),
    pa.field(CONFIG_ID, pa.string(), nullable=False),
    pa.field(ARM, pa.string(), nullable=False),
    pa.field(SEED, pa.int64(), nullable=False),
]
SAMPLES_SCHEMA = pa.schema(
    [
        *_ROW_KEY,
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
ROLE_FIELDS = [
    pa.field(WB_ROLE, pa.string()),
    pa.field(WB_SLOT, pa.int32()),
    pa.field(WB_ROLE_P, pa.float64()),
    pa.field(WB_ROLE_CDF_LO, pa.float64()),
    pa.field(WB_ROLE_RATIO, pa.float64()),
    pa.field(WB_ROLE_BEYOND, pa.bool_()),
    pa.field(WB_ROLE_TAIL, pa.float64()),
]
SAMPLES_ROLE_SCHEMA = pa.schema(list(SAMPLES_WB_SCHEMA) + ROLE_FIELDS)
REPORTED_FIELDS = [pa.field(c, pa.float64()) for c in REPORTED_COLUMNS]
BYO_SCHEMA = pa.schema([f for f in SAMPLES_SCHEMA if f.name != ARM])

ROUNDS_SCHEMA = pa.schema(
    [
        *_ROW_KEY,
        *(pa.field(n, pa.int32(), nullable=False) for n in ("round", POSITION)),
        *(pa.field(n, pa.int32(), nullable=False) for n in ("drafted", "accepted", "emitted")),
    ]
)

# Analysis tables (one row per test; ``comparison`` names the arm compared with the reference).
# Columns follow ``stats.battery.CELL_COLUMNS`` / ``TRIE_COLUMNS`` / ``stats.whitebox``; a test
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
# the matched arm's numerics drift per measured sequence and position (numerics.table.COLUMNS):
# ``tv`` verify vs decode in the run's batch, ``flip`` their argmax differs, ``floor_tv`` decode in
# the batch vs alone (NaN: not a floor sequence)
NUMERICS_SCHEMA = pa.schema(
    [
        pa.field(PROMPT_ID, pa.string()),
        pa.field(CONFIG_ID, pa.string()),
        pa.field(SEED, _i64),
        pa.field(POSITION, _i64),
        pa.field("tv", _f64),
        pa.field("flip", pa.bool_()),
        pa.field("floor_tv", _f64),
    ]
)
NUMERICS_FLOOR_COLUMNS = ("floor_prefill_tv", "floor_dtype_tv")  # spectest.numerics.floors


def numerics_schema(columns: object) -> pa.Schema:
    """``NUMERICS_SCHEMA`` with the extra floors' columns the table holds, in order:
    a table without them is written exactly as before."""
    have = set(columns)  # type: ignore[call-overload]
    extra = [pa.field(c, _f64) for c in NUMERICS_FLOOR_COLUMNS if c in have]
    return pa.schema(list(NUMERICS_SCHEMA) + extra)


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
