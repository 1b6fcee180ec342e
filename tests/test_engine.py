"""Built-in engines: token-for-token equality with slow references, batch invariance, greedy
equality, the exact law of the first positions on the toy LM, tables and bad input."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pyarrow as pa
import pytest
import torch
from scipy import stats

from spectest import schema
from spectest.engines.base import ArmOutput, DecodeRequest, rounds_frame, samples_frame
from spectest.engines.builtin import (
    DrafterSpec,
    RowSpec,
    plain_decode,
    plain_decode_reference,
    speculative_decode,
    speculative_decode_reference,
)
from spectest.errors import ConfigError, InputError, ModelError, NumericsError
from spectest.models.derive import first_layers
from spectest.models.hf import HFModel, from_preset
from spectest.models.toy import ToyLM
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.transforms import logits_to_probs

RUN_KEY = 1234
PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=1.0, top_k=8, top_p=0.9, min_p=0.05),
]
ROWS = [RowSpec(f"cfg{i}", seed, p) for seed in range(2) for i, p in enumerate(PARAMS)]
EXACT = get_variant("exact")


@pytest.fixture(scope="module")
def toy_pair() -> tuple[ToyLM, ToyLM]:
    target = ToyLM(12, 3, 2.0, seed=1)
    return target, target.perturbed(0.8, seed=2)


@pytest.fixture(scope="module")
def hf_pair() -> tuple[HFModel, HFModel]:
    target = from_preset("llama-tiny", seed=3, logit_scale=12.0)
    return target, first_layers(target, 1)


def spec(
    target, draft, rows, *, T=9, drafter=None, variant=EXACT, prompt=(1, 2, 3), **kw
) -> ArmOutput:
    drafter = drafter or DrafterSpec(onehot=False, k=3)
    return speculative_decode(
        target,
        draft,
        DecodeRequest(list(prompt), rows, num_positions=T, run_key=RUN_KEY, prompt_id="p", **kw),
        drafter=drafter,
        variant=variant,
    )


# -- equality with the slow references (exact: the path is a deterministic function of uniforms)
def test_plain_equals_reference_toy_and_hf(toy_pair, hf_pair) -> None:
    for model, T in ((toy_pair[0], 9), (hf_pair[0], 5)):
        got = plain_decode(
            model,
            DecodeRequest(
                [1, 2, 3], ROWS, num_positions=T, run_key=RUN_KEY, prompt_id="p", batch_size=4
            ),
        )
        want = plain_decode_reference(
            model, DecodeRequest([1, 2, 3], ROWS, num_positions=T, run_key=RUN_KEY, prompt_id="p")
        )
        assert np.array_equal(got.tokens, want), model.name


@pytest.mark.parametrize(
    ("variant", "onehot", "q_mode"),
    [
        ("exact", False, "processed"),
        ("exact", True, "processed"),
        ("exact", False, "raw"),
        ("eps_biased:0.5", False, "processed"),
        ("residual_from_p", False, "temperature"),
        ("commit_on_telemetry", False, "processed"),  # commits rejected drafts: cache alignment
        ("bonus_wrong_row", True, "processed"),
    ],
)
def test_speculative_equals_reference_toy(
    toy_pair, variant: str, onehot: bool, q_mode: str
) -> None:
    target, draft = toy_pair
    drafter = DrafterSpec(onehot=onehot, q_mode=q_mode, k=3)
    v = get_variant(variant)
    out = spec(target, draft, ROWS, T=11, drafter=drafter, variant=v, batch_size=4)
    want, rounds = speculative_decode_reference(
        target,
        draft,
        DecodeRequest([1, 2, 3], ROWS, num_positions=11, run_key=RUN_KEY, prompt_id="p"),
        drafter=drafter,
        variant=v,
    )
    assert np.array_equal(out.tokens, want)
    assert out.rounds is not None
    for b, row_rounds in enumerate(rounds):
        got = out.rounds[out.rounds["row"] == b]
        assert got["accepted"].tolist() == [a for a, _ in row_rounds]
        emitted = np.minimum([n for _, n in row_rounds], 11 - got["position"].to_numpy())
        assert got["emitted"].tolist() == emitted.tolist()
        assert got["position"].tolist() == np.cumsum([0, *emitted.tolist()])[:-1].tolist()


def test_speculative_equals_reference_hf(hf_pair) -> None:
    target, draft = hf_pair
    for drafter in (DrafterSpec(onehot=False, k=2), DrafterSpec(onehot=True, k=3)):
        out = spec(target, draft, ROWS[:5], T=6, drafter=drafter, batch_size=3)
        want, _ = speculative_decode_reference(
            target,
            draft,
            DecodeRequest([1, 2, 3], ROWS[:5], num_positions=6, run_key=RUN_KEY, prompt_id="p"),
            drafter=drafter,
            variant=EXACT,
        )
        assert np.array_equal(out.tokens, want)


# -- batch invariance --------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["toy_pair", "hf_pair"])
def test_batch_invariance(which: str, request: pytest.FixtureRequest) -> None:
    """A row's tokens are bit-identical alone and inside a shuffled batch (other chunking too)."""
    target, draft = request.getfixturevalue(which)
    rows = [RowSpec(f"c{i % 5}", s, PARAMS[i % 5]) for i, s in enumerate(range(40))]
    shuffled = rows[:]
    random.Random(0).shuffle(shuffled)
    T = 8 if which == "toy_pair" else 5
    big_plain = plain_decode(
        target,
        DecodeRequest(
            [4, 5], shuffled, num_positions=T, run_key=RUN_KEY, prompt_id="p", batch_size=16
        ),
    )
    big_spec = spec(target, draft, shuffled, T=T, prompt=(4, 5), batch_size=16)
    for r in (rows[3], rows[17], rows[38]):
        i = shuffled.index(r)
        alone = plain_decode(
            target, DecodeRequest([4, 5], [r], num_positions=T, run_key=RUN_KEY, prompt_id="p")
        )
        assert np.array_equal(alone.tokens[0], big_plain.tokens[i])
        assert np.array_equal(
            spec(target, draft, [r], T=T, prompt=(4, 5)).tokens[0], big_spec.tokens[i]
        )


