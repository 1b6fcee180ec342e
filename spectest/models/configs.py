"""The hand-written transformers configs (random-init, never downloaded), torch-free.

Owns: ``HF_PRESETS`` (the ``hf-preset:`` zoo kind's shapes) and ``TINY_LLAMA_FIXTURE`` (the
config of ``fixtures.FIXTURES["tiny-llama"]``). Knows nothing of loading them (``hf``).
"""

from __future__ import annotations

from typing import Any

# Hand-written configs. The tiny ones are for CI (V = 512); the real shapes copy the published
# Qwen3 configs (hidden sizes, heads, vocab) for GPU throughput work with random weights.
_TINY: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
)
_QWEN3: dict[str, Any] = dict(  # the published Qwen3 configs' shared fields
    model_type="qwen3",
    vocab_size=151936,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    tie_word_embeddings=True,
)
HF_PRESETS: dict[str, dict[str, Any]] = {
    "llama-tiny": {**_TINY, "model_type": "llama", "tie_word_embeddings": False},
    "qwen3-tiny": {
        **_TINY,
        "model_type": "qwen3",
        "head_dim": 16,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": True,
    },
    "qwen3-0.6b": {
        **_QWEN3,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
    },
    "qwen3-4b": {
        **_QWEN3,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
    },
    "qwen3-8b": {  # Qwen3-8B's published shape: 8.19 B parameters, embeddings untied
        **_QWEN3,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "tie_word_embeddings": False,
    },
}


# The bundled fixture's target: the llama-tiny preset at hidden 128 (its content key hashes it).
TINY_LLAMA_FIXTURE: dict[str, Any] = {
    **HF_PRESETS["llama-tiny"],
    "hidden_size": 128,
    "intermediate_size": 256,
    "max_position_embeddings": 512,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
