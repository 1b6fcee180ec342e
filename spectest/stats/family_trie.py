"""The prefix-trie family (``TrieFamily``): per cell a node χ² at every well-filled prefix and one
chain-rule G² over the trie (``stats.trie``), corrected together by BH (BY under 'by' or
'maxT'); its table ``TRIE_COLUMNS`` (trie.parquet). Knows no other family, files or torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from spectest import schema as sc
from spectest.stats import families, homogeneity, multiplicity, tables, trie
from spectest.stats.families import FamilyInputs, FamilyResult, empty_frame
from spectest.stats.histograms import format_prefix

TRIE_COLUMNS = [
    sc.PROMPT_ID,
    sc.CONFIG_ID,
    "kind",
    "depth",
    "prefix",
    *homogeneity.CHI2_COLUMNS,
    "status",
]


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
    tt = trie.build_trie_table(tok, opts.trie_depth, merge_singletons=inputs.merge)
    chain = trie.chain_rule_g2(tt, labels, block=families.BLOCK)
    ref = tables.ref_counts(tt.table, labels[:, :1])  # [K, 1] observed
    nodes = trie.node_chi2(tt, ref, min_count=opts.trie_min_count, min_expected=opts.min_expected)
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
