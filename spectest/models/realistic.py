"""A benchmark pair at a real model's shape whose draft accepts like a real one (``damped_target``,
the ``realistic:`` zoo kind). Knows nothing about sampling or engines. Why and details:
docs/internals.md.
"""

from __future__ import annotations

from typing import Any

import torch

from spectest.errors import ModelError
from spectest.models.hf import HFModel, from_preset

DEFAULTS: dict[str, Any] = {"draft_layers": 4, "damp": 0.03, "logit_scale": 20.0}


def damped_target(
    preset: str,
    *,
    draft_layers: int = DEFAULTS["draft_layers"],
    damp: float = DEFAULTS["damp"],
    logit_scale: float = DEFAULTS["logit_scale"],
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str | None = None,
    **overrides: Any,
) -> HFModel:
    """Random-init ``preset`` with the output projections of layers ``>= draft_layers`` scaled
    by ``damp`` (docs/internals.md); pair it with ``first_layers(target, draft_layers)``.

    Notes
    -----
    The scaling is applied after the seeded initialisation, in the model's dtype, so the pair is
    a deterministic function of (preset, overrides, seed, device type, dtype). Layers are found as
    ``model.model.layers[i].self_attn.o_proj`` / ``.mlp.down_proj`` (Llama and Qwen3 presets); a
    model without them is a ``ModelError``.
    """
    if isinstance(draft_layers, bool) or not isinstance(draft_layers, int) or draft_layers < 1:
        raise ModelError(f"realistic: draft_layers must be an integer >= 1, got {draft_layers!r}")
    if not isinstance(damp, (int, float)) or not 0.0 <= damp <= 1.0:
        raise ModelError(f"realistic: damp must be a number in [0, 1], got {damp!r}")
    model = from_preset(
        preset, seed=seed, device=device, dtype=dtype, logit_scale=logit_scale, **overrides
    )
    layers = getattr(getattr(model.model, "model", None), "layers", None)
    if layers is None or draft_layers > len(layers):
        n = None if layers is None else len(layers)
        raise ModelError(
            f"realistic: {preset!r} has {n!r} decoder layers, draft_layers={draft_layers!r}"
        )
    with torch.no_grad():
        for layer in list(layers)[draft_layers:]:
            try:
                layer.self_attn.o_proj.weight.mul_(float(damp))
                layer.mlp.down_proj.weight.mul_(float(damp))
            except AttributeError as err:
                raise ModelError(f"realistic: {preset!r} layers have no o_proj/down_proj") from err
    model.name = (
        f"realistic:{preset},draft_layers={draft_layers},damp={damp}," + model.name.split(",", 1)[1]
    )
    return model
