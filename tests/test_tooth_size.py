"""A tooth's size (spectest.tooth_size): the TV per cell-position between an ε arm's or mutant's
law and plain sampling, computed from real LanguageModels (the toy LM with the canonical chain of
tests/test_mutants.py as its table, and a seeded toy pair), checked against brute force
(``exact_law.round_law`` over every draft, ``complete_law``, ``marginal``, ``total_variation``);
a budget too small to compute it gives an upper bound, never less; the compact vocabulary and the
batched draft tree give the law the reference code gives. All exact (no randomness)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from test_mutants import CANON_PARAMS, K, V, canonical_chain

from spectest.engines.base import DrafterSpec
from spectest.models.toy import ToyLM
from spectest.sampling import exact_law
from spectest.sampling.mutants import VARIANT_NAMES, get_variant
from spectest.sampling.params import SamplingParams
from spectest.tooth_size import SIZE_COLUMNS, size_of, tooth_sizes

TOL = 1e-9
TEETH = [
    "eps_biased:0.5", "residual_from_p", "always_accept", "swapped_filter_order",
    "reuse_accept_uniform", "onehot_softmax_q", "raw_q", "bonus_wrong_row", "target_unprocessed",
    "bonus_reuse_accept_uniform",
]  # fmt: skip


def chain_lms() -> tuple[ToyLM, ToyLM]:
    """The canonical chain as two order-2 toy LMs (row V: the virtual start, = token 0's row)."""
    chain = canonical_chain()
    t = torch.cat([chain.target_logits, chain.target_logits[:1]])  # [V+1, V]
    d = torch.cat([chain.draft_logits, chain.draft_logits[:1]])
    return ToyLM(V, 2, table=t.float(), name="chain-target"), ToyLM(V, 2, table=d.float())


def brute_force(
    spec: str, target: ToyLM, draft: ToyLM, prompt: list[int], params: SamplingParams,
    drafter: DrafterSpec, positions: int,
) -> list[float]:  # fmt: skip
    """TV at positions 0..n-1 from the reference code: every draft, no compaction, the whole
    plain tree (``complete_law``)."""

    def fn(model: ToyLM):  # type: ignore[no-untyped-def]
        return lambda ctx: model.conditional_logits([*prompt, *ctx])

    n = min(drafter.k + 1, positions)
    law = exact_law.round_law(
        get_variant(spec), fn(target), fn(draft), params, drafter.k, onehot=drafter.onehot,
        q_mode=drafter.q_mode, extra_accept_breaks=exact_law.known_accept_breaks(spec),
    )  # fmt: skip
    got = exact_law.complete_law(law, fn(target), params, n)
    plain = exact_law.plain_law(fn(target), params, n)
    out = []
    for i in range(n):
        a, b = exact_law.marginal(got, i), exact_law.marginal(plain, i)
        out.append(exact_law.total_variation({(k,): v for k, v in a.items()},
                                             {(k,): v for k, v in b.items()}))  # fmt: skip
    return out


@pytest.mark.parametrize("onehot", [True, False])
def test_sizes_equal_brute_force_on_the_canonical_chain(onehot: bool) -> None:
    """Every catalogue mutant with a size, sampled and one-hot drafter, K = 2, 3 positions: the
    stored TV equals brute force to 1e-9 and is marked exact; the size is the maximum."""
    target, draft = chain_lms()
    drafter = DrafterSpec(onehot=onehot, q_mode="processed", k=K)
    prompts = {"p": [0], "q": [3, 1]}
    teeth = [(f"t:{s}", s) for s in TEETH]
    df = tooth_sizes(target, draft, prompts, [("c", CANON_PARAMS)], teeth, drafter, 5,
                     budget=10_000)  # fmt: skip
    assert list(df.columns) == list(SIZE_COLUMNS)
    assert len(df) == len(prompts) * len(teeth) * (K + 1)
    for arm, spec in teeth:
        for pid, ids in prompts.items():
            want = brute_force(spec, target, draft, ids, CANON_PARAMS, drafter, 5)
            rows = df[(df["arm"] == arm) & (df["prompt_id"] == pid)].sort_values("position")
            assert (rows["status"] == "exact").all(), rows
            assert rows["tv"].tolist() == pytest.approx(want, abs=TOL), (spec, pid)
        size = size_of(df, arm)
        sub = df[df["arm"] == arm]
        assert size.exact and size.tv == pytest.approx(float(sub["tv"].max()), abs=0)
    # the catalogue's mutants are visible here (tests/test_mutants.py): every size > 0.01
    assert all(size_of(df, a).tv > 0.01 for a, _ in teeth)  # type: ignore[operator]


def test_the_exact_sampler_has_size_zero() -> None:
    target, draft = chain_lms()
    for onehot in (True, False):
        df = tooth_sizes(target, draft, {"p": [2]}, [("c", CANON_PARAMS)], [("e", "exact")],
                         DrafterSpec(onehot=onehot, k=K), 3)  # fmt: skip
        assert float(df["tv"].max()) < TOL and (df["status"] == "exact").all()


def test_positions_cut_the_first_round() -> None:
    """``positions`` 1: only position 0 (exactly the tooth's first token)."""
    target, draft = chain_lms()
    drafter = DrafterSpec(onehot=True, k=K)
    df = tooth_sizes(target, draft, {"p": [0]}, [("c", CANON_PARAMS)],
                     [("r", "residual_from_p")], drafter, 1)  # fmt: skip
    assert df["position"].tolist() == [0]
    want = brute_force("residual_from_p", target, draft, [0], CANON_PARAMS, drafter, 1)
    assert df["tv"].tolist() == pytest.approx(want, abs=TOL)


@pytest.mark.parametrize("budget", [0, 5, 60, 200])
def test_a_small_budget_gives_an_upper_bound_never_less(budget: int) -> None:
    """A seeded toy pair (V = 8, order 2, full support at T = 1, K = 2): with a budget too
    small for the plain completion (and, for the sampled drafter, the drafts and their
    quadrature cells) every stated TV is ≥ the exact one and marked ``bound``; a round law that
    does not fit in the budget's cells at all is ``unknown`` (budget 5: 125 cells), and budget 0
    computes nothing."""
    target = ToyLM(8, 2, scale=1.5, seed=3)
    draft = ToyLM(8, 2, scale=1.0, seed=4)
    params = SamplingParams(temperature=1.0)
    for onehot in (True, False):
        drafter = DrafterSpec(onehot=onehot, k=2)
        teeth = [("e", "eps_biased:0.5"), ("r", "residual_from_p")]
        exact = tooth_sizes(target, draft, {"p": [1]}, [("c", params)], teeth, drafter, 3,
                            budget=100_000)  # fmt: skip
        small = tooth_sizes(target, draft, {"p": [1]}, [("c", params)], teeth, drafter, 3,
                            budget=budget)  # fmt: skip
        assert (exact["status"] == "exact").all()
        if budget <= 5:
            assert (small["status"] == "unknown").all() and small["tv"].isna().all()
            assert size_of(small, "e").tv is None
            continue
        assert (small["status"] != "unknown").all()
        assert (small["tv"] >= exact["tv"] - 1e-12).all(), (small, exact)
        assert (small.loc[small["slack"] > 0, "status"] == "bound").all()
        # the one-hot completion needs 8 + 64 contexts: bounded at 60, exact at 200
        assert (small["status"] == "bound").any() == (budget == 60 or not onehot)
        for arm in ("e", "r"):  # the tooth's size: never below the exact one either
            assert size_of(small, arm).tv >= size_of(exact, arm).tv - 1e-12  # type: ignore[operator]


def test_size_of_a_table() -> None:
    rows = [
        ("a", "x", "p", "c", 0, 0.1, 0.0, "exact"),
        ("a", "x", "p", "c", 1, 0.3, 0.0, "exact"),
        ("b", "y", "p", "c", 0, 0.2, 0.05, "bound"),
        ("b", "y", "q", "c", 0, 0.1, 0.0, "exact"),
        ("m", "w", "p", "c", 0, 0.3, 0.0, "exact"),
        ("m", "w", "q", "c", 0, 0.25, 0.1, "bound"),
        ("u", "z", "p", "c", 0, 0.5, 0.0, "exact"),
        ("u", "z", "q", "c", 0, math.nan, math.nan, "unknown"),
    ]
    df = pd.DataFrame(rows, columns=list(SIZE_COLUMNS))
    a = size_of(df, "a")
    assert (a.tv, a.exact, a.where) == (0.3, True, "p/c@1") and a.label() == "size 0.3"
    b = size_of(df, "b")
    assert (b.tv, b.exact) == (0.2, False) and b.label() == "size ≤ 0.2"
    # a bound below an exact maximum: the maximum is still exact (the bound's truth is lower)
    m = size_of(df, "m")
    assert (m.tv, m.exact, m.where) == (0.3, True, "p/c@0")
    # one unknown cell: the maximum over cells is not bounded
    assert size_of(df, "u").tv is None and size_of(df, "u").label() == "size unknown"
    assert size_of(df, "nope").tv is None and size_of(None, "a").tv is None


@pytest.mark.parametrize("onehot", [True, False])
def test_compact_vocabulary_and_batched_drafts_give_the_same_law(onehot: bool) -> None:
    """``round_law(compact=True)`` (the tokens that can matter only) equals the full-vocabulary
    law for every catalogue variant, on the canonical chain with a filter that leaves zeros; and
    ``draft_tree`` with ``max_drafts`` returns the most probable drafts and the rest's mass."""
    chain = canonical_chain()
    params = SamplingParams(temperature=0.8, top_k=3)
    for name in VARIANT_NAMES:
        spec = "eps_biased:0.3" if name == "eps_biased" else name
        v = get_variant(spec)
        kw = dict(onehot=onehot, extra_accept_breaks=exact_law.known_accept_breaks(spec))
        full = exact_law.round_law(v, chain.target, chain.draft, params, K, **kw)  # type: ignore[arg-type]
        comp = exact_law.round_law(v, chain.target, chain.draft, params, K, compact=True, **kw)  # type: ignore[arg-type]
        assert set(full) == set(comp), spec
        assert max(abs(full[s] - comp[s]) for s in full) < 1e-15, spec
    if onehot:
        return
    v = get_variant("exact")

    def batch(ctxs: list[tuple[int, ...]]) -> torch.Tensor:
        return torch.stack([chain.draft(c) for c in ctxs])

    every, missing = exact_law.draft_tree(v, batch, params, K, onehot=False)
    assert missing == 0.0 and sum(w for _, w, _ in every) == pytest.approx(1.0, abs=1e-12)
    kept, missing = exact_law.draft_tree(v, batch, params, K, onehot=False, max_drafts=4)
    assert len(kept) == 4
    assert missing == pytest.approx(1.0 - sum(w for _, w, _ in kept), abs=1e-12)
    assert missing > 0.0


def test_a_small_logits_cache_gives_the_same_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The logits kept per prompt are bounded (``CACHE_BYTES``; a large vocabulary keeps fewer):
    with room for 16 contexts only (contexts are then computed again), every size is the same
    as with all of them kept."""
    import spectest.tooth_size.logits as ts

    computed: list[int] = []
    compute = ts.ContextLogits._compute

    def counting(self, ctxs):  # type: ignore[no-untyped-def]
        computed.append(len(set(ctxs)))
        return compute(self, ctxs)

    monkeypatch.setattr(ts.ContextLogits, "_compute", counting)
    target, draft = chain_lms()
    drafter = DrafterSpec(onehot=False, k=K)
    teeth = [("e", "eps_biased:0.5"), ("r", "residual_from_p"), ("a", "always_accept")]
    args = (target, draft, {"p": [0]}, [("c", CANON_PARAMS)], teeth, drafter, 5)
    full = tooth_sizes(*args)
    n_full = sum(computed)
    computed.clear()
    monkeypatch.setattr(ts, "CACHE_BYTES", 1)  # the floor: 16 contexts
    small = tooth_sizes(*args)
    assert sum(computed) > n_full  # evicted contexts were computed again
    pd.testing.assert_frame_equal(full, small)
