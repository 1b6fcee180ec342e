"""Teacher forcing: white-box columns against a slow per-token reference on the toy LM."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from spectest import schema
from spectest.engines.base import DecodeRequest, samples_frame
from spectest.engines.builtin import (
    DrafterSpec,
    RowSpec,
    plain_decode,
    speculative_decode,
)
from spectest.engines.teacher import (
    teacher_force,
    whitebox_columns,
    whitebox_columns_shortlist,
    whitebox_reference,
)
from spectest.errors import InputError
from spectest.models.hf import from_preset
from spectest.models.toy import ToyLM
from spectest.sampling.laws import DenseLaw, Law, ShortlistLaw
from spectest.sampling.mutants import draft_q, get_variant
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.transforms import logits_to_probs

PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.8, top_k=4),
    SamplingParams(temperature=1.2, top_p=0.7),
    SamplingParams(temperature=0.0),
]
ROWS = [RowSpec(f"c{i}", s, p) for s in range(3) for i, p in enumerate(PARAMS)]


def assert_columns_equal(got: dict, want: dict) -> None:
    for c in schema.WHITEBOX_COLUMNS:
        g, w = got[c], want[c]
        if isinstance(w, float) and math.isnan(w):
            assert math.isnan(g), c
        elif c == schema.WB_IN_A:
            assert bool(g) == w, c
        else:
            assert g == pytest.approx(w, abs=1e-12), c


def test_columns_equal_reference_random_laws() -> None:
    """Random laws with exact zeros, ties in p and in p/q, q = 0 where p > 0."""
    gen = torch.Generator().manual_seed(0)
    V, N = 7, 200
    p = torch.rand((N, V), generator=gen, dtype=torch.float64)
    p[p < 0.3] = 0.0
    p[:, 3] = p[:, 2]  # ties in p
    q = torch.rand((N, V), generator=gen, dtype=torch.float64)
    q[q < 0.2] = 0.0
    q[:, 5] = 2 * p[:, 5]
    q[:, 6] = 2 * p[:, 6]  # ties in p/q
    p[:, 0] += 1e-3  # every row has mass
    q[:, 0] += 1e-3
    p, q = p / p.sum(1, keepdim=True), q / q.sum(1, keepdim=True)
    x = torch.multinomial(p, 1, generator=gen)[:, 0]  # [N] tokens with p > 0
    for qq in (q, None):
        cols = whitebox_columns(p, qq, x)
        for n in range(N):
            want = whitebox_reference(
                p[n].tolist(), None if qq is None else qq[n].tolist(), int(x[n])
            )
            assert_columns_equal({c: cols[c][n].item() for c in cols}, want)


def _random_shortlists(
    gen: torch.Generator, N: int, V: int, W: int, *, dyadic: bool, avoid: torch.Tensor | None = None
) -> ShortlistLaw:
    """``N`` rows of ``W`` distinct ascending ids in ``[0, V)`` (outside ``avoid`` ``[N, *]`` when
    given: disjoint supports), probabilities with exact zeros; ``dyadic``: multiples of 1/8 (ties
    in p and in p/q, exact sums)."""
    ids = torch.empty((N, W), dtype=torch.int64)
    for n in range(N):
        perm = torch.randperm(V, generator=gen)
        if avoid is not None:
            perm = perm[~torch.isin(perm, avoid[n])]
        ids[n] = perm[:W].sort().values
    if dyadic:
        probs = torch.randint(0, 5, (N, W), generator=gen).to(torch.float64) / 8
    else:
        probs = torch.rand((N, W), generator=gen, dtype=torch.float64)
        probs[probs < 0.2] = 0.0
    return ShortlistLaw(ids, probs, V)


def _assert_close_columns(got: dict, want: dict) -> None:
    for c in schema.WHITEBOX_COLUMNS:
        if c == schema.WB_IN_A:
            assert torch.equal(got[c], want[c]), c
        else:
            torch.testing.assert_close(got[c], want[c], rtol=1e-12, atol=1e-15, equal_nan=True)


@pytest.mark.parametrize("dyadic", [False, True], ids=["random", "ties"])
@pytest.mark.parametrize("q_kind", ["none", "shortlist", "onehot", "dense", "disjoint"])
def test_shortlist_columns_equal_dense(q_kind: str, dyadic: bool) -> None:
    """``whitebox_columns_shortlist`` == ``whitebox_columns`` on the densified laws (relative
    1e-12, ``wb_in_a`` exact) and == ``whitebox_reference``: q absent, on a shortlist (overlapping
    p's), one-hot (``W = 1``), dense with exact zeros, or on ids disjoint from p's; tokens drawn
    from p's shortlist, q's shortlist and the rest of the vocabulary (p(x) = 0, q(x) = 0);
    ``dyadic`` laws make ties in p and in p/q (then sums are exact in both orders)."""
    gen = torch.Generator().manual_seed(1)
    N, V, W = 300, 40, 9
    p = _random_shortlists(gen, N, V, W, dyadic=dyadic)
    q: Law | None = None
    if q_kind == "shortlist":
        q = _random_shortlists(gen, N, V, 12, dyadic=dyadic)
    elif q_kind == "onehot":
        other = torch.randint(0, V, (N,), generator=gen)
        tok = torch.where(torch.rand(N, generator=gen) < 0.5, p.ids[:, 0], other)  # [N]
        q = ShortlistLaw(tok[:, None], torch.ones((N, 1), dtype=torch.float64), V)
    elif q_kind == "dense":
        half = _random_shortlists(gen, N, V, V // 2, dyadic=dyadic)
        q = DenseLaw(half.dense())  # [N, V] zeros off half
    elif q_kind == "disjoint":
        q = _random_shortlists(gen, N, V, 7, dyadic=dyadic, avoid=p.ids)
    # tokens: a third p's shortlist, a third q's (or anything), a third uniform over V
    pick = torch.randint(0, W, (N,), generator=gen)
    x = p.ids.gather(1, pick[:, None])[:, 0]  # [N]
    if isinstance(q, ShortlistLaw):
        qx = q.ids.gather(1, torch.randint(0, int(q.ids.shape[1]), (N, 1), generator=gen))[:, 0]
        x = torch.where(torch.arange(N) % 3 == 1, qx, x)
    x = torch.where(torch.arange(N) % 3 == 2, torch.randint(0, V, (N,), generator=gen), x)
    q_dense = None if q is None else q.dense()
    p_dense = p.dense()
    got = whitebox_columns_shortlist(p, q, x)
    want = whitebox_columns(p_dense, q_dense, x)
    _assert_close_columns(got, want)
    assert bool((got[schema.WB_P] == 0).any()) and bool((got[schema.WB_P] > 0).any())
    for n in range(0, N, 7):
        ref = whitebox_reference(
            p_dense[n].tolist(), None if q_dense is None else q_dense[n].tolist(), int(x[n])
        )
        assert_columns_equal({c: got[c][n].item() for c in got}, ref)


def test_shortlist_columns_bad_token() -> None:
    p = ShortlistLaw(torch.tensor([[1, 3]]), torch.tensor([[0.5, 0.5]], dtype=torch.float64), 5)
    with pytest.raises(InputError, match="whitebox_columns_shortlist"):
        whitebox_columns_shortlist(p, None, torch.tensor([5]))


@pytest.mark.parametrize(
    ("onehot", "q_mode"), [(False, "processed"), (True, "processed"), (False, "raw")]
)
def test_teacher_force_equals_reference_on_toy(onehot: bool, q_mode: str) -> None:
    target = ToyLM(9, 3, 1.5, seed=4)
    draft = target.perturbed(0.7, seed=5)
    drafter = DrafterSpec(onehot=onehot, q_mode=q_mode, k=3)
    prompt = [1, 2]
    out = speculative_decode(
        target,
        draft,
        DecodeRequest(prompt, ROWS, num_positions=6, run_key=3, prompt_id="p"),
        drafter=drafter,
        variant=get_variant("exact"),
    )
    wb = teacher_force(
        target, prompt, [r.params for r in ROWS], out.tokens, draft=draft, drafter=drafter
    )
    samples = samples_frame(out.tokens, "p", ROWS, schema.CANDIDATE)
    assert len(wb) == len(samples)
    for b, r in enumerate(ROWS):
        pt = SamplingTensors.from_params([r.params])
        seq = prompt + out.tokens[b].tolist()
        for t in range(6):
            ctx = seq[: len(prompt) + t]
            p = logits_to_probs(target.conditional_logits(ctx)[None], pt)[0]
            d_logits = draft.conditional_logits(ctx)[None]
            if onehot:
                q = torch.zeros(9, dtype=torch.float64)
                q[int(d_logits[0].argmax())] = 1.0
            else:
                q = draft_q(d_logits, pt, q_mode)[0]
            want = whitebox_reference(p.tolist(), q.tolist(), seq[len(prompt) + t])
            row = wb.iloc[b * 6 + t]
            assert_columns_equal({c: row[c] for c in schema.WHITEBOX_COLUMNS}, want)
            assert samples.iloc[b * 6 + t][schema.TOKEN_ID] == seq[len(prompt) + t]


def test_no_draft_and_pit_is_uniform_on_plain_arm() -> None:
    """Without a draft: p_A = 0, not in A, overlap NaN. The randomised PIT of the plain arm under
    the teacher's p is U(0, 1) (KS, 1200 values, fixed seed; false-failure rate 1e-3)."""
    target = ToyLM(10, 2, 2.0, seed=8)
    params = SamplingParams(temperature=0.9, top_p=0.9)
    rows = [RowSpec("c", s, params) for s in range(200)]
    out = plain_decode(target, DecodeRequest([3], rows, num_positions=6, run_key=9, prompt_id="p"))
    wb = teacher_force(target, [3], [params] * 200, out.tokens, drafter=DrafterSpec(onehot=True))
    assert (wb[schema.WB_P_A] == 0).all() and not wb[schema.WB_IN_A].any()
    assert wb[schema.WB_OVERLAP].isna().all() and (wb[schema.WB_P] > 0).all()
    v = np.random.default_rng(0).random(len(wb))
    u = wb[schema.WB_CDF_LO].to_numpy() + v * wb[schema.WB_P].to_numpy()
    assert stats.kstest(u, "uniform").pvalue > 1e-3


def test_teacher_force_hf_matches_engine_pipeline() -> None:
    """On a tiny HF model the teacher's p is positive on every emitted token, and equals the
    plain engine's law at position 0 (computed from the prompt's logits)."""
    m = from_preset("qwen3-tiny", seed=1, logit_scale=8.0)
    rows = ROWS[:4]
    out = plain_decode(m, DecodeRequest([5, 6], rows, num_positions=5, run_key=2, prompt_id="p"))
    wb = teacher_force(m, [5, 6], [r.params for r in rows], out.tokens)
    assert (wb[schema.WB_P] > 0).all()
    p0 = logits_to_probs(
        m.logits_full(torch.tensor([[5, 6]] * 4))[:, -1],
        SamplingTensors.from_params([r.params for r in rows]),
    )
    want = p0.gather(1, torch.as_tensor(out.tokens[:, :1]))[:, 0].numpy()
    np.testing.assert_allclose(wb[schema.WB_P].to_numpy()[::5], want, rtol=1e-6)


def test_teacher_bad_input() -> None:
    target = ToyLM(5, 2, 1.0)
    with pytest.raises(InputError, match="a draft needs its drafter"):
        teacher_force(
            target, [1], [PARAMS[0]], torch.zeros((1, 2), dtype=torch.int64), draft=target
        )
    with pytest.raises(InputError, match="1 token rows but 2 params"):
        teacher_force(target, [1], PARAMS[:2], torch.zeros((1, 2), dtype=torch.int64))
    with pytest.raises(InputError, match=r"token ids must be in \[0, 5\)"):
        teacher_force(target, [1], [PARAMS[0]], torch.tensor([[0, 7]]))
