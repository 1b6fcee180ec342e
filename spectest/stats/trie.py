"""Prefix-conditional tests: next-token tables at every prefix-trie node (``build_trie_table``),
node χ² and the chain-rule G² over the trie (``chain_rule_g2``) with its slow scipy reference
(``g2_table``), and their family (``TrieFamily``: per cell, corrected together by BH, BY under
'by' or 'maxT'; its table ``TRIE_COLUMNS``, trie.parquet). Knows no other family, files or
torch. docs/statistics.md ("Marginals are not enough").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy import stats

from spectest import schema as sc
from spectest.stats import families, homogeneity, multiplicity
from spectest.stats.families import FamilyInputs, FamilyResult, empty_frame
from spectest.stats.histograms import format_prefix, prefix_nodes
from spectest.stats.homogeneity import chi2_statistics, pool_table
from spectest.stats.tables import (
    StrataTable,
    build_table,
    ref_counts,
    segment_sum,
    stratum_arm_sizes,
)

TRIE_COLUMNS = [
    sc.PROMPT_ID,
    sc.CONFIG_ID,
    "kind",
    "depth",
    "prefix",
    *homogeneity.CHI2_COLUMNS,
    "status",
]


@dataclass(frozen=True)
class TrieTable:
    """The node tables of one cell's trie: node = stratum of ``table``."""

    table: StrataTable  # strata = nodes with >= 2 sequences
    node_depth: np.ndarray  # [S] int64 prefix length of each node
    node_rep: np.ndarray  # [S] int64 a sequence through the node (gives its prefix)


@dataclass(frozen=True)
class ChainG2Result:
    """Chain-rule G² over a trie with its sequence-permutation p-value."""

    statistic: float
    pvalue: float  # (1 + #{G²_b >= G²_obs}) / (B + 1); NaN when B = 0
    dof: int  # nominal: Σ over nodes of (distinct next tokens − 1)
    n_nodes: int
    n_permutations: int


def build_trie_table(tokens: np.ndarray, depth: int, *, merge_singletons: bool = True) -> TrieTable:
    """Next-token tables at every node of depth 0..``depth`` of one cell's sequences.

    ``tokens``: [n, T] int token matrix of the cell (-1 = absent). Nodes with a single
    sequence are dropped: their G² is 0 under every labeling and they are never testable.
    """
    assert tokens.ndim == 2 and depth >= 0
    n_seq, n_pos = tokens.shape
    depth = min(depth, n_pos - 1)
    if depth < 0 or n_seq == 0:
        empty = build_table(np.zeros(0), np.zeros(0), np.zeros(0), n_seq=n_seq)
        return TrieTable(empty, np.zeros(0, np.int64), np.zeros(0, np.int64))
    nodes = prefix_nodes(tokens, np.zeros(n_seq, dtype=np.int64), depth)  # [n, D+1]
    tok = tokens[:, : depth + 1].astype(np.int64)  # [n, D+1]
    valid = (nodes >= 0) & (tok >= 0)  # [n, D+1]
    n_per_depth = np.array([nodes[:, d].max(initial=-1) + 1 for d in range(depth + 1)])
    offset = np.concatenate([[0], np.cumsum(n_per_depth)])  # [D+2]
    label = np.where(valid, nodes + offset[None, :-1], -1)  # [n, D+1] global node label
    size = np.bincount(label[valid], minlength=int(offset[-1]))  # [nodes] sequences per node
    valid &= size[np.maximum(label, 0)] >= 2
    seq = np.broadcast_to(np.arange(n_seq)[:, None], label.shape)
    # row-major flattening keeps entries sorted by sequence, as build_table needs
    table = build_table(
        label[valid], tok[valid], seq[valid], n_seq=n_seq, merge_singletons=merge_singletons
    )
    node_depth = np.searchsorted(offset, table.strata, side="right") - 1
    rep = np.zeros(int(offset[-1]), dtype=np.int64)
    rep[label[valid]] = seq[valid]
    return TrieTable(table, node_depth.astype(np.int64), rep[table.strata])


def _xlogx(n: int) -> np.ndarray:
    """Table f[i] = i·ln i for i = 0..n (f[0] = 0): [n+1] float64."""
    i = np.arange(n + 1, dtype=np.float64)
    return i * np.log(np.maximum(i, 1.0))


