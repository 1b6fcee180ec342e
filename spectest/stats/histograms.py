"""Samples table → integer-encoded sequences (``encode_samples`` → ``EncodedSamples``, validated
by ``validate_samples``), prefix-trie node ids, and the tidy count tables the store writes as
histograms (``position_counts``, ``trie_counts``). Knows no statistic, Parquet files or torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from spectest import schema as sc
from spectest.errors import ConfigError, InputError

REQUIRED_COLUMNS = (sc.PROMPT_ID, sc.CONFIG_ID, sc.ARM, sc.SEED, sc.POSITION, sc.TOKEN_ID)
MISSING = -1  # token matrix entry of a position the sequence does not have
_INT_COLUMNS = (sc.SEED, sc.POSITION, sc.TOKEN_ID)


def validate_samples(samples: object, arms: Sequence[str] | None = None) -> pd.DataFrame:
    """Check the columns the statistics need; return ``samples`` unchanged.

    Raises ``InputError`` naming the column (missing, not integer, negative, null) or the arm
    that is absent. ``arms`` are the arm names that must be present.
    """
    if not isinstance(samples, pd.DataFrame):
        raise InputError(f"samples: expected a pandas DataFrame, got {type(samples).__name__!r}")
    for col in REQUIRED_COLUMNS:
        if col not in samples.columns:
            raise InputError(
                f"samples: missing column {col!r} (columns: {list(samples.columns)!r})"
            )
    for col in REQUIRED_COLUMNS:  # the id columns first, then the integer ones
        dtype = samples[col].dtype
        integer = pd.api.types.is_integer_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype)
        if col in _INT_COLUMNS and not integer:
            raise InputError(
                f"samples: column {col!r} must hold integers, got dtype {str(dtype)!r}"
            )
        if samples[col].isna().any():
            raise InputError(f"samples: column {col!r} has null values")
    for col in (sc.POSITION, sc.TOKEN_ID):
        if len(samples) and int(samples[col].min()) < 0:
            bad = int(samples[col].min())
            raise InputError(f"samples: column {col!r} must be >= 0, got {bad!r}")
    if arms is not None:
        present = set(pd.unique(samples[sc.ARM]).tolist())
        for arm in arms:
            if arm not in present:
                raise InputError(
                    f"samples: arm {arm!r} not found (arms present: {sorted(present)!r})"
                )
    return samples


@dataclass(frozen=True)
class EncodedSamples:
    """One row per sequence (cell, arm, seed); sequences ordered by cell, then arm, then seed.

    ``arms[i]`` is the name of arm code ``i``; for a two-arm encoding code 0 is the reference
    arm, code 1 the other arm, so within a cell the reference sequences come first.

    ``tokens`` holds the token ids themselves when they fit int32 (every engine's vocabulary);
    otherwise (a bring-your-own file's int64 ids ≥ 2**31) their ranks among the distinct ids,
    with ``token_values[rank]`` the id. Ranks keep equality and order, which is all any statistic
    uses; ``token_id`` maps entries back wherever an id is reported.
    """

    arms: tuple[str, ...]
    cells: pd.DataFrame  # [C] prompt_id, config_id (row i = cell code i), sorted
    tokens: np.ndarray  # [S, T] int32 token ids, MISSING where the sequence has no token
    seq_cell: np.ndarray  # [S] int64, non-decreasing
    seq_arm: np.ndarray  # [S] int64 index into ``arms``
    seq_seed: np.ndarray  # [S] int64
    cell_start: np.ndarray  # [C+1] int64 sequence offsets of each cell
    row_index: np.ndarray  # [n] int64 position (iloc) of each encoded input row
    row_seq: np.ndarray  # [n] int64 sequence of each encoded input row
    token_values: np.ndarray | None = None  # [U] int64 id of each rank; None: tokens are ids

    def token_id(self, entries: np.ndarray) -> np.ndarray:
        """Token ids of ``tokens`` entries (>= 0) as int64."""
        e = np.asarray(entries, dtype=np.int64)
        return e if self.token_values is None else self.token_values[e]

    @property
    def n_cells(self) -> int:
        return int(self.cells.shape[0])

    @property
    def n_positions(self) -> int:
        return int(self.tokens.shape[1])

    def arm_sizes(self, cell: int) -> np.ndarray:
        """Sequences per arm in ``cell``: [len(arms)] int64."""
        lo, hi = int(self.cell_start[cell]), int(self.cell_start[cell + 1])
        return np.bincount(self.seq_arm[lo:hi], minlength=len(self.arms)).astype(np.int64)


def _codes(col: pd.Series | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense codes of ``col`` ordered like its sorted unique values: (codes [n], uniques [u]).

    NOTE: hashing without sorting and then ranking the (few) uniques is several times faster
    than ``pd.factorize(sort=True)`` on 10⁷ rows; non-negative integers in a small range skip
    hashing altogether (a presence table and a cumulative sum).
    """
    if isinstance(col, pd.Series) and isinstance(col.dtype, pd.CategoricalDtype):
        codes = col.cat.codes.to_numpy().astype(np.int64)
        cats = np.asarray(col.cat.categories)
        used = np.zeros(len(cats), dtype=bool)
        used[codes] = True
        order = np.argsort(cats[used], kind="stable")
        rank = np.full(len(cats), -1, dtype=np.int64)
        rank[np.flatnonzero(used)[order]] = np.arange(int(used.sum()))
        return rank[codes], cats[used][order]
    is_int = pd.api.types.is_integer_dtype(col.dtype) and not pd.api.types.is_bool_dtype(col.dtype)
    values = (col.to_numpy() if isinstance(col, pd.Series) else col) if is_int else None
    if values is not None and values.size:
        lo, hi = int(values.min()), int(values.max())
        if lo >= 0 and hi < max(4 * values.size, 1 << 20):
            present = np.zeros(hi + 1, dtype=bool)
            present[values] = True
            rank = np.cumsum(present, dtype=np.int64) - 1
            return rank[values], np.flatnonzero(present)
    codes, uniques = pd.factorize(col, sort=False)
    uniques = np.asarray(uniques)
    order = np.argsort(uniques, kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank[codes], uniques[order]


def _arm_rows(samples: pd.DataFrame, arms: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, bool]:
    """Every row's index in ``arms`` (−1: another arm), the kept rows' indices, and whether
    every row is kept. Raises ``InputError`` for an arm absent from the samples."""
    arm_codes, arm_names = _codes(samples[sc.ARM])
    names = [str(a) for a in arm_names]
    for arm in arms:
        if arm not in names:
            raise InputError(f"samples: arm {arm!r} not found (arms present: {names!r})")
    lookup = np.array([arms.index(a) if a in arms else -1 for a in names], dtype=np.int64)
    row_arm = lookup[arm_codes]  # [N]
    keep = row_arm >= 0
    all_rows = bool(keep.all())
    return (
        row_arm,
        np.arange(len(samples), dtype=np.int64) if all_rows else np.flatnonzero(keep),
        all_rows,
    )


def _row_cells(
    samples: pd.DataFrame, take: Callable[[np.ndarray], np.ndarray]
) -> tuple[np.ndarray, pd.DataFrame]:
    """Each kept row's cell code (``take`` keeps the rows) and the cells' prompt_id, config_id
    in code order. The full columns are coded, then subset: cheaper than copying the frame."""
    p_codes, p_names = _codes(samples[sc.PROMPT_ID])
    c_codes, c_names = _codes(samples[sc.CONFIG_ID])
    n_conf = max(len(c_names), 1)
    row_cell, cell_keys = _codes(take(p_codes * n_conf + c_codes))
    cells = pd.DataFrame(
        {sc.PROMPT_ID: p_names[cell_keys // n_conf], sc.CONFIG_ID: c_names[cell_keys % n_conf]}
    )
    return row_cell, cells


def encode_samples(samples: pd.DataFrame, arms: Sequence[str]) -> EncodedSamples:
    """Validate and encode the rows of ``arms`` (others are ignored) into a token matrix.

    Raises ``InputError`` for bad columns, an absent arm, or a duplicated
    (prompt_id, config_id, arm, seed, position); ``ConfigError`` for repeated arm names.
    """
    arms = tuple(arms)
    if len(set(arms)) != len(arms) or not arms:
        raise ConfigError(f"arms must be distinct and non-empty, got {arms!r}")
    validate_samples(samples)
    row_arm, row_index, all_rows = _arm_rows(samples, arms)

    def take(a: np.ndarray) -> np.ndarray:
        return a if all_rows else a[row_index]

    row_arm = take(row_arm)
    row_cell, cells = _row_cells(samples, take)
    s_codes, s_values = _codes(take(samples[sc.SEED].to_numpy(dtype=np.int64)))
    n_seeds = max(len(s_values), 1)
    row_seq, seq_keys = _codes((row_cell * len(arms) + row_arm) * n_seeds + s_codes)
    seq_seed = np.asarray(s_values, dtype=np.int64)[seq_keys % n_seeds]
    seq_cell = seq_keys // n_seeds // len(arms)
    seq_arm = seq_keys // n_seeds % len(arms)
    position = take(samples[sc.POSITION].to_numpy(dtype=np.int64))
    n_seq = len(seq_keys)
    n_pos = int(position.max()) + 1 if len(position) else 0
    flat = row_seq * n_pos + position
    occupancy = np.bincount(flat, minlength=n_seq * n_pos) if n_seq else np.zeros(0, np.int64)
    if occupancy.size and occupancy.max() > 1:
        s, t = divmod(int(np.flatnonzero(occupancy > 1)[0]), n_pos)
        cell = cells.iloc[int(seq_cell[s])]
        raise InputError(
            f"samples: duplicated row for prompt_id={cell[sc.PROMPT_ID]!r}, "
            f"config_id={cell[sc.CONFIG_ID]!r}, arm={arms[int(seq_arm[s])]!r}, "
            f"seed={int(seq_seed[s])!r}, position={t!r}"
        )
    tokens = np.full((n_seq, n_pos), MISSING, dtype=np.int32)  # [S, T]
    tok = take(samples[sc.TOKEN_ID].to_numpy(dtype=np.int64))
    token_values = None
    if tok.size and int(tok.max()) > np.iinfo(np.int32).max:  # int64 ids: ranks (see the class)
        tok, token_values = _codes(tok)
        token_values = np.asarray(token_values, dtype=np.int64)
    tokens.reshape(-1)[flat] = tok
    cell_start = np.searchsorted(seq_cell, np.arange(len(cells) + 1)).astype(np.int64)
    return EncodedSamples(
        arms=arms,
        cells=cells,
        tokens=tokens,
        seq_cell=seq_cell.astype(np.int64),
        seq_arm=seq_arm.astype(np.int64),
        seq_seed=seq_seed,
        cell_start=cell_start,
        row_index=row_index,
        row_seq=row_seq,
        token_values=token_values,
    )


def prefix_nodes(tokens: np.ndarray, seq_cell: np.ndarray, depth: int) -> np.ndarray:
    """Trie node of every sequence at every depth: [S, depth+1] int64.

    ``node[s, d]`` identifies (cell, tokens[s, :d]); ids are dense, ordered by cell then
    prefix (lexicographic), and -1 where the sequence is shorter than ``d``. Depth 0 is the
    cell's root.
    """
    assert tokens.ndim == 2 and seq_cell.shape == (tokens.shape[0],) and depth >= 0
    n_seq = tokens.shape[0]
    out = np.full((n_seq, depth + 1), -1, dtype=np.int64)  # [S, D+1]
    if n_seq == 0:
        return out
    codes, _ = pd.factorize(seq_cell, sort=True)
    out[:, 0] = codes
    n_tok = int(max(tokens[:, :depth].max(initial=0), 0)) + 2
    for d in range(1, min(depth, tokens.shape[1]) + 1):
        prev = out[:, d - 1]
        alive = (prev >= 0) & (tokens[:, d - 1] >= 0)
        key = np.where(alive, prev * n_tok + tokens[:, d - 1].astype(np.int64), -1)
        if not alive.any():
            break
        ids, _ = pd.factorize(key[alive], sort=True)
        out[alive, d] = ids
    return out


def position_counts(samples: pd.DataFrame, arms: Sequence[str] | None = None) -> pd.DataFrame:
    """Token counts per (prompt_id, config_id, position, arm, token_id), tidy, sorted.

    Columns: prompt_id, config_id, position, arm, token_id, count (int64). ``arms`` defaults
    to every arm in the table.
    """
    validate_samples(samples, arms)
    if arms is None:
        arms = sorted(pd.unique(samples[sc.ARM]).tolist())
    enc = encode_samples(samples, arms)
    seq_idx, pos = np.nonzero(enc.tokens >= 0)  # [n], [n] row-major: by sequence, position
    tok = enc.tokens[seq_idx, pos].astype(np.int64)
    group = enc.seq_cell[seq_idx] * len(enc.arms) + enc.seq_arm[seq_idx]
    n_pos, n_tok = enc.n_positions, int(tok.max(initial=0)) + 1
    # key order = (cell, position, arm, token)
    cell, arm = group // len(enc.arms), group % len(enc.arms)
    key = ((cell * n_pos + pos) * len(enc.arms) + arm) * n_tok + tok
    codes, uniq = pd.factorize(key, sort=True)
    count = np.bincount(codes, minlength=len(uniq)).astype(np.int64)
    u_tok = uniq % n_tok
    rest = uniq // n_tok
    u_arm = rest % len(enc.arms)
    rest = rest // len(enc.arms)
    u_pos, u_cell = rest % n_pos, rest // n_pos
    return pd.DataFrame(
        {
            sc.PROMPT_ID: enc.cells[sc.PROMPT_ID].to_numpy()[u_cell],
            sc.CONFIG_ID: enc.cells[sc.CONFIG_ID].to_numpy()[u_cell],
            sc.POSITION: u_pos.astype(np.int32),
            sc.ARM: np.asarray(enc.arms, dtype=object)[u_arm],
            sc.TOKEN_ID: enc.token_id(u_tok),
            "count": count,
        }
    )


def format_prefix(tokens: Sequence[int] | np.ndarray) -> str:
    """The text form of a trie prefix: token ids joined by commas ("" for the root)."""
    return ",".join(str(int(t)) for t in tokens)


def trie_counts(
    samples: pd.DataFrame, *, depth: int, min_count: int, arms: Sequence[str] | None = None
) -> pd.DataFrame:
    """Next-token counts per arm at every prefix-trie node of depth 0..``depth``, tidy.

    A node is (cell, prefix of ``d`` tokens); it is kept when every arm in ``arms`` has at
    least ``min_count`` sequences through it. Columns: prompt_id, config_id, depth, prefix
    (``format_prefix``), arm, token_id, count.
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise ConfigError(f"trie depth must be an integer >= 0, got {depth!r}")
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
        raise ConfigError(f"trie min_count must be an integer >= 1, got {min_count!r}")
    validate_samples(samples, arms)
    if arms is None:
        arms = sorted(pd.unique(samples[sc.ARM]).tolist())
    enc = encode_samples(samples, arms)
    nodes = prefix_nodes(enc.tokens, enc.seq_cell, depth)  # [S, D+1]
    depths = range(min(depth, enc.n_positions - 1) + 1)
    frames = [f for d in depths if (f := _depth_counts(enc, nodes, d, min_count)) is not None]
    columns = [sc.PROMPT_ID, sc.CONFIG_ID, "depth", "prefix", sc.ARM, sc.TOKEN_ID, "count"]
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
    return pd.concat(frames, ignore_index=True)[columns]


def _depth_counts(
    enc: EncodedSamples, nodes: np.ndarray, d: int, min_count: int
) -> pd.DataFrame | None:
    """``trie_counts``' rows at depth ``d`` (None: no node kept)."""
    n_arms = len(enc.arms)
    alive = (nodes[:, d] >= 0) & (enc.tokens[:, d] >= 0)
    node, arm = nodes[alive, d], enc.seq_arm[alive]
    tok = enc.tokens[alive, d].astype(np.int64)
    if node.size == 0:
        return None
    n_nodes = int(node.max()) + 1
    sizes = np.bincount(node * n_arms + arm, minlength=n_nodes * n_arms).reshape(n_nodes, n_arms)
    good = sizes.min(axis=1) >= min_count  # [n_nodes]
    sel = good[node]
    if not sel.any():
        return None
    n_tok = int(tok.max()) + 1
    key = (node[sel] * n_arms + arm[sel]) * n_tok + tok[sel]
    codes, uniq = pd.factorize(key, sort=True)
    count = np.bincount(codes, minlength=len(uniq)).astype(np.int64)
    u_tok, rest = uniq % n_tok, uniq // n_tok
    u_arm, u_node = rest % n_arms, rest // n_arms
    # one representative sequence per node gives its cell and prefix
    seq_ids = np.flatnonzero(alive)[sel]
    rep = np.zeros(n_nodes, dtype=np.int64)
    rep[node[sel]] = seq_ids
    prefixes = {
        int(n): format_prefix(enc.token_id(enc.tokens[rep[n], :d])) for n in np.unique(u_node)
    }
    cell = enc.seq_cell[rep[u_node]]
    return pd.DataFrame(
        {
            sc.PROMPT_ID: enc.cells[sc.PROMPT_ID].to_numpy()[cell],
            sc.CONFIG_ID: enc.cells[sc.CONFIG_ID].to_numpy()[cell],
            "depth": np.full(len(uniq), d, dtype=np.int32),
            "prefix": [prefixes[int(n)] for n in u_node],
            sc.ARM: np.asarray(enc.arms, dtype=object)[u_arm],
            sc.TOKEN_ID: enc.token_id(u_tok),
            "count": count,
        }
    )
