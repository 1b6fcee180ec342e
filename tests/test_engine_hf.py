"""The hf backend (transformers generate / assisted generation) and its teacher forcing.

What is checked: every sampling field reaches ``generate`` explicitly (the processor list that
transformers itself builds is recorded and compared with ``hf_warpers``; checkpoint defaults such
as top_k = 50 or an EOS id do not leak); the assistant's K / schedule / threshold are set and
restored; the round telemetry accounts for every token; transformers' own processed target scores
equal our teacher-forced p_t; the q it used is one of the documented laws (release-dependent);
HF warpers vs ``logits_to_probs``; reproducibility and RNG isolation; and a cross-engine null
(builtin plain decode vs transformers' plain generate on the same model) through ``analyze``.
Runs on tiny random-init models (V = 64) in about 30 s on one core.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from spectest import schema
from spectest.engines.base import DecodeRequest, samples_frame
from spectest.engines.builtin import RowSpec, plain_decode
from spectest.engines.hf import decode as hfd
from spectest.engines.hf import laws as ht
from spectest.engines.hf import pinning as hfp
from spectest.engines.hf import probe as hfprobe
from spectest.engines.hf import rounds as hfr
from spectest.engines.teacher import teacher_force
from spectest.errors import ConfigError, InputError, ModelError
from spectest.models.toy import ToyLM
from spectest.models.zoo import load_pair
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.transforms import logits_to_probs

PROMPT = [1, 2, 3]
RUN_KEY = 77
PARAMS = {
    "t1": SamplingParams(temperature=1.0),
    "t0.8-p0.9": SamplingParams(temperature=0.8, top_p=0.9),
    "t1.2-k8": SamplingParams(temperature=1.2, top_k=8),
    "t0.7-k20-p0.95-m0.05": SamplingParams(temperature=0.7, top_k=20, top_p=0.95, min_p=0.05),
}


@pytest.fixture(scope="module")
def pair():
    """V = 64, logit_scale 30 (entropy ≈ 2.2 nats), draft = noised copy (acceptance ≈ 0.85)."""
    return load_pair(
        "hf-preset:llama-tiny,vocab_size=64,logit_scale=30", "derived:noised,noise=0.05", seed=0
    )


def _record_processors(model):
    """Record the lists ``_get_logits_processor`` (and 4.x ``_get_logits_warper``) build."""
    inner = hfp.hf_model_of(model)
    seen: list[list[object]] = []
    names = [n for n in ("_get_logits_processor", "_get_logits_warper") if hasattr(inner, n)]
    originals = {n: getattr(inner, n) for n in names}

    def wrap(name):
        def f(*a, **k):
            out = originals[name](*a, **k)
            seen.append(list(out))
            return out

        return f

    for n in names:
        setattr(inner, n, wrap(n))
    return seen, lambda: [delattr(inner, n) for n in names]


def _describe(procs) -> list[tuple]:
    out = []
    for p in procs:
        attrs = tuple(
            float(getattr(p, a))
            for a in ("temperature", "top_k", "top_p", "min_p", "scale")
            if hasattr(p, a)
        )
        out.append((type(p).__name__, attrs))
    return out


# ----------------------------------------------------------------------------- generation config
def test_generation_config_sets_everything_explicitly():
    gc = hfp.generation_config(
        SamplingParams(temperature=0.5, top_k=0, top_p=1.0, min_p=0.0), 7, 64
    )
    assert gc.do_sample is True and gc.temperature == 0.5
    assert gc.top_k == 0 and gc.top_p == 1.0 and gc.min_p == 0.0  # 0 = off, never None (→ 50)
    assert gc.max_new_tokens == 7 and gc.min_new_tokens is None
    assert list(gc.eos_token_id) == [] and gc.pad_token_id == 64  # no EOS; pad is no real id
    assert gc.repetition_penalty == 1.0 and gc.num_beams == 1 and gc.renormalize_logits is False
    greedy = hfp.generation_config(SamplingParams(temperature=0.0), 3, 64)
    assert greedy.do_sample is False
    with pytest.raises(ConfigError, match="num_tokens must be an integer >= 1, got 0"):
        hfp.generation_config(SamplingParams(), 0, 64)


@pytest.mark.parametrize("cid", list(PARAMS))
def test_transformers_builds_exactly_our_warpers(pair, cid):
    """Processors ``generate`` builds = [LogitScale] + ``hf_warpers``, whatever the checkpoint."""
    target, _ = pair
    params = PARAMS[cid]
    inner = hfp.hf_model_of(target)
    saved = inner.generation_config
    # checkpoint-style defaults that must not leak into the law
    leaky = dict(
        top_k=5,
        eos_token_id=2,
        repetition_penalty=1.3,
        suppress_tokens=[5, 6],
        forced_bos_token_id=7,
    )
    if hasattr(saved, "top_h"):
        leaky["top_h"] = 0.5
    inner.generation_config = type(saved)(**leaky)
    seen, restore = _record_processors(target)
    try:
        toks, _ = hfd.generate_plain(target, torch.tensor(PROMPT), params, 6, 3, seed=1)
    finally:
        restore()
        inner.generation_config = saved
    assert inner.generation_config is saved
    assert toks.shape == (3, 6)
    built = [p for lst in seen for p in lst]
    expected = [hfp.LogitScale(30.0), *ht.hf_warpers(params)]
    assert _describe(built) == _describe(expected)


def test_assistant_settings_set_and_restore(pair):
    _, draft = pair
    inner = hfp.hf_model_of(draft)
    saved = inner.generation_config
    with hfp.assistant_settings(draft, 3, 0.0):
        gc = inner.generation_config
        assert gc is not saved  # blank: no checkpoint default can leak into the draft
        assert gc.num_assistant_tokens == 3 and gc.num_assistant_tokens_schedule == "constant"
        if hfp.has_confidence_threshold():
            assert gc.assistant_confidence_threshold == 0.0
    assert inner.generation_config is saved
    with pytest.raises(ConfigError, match="num_assistant_tokens must be an integer >= 1, got 0"):
        with hfp.assistant_settings(draft, 0):
            pass
    with pytest.raises(ConfigError, match=r"confidence_threshold must be in \[0, 1\), got 1.5"):
        with hfp.assistant_settings(draft, 2, 1.5):
            pass


def test_models_transformers_cannot_run():
    with pytest.raises(ModelError, match="is not a transformers model"):
        hfp.hf_model_of(ToyLM(8, 1, 1.0, seed=0))


def test_logit_scale_mismatch_is_refused(pair):
    target, _ = pair
    other, _ = load_pair(
        "hf-preset:llama-tiny,vocab_size=64,logit_scale=2", "derived:noised,noise=0.05", seed=0
    )
    with pytest.raises(ModelError, match=r"logit_scale differ \(30.0 vs 2.0\)"):
        hfd.generate_assisted(target, other, torch.tensor(PROMPT), PARAMS["t1"], 4, 2, seed=0)


# ----------------------------------------------------------------------------- telemetry and laws
def test_round_telemetry_and_engine_p_equal_teacher(pair):
    """transformers' processed target scores (recorded) = our teacher-forced p_t, every round."""
    target, draft = pair
    params = PARAMS["t0.7-k20-p0.95-m0.05"]
    T, K = 10, 3
    for seed in (0, 1, 2):
        toks, rec = hfd.generate_assisted(
            target, draft, torch.tensor(PROMPT), params, T, K, seed, keep_scores=True
        )
        assert toks.shape == (T,) and sum(r.emitted for r in rec.rounds) == T
        pos = 0
        for r, (spos, drafted, _, p_scores) in zip(rec.rounds, rec.scores, strict=True):
            assert r.position == pos == spos and 0 <= r.accepted <= r.drafted <= K
            assert (
                len(r.engine_overlap) == r.accepted + (r.accepted < r.drafted)
                if r.drafted
                else not r.engine_overlap
            )
            assert all(0.0 <= a <= 1.0 for a in r.engine_accept_prob)
            assert toks[pos : pos + r.accepted].tolist() == drafted[: r.accepted].tolist()
            # p at the drafted positions and the bonus one: prompt + prefix + drafts + 1 dummy
            seq = torch.cat(
                [torch.tensor(PROMPT), toks[:pos], drafted, torch.zeros(1, dtype=torch.int64)]
            )[None]
            p_teacher = ht.forced_probs(target, seq, len(PROMPT) + pos, params)[0]  # [d + 1, V]
            p_engine = torch.softmax(p_scores.double(), dim=-1)
            assert (p_teacher - p_engine).abs().max() < 1e-5
            pos += r.emitted


