"""Model zoo: spec strings to ``LanguageModel`` objects (``PRESETS``, ``load_model``,
``load_pair``). Knows nothing about sampling, protocols or engines. Why and details:
docs/internals.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from spectest.errors import ConfigError
from spectest.models.base import LanguageModel
from spectest.models.derive import check_same_vocab, derive_draft
from spectest.models.hf import HF_PRESETS, from_local, from_preset
from spectest.models.toy import ToyLM

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "zoo" / "bundled"
BUNDLED_NAMES = ("target", "draft")

PRESETS: dict[str, str] = {
    "toy": "analytic order-n Markov LM, closed-form conditionals (toy:V=16,order=2,scale=2,seed=3)",
    "hf-preset:llama-tiny": "random-init Llama, V=512, 2 layers, hidden 64 (CPU/CI)",
    "hf-preset:qwen3-tiny": "random-init Qwen3, V=512, 2 layers, hidden 64 (CPU/CI)",
    "hf-preset:qwen3-0.6b": "random-init Qwen3-0.6B shapes, V=151936, 28 layers (GPU)",
    "hf-preset:qwen3-4b": "random-init Qwen3-4B shapes, V=151936, 36 layers (GPU)",
    "hf-preset:qwen3-8b": "random-init Qwen3-8B shapes, V=151936, 36 layers, 8.19 B params (GPU)",
    "hf-local:<dir>": "a transformers causal LM from a local directory (local_files_only)",
    "realistic:qwen3-0.6b": (
        "benchmark target at Qwen3-0.6B shape, deep layers damped, peaked logits; draft "
        "derived:first_layers,layers=4 accepts like a real one (GPU)"
    ),
    "bundled:target": "the shipped trained target (spectest/zoo/bundled/target)",
    "bundled:draft": "the shipped trained draft (spectest/zoo/bundled/draft)",
    "derived:first_layers": "draft only: the target's first n layers, shared weights (layers=n)",
    "derived:noised": "draft only: the target with seeded Gaussian weight noise (noise=, seed=)",
    "fixture:tiny-llama/target": "real-engine fixture (models/fixtures.py): HF dir + GGUF, cached",
    "fixture:tiny-llama/draft": "its draft: the target with weight noise 0.1 (sampled acc. ~0.66)",
}
assert {f"hf-preset:{k}" for k in HF_PRESETS} <= set(PRESETS)

_TOY_KEYS = {
    "V": int,
    "order": int,
    "scale": float,
    "seed": int,
    "numerics": float,
    "verify_numerics": float,
}
_HF_KEYS = {"logit_scale": float, "seed": int}
_REALISTIC_KEYS = {"draft_layers": int, "damp": float, "logit_scale": float, "seed": int}
_DERIVED_KEYS = {"layers": int, "noise": float, "seed": int}


def parse_spec(spec: str | Mapping[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """``spec`` → (kind, head, options). ``head`` is the preset name / path / bundled name."""
    if isinstance(spec, Mapping):
        opts = dict(spec)
        kind = opts.pop("kind", None)
        if not isinstance(kind, str):
            raise ConfigError(f"model spec {dict(spec)!r}: missing string field 'kind'")
        head = opts.pop("name", opts.pop("path", ""))
        return kind, str(head), opts
    if not isinstance(spec, str) or ":" not in spec:
        raise ConfigError(
            f"model spec must look like 'kind:...' (see `spectest models`), got {spec!r}"
        )
    kind, rest = spec.split(":", 1)
    if kind in ("hf-local",):  # a path may contain commas and '='
        return kind, rest, {}
    parts = [p for p in rest.split(",") if p]
    head = ""
    if parts and "=" not in parts[0]:
        head, parts = parts[0], parts[1:]
    options: dict[str, Any] = {}
    for part in parts:
        if "=" not in part:
            raise ConfigError(f"model spec {spec!r}: option {part!r} is not key=value")
        key, value = part.split("=", 1)
        options[key.strip()] = value.strip()
    return kind, head, options


def _typed(
    spec: Any, opts: dict[str, Any], schema: dict[str, type], extra_int: bool = False
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in opts.items():
        typ = schema.get(key, int if extra_int else None)
        if typ is None:
            raise ConfigError(
                f"model spec {spec!r}: unknown option {key!r}; valid: {', '.join(schema)}"
            )
        try:
            if isinstance(value, bool) or (typ is int and isinstance(value, float)):
                raise TypeError
            out[key] = typ(value)
        except (TypeError, ValueError):
            raise ConfigError(
                f"model spec {spec!r}: {key} must be {typ.__name__}, got {value!r}"
            ) from None
    return out


def load_model(
    spec: str | Mapping[str, Any],
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str | None = None,
    seed: int = 0,
    target: LanguageModel | None = None,
) -> LanguageModel:
    """Build the model named by ``spec`` (grammar in the docs/internals.md).

    ``dtype=None`` means float32 on CPU and bfloat16 on CUDA for HF models (the toy LM is always
    float32). ``target`` is needed only for ``derived:*`` drafts.
    """
    kind, head, opts = parse_spec(spec)
    if kind == "toy":
        return _load_toy(spec, head, opts, seed, device)
    if kind == "hf-preset":
        _check_preset(spec, head)
        o = _typed(spec, opts, _HF_KEYS, extra_int=True)  # extra ints = config overrides
        s = o.pop("seed", seed)
        scale = o.pop("logit_scale", 1.0)
        return from_preset(head, seed=s, device=device, dtype=dtype, logit_scale=scale, **o)
    if kind == "realistic":
        from spectest.models.realistic import damped_target

        _check_preset(spec, head)
        o = _typed(spec, opts, _REALISTIC_KEYS, extra_int=True)  # extra ints = config overrides
        o.setdefault("seed", seed)
        return damped_target(head, device=device, dtype=dtype, **o)
    if kind in ("hf-local", "bundled"):
        if kind == "bundled" and head not in BUNDLED_NAMES:
            raise ConfigError(
                f"model spec {spec!r}: bundled model must be one of {BUNDLED_NAMES}, got {head!r}"
            )
        o = _typed(spec, opts, {"logit_scale": float})
        if kind == "hf-local" and not head:
            raise ConfigError(f"model spec {spec!r}: hf-local needs a directory path")
        path = head if kind == "hf-local" else BUNDLED_DIR / head
        return from_local(path, device=device, dtype=dtype, logit_scale=o.get("logit_scale", 1.0))
    if kind == "fixture":  # built on first use under ~/.cache/spectest/fixtures
        from spectest.models.fixtures import hf_dir, parse_fixture_spec

        _typed(spec, opts, {})  # no options
        return from_local(hf_dir(*parse_fixture_spec(head)), device=device, dtype=dtype)
    if kind == "derived":
        return _load_derived(spec, head, opts, seed, target)
    raise ConfigError(
        f"model spec {spec!r}: unknown kind {kind!r}; "
        "valid: toy, hf-preset, realistic, hf-local, bundled, derived, fixture"
    )


def _check_preset(spec: Any, head: str) -> None:
    if head not in HF_PRESETS:
        raise ConfigError(
            f"model spec {spec!r}: unknown preset {head!r}; valid: {', '.join(HF_PRESETS)}"
        )


def _load_toy(
    spec: Any, head: str, opts: dict[str, Any], seed: int, device: torch.device | str
) -> LanguageModel:
    o = _typed(spec, opts, _TOY_KEYS)
    if head:
        raise ConfigError(f"model spec {spec!r}: toy takes only key=value options, got {head!r}")
    return ToyLM(
        o.get("V", 16),
        o.get("order", 2),
        o.get("scale", 1.0),
        o.get("seed", seed),
        device=device,
        numerics=o.get("numerics", 0.0),
        verify_numerics=o.get("verify_numerics"),
    )


def _load_derived(
    spec: Any, head: str, opts: dict[str, Any], seed: int, target: LanguageModel | None
) -> LanguageModel:
    if target is None:
        raise ConfigError(f"model spec {spec!r}: a derived draft needs a target (use load_pair)")
    o = _typed(spec, opts, _DERIVED_KEYS)
    if head == "noised":
        o.setdefault("seed", seed)
    return derive_draft(target, head, **o)


def load_pair(
    target_spec: str | Mapping[str, Any],
    draft_spec: str | Mapping[str, Any],
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str | None = None,
    seed: int = 0,
    draft_seed: int | None = None,
) -> tuple[LanguageModel, LanguageModel]:
    """Target and draft, with vocabulary equality checked (``ModelError`` naming both sizes).

    The draft's default seed is ``draft_seed`` (``seed + 1`` when omitted) so that an independent
    draft of the same preset is not the target itself.
    """
    target = load_model(target_spec, device=device, dtype=dtype, seed=seed)
    dseed = seed + 1 if draft_seed is None else draft_seed
    draft = load_model(draft_spec, device=device, dtype=dtype, seed=dseed, target=target)
    check_same_vocab(target, draft)
    return target, draft