def g2_statistics(
    table: StrataTable, ref: np.ndarray, n_ref: np.ndarray, n_cand: np.ndarray
) -> np.ndarray:
    """Unpooled G² = 2 Σ O·ln(O/E) of every stratum under every labeling: [S, L] float64.

    ``ref``: [K, L] integer reference counts per key row; ``n_ref``, ``n_cand``: [S, L].

    Notes
    -----
    Uses the margin form of a 2 × J table, G² = 2·[Σ_j (f(a_j) + f(b_j) − f(c_j)) − f(n_a)
    − f(n_b) + f(n)] with f(x) = x·ln x: integer counts make f a table lookup (no log per
    cell). A token seen once adds f(1) + f(0) − f(1) = 0, so merged singleton rows drop out;
    a stratum with an empty arm gets 0. NOTE: float64 throughout — the form subtracts sums of
    size ~n·ln n, which float32 would cancel badly. Tested equal to ``g2_table`` (scipy).
    """
    K, L = ref.shape
    assert K == table.n_keys and n_ref.shape == (table.n_strata, L) == n_cand.shape
    f = _xlogx(max(table.n_seq, int(table.key_total.max(initial=0))))
    keep = np.flatnonzero(~table.is_singleton_row)
    a = ref[keep]  # [K', L]
    c = table.key_total[keep]  # [K']
    term = f[a]  # [K', L]
    term += f[c[:, None] - a]
    term -= f[c][:, None]
    agg = sp.csr_matrix(
        (np.ones(keep.size), (table.key_stratum[keep], np.arange(keep.size))),
        shape=(table.n_strata, keep.size),
    )
    per = np.asarray(agg @ term)  # [S, L]
    per -= f[n_ref] + f[n_cand] - f[n_ref + n_cand]
    return 2.0 * per


def g2_table(ref_counts: np.ndarray, cand_counts: np.ndarray) -> float:
    """G² of one 2 × J table: ``scipy.stats.chi2_contingency(t, correction=False,
    lambda_="log-likelihood").statistic`` on the non-empty columns (0 if < 2 columns or an
    empty arm)."""
    t = np.vstack([np.asarray(ref_counts), np.asarray(cand_counts)]).astype(np.float64)  # [2, J]
    t = t[:, t.sum(axis=0) > 0]
    if t.shape[1] < 2 or (t.sum(axis=1) == 0).any():
        return 0.0
    return float(stats.chi2_contingency(t, correction=False, lambda_="log-likelihood").statistic)


def chain_rule_g2(trie: TrieTable, labels: np.ndarray, *, block: int = 256) -> ChainG2Result:
    """Σ of node G² over the trie and its permutation p-value.

    ``labels``: [n_seq, 1+B] reference indicators, column 0 the observed labeling
    (``tables.label_matrix``); processed ``block`` columns at a time (memory O(K·block)).

    Notes
    -----
    Assumption: sequences are exchangeable between arms under H0 (whole sequences are
    permuted, so the dependence along a sequence is preserved). The observed and permuted
    statistics come from one computation (same arithmetic, so equal tables tie exactly).
    """
    table = trie.table
    assert labels.ndim == 2 and labels.shape[0] == table.n_seq and block >= 1
    B = labels.shape[1] - 1
    if table.n_strata == 0:
        return ChainG2Result(0.0, float("nan") if B == 0 else 1.0, 0, 0, B)
    parts = []
    for lo in range(0, labels.shape[1], block):
        ref = ref_counts(table, labels[:, lo : lo + block])  # [K, block]
        n_ref, n_cand = stratum_arm_sizes(table, ref)
        parts.append(g2_statistics(table, ref, n_ref, n_cand).sum(axis=0))
    g = np.concatenate(parts)  # [1+B]
    pvalue = float((1.0 + np.sum(g[1:] >= g[0])) / (B + 1.0)) if B else float("nan")
    distinct = np.where(table.is_singleton_row, table.key_total, 1)
    dof = int((segment_sum(distinct, table.stratum_start) - 1).sum())
    return ChainG2Result(float(g[0]), pvalue, dof, table.n_strata, B)


@dataclass(frozen=True)
class NodeTests:
    """Pooled next-token χ² at the selected nodes of one trie (arrays over selected nodes)."""

    node: np.ndarray  # [M] int64 stratum index in ``TrieTable.table``
    statistic: np.ndarray  # [M] float64 (NaN if untestable)
    pvalue: np.ndarray  # [M] float64 asymptotic χ²(dof)
    dof: np.ndarray  # [M] int64
    n_ref: np.ndarray  # [M] int64
    n_cand: np.ndarray  # [M] int64
    n_bins: np.ndarray  # [M] int64
    min_expected: np.ndarray  # [M] float64
    testable: np.ndarray  # [M] bool


def node_chi2(
    trie: TrieTable,
    ref: np.ndarray,
    *,
    min_count: int,
    min_expected: float = 5.0,
    min_depth: int = 1,
) -> NodeTests:
    """Pooled χ² (``homogeneity`` rule) at every node of depth ≥ ``min_depth`` whose arms both
    have ≥ ``min_count`` sequences. ``ref``: [K, 1] observed reference counts.

    Notes
    -----
    Conditional on the prefixes, the next tokens at a node are iid draws from each arm's
    conditional law, so the pooled homogeneity test at a node is valid given the node's arm
    sizes (the node is selected on them; under H0 the conditional laws agree). Depth 0 is the
    position-0 test already run per cell, so it is skipped by default.
    """
    table = trie.table
    assert ref.shape == (table.n_keys, 1)
    n_ref, n_cand = stratum_arm_sizes(table, ref)  # [S, 1]
    nr, nc = n_ref[:, 0], n_cand[:, 0]
    sel = np.flatnonzero((trie.node_depth >= min_depth) & (np.minimum(nr, nc) >= min_count))
    bins = pool_table(table, nr, nc, min_expected)
    stat = chi2_statistics(table, bins, ref, n_ref, n_cand)[:, 0]  # [S]
    dof = bins.n_bins - 1
    with np.errstate(invalid="ignore"):
        p = np.where(bins.testable, stats.chi2.sf(stat, np.maximum(dof, 1)), np.nan)
    return NodeTests(
        node=sel,
        statistic=stat[sel],
        pvalue=p[sel],
        dof=np.where(bins.testable, dof, 0)[sel],
        n_ref=nr[sel],
        n_cand=nc[sel],
        n_bins=bins.n_bins[sel],
        min_expected=bins.min_expected[sel],
        testable=bins.testable[sel],
    )


