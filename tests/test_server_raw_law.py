"""A server's full raw law turned into the law it should have sampled (``engines.server_raw_law``,
the http option ``probs_law: raw``; issue 31 item 3, vLLM-CPU #55005).

- ``processed_of`` equals its pure-Python twin and spectest's reference pipeline on random raw
  laws and settings, and the PIT intervals it gives tile [0, 1) with widths equal to the
  processed law: the PIT is exactly U(0, 1) under it, by enumeration of every token (no sampling).
- A list short of the vocabulary is refused (a Violation naming the field), min-p with another
  filter is refused (ConfigError, exit 2), ``probs_law: raw`` is refused off the OpenAI API and
  hashed only when set.
- Through the real http engine and a real loopback server (``tests/fake_completion_server.py``
  reports its fixed law as the raw one): each emitted token's reported p is the law processed at
  the request's temperature and top-p, not the raw one.

All checks are exact (no randomness beyond fixed-seed inputs): false-failure rate 0.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from spectest.engines import replies
from spectest.engines.base import ArmJob, DrafterSpec, Models, RowSpec, options_dict
from spectest.engines.http import HTTPEngine
from spectest.engines.server_raw_law import processed_of, processed_of_reference, settings_of
from spectest.errors import ConfigError
from spectest.sampling.params import SamplingParams
from spectest.sampling.transforms import logits_to_probs_reference
from spectest.stats import pit

FAKE = Path(__file__).resolve().parent / "fake_completion_server.py"
LAW = [(16 - v) / 136 for v in range(16)]  # the fake server's law


def _raw(rng: np.random.Generator, V: int) -> list[tuple[int, float]]:
    x = rng.normal(0.0, 2.0, V)
    x[rng.integers(0, V)] = x.max()  # a tie at the top
    lp = x - (x.max() + math.log(np.exp(x - x.max()).sum()))
    return [(int(i), float(v)) for i, v in enumerate(lp)]


@pytest.mark.parametrize(
    "sp",
    [
        SamplingParams(0.8, 0, 0.8),
        SamplingParams(1.5, 0, 0.6),
        SamplingParams(1.0, 5, 0.95),
        SamplingParams(0.7, 0, 1.0, 0.1),
        SamplingParams(0.0),
    ],
)
def test_processed_law_is_the_pipeline_and_its_pit_is_exactly_uniform(sp: SamplingParams) -> None:
    rng = np.random.default_rng(3)
    a = np.linspace(0.0, 1.0, 101)
    for _ in range(6):
        V = int(rng.integers(2, 40))
        raw = _raw(rng, V)
        law = np.array(
            logits_to_probs_reference(
                [v for _, v in raw], sp.temperature, sp.top_k, sp.top_p, sp.min_p
            )
        )
        rep = np.array([processed_of(raw, v, V, sp, "w")[:2] for v in range(V)])
        slow = np.array([processed_of_reference(raw, v, V, sp, "w")[:2] for v in range(V)])
        np.testing.assert_allclose(rep, slow, atol=1e-12)
        np.testing.assert_allclose(rep[:, 0], law, atol=1e-12)
        lo, w, ok = pit.pit_interval(rep[:, 0], rep[:, 1], np.full(V, np.nan))
        assert ok.all()
        frac = np.clip((a[:, None] - lo) / np.where(w > 0, w, 1.0), 0.0, 1.0)
        np.testing.assert_allclose((frac * law).sum(1), a, atol=1e-12)  # P(u ≤ a) = a


def test_a_partial_raw_law_and_min_p_with_a_filter_are_refused() -> None:
    raw = _raw(np.random.default_rng(0), 8)
    with pytest.raises(replies.Violation, match="the full raw law") as info:
        processed_of(raw[:-1], 0, 8, SamplingParams(0.8), "choices[0].logprobs.top_logprobs[0]")
    assert info.value.path == "choices[0].logprobs.top_logprobs[0]"
    with pytest.raises(ConfigError, match="min-p before top-k/top-p"):
        settings_of({"temperature": 0.8, "top_p": 0.9, "min_p": 0.1, "top_k": -1})
    assert settings_of({"temperature": 0.8, "top_k": -1, "top_p": 1.0}).top_k == 0


def test_probs_law_option_is_checked_and_hashed_only_when_set() -> None:
    base = {"api": "openai", "url": "http://127.0.0.1:1", "probs": 8}
    assert "probs_law" not in options_dict(HTTPEngine.parse_options(base, "t"))
    raw = options_dict(HTTPEngine.parse_options({**base, "probs_law": "raw"}, "t"))
    assert raw["probs_law"] == "raw"
    for bad in ({**base, "probs_law": "logits"}, {**base, "api": "llamacpp", "probs_law": "raw"}):
        with pytest.raises(ConfigError, match=r"t\.probs_law"):
            HTTPEngine.parse_options(bad, "t")


def test_http_engine_reports_the_processed_law_of_a_raw_report() -> None:
    sp = SamplingParams(temperature=0.8, top_p=0.5)
    raw = {
        "api": "openai",
        "server": ["{python}", str(FAKE), "--port", "{port}"],
        "probs": 16,
        "probs_law": "raw",
    }
    eng = HTTPEngine(
        HTTPEngine.parse_options(raw, "t"), Models(SimpleNamespace(vocab_size=16), None)
    )
    job = ArmJob(
        arm="candidate", role="candidate", variant=None, prompt_id="p0", prompt_ids=(1, 2, 3),
        rows=tuple(RowSpec("c", 100 + i, sp) for i in range(6)), num_positions=5, run_key=9,
        batch_size=16, drafter=DrafterSpec(onehot=False, k=3),
    )  # fmt: skip
    try:
        out = eng.generate(job)
    finally:
        eng.close()
    law = logits_to_probs_reference([math.log(p) for p in LAW], 0.8, 0, 0.5)
    assert out.reported is not None
    for (b, t), tok in np.ndenumerate(out.tokens):
        p, lo, mass = out.reported[b, t]
        assert p == pytest.approx(law[tok], abs=1e-12) and np.isnan(mass)
        assert lo == pytest.approx(sum(law[:tok]), abs=1e-12)  # LAW descends in id
    assert (out.reported[..., 0] == 0).any()  # tokens the processed law cuts: support fails there