def test_probe_finds_the_q_this_release_uses(pair):
    """The q ``_speculative_sampling`` uses is one documented law (to 1e-4), pinned per release."""
    from transformers import GenerationMixin

    target, draft = pair
    params = PARAMS["t0.8-p0.9"]  # temperature and top-p: warpers twice ≠ once
    probe = hfprobe.probe_draft_law(target, draft, torch.tensor(PROMPT), params, 8, 3, seeds=[0, 1])
    assert probe.q_law != "unknown", probe
    # 4.4x (warpers kept apart): greedy assistant, q = raw softmax (transformers #32867)
    if hasattr(GenerationMixin, "_get_logits_warper"):
        assert probe.q_law == "raw" and probe.argmax_fraction == 1.0
    else:  # 5.x: the assistant samples from the warpers applied twice
        assert probe.q_law == "processed_twice" and probe.argmax_fraction < 1.0
        assert probe.max_abs_diff["processed"] > 1e-2


def test_hf_warpers_agree_with_logits_to_probs():
    """HF's float32 warper chain vs spectest's float64 pipeline: same support, |Δp| < 2e-5.

    Continuous random logits have no exact top-k/top-p boundary ties, where the two may differ.
    """
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(200, 1, 64, generator=g) * 3).float()  # [N, 1, V]
    for params in PARAMS.values():
        p_hf = ht.processed_probs(logits, params)[:, 0]  # [N, V]
        p_st = logits_to_probs(logits[:, 0], SamplingTensors.from_params([params] * 200))
        assert torch.equal(p_hf > 0, p_st > 0)
        assert (p_hf - p_st).abs().max() < 2e-5