# -- greedy ------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["toy_pair", "hf_pair"])
def test_spec_greedy_equals_plain_greedy(which: str, request: pytest.FixtureRequest) -> None:
    target, draft = request.getfixturevalue(which)
    rows = [RowSpec("greedy", s, SamplingParams(temperature=0.0)) for s in range(3)]
    plain = plain_decode(
        target, DecodeRequest([7], rows, num_positions=10, run_key=RUN_KEY, prompt_id="p")
    ).tokens
    assert np.array_equal(plain[0], plain[1])  # greedy ignores the seed
    for onehot in (True, False):
        out = spec(target, draft, rows, T=10, drafter=DrafterSpec(onehot=onehot, k=4), prompt=(7,))
        assert np.array_equal(out.tokens, plain), onehot


# -- the exact law of the first two positions on the toy LM ------------------------------------
def exact_law_two(model: ToyLM, prompt: list[int], params: SamplingParams) -> np.ndarray:
    """P(x0, x1) [V, V] from the closed-form conditionals, through the same pipeline."""
    pt = SamplingTensors.from_params([params])
    V = model.vocab_size
    p0 = logits_to_probs(model.conditional_logits(prompt)[None], pt)[0]
    law = np.zeros((V, V))
    for a in range(V):
        p1 = logits_to_probs(model.conditional_logits([*prompt, a])[None], pt)[0]
        law[a] = float(p0[a]) * p1.numpy()
    return law


def test_first_positions_follow_the_exact_law() -> None:
    """Pearson GOF of (x0, x1) over 3000 seeds against the closed-form law, per arm.

    False-failure rate: each exact arm asserts p > 1e-4 (1e-4 each, 2e-4 for the test; the seed is
    fixed, so the outcome is deterministic). The always-accept mutant must be rejected (p < 1e-6):
    the check has teeth at this N.
    """
    target = ToyLM(6, 2, 1.0, seed=11)
    draft = target.perturbed(1.0, seed=12)
    params = SamplingParams(temperature=0.9, top_k=5)
    law = exact_law_two(target, [0], params).reshape(-1)
    rows = [RowSpec("c", s, params) for s in range(3000)]
    arms = {
        "plain": plain_decode(
            target, DecodeRequest([0], rows, num_positions=2, run_key=5, prompt_id="p")
        ),
        "spec": spec(target, draft, rows, T=2, prompt=(0,), drafter=DrafterSpec(onehot=False, k=2)),
        "spec1": spec(target, draft, rows, T=2, prompt=(0,), drafter=DrafterSpec(onehot=True, k=1)),
        "always_accept": spec(
            target, draft, rows, T=2, prompt=(0,), variant=get_variant("always_accept")
        ),
    }
    for name, out in arms.items():
        cells = out.tokens[:, 0] * 6 + out.tokens[:, 1]
        counts = np.bincount(cells, minlength=36)
        assert counts[law == 0].sum() == 0 or name == "always_accept", name  # support (top-k)
        keep = law > 0
        obs, exp = counts[keep], law[keep] * len(rows)
        pvalue = stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue
        if name == "always_accept":
            assert pvalue < 1e-6, pvalue
        else:
            assert pvalue > 1e-4, (name, pvalue)


