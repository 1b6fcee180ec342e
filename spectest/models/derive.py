"""Drafts derived from a target: ``first_layers``, ``noised``, ``check_same_vocab`` and
``derive_draft``. Knows nothing about sampling or engines. Why and details: docs/internals.md.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from spectest.errors import ModelError
from spectest.models.base import LanguageModel
from spectest.models.hf import HFModel
from spectest.models.toy import ToyLM


def check_same_vocab(target: LanguageModel, draft: LanguageModel) -> None:
    """Raise ``ModelError`` naming both sizes when the vocabularies differ."""
    if int(target.vocab_size) != int(draft.vocab_size):
        raise ModelError(
            f"vocabulary mismatch: target {target.name!r} has V={target.vocab_size!r}, "
            f"draft {draft.name!r} has V={draft.vocab_size!r}"
        )


def first_layers(target: HFModel, num_layers: int) -> HFModel:
    """Layer-skip draft: the first ``num_layers`` decoder layers of ``target``.

    The draft reuses the target's parameter tensors (``load_state_dict(assign=True)``): embeddings,
    the first layers, the final norm and lm_head are shared, so it costs no weight memory.

    Notes
    -----
    Built on the ``meta`` device from the truncated config, then every parameter and buffer is
    taken from the target by name (a missing name is an error: no partially-initialised draft).
    """
    from transformers import AutoModelForCausalLM

    if not isinstance(target, HFModel):
        raise ModelError(f"first-layers draft needs an HF target, got {target.name!r}")
    total = int(target.config.num_hidden_layers)
    if (
        isinstance(num_layers, bool)
        or not isinstance(num_layers, int)
        or not 1 <= num_layers <= total
    ):
        raise ModelError(
            f"first-layers: layers must be an integer in [1, {total}], got {num_layers!r}"
        )
    cfg = copy.deepcopy(target.config)
    cfg.num_hidden_layers = num_layers
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = list(cfg.layer_types)[:num_layers]
    if getattr(cfg, "max_window_layers", None) is not None:
        cfg.max_window_layers = min(int(cfg.max_window_layers), num_layers)
    with torch.device("meta"):
        draft = AutoModelForCausalLM.from_config(cfg, trust_remote_code=False)
    source: dict[str, torch.Tensor] = dict(target.model.named_parameters(remove_duplicate=False))
    source.update(dict(target.model.named_buffers(remove_duplicate=False)))
    _assign_from(draft, source, target.name)
    return HFModel(
        draft.eval(),
        f"{target.name}|first_layers={num_layers}",
        logit_scale=target.logit_scale,
    )


def _assign_from(module: torch.nn.Module, source: dict[str, torch.Tensor], where: str) -> None:
    """Point each parameter and buffer of ``module`` at the same-named tensor of ``source``."""
    named = [("parameter", n) for n, _ in module.named_parameters(remove_duplicate=False)]
    named += [("buffer", n) for n, _ in module.named_buffers(remove_duplicate=False)]
    for kind, name in named:
        if name not in source:
            raise ModelError(f"first-layers: {where!r} has no {kind} {name!r}")
        (owner, attr), t = _owner(module, name), source[name]
        if kind == "buffer":
            owner._buffers[attr] = t
        elif isinstance(t, torch.nn.Parameter):
            setattr(owner, attr, t)
        else:
            setattr(owner, attr, torch.nn.Parameter(t, requires_grad=False))


def _owner(module: torch.nn.Module, dotted: str) -> tuple[torch.nn.Module, str]:
    *path, attr = dotted.split(".")
    for p in path:
        module = getattr(module, p)
    return module, attr


def noised(model: LanguageModel, noise: float, seed: int) -> LanguageModel:
    """A noised copy: every weight ``w`` becomes ``w + noise * rms(w) * N(0, 1)`` (seeded).

    For a ``ToyLM`` the noise is added to the logit table (``ToyLM.perturbed``) without the RMS
    factor. The noise is drawn on CPU from a private generator in float32, then moved to the
    model's device and dtype, so the same seed gives the same draft on every machine.
    """
    if not isinstance(noise, (int, float)) or not noise >= 0.0 or noise == float("inf"):
        raise ModelError(f"noised draft: noise must be a finite number >= 0, got {noise!r}")
    if isinstance(model, ToyLM):
        return model.perturbed(float(noise), int(seed))
    if not isinstance(model, HFModel):
        raise ModelError(f"noised draft: unsupported model {model.name!r}")
    new = copy.deepcopy(model.model)
    gen = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for _, param in new.named_parameters():  # tied weights appear once (deduplicated)
            eps = torch.randn(tuple(param.shape), generator=gen, dtype=torch.float32)
            rms = param.detach().float().pow(2).mean().sqrt().cpu()
            param.add_((float(noise) * rms * eps).to(device=param.device, dtype=param.dtype))
    return HFModel(new, f"{model.name}|noise={noise},seed={seed}", logit_scale=model.logit_scale)


def derive_draft(target: LanguageModel, how: str, **kwargs: Any) -> LanguageModel:
    """Derive a draft by name: ``"first_layers"`` (layers=n) or ``"noised"`` (noise=, seed=)."""
    if how == "first_layers":
        if set(kwargs) - {"layers"}:
            raise ModelError(f"first_layers: unknown options {sorted(set(kwargs) - {'layers'})!r}")
        if not isinstance(target, HFModel):
            raise ModelError(f"first_layers draft needs an HF target, got {target.name!r}")
        return first_layers(target, kwargs.get("layers", 1))
    if how == "noised":
        if set(kwargs) - {"noise", "seed"}:
            raise ModelError(f"noised: unknown options {sorted(set(kwargs) - {'noise', 'seed'})!r}")
        return noised(target, kwargs.get("noise", 0.1), kwargs.get("seed", 0))
    raise ModelError(f"unknown draft derivation {how!r}; valid: first_layers, noised")