class TrieFamily:
    """Node χ² and chain-rule G² of the prefix trie, one family per comparison."""

    name = "trie"
    label = "prefix trie"

    def active(self, inputs: FamilyInputs) -> bool:
        return inputs.options.trie_depth >= 1 and inputs.enc.n_positions >= 2

    def run(self, inputs: FamilyInputs, alpha: float) -> FamilyResult:
        rows = [_trie_cell(inputs, c) for c in range(inputs.enc.n_cells)] if alpha > 0 else []
        df = _trie_frame(inputs, rows, alpha)
        tested = _tested(df, inputs.options.trie_min_count)
        return FamilyResult.of(self, alpha, df, tested, families.failures(df, _line))


def _line(r: Any) -> str:
    return (
        f"trie {r.prompt_id}/{r.config_id} {r.kind} depth {r.depth} "
        f"prefix [{r.prefix}] p_adj={float(r.p_adj):.3g}"
    )


def _tested(df: pd.DataFrame, min_count: int) -> np.ndarray:
    """The rows that ran on enough data.

    NOTE: a chain-rule G² is a permutation test, valid on any number of sequences, but on a
    handful it cannot reach its level: it counts as tested when both arms have the node rule's
    ``trie_min_count`` sequences in the cell (it still rejects if it can).
    """
    if not len(df):
        return np.zeros(0, dtype=bool)
    least = np.minimum(df["n_ref"].to_numpy(), df["n_cand"].to_numpy())
    enough = (df["kind"] != "chain").to_numpy() | (least >= min_count)
    return ((df["status"] == homogeneity.OK).to_numpy() & enough).astype(bool)


def _trie_cell(inputs: FamilyInputs, c: int) -> dict[str, np.ndarray]:
    """The chain-rule G² row then the node χ² rows of one cell, as column arrays (one DataFrame
    for all cells is built at the end: small frames per cell are slow)."""
    opts, enc = inputs.options, inputs.enc
    tok, labels = inputs.cell_tokens(c), inputs.labels[c]
    tt = build_trie_table(tok, opts.trie_depth, merge_singletons=inputs.merge)
    chain = chain_rule_g2(tt, labels, block=families.BLOCK)
    ref = ref_counts(tt.table, labels[:, :1])  # [K, 1] observed
    nodes = node_chi2(tt, ref, min_count=opts.trie_min_count, min_expected=opts.min_expected)
    depth = tt.node_depth[nodes.node]
    prefixes = [
        format_prefix(enc.token_id(tok[r, :d]))
        for r, d in zip(tt.node_rep[nodes.node], depth, strict=True)
    ]
    sizes = enc.arm_sizes(c)
    chain_ok = homogeneity.OK if np.isfinite(chain.pvalue) else homogeneity.UNTESTABLE
    m = len(nodes.node)
    return {
        "cell": np.full(m + 1, c),
        "kind": np.array(["chain"] + ["node"] * m, dtype=object),
        "depth": np.r_[min(opts.trie_depth, tok.shape[1] - 1), depth].astype(np.int64),
        "prefix": np.array(["", *prefixes], dtype=object),
        "statistic": np.r_[chain.statistic, nodes.statistic],
        "pvalue": np.r_[chain.pvalue, nodes.pvalue],
        "dof": np.r_[chain.dof, nodes.dof].astype(np.int64),
        "n_ref": np.r_[sizes[0], nodes.n_ref].astype(np.int64),
        "n_cand": np.r_[sizes[1], nodes.n_cand].astype(np.int64),
        "n_bins": np.r_[chain.n_nodes, nodes.n_bins].astype(np.int64),
        "status": np.r_[
            [chain_ok], np.where(nodes.testable, homogeneity.OK, homogeneity.UNTESTABLE)
        ].astype(object),
    }


def _trie_frame(
    inputs: FamilyInputs, rows: list[dict[str, np.ndarray]], alpha: float
) -> pd.DataFrame:
    """Every cell's rows in one frame, corrected together at ``alpha``."""
    if not rows:
        return empty_frame(TRIE_COLUMNS)
    cat = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
    cell = cat.pop("cell").astype(np.int64)
    df = pd.DataFrame({**inputs.cell_ids(cell), **cat})
    method = "bh" if inputs.options.multiplicity == "bh" else "by"
    res = multiplicity.adjust(df["pvalue"].to_numpy(dtype=np.float64), method, alpha)
    df["p_adj"] = res.pvalue_adjusted
    df["reject"] = res.reject
    return df[TRIE_COLUMNS]