# -- tables, truncation, progress --------------------------------------------------------------
def test_tables_and_truncation(toy_pair) -> None:
    target, draft = toy_pair
    done: list[int] = []
    out = spec(
        target,
        draft,
        ROWS,
        T=7,
        drafter=DrafterSpec(onehot=False, k=4),
        batch_size=4,
        progress=done.append,
    )
    assert done == [4, 8, 10]
    assert out.tokens.shape == (10, 7) and int(out.tokens.min()) >= 0
    assert out.rounds is not None
    assert out.rounds.groupby("row")["emitted"].sum().tolist() == [7] * 10  # stops exactly at T
    assert (out.rounds["accepted"] <= 4).all() and (out.rounds["drafted"] == 4).all()
    samples = samples_frame(out.tokens, "p", ROWS, schema.CANDIDATE)
    table = pa.Table.from_pandas(samples, schema=schema.SAMPLES_SCHEMA, preserve_index=False)
    assert table.num_rows == 70
    assert samples[schema.TOKEN_ID].tolist()[7:14] == out.tokens[1].tolist()
    assert samples[schema.CONFIG_ID].tolist()[7] == ROWS[1].config_id
    rounds = rounds_frame(out.rounds, "p", ROWS, schema.CANDIDATE)
    assert pa.Table.from_pandas(
        rounds, schema=schema.ROUNDS_SCHEMA, preserve_index=False
    ).num_rows == len(out.rounds)
    plain = plain_decode(
        target, DecodeRequest([3], ROWS, num_positions=4, run_key=1, prompt_id="p")
    )
    assert plain.rounds is None


# -- bad input ---------------------------------------------------------------------------------
def test_bad_input(toy_pair) -> None:
    target, draft = toy_pair
    with pytest.raises(ConfigError, match="k must be an integer >= 1, got 0"):
        DrafterSpec(onehot=False, k=0)
    with pytest.raises(ConfigError, match="q_mode"):
        DrafterSpec(onehot=False, q_mode="softmax")
    with pytest.raises(ModelError, match=r"V=12.*V=13"):
        spec(target, ToyLM(13, 2), ROWS)
    with pytest.raises(InputError, match="prompt must hold"):
        plain_decode(target, DecodeRequest([], ROWS, num_positions=3, run_key=1, prompt_id="p"))
    with pytest.raises(InputError, match="prompt token 12"):
        spec(target, draft, ROWS, prompt=(1, 12))
    with pytest.raises(ConfigError, match="num_positions"):
        plain_decode(target, DecodeRequest([1], ROWS, num_positions=0, run_key=1, prompt_id="p"))
    with pytest.raises(InputError, match="at least one RowSpec"):
        plain_decode(target, DecodeRequest([1], [], num_positions=2, run_key=1, prompt_id="p"))
    nan = ToyLM(12, 3, 2.0, seed=1, table=torch.full((169, 12), float("nan"), dtype=torch.float64))
    with pytest.raises(NumericsError, match="non-finite"):
        plain_decode(nan, DecodeRequest([1], ROWS, num_positions=2, run_key=1, prompt_id="p"))
    with pytest.raises(NumericsError, match="non-finite"):
        spec(nan, draft, ROWS)
    with pytest.raises(NumericsError, match="non-finite"):
        spec(target, nan, ROWS)


def test_one_token_prompt_and_all_configs_run(toy_pair) -> None:
    """A BOS-only prompt (no prefill); every (drafter, q_mode) pair gives in-range tokens."""
    target, draft = toy_pair
    for onehot, q_mode in itertools.product((False, True), ("processed", "temperature", "raw")):
        out = spec(
            target,
            draft,
            ROWS,
            T=5,
            prompt=(0,),
            drafter=DrafterSpec(onehot=onehot, q_mode=q_mode, k=2),
        )
        assert (
            out.tokens.shape == (10, 5)
            and 0 <= int(out.tokens.min())
            and int(out.tokens.max()) < 12
        )
