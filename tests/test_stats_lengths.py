"""The sequence-length family (``spectest.stats.lengths``) and its place in ``analyze``'s α split:
a candidate whose sequences stop early is DIFFERENT, not "untestable" (issue 9, bullet 2)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from spectest.stats import AnalysisOptions, analyze
from spectest.stats.histograms import MISSING, encode_samples
from spectest.stats.lengths import adjust, is_active, length_tests, sequence_lengths

V = 6
PROBS = np.array([0.3, 0.25, 0.2, 0.12, 0.08, 0.05])
OPTS = AnalysisOptions(alpha=0.05, null_permutations=20, trie_depth=1, trie_min_count=50)


def frame(
    rng: np.random.Generator,
    arm: str,
    n: int,
    T: int,
    *,
    lengths: np.ndarray | None = None,
    cells=(("p0", "c0"),),
    seed0: int = 0,
) -> pd.DataFrame:
    """iid tokens from PROBS at every position; sequence i has ``lengths[i]`` positions."""
    parts = []
    for pid, cid in cells:
        toks = rng.choice(V, size=(n, T), p=PROBS)
        ln = np.full(n, T) if lengths is None else lengths
        seq, pos = np.nonzero(np.arange(T)[None, :] < ln[:, None])
        parts.append(
            pd.DataFrame(
                {
                    "prompt_id": pid,
                    "config_id": cid,
                    "arm": arm,
                    "seed": seed0 + seq,
                    "position": pos.astype(np.int32),
                    "token_id": toks[seq, pos].astype(np.int64),
                }
            )
        )
    return pd.concat(parts, ignore_index=True)


def test_sequence_lengths_count_present_positions() -> None:
    tok = np.array([[1, 2, 3], [1, MISSING, MISSING], [MISSING, 4, 5]], dtype=np.int32)
    assert sequence_lengths(tok).tolist() == [3, 1, 2]


def test_full_length_runs_do_not_spend_alpha() -> None:
    """Today's engines emit full-length sequences: the family is inactive and the α split (cells,
    trie) is exactly what it was without it."""
    rng = np.random.default_rng(1)
    s = pd.concat([frame(rng, "reference", 200, 4), frame(rng, "candidate", 200, 4, seed0=200)])
    a = analyze(s, reference="reference", candidate="candidate", options=OPTS)
    assert a.families["lengths"].alpha == 0.0 and not a.families["lengths"].rejected
    # the other active families share the whole α equally, as without the lengths family
    shares = [f.alpha for name, f in a.families.items() if name != "lengths"]
    active = [x for x in shares if x > 0]
    assert a.families["trie"].alpha > 0 and all(
        x == pytest.approx(0.05 / len(active)) for x in active
    )
    assert a.table("lengths")["status"].tolist() == ["untestable"]  # one length: one bin


@pytest.mark.parametrize("case", ["positions past 5 missing", "half the sequences truncated"])
def test_early_stopping_candidate_is_rejected(case: str) -> None:
    """The issue's inputs: T = 8, 400 sequences per arm. Positions 5.. missing in every candidate
    sequence, or half the candidate's sequences cut at a uniform length in 1..7. The length χ²
    has p < 1e-30 in both (a deterministic margin: this cannot fail by chance)."""
    rng = np.random.default_rng(9)
    T, n = 8, 400
    if case == "positions past 5 missing":
        ln = np.full(n, 5)
    else:
        ln = np.where(np.arange(n) % 2 == 0, T, rng.integers(1, T, size=n))
    s = pd.concat(
        [frame(rng, "reference", n, T), frame(rng, "candidate", n, T, lengths=ln, seed0=n)]
    )
    a = analyze(s, reference="reference", candidate="candidate", options=OPTS)
    assert a.rejected and a.families["lengths"].rejected, a.table("lengths")
    lengths = a.families["lengths"]
    assert lengths.alpha == pytest.approx(a.families["cells"].alpha) and lengths.alpha > 0  # equal
    row = a.table("lengths").iloc[0]
    assert row["pvalue"] < 1e-30 and row["short_cand"] == (n if ln.max() < T else n // 2)
    assert row["short_ref"] == 0 and np.isfinite(row["mde_tv"])


def test_type_one_rate_under_equal_stopping_laws() -> None:
    """H0: both arms stop with probability 0.15 after each position (T = 8), 150 sequences per
    arm, 600 replications at α = 0.05. The rejection rate lies within 3σ (±0.027) of α; for an
    arbitrary seed this fails with probability ≈ 0.003 (fixed seed here)."""
    rng = np.random.default_rng(20261130)
    T, n, reps = 8, 150, 600
    rejected = 0
    for _ in range(reps):
        parts = []
        for arm, seed0 in (("reference", 0), ("candidate", n)):
            ln = np.minimum(rng.geometric(0.15, size=n), T)
            parts.append(frame(rng, arm, n, T, lengths=ln, seed0=seed0))
        enc = encode_samples(pd.concat(parts, ignore_index=True), ("reference", "candidate"))
        df = length_tests(enc)
        assert is_active(df)
        rejected += int(adjust(df, 0.05)["reject"].iloc[0])
    rate = rejected / reps
    assert abs(rate - 0.05) < 3 * np.sqrt(0.05 * 0.95 / reps), rate