def test_processed_probs_twice_sharpens():
    logits = torch.tensor([[[2.0, 1.0, 0.0, -1.0]]])
    once = ht.processed_probs(logits, SamplingParams(temperature=0.5))
    twice = ht.processed_probs(logits, SamplingParams(temperature=0.5), times=2)
    assert torch.allclose(twice, ht.processed_probs(logits, SamplingParams(temperature=0.25)))
    assert float(twice.max()) > float(once.max())
    with pytest.raises(ConfigError, match="draft law must be one of"):
        ht.draft_law(logits, SamplingParams(), "cooked")


# ----------------------------------------------------------------------------- rows → outputs
def test_plain_batches_never_mix_params():
    a, b = SamplingParams(temperature=0.5), SamplingParams(temperature=0.9)
    rows = [RowSpec("a", s, a) for s in range(5)] + [RowSpec("b", s, b) for s in range(3)]
    assert hfd.plain_batches(rows, 2) == [(0, 2), (2, 4), (4, 5), (5, 7), (7, 8)]
    assert hfd.plain_batches(rows, 100) == [(0, 5), (5, 8)]


def test_reproducible_and_global_rng_untouched(pair):
    target, draft = pair
    rows = [RowSpec("x", s, PARAMS["t1.2-k8"]) for s in range(4)]
    state = torch.get_rng_state()
    kw = dict(num_positions=5, run_key=RUN_KEY, prompt_id="p")
    a = hfd.hf_plain_decode(target, DecodeRequest(PROMPT, rows, batch_size=4, **kw))
    assert torch.equal(torch.get_rng_state(), state)
    b = hfd.hf_plain_decode(target, DecodeRequest(PROMPT, rows, batch_size=4, **kw))
    assert np.array_equal(a.tokens, b.tokens) and a.tokens.shape == (4, 5)
    c = hfd.hf_assisted_decode(
        target, draft, DecodeRequest(PROMPT, rows, **kw), num_assistant_tokens=2
    )
    d = hfd.hf_assisted_decode(
        target, draft, DecodeRequest(PROMPT, rows[2:3], **kw), num_assistant_tokens=2
    )
    assert torch.equal(torch.get_rng_state(), state)
    assert np.array_equal(c.tokens[2], d.tokens[0])  # per-row reproducible
    r = c.rounds
    assert set(hfr.ROUND_EXTRA_COLUMNS) <= set(r.columns)
    assert (r.groupby("row")["emitted"].sum() == 5).all()
    with pytest.raises(InputError, match="rows: at least one RowSpec"):
        hfd.hf_plain_decode(target, DecodeRequest(PROMPT, [], **kw))
    with pytest.raises(ConfigError, match=r"prompt token ids must be in \[0, 64\)"):
        hfd.hf_plain_decode(target, DecodeRequest([1, 99], rows, **kw))


