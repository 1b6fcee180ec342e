"""The processed law rebuilt from a server's top-n list of its raw (vLLM) or tempered (SGLang)
law (``engines.top_n_law``, issue 31), against the whole vocabulary's law from a real torch
model (the bundled target, V 259): the bracket on Z_T = Σ_v p_v^(1/T) holds; where a list
decides a nucleus it is the full law's (same support, values to 1e-12), where the bracket
straddles the cut it is refused with one line; the grid has teeth (ignoring the outside mass,
Z = Σ_list p^(1/T), cuts elsewhere in some of the decided cases). Through a real loopback server
answering from that model (``tests/model_openai_server.py``): claim (b)'s laws at prefixes
(``probs_law: tempered`` and ``raw`` with ``probs`` n < V) and claim (a)'s per-token (p, cdf_lo)
equal the whole vocabulary's; refusals are one line, exit 2; the PIT of a correct server's
tokens under the rebuilt law is uniform, and a sampler that applies top-p before temperature
emits tokens the rebuilt law gives p = 0.

False-failure rates: every check but one is deterministic (fixed laws, fixed seeds). The PIT's
KS at p > 1e-3 would fail a correct server 0.1 % of the time over seeds; at the fixed seeds used
it passes (p printed by ``-s``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

from spectest.engines.base import Models
from spectest.engines.http import HTTPEngine
from spectest.engines.plain_laws import LawAsker
from spectest.engines.replies import ReplyError, Violation
from spectest.engines.server_raw_law import processed_law
from spectest.engines.top_n_law import processed_from_list, z_bracket
from spectest.errors import ConfigError, EngineError, ExitCode
from spectest.sampling.params import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from model_openai_server import ModelServer, _law  # noqa: E402

PROMPTS = [list(b"def main():\n    "), list(b"The cat sat on the"), list(b"import os\nimport ")]
TEMPS = (0.5, 0.7, 0.9, 1.3, 2.0)
TOP_PS = (0.5, 0.7, 0.8, 0.9, 0.95)


@pytest.fixture(scope="module")
def model() -> Any:
    from spectest.models.zoo import load_model

    return load_model("bundled:target")


def _prefix_logits(model: Any) -> list[torch.Tensor]:
    with torch.inference_mode():
        return [model.logits_full(torch.tensor([p]))[0, -1].double() for p in PROMPTS]


def test_the_bracket_holds_and_a_decided_nucleus_is_the_full_law(model: Any) -> None:
    V = int(model.vocab_size)
    decided = straddled = naive_wrong = 0
    for logits in _prefix_logits(model):
        raw = torch.log_softmax(logits, -1)
        full_raw = list(enumerate(raw.tolist()))
        order = sorted(range(V), key=lambda v: (-float(raw[v]), v))
        for n, T, top_p in ((n, T, q) for n in (8, 32) for T in TEMPS for q in TOP_PS):
            ids = order[:n]
            p = raw[ids].exp()
            zlo, zhi = z_bracket(p, V, 1 / T)
            z = float((raw.exp() ** (1 / T)).sum())
            assert zlo <= z * (1 + 1e-12) and z <= zhi * (1 + 1e-12), (n, T, zlo, z, zhi)
            sp = SamplingParams(temperature=T, top_p=top_p)
            full = processed_law(full_raw, V, sp, "w")
            w = p ** (1 / T)
            naive_keep = _nucleus_size(w / w.sum(), top_p)  # o ignored: Z = Σ_list p^(1/T)
            try:
                got = processed_from_list(ids, p.tolist(), V, sp, "w")
            except Violation as v:
                assert "\n" not in str(v) and "top-p nucleus" in str(v)
                straddled += "one cut for every Z" in str(v)
                continue
            decided += 1
            assert torch.equal(got > 0, full > 0)
            torch.testing.assert_close(got, full, rtol=0, atol=1e-12)
            naive_wrong += naive_keep != int((full > 0).sum())
    print(f"decided {decided}, straddled {straddled}, naive Z wrong on {naive_wrong}")
    assert decided >= 40 and straddled >= 5 and naive_wrong >= 3


def _nucleus_size(q: torch.Tensor, top_p: float) -> int:
    """Tokens the nucleus of ``q`` (a law over the list, normalised as if Z = Σ_list) keeps."""
    s = torch.sort(q, descending=True).values
    before = torch.cumsum(s, 0) - s
    return int(((before < top_p) & (s > 0)).sum())


def _http(url: str, V: int, kind: str, probs: int) -> Any:
    raw = {"api": "openai", "url": url, "model": "m", "probs": probs, "probs_law": kind}
    raw["concurrency"] = 2
    return SimpleNamespace(name="http", options=HTTPEngine.parse_options(raw, "t"))


TOKENS = np.array([[65, 66, 67], [65, 68, -1], [70, 71, 72]])


@pytest.mark.parametrize(
    ("kind", "sp"),
    [
        ("tempered", SamplingParams(temperature=0.7, top_k=10, top_p=0.9)),
        ("tempered", SamplingParams(temperature=1.4, top_p=0.6)),
        ("tempered", SamplingParams(temperature=0.8, min_p=0.05)),
        ("tempered", SamplingParams(temperature=0.0)),
        ("raw", SamplingParams(temperature=0.7, top_p=0.8)),
    ],
)
def test_claim_b_laws_from_a_real_server_list_are_the_full_law(
    model: Any, kind: str, sp: SamplingParams
) -> None:
    """``probs`` 24 of 259: the laws at every prefix equal the model's processed law."""
    V = int(model.vocab_size)
    server = ModelServer(model, kind)
    asker = LawAsker(_http(server.url, V, kind, 24), Models(SimpleNamespace(vocab_size=V), None))
    try:
        got = asker.laws(PROMPTS[0], sp, TOKENS)
    finally:
        asker.close()
        server.close()
    assert len(got) == 5 and server.requests == 5  # the distinct prefixes
    for h, (ids, p) in got.items():
        want = _law(server.logits(PROMPTS[0] + list(h)), sp).numpy()
        assert ids.tolist() == np.flatnonzero(want).tolist() and len(ids) <= 24
        np.testing.assert_allclose(p, want[ids], rtol=0, atol=1e-12)


