"""Model zoo: toy LM closed form, HF slot cache with holes, draft derivation, spec strings."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from spectest.errors import ConfigError, ModelError
from spectest.models import zoo
from spectest.models.base import LanguageModel
from spectest.models.derive import check_same_vocab, first_layers, noised
from spectest.models.hf import HFModel, from_local, from_preset
from spectest.models.toy import ToyLM


@pytest.fixture(scope="module")
def llama() -> HFModel:
    return from_preset("llama-tiny", seed=1, logit_scale=3.0)


@pytest.fixture(scope="module")
def qwen() -> HFModel:
    return from_preset("qwen3-tiny", seed=2)


def run_with_holes(model: LanguageModel, seqs: torch.Tensor, seed: int) -> torch.Tensor:
    """Feed ``seqs`` [B, L] in random chunks, interleaving junk slots that are then invalidated
    (the speculative engine's pattern: junk of different lengths per row within one call).
    Returns the logits of the real tokens [B, L, V] in order."""
    gen = torch.Generator().manual_seed(seed)
    B, L = seqs.shape
    cache = model.new_cache(B)
    out = []
    t = 0
    while t < L:
        s = int(torch.randint(1, 4, (1,), generator=gen))
        chunk = seqs[:, t : t + s]  # [B, s]
        out.append(model.forward(cache, chunk))
        t += chunk.shape[1]
        if t < L:  # append 3 junk slots, keep a per-row random prefix of them as... holes all
            junk = torch.randint(0, model.vocab_size, (B, 3), generator=gen)
            n0 = cache.num_slots
            model.forward(cache, junk)
            mask = torch.zeros((B, cache.num_slots), dtype=torch.bool)
            mask[:, n0:] = True
            cache.invalidate(mask)
    return torch.cat(out, dim=1)  # [B, L, V]


# -- toy ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("order", [1, 2, 3])
def test_toy_cache_with_holes_equals_closed_form(order: int) -> None:
    m = ToyLM(6, order, 2.0, seed=order)
    seqs = torch.randint(0, 6, (4, 9), generator=torch.Generator().manual_seed(0))
    got = run_with_holes(m, seqs, seed=order)
    for b in range(4):
        for i in range(9):
            assert torch.equal(got[b, i], m.conditional_logits(seqs[b, : i + 1].tolist()))


def test_toy_partial_holes_row_dependent() -> None:
    """Holes at different slots per row, the engine's real pattern (accepted prefix kept)."""
    m = ToyLM(5, 3, 1.5, seed=7)
    cache = m.new_cache(2)
    m.forward(cache, torch.tensor([[1, 2, 3, 4], [4, 3, 2, 1]]))
    cache.invalidate(torch.tensor([[0, 0, 1, 1], [0, 0, 0, 1]], dtype=torch.bool))
    got = m.forward(cache, torch.tensor([[0], [0]]))[:, 0]
    assert torch.equal(got[0], m.conditional_logits([1, 2, 0]))
    assert torch.equal(got[1], m.conditional_logits([4, 3, 2, 0]))


def test_toy_seeded_and_perturbed() -> None:
    a, b = ToyLM(8, 2, 1.0, seed=3), ToyLM(8, 2, 1.0, seed=3)
    assert torch.equal(a.table, b.table)
    assert not torch.equal(a.table, ToyLM(8, 2, 1.0, seed=4).table)
    d = a.perturbed(0.3, seed=1)
    assert d.vocab_size == 8 and d.order == 2
    diff = (d.table - a.table).std().item()
    assert 0.2 < diff < 0.4  # 144 iid N(0, 0.3^2) draws: sample std within ±33 % essentially surely
    assert torch.equal(d.table, a.perturbed(0.3, seed=1).table)
    assert torch.equal(ToyLM(8, 2, 0.0).table, torch.zeros(9, 8))  # scale 0 = uniform


def test_toy_start_symbol_and_bad_input() -> None:
    m = ToyLM(4, 3, 1.0, seed=0)
    assert m.context_index([]) == 4 * 5 + 4 and m.context_index([2]) == 4 * 5 + 2
    assert m.context_index([1, 2, 3]) == 2 * 5 + 3
    with pytest.raises(ModelError, match="outside"):
        m.forward(m.new_cache(1), torch.tensor([[4]]))
    with pytest.raises(ModelError, match="V must be"):
        ToyLM(1)
    with pytest.raises(ModelError, match="exceeds"):
        ToyLM(5000, 3)


# -- HF ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["llama", "qwen"])
def test_hf_cache_with_holes_equals_full_forward(
    which: str, request: pytest.FixtureRequest
) -> None:
    m: HFModel = request.getfixturevalue(which)
    seqs = torch.randint(0, m.vocab_size, (3, 11), generator=torch.Generator().manual_seed(5))
    got = run_with_holes(m, seqs, seed=11)
    want = m.logits_full(seqs)
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert want.std() > 0.1  # not a degenerate all-equal model


def test_hf_save_reload_and_holes(llama: HFModel, tmp_path) -> None:
    llama.model.save_pretrained(tmp_path / "m")
    m = from_local(tmp_path / "m", logit_scale=3.0)
    seqs = torch.randint(0, 512, (2, 8), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(m.logits_full(seqs), llama.logits_full(seqs), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        run_with_holes(m, seqs, seed=2), llama.logits_full(seqs), rtol=1e-4, atol=1e-5
    )


def test_hf_local_errors(tmp_path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        from_local(tmp_path / "nope")
    with pytest.raises(ModelError, match=r"no config\.json"):
        from_local(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 8}))
    with pytest.raises(ModelError, match=r"no \*\.safetensors weights"):
        from_local(tmp_path)  # config but no weights


def test_hf_sliding_window_refuses_holes() -> None:
    m = from_preset(
        "qwen3-tiny", seed=0, num_hidden_layers=1, use_sliding_window=True, sliding_window=8,
        max_window_layers=0, layer_types=["sliding_attention"],
    )  # fmt: skip
    cache = m.new_cache(1)
    m.forward(cache, torch.tensor([[1, 2, 3]]))
    cache.invalidate(torch.zeros((1, 3), dtype=torch.bool))  # no hole: fine
    with pytest.raises(ModelError, match="sliding-window attention cannot take cache holes"):
        cache.invalidate(torch.tensor([[False, False, True]]))


def test_hf_seeded_init_leaves_global_rng(llama: HFModel) -> None:
    state = torch.random.get_rng_state()
    again = from_preset("llama-tiny", seed=1, logit_scale=3.0)
    assert torch.equal(torch.random.get_rng_state(), state)
    for (n1, p1), (_, p2) in zip(
        llama.model.named_parameters(), again.model.named_parameters(), strict=True
    ):
        assert torch.equal(p1, p2), n1
    other = from_preset("llama-tiny", seed=2)
    assert not torch.equal(other.model.lm_head.weight, llama.model.lm_head.weight)
    ids = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(
        llama.logits_full(ids), 3.0 * from_preset("llama-tiny", seed=1).logits_full(ids)
    )


# -- derive ------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["llama", "qwen"])
def test_first_layers_shares_weights_and_matches_truncation(
    which: str, request: pytest.FixtureRequest
) -> None:
    m: HFModel = request.getfixturevalue(which)
    d = first_layers(m, 1)
    ref = copy.deepcopy(m.model)
    ref.model.layers = ref.model.layers[:1]
    ids = torch.randint(0, 512, (2, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = ref(ids).logits.float() * m.logit_scale
    torch.testing.assert_close(d.logits_full(ids), want, rtol=0, atol=0)
    torch.testing.assert_close(run_with_holes(d, ids, seed=4), want, rtol=1e-4, atol=1e-5)
    assert d.model.lm_head.weight.data_ptr() == m.model.lm_head.weight.data_ptr()
    assert d.model.model.layers[0].mlp.up_proj.weight is m.model.model.layers[0].mlp.up_proj.weight
    with pytest.raises(ModelError, match="layers must be"):
        first_layers(m, 3)


def test_noised_draft(llama: HFModel) -> None:
    ids = torch.tensor([[5, 6, 7, 8]])
    a, b = noised(llama, 0.1, seed=1), noised(llama, 0.1, seed=1)
    torch.testing.assert_close(a.logits_full(ids), b.logits_full(ids), rtol=0, atol=0)
    assert not torch.allclose(a.logits_full(ids), llama.logits_full(ids))
    assert torch.equal(noised(llama, 0.0, seed=1).logits_full(ids), llama.logits_full(ids))
    toy = ToyLM(6, 2, 1.0, seed=0)
    assert torch.equal(noised(toy, 0.2, seed=5).table, toy.perturbed(0.2, 5).table)


def test_vocab_mismatch_names_both_sizes() -> None:
    with pytest.raises(ModelError, match=r"V=16.*V=17"):
        zoo.load_pair("toy:V=16", "toy:V=17")
    with pytest.raises(ModelError, match=r"V=512.*V=9"):
        check_same_vocab(from_preset("qwen3-tiny", seed=0, num_hidden_layers=1), ToyLM(9))


# -- zoo ---------------------------------------------------------------------------------------
def test_zoo_specs(llama: HFModel, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    m = zoo.load_model("toy:V=16,order=3,scale=2.0,seed=3")
    assert isinstance(m, ToyLM) and (m.vocab_size, m.order, m.scale, m.seed) == (16, 3, 2.0, 3)
    assert zoo.load_model({"kind": "toy", "V": 5}, seed=9).seed == 9
    h = zoo.load_model("hf-preset:llama-tiny,logit_scale=3,seed=1")
    assert isinstance(h, HFModel)
    torch.testing.assert_close(
        h.logits_full(torch.tensor([[1, 2]])), llama.logits_full(torch.tensor([[1, 2]]))
    )
    assert zoo.load_model("hf-preset:qwen3-tiny,num_hidden_layers=1").config.num_hidden_layers == 1
    t, d = zoo.load_pair(
        "hf-preset:llama-tiny,logit_scale=3", "derived:first_layers,layers=1", seed=1
    )
    assert d.config.num_hidden_layers == 1 and d.model.lm_head.weight is t.model.lm_head.weight
    t, d = zoo.load_pair("toy:V=6", "derived:noised,noise=0.5", seed=1)
    assert isinstance(d, ToyLM) and not torch.equal(d.table, t.table)
    # bundled:* routes to the hf-local loader on spectest/zoo/bundled/<name>
    llama.model.save_pretrained(tmp_path / "target")
    monkeypatch.setattr(zoo, "BUNDLED_DIR", tmp_path)
    b = zoo.load_model("bundled:target")
    assert isinstance(b, HFModel) and b.vocab_size == 512
    with pytest.raises(ModelError, match="does not exist"):
        zoo.load_model("bundled:draft")


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("toy", "kind:"),
        ("gguf:x", "unknown kind 'gguf'"),
        ("toy:V=abc", "V must be int"),
        ("toy:V=16,colour=red", "unknown option 'colour'"),
        ("hf-preset:gpt5", "unknown preset 'gpt5'"),
        ("bundled:other", "bundled model must be one of"),
        ("derived:first_layers,layers=1", "needs a target"),
        ({"V": 3}, "missing string field 'kind'"),
    ],
)
def test_zoo_bad_specs(spec, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        zoo.load_model(spec)


def test_presets_listed() -> None:
    for name in ("toy", "hf-preset:llama-tiny", "hf-preset:qwen3-4b", "bundled:target"):
        assert zoo.PRESETS.get(name)
    assert zoo.PRESETS.get("hf-preset:qwen3-8b")


def test_qwen3_8b_preset_has_the_published_parameter_count() -> None:
    """The 8B-shape preset (issue 24's P1-8B) is Qwen3-8B's shape: 8 190 735 360 parameters
    (model card: 8.2 B; counted on the meta device, nothing allocated)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from spectest.models.hf import HF_PRESETS

    cfg = dict(HF_PRESETS["qwen3-8b"])
    cfg = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    assert sum(p.numel() for p in model.parameters()) == 8_190_735_360


@pytest.mark.parametrize("which", ["toy", "llama"])
def test_prefill_shared_equals_batched_prefill(which: str, request: pytest.FixtureRequest) -> None:
    """One prompt forward repeated to B rows == B rows prefilled together, then decode on.

    Rows then diverge (different next tokens, a hole in one row) to show the repeated cache is
    per-row state, not a view shared between rows.
    """
    m: LanguageModel = (
        ToyLM(vocab_size=11, order=3, seed=5) if which == "toy" else request.getfixturevalue(which)
    )
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, m.vocab_size, (7,), generator=g)
    B = 3
    shared, logits = m.prefill_shared(prompt, B)
    batched = m.new_cache(B)
    ref = m.forward(batched, prompt.expand(B, -1))
    torch.testing.assert_close(logits, ref[0], rtol=1e-5, atol=1e-5)
    assert shared.num_slots == batched.num_slots == 7
    nxt = torch.randint(0, m.vocab_size, (B, 2), generator=g)
    hole = torch.zeros((B, 7), dtype=torch.bool)
    hole[1, 3] = True
    for cache in (shared, batched):
        cache.invalidate(hole)
    torch.testing.assert_close(
        m.forward(shared, nxt), m.forward(batched, nxt), rtol=1e-5, atol=1e-5
    )


def test_a_fixture_build_step_that_fails_names_itself_its_exit_and_stderr() -> None:
    """The GGUF converter and the tokenizer training run through ``fixtures._run`` (a real
    subprocess here): a failure is one ``ModelError`` line; a success is silent."""
    import sys

    from spectest.models.fixtures import _run

    script = "import sys; sys.stderr.write('a\\nb\\nc\\nd\\n'); sys.exit(3)"
    with pytest.raises(ModelError, match=r"^step x: exit 3: b \| c \| d$"):
        _run([sys.executable, "-c", script], "step x")
    _run([sys.executable, "-c", "pass"], "step y", {"PATH": "/usr/bin"})