def test_hf_teacher_force_alignment(pair):
    target, draft = pair
    rows = [RowSpec(c, s, p) for c, p in PARAMS.items() for s in range(2)]
    out = hfd.hf_plain_decode(
        target, DecodeRequest(PROMPT, rows, num_positions=4, run_key=RUN_KEY, prompt_id="p")
    )
    wb = ht.hf_teacher_force(target, PROMPT, [r.params for r in rows], out.tokens, draft=draft)
    assert list(wb.columns) == list(schema.WHITEBOX_COLUMNS) and len(wb) == len(rows) * 4
    # row 5, position 2 by hand. NOTE a one-row float32 forward may round differently from the
    # batched one (CPU GEMM kernels depend on shape and threads: 2e-7 seen under load); the check
    # is the alignment (row, position, token), which a misalignment would miss by far more
    seq = torch.cat([torch.tensor(PROMPT), torch.from_numpy(out.tokens[5])])[None]
    p = ht.forced_probs(target, seq, len(PROMPT), rows[5].params)[0, 2]
    assert wb[schema.WB_P].iloc[5 * 4 + 2] == pytest.approx(float(p[out.tokens[5, 2]]), rel=1e-5)
    assert (wb[schema.WB_P] > 0).all() and wb[schema.WB_OVERLAP].between(0, 1).all()


# ----------------------------------------------------------------------------- cross-engine null
def test_cross_engine_null_builtin_plain_vs_transformers_generate(pair):
    """spectest's plain decode and transformers' plain generate have the same law (analyze passes).

    Fixed seeds; under H0 the run-level false-failure rate is ≤ α = 0.05 (union bound over the
    families, ``Analysis`` docstring), so this seed either passes or documents a 5 % event.
    """
    from spectest.stats.battery import AnalysisOptions, analyze

    target, _ = pair
    params = PARAMS["t0.7-k20-p0.95-m0.05"]
    T, N = 3, 300
    ref_rows = [RowSpec("c", s, params) for s in range(N)]
    cand_rows = [RowSpec("c", s, params) for s in range(N, 2 * N)]
    kw = dict(num_positions=T, run_key=RUN_KEY, prompt_id="p")
    ref = plain_decode(target, DecodeRequest(PROMPT, ref_rows, **kw))
    cand = hfd.hf_plain_decode(target, DecodeRequest(PROMPT, cand_rows, batch_size=100, **kw))
    frames = []
    for out, rows, arm, wb in (
        (
            ref,
            ref_rows,
            "reference",
            teacher_force(target, PROMPT, [r.params for r in ref_rows], ref.tokens),
        ),
        (
            cand,
            cand_rows,
            "candidate",
            ht.hf_teacher_force(target, PROMPT, [r.params for r in cand_rows], cand.tokens),
        ),
    ):
        frames.append(pd.concat([samples_frame(out.tokens, "p", rows, arm), wb], axis=1))
    samples = pd.concat(frames, ignore_index=True)
    a = analyze(
        samples,
        reference="reference",
        candidate="candidate",
        options=AnalysisOptions(null_permutations=50, trie_depth=1, trie_min_count=50),
        rng_seed=3,
    )
    assert not a.rejected, a.summary()
    assert a.n_tested >= T and not a.support_violation and not a.whitebox_control_failed
    pit = a.whitebox[(a.whitebox["arm"] == "candidate") & (a.whitebox["test"] == "pit_ks")]
    assert len(pit) == 1 and float(pit["pvalue"].iloc[0]) > 0.001
    assert np.isfinite(a.max_tv_excess)


# ----------------------------------------------------------------------------- protocol end to end
PROTOCOLS = __import__("pathlib").Path(__file__).resolve().parent.parent / "protocols"