def test_claim_b_refusals_and_the_unfiltered_tempered_list(model: Any) -> None:
    """Top-k 40 > 24, and a nucleus that leaves the list, are refused with one line (exit 2);
    a tempered list without a filter is the processed law's top 24 (short of 1: coarsened)."""
    V = int(model.vocab_size)
    server = ModelServer(model, "tempered")
    models = Models(SimpleNamespace(vocab_size=V), None)
    try:
        for sp, why in (
            (SamplingParams(temperature=0.7, top_k=40), "closes inside the top-24 tempered"),
            (SamplingParams(temperature=1.5, top_p=0.999), "the nucleus may leave the list"),
        ):
            asker = LawAsker(_http(server.url, V, "tempered", 24), models)
            with pytest.raises(EngineError, match=why) as e:
                asker.laws(PROMPTS[1], sp, TOKENS)
            assert "\n" not in str(e.value) and e.value.exit_code == ExitCode.BAD_INPUT
        sp = SamplingParams(temperature=1.5)
        got = LawAsker(_http(server.url, V, "tempered", 24), models).laws(PROMPTS[1], sp, TOKENS)
    finally:
        server.close()
    for h, (ids, p) in got.items():
        want = _law(server.logits(PROMPTS[1] + list(h)), sp).numpy()
        assert len(ids) == 24 and p.sum() < 1 - 1e-3
        np.testing.assert_allclose(p, want[ids], rtol=0, atol=1e-12)
        assert float(p.min()) >= float(np.sort(want)[-24]) - 1e-15  # the top 24