def test_protocol_engine_key_is_validated(tmp_path):
    import yaml

    DROP = object()
    from spectest.engines.hf.engines import HFAssistedEngine, HFGenerateEngine
    from spectest.protocol import EngineChoice, load_protocol

    raw = yaml.safe_load((PROTOCOLS / "hf-assisted-ci.yaml").read_text())
    raw["prompts"]["file"] = str(PROTOCOLS / "prompts" / "ids-tiny.jsonl")
    p = load_protocol(PROTOCOLS / "hf-assisted-ci.yaml")
    assert p.reference_engine == EngineChoice("hf-generate", HFGenerateEngine.Options())
    assert p.candidate_engine == EngineChoice("hf-assisted", HFAssistedEngine.Options(0.0))
    cases = [
        (
            {"engine": {"candidate": "vllm"}},
            r"engine.candidate: expected one of builtin, hf-assisted",
        ),
        ({"engine": {"reference": "hf-assisted"}}, r"engine.reference: expected one of builtin"),
        ({"engine": {"flavour": 1}}, r"engine.flavour: unknown key 'flavour'"),
        (
            {"engine": {**raw["engine"], "assistant_confidence_threshold": 1.5}},
            r"engine.assistant_confidence_threshold: expected a number in \[0, 1\)",
        ),
        (
            {
                "version": 2,
                "engine": DROP,
                "engines": {"candidate": {"name": "hf-assisted", "x": 1}},
            },
            r"engines.candidate.x: unknown key 'x' \(allowed: name, assistant_confidence_thr",
        ),
        (
            {"version": 2, "engine": DROP, "engines": {"candidate": "vllm"}},
            r"engines.candidate.name: unknown engine 'vllm' \(known: builtin, hf-generate",
        ),
        ({"engines": {"candidate": "builtin"}}, r"engines: needs version: 2"),
        ({"candidate": "always_accept"}, r"candidate: engine hf-assisted runs transformers' own"),
        ({"drafter": {"kind": "onehot", "k": 3}}, r"drafter: engine hf-assisted is teacher-forced"),
    ]
    for i, (patch, msg) in enumerate(cases):
        f = tmp_path / f"p{i}.yaml"
        f.write_text(yaml.safe_dump({k: v for k, v in {**raw, **patch}.items() if v is not DROP}))
        with pytest.raises(ConfigError, match=msg):
            load_protocol(f)
    # a builtin-only protocol keeps its hash (engine is hashed only when not the default)
    f = tmp_path / "builtin.yaml"
    f.write_text(
        yaml.safe_dump(
            {**{k: v for k, v in raw.items() if k != "engine"}, "drafter": raw["drafter"]}
        )
    )
    f2 = tmp_path / "builtin2.yaml"
    f2.write_text(
        yaml.safe_dump({**raw, "engine": {"reference": "builtin", "candidate": "builtin"}})
    )
    assert load_protocol(f).hash == load_protocol(f2).hash != p.hash


def test_ci_protocol_end_to_end(tmp_path):
    """protocols/hf-assisted-ci.yaml through ``run_protocol``: transformers' assisted generation
    against its plain generate, with builtin teeth.

    The candidate is exact in transformers >= 4.45 (a pass); 4.44 has transformers #32867
    (a greedy draft token with q = softmax) and must fail, by a wide margin (TV ≈ 0.65 measured).
    Fixed seeds; an exact candidate fails with probability ≤ α = 0.05 (union bound).

    The null tooth is hf-generate itself, plain vs plain on its own seeds (the reference engine
    is foreign: ``Protocol.null_on_reference``): the same law by construction, so it passes
    except with probability ≤ α = 0.05 at any numerics; the report says what it compared.
    """
    from transformers import GenerationMixin

    from spectest.plan import make_plan
    from spectest.protocol import load_protocol
    from spectest.runner import run_protocol

    res = run_protocol(load_protocol(PROTOCOLS / "hf-assisted-ci.yaml"), out=tmp_path / "run")
    teeth = {t.arm: t.label for t in res.verdict.teeth}
    assert teeth == {
        "null": "passed (sound)", "mutant:onehot_softmax_q": "killed (size 0.509)",
    }, teeth  # fmt: skip
    protocol = load_protocol(PROTOCOLS / "hf-assisted-ci.yaml")
    null = make_plan(protocol).arm("null")
    assert (null.engine, null.variant) == (protocol.reference_engine, None)
    assert res.summary["arms_engines"]["null"] == "hf-generate (plain vs plain, disjoint seeds)"
    said = [t.get("null") for t in res.summary["teeth"] if t["arm"] == "null"]
    assert said == ["hf-generate plain vs plain, disjoint seeds"]
    assert (
        "pass (hf-generate plain vs plain, disjoint seeds)"
        in (tmp_path / "run" / "report.md").read_text()
    )
    rounds = pd.read_parquet(tmp_path / "run" / "rounds.parquet")
    assert "null" not in set(rounds[schema.ARM])  # plain decoding: no rounds
    assert (
        rounds[rounds[schema.ARM] == "candidate"].groupby(schema.SEED)["emitted"].sum() == 4
    ).all()
    buggy = hasattr(GenerationMixin, "_get_logits_warper")  # 4.4x, before transformers #33534
    assert res.verdict.decision == ("different" if buggy else "equivalent"), res.summary["verdict"]