def _engine(url: str, kind: str, probs: int) -> HTTPEngine:
    raw = {"api": "openai", "url": url, "model": "m", "probs": probs, "probs_law": kind}
    models = Models(SimpleNamespace(vocab_size=259), None)
    return HTTPEngine(HTTPEngine.parse_options(raw, "t"), models)


def _reported(
    server: ModelServer, kind: str, sp: SamplingParams, seeds: range, n: int = 24
) -> list[Any]:
    """(prefix, token, reported (p, cdf_lo, mass)) of every token of 6-token replies."""
    eng, out = _engine(server.url, kind, n), []
    for seed in seeds:
        r = eng._one(PROMPTS[2], sp, seed, 6, "t")
        assert r.reported is not None
        for i, (t, rep) in enumerate(zip(r.tokens, r.reported, strict=True)):
            out.append((PROMPTS[2] + r.tokens[:i], t, rep))
    return out


@pytest.mark.parametrize(
    ("kind", "sp", "n"),
    [
        ("tempered", SamplingParams(temperature=0.6, top_p=0.8), 24),
        ("tempered", SamplingParams(temperature=1.2, top_k=12), 24),
        ("raw", SamplingParams(temperature=0.6, top_p=0.8), 64),
    ],
)
def test_claim_a_from_a_real_server_list(model: Any, kind: str, sp: SamplingParams, n: int) -> None:
    """Each token's (p, cdf_lo) from the 24-entry list is the whole vocabulary's (processed
    law from the model's logits; cdf_lo in descending p, ties by id; the raw list at
    temperature 0.6 needs 64 entries for the bracket to decide every nucleus met, 24 straddle
    once); the randomised PIT of 600 tokens is uniform (KS p > 1e-3); the misordered
    sampler's tokens include ones the rebuilt law gives p = 0 (support)."""
    server = ModelServer(model, kind)
    try:
        got = _reported(server, kind, sp, range(100), n)
    finally:
        server.close()
    u = np.random.default_rng(5).uniform(size=len(got))
    pit = []
    for (prefix, tok, (p, lo, mass)), v in zip(got, u, strict=True):
        want = _law(server.logits(prefix), sp).numpy()
        before = want[(want > want[tok]) | ((want == want[tok]) & (np.arange(len(want)) < tok))]
        assert mass is None and abs(p - want[tok]) <= 1e-12 and abs(lo - before.sum()) <= 1e-12
        pit.append(lo + v * p)
    ks = stats.kstest(pit, "uniform")
    print(f"{kind} {sp}: {len(pit)} tokens, KS {ks.statistic:.4f} p {ks.pvalue:.3f}")
    assert ks.pvalue > 1e-3
    bug = ModelServer(model, kind, bug="untempered-top-p")
    try:
        bad = _reported(bug, kind, sp, range(100), n)
    finally:
        bug.close()
    zero = sum(rep[0] == 0 for _, _, rep in bad)
    print(f"misordered: {zero} of {len(bad)} tokens with p = 0 under the rebuilt law")
    assert zero > 0 if sp.top_p < 1 else zero == 0


def test_claim_a_refuses_a_list_that_does_not_fix_the_law(model: Any) -> None:
    server = ModelServer(model, "tempered")
    try:
        with pytest.raises(ReplyError, match="closes inside the top-24 tempered list") as e:
            _reported(server, "tempered", SamplingParams(temperature=0.8, top_k=50), range(1))
    finally:
        server.close()
    assert "\n" not in str(e.value) and e.value.exit_code == ExitCode.BAD_INPUT


def test_probs_law_tempered_is_an_openai_option() -> None:
    opts = HTTPEngine.parse_options(
        {"api": "openai", "url": "http://127.0.0.1:9", "probs_law": "tempered"}, "t"
    )
    assert opts.probs_law == "tempered"
    with pytest.raises(ConfigError, match="raw / tempered with api openai"):
        HTTPEngine.parse_options({"url": "http://127.0.0.1:9", "probs_law": "tempered"}, "t")
