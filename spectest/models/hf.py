"""transformers causal LMs behind the ``LanguageModel`` contract (``HFModel``) and their loaders
(``from_preset``, ``from_local``). Knows nothing about sampling. Why and details:
docs/internals.md.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import torch

from spectest.errors import ConfigError, ModelError
from spectest.models import attention
from spectest.models.base import Cache, LanguageModel
from spectest.models.configs import HF_PRESETS
from spectest.models.dtypes import torch_dtype


class HFCache(Cache):
    """A transformers ``DynamicCache`` plus the slot validity the engines edit."""

    def __init__(
        self, batch_size: int, kv: Any, device: torch.device, *, sliding: str | None = None
    ) -> None:
        self.kv = kv
        self.valid = torch.zeros((batch_size, 0), dtype=torch.bool, device=device)  # [B, N]
        self.sliding = sliding  # model name when it uses sliding-window attention

    def invalidate(self, mask: torch.Tensor) -> None:
        # NOTE: a sliding window counts slots, holes included, and transformers' sliding cache
        # layers drop old slots; with holes the window would no longer be "the last W tokens".
        if self.sliding is not None and bool(mask.any()):
            raise ModelError(
                f"{self.sliding}: sliding-window attention cannot take cache holes "
                "(speculative decoding with the built-in engine); use a full-attention model"
            )
        super().invalidate(mask)

    def repeat_rows(self, n: int) -> None:
        assert self.batch_size == 1, self.batch_size
        self.kv.batch_repeat_interleave(n)  # every layer's keys/values [1, ...] → [n, ...]
        self.valid = self.valid.expand(n, -1).clone()  # [n, N]


def uses_sliding_window(config: Any) -> bool:
    """True when some layer of ``config`` attends through a sliding window."""
    if "sliding_attention" in (getattr(config, "layer_types", None) or []):
        return True
    return bool(getattr(config, "sliding_window", None)) and bool(
        getattr(config, "use_sliding_window", True)
    )


class HFModel(LanguageModel):
    """A transformers causal LM (eval mode, no grad) behind the slot-cache contract.

    Parameters
    ----------
    model : a causal LM (``AutoModelForCausalLM``-compatible), already on its device and dtype.
    name : for messages and provenance.
    logit_scale : multiplies the float32 logits (entropy knob; 1.0 = the model as is).
    """

    def __init__(self, model: Any, name: str, *, logit_scale: float = 1.0) -> None:
        if not (isinstance(logit_scale, (int, float)) and 0 < logit_scale < float("inf")):
            raise ModelError(
                f"{name}: logit_scale must be a finite number > 0, got {logit_scale!r}"
            )
        self.model = model.eval()
        self.name = name
        self.logit_scale = float(logit_scale)
        self.vocab_size = int(model.config.vocab_size)
        params = inspect.signature(model.forward).parameters
        # NOTE: transformers 5.x renamed ``past_key_values`` to ``cache`` and derives
        # cache_position from the cache; older versions take both explicitly.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._pass_cache_position = "cache_position" in params

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def new_cache(self, batch_size: int) -> HFCache:
        from transformers import DynamicCache

        try:
            kv = DynamicCache(config=self.model.config)
        except TypeError:  # transformers < 4.56: no config argument
            kv = DynamicCache()
        sliding = self.name if uses_sliding_window(self.model.config) else None
        return HFCache(batch_size, kv, self.device, sliding=sliding)

    @torch.inference_mode()
    def forward(self, cache: Cache, input_ids: torch.Tensor) -> torch.Tensor:
        assert isinstance(cache, HFCache), type(cache)
        assert input_ids.dim() == 2 and input_ids.shape[0] == cache.batch_size, input_ids.shape
        if input_ids.dtype != torch.int64:
            raise ModelError(f"{self.name}: input_ids must be int64, got {input_ids.dtype!r}")
        B, S = input_ids.shape
        dev = self.device
        n0 = cache.num_slots
        new_valid = torch.ones((B, S), dtype=torch.bool, device=dev)  # [B, S]
        if S == 0:
            return torch.zeros((B, 0, self.vocab_size), dtype=torch.float32, device=dev)
        mask = torch.cat([cache.valid, new_valid], dim=1)  # [B, N + S], 0 = hole
        # Position of each new token = number of valid slots before it (holes do not count).
        pos = cache.valid.sum(dim=1, keepdim=True) + torch.arange(S, device=dev)  # [B, S]
        kwargs: dict[str, Any] = {self._cache_kw: cache.kv}
        if self._pass_cache_position:
            kwargs["cache_position"] = torch.arange(n0, n0 + S, device=dev)  # [S] slot indices
        with attention.CONFIG_LOCK.shared():  # no other thread's switched forward meanwhile
            out = self.model(
                input_ids=input_ids.to(dev),
                attention_mask=mask.to(torch.int64),
                position_ids=pos,
                use_cache=True,
                **kwargs,
            )
        cache.valid = mask
        return self.scaled(out.logits)  # [B, S, V]

    def scaled(self, logits: torch.Tensor) -> torch.Tensor:
        """The model's logits as this model returns them: float32, times ``logit_scale``."""
        return logits.float() * self.logit_scale if self.logit_scale != 1.0 else logits.float()

    def logits_full(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Teacher forcing without a cache: hole-free sequences [B, L] → logits [B, L, V]."""
        assert input_ids.dim() == 2, input_ids.shape
        with torch.inference_mode(), attention.CONFIG_LOCK.shared():
            out = self.model(input_ids=input_ids.to(self.device), use_cache=False)
        return out.logits.float() * self.logit_scale


def _dtype_kw() -> str:
    """transformers >= 4.56 calls the load dtype ``dtype``; older versions ``torch_dtype``."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


_DTYPE_KW = _dtype_kw()


def _resolve_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    """The dtype rule (``models.dtypes``): None is the device's default, a name or alias its
    ``torch.dtype``; another value is a ``ModelError`` naming it."""
    try:
        return torch_dtype(dtype, device.type)
    except ConfigError as err:
        raise ModelError(str(err)) from None


def config_of(fields: dict[str, Any], what: str) -> Any:
    """The transformers config of ``fields`` (``model_type`` and its arguments); a
    ``ModelError`` naming ``what`` when transformers refuses them."""
    from transformers import AutoConfig

    rest = dict(fields)
    model_type = rest.pop("model_type")
    try:
        return AutoConfig.for_model(model_type, **rest)
    except (TypeError, ValueError) as err:
        raise ModelError(f"{what}: invalid config override: {err}") from err


def from_config(
    config: Any,
    *,
    name: str,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str | None = None,
    logit_scale: float = 1.0,
) -> HFModel:
    """Random-init a causal LM from a config, seeded, directly on ``device``.

    Notes
    -----
    Weights are drawn under ``torch.random.fork_rng`` with ``manual_seed(seed)``, so the caller's
    global RNG state is untouched and the same seed gives the same weights on one device type
    (CPU and CUDA generators differ: the same seed gives different weights on CPU and GPU).
    """
    from transformers import AutoModelForCausalLM

    dev = torch.device(device)
    dt = _resolve_dtype(dtype, dev)
    fork_devices = [dev] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(int(seed))
        with torch.device(dev):
            model: Any = AutoModelForCausalLM.from_config(
                config, trust_remote_code=False, **{_DTYPE_KW: dt}
            )
    return HFModel(model.to(dev), name, logit_scale=logit_scale)


def from_preset(
    preset: str,
    *,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str | None = None,
    logit_scale: float = 1.0,
    **overrides: Any,
) -> HFModel:
    """Random-init model of a named preset (``HF_PRESETS``, plus config ``overrides``); nothing is
    downloaded."""
    if preset not in HF_PRESETS:
        raise ModelError(
            f"hf-preset: unknown preset {preset!r}; valid: {', '.join(sorted(HF_PRESETS))}"
        )
    cfg = config_of({**HF_PRESETS[preset], **overrides}, f"hf-preset {preset!r}")
    suffix = "".join(f",{k}={v}" for k, v in sorted(overrides.items()))
    name = f"hf-preset:{preset},seed={seed},logit_scale={logit_scale}{suffix}"
    return from_config(
        cfg, name=name, seed=seed, device=device, dtype=dtype, logit_scale=logit_scale
    )


def refuse_remote_code(config_json: Path) -> None:
    """``ModelError`` when ``config.json`` is not a JSON object or asks for custom code
    (``auto_map``): spectest runs no model directory's code (``from_local`` Notes)."""
    where = f"hf-local: {str(config_json)!r}"
    try:
        cfg = json.loads(config_json.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ModelError(f"{where}: not valid JSON ({err})") from None
    if not isinstance(cfg, dict):
        raise ModelError(f"{where}: expected a JSON object, got {type(cfg).__name__}")
    if "auto_map" in cfg:
        classes = cfg["auto_map"] if isinstance(cfg["auto_map"], dict) else {}
        names = ", ".join(f"{k} → {v}" for k, v in list(classes.items())[:3])
        raise ModelError(
            f"{where}: has auto_map ({names or cfg['auto_map']!r}): the directory ships its own "
            "modelling code, and spectest never runs a model directory's code "
            "(trust_remote_code=False); use an architecture transformers implements, or remove "
            "auto_map if the model_type is one"
        )


def from_local(
    path: str | Path,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str | None = None,
    logit_scale: float = 1.0,
) -> HFModel:
    """Load a causal LM from a local directory (``local_files_only=True``; never downloads).

    Notes
    -----
    A model directory is data, never code: ``trust_remote_code=False``, and a ``config.json``
    with ``auto_map`` is refused before transformers can ask on stdin whether to run its code.
    """
    from transformers import AutoModelForCausalLM

    p = Path(path)
    if not p.is_dir():
        raise ModelError(f"hf-local: model directory {str(path)!r} does not exist")
    if not (p / "config.json").is_file():
        raise ModelError(
            f"hf-local: {str(path)!r} has no config.json (not a transformers model dir)"
        )
    if not any(p.glob("*.safetensors")):
        # NOTE: pickle-based weights (pytorch_model.bin) can run code when loaded: never load them
        raise ModelError(
            f"hf-local: {str(path)!r} has no *.safetensors weights (spectest loads safetensors "
            "only; convert the checkpoint with transformers' save_pretrained)"
        )
    refuse_remote_code(p / "config.json")
    dev = torch.device(device)
    dt = _resolve_dtype(dtype, dev)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Loading weights" bars in spectest's own output
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(p),
            local_files_only=True,
            use_safetensors=True,
            trust_remote_code=False,
            **{_DTYPE_KW: dt},
        )
    except Exception as err:  # transformers raises OSError/ValueError/KeyError/... for bad dirs
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ModelError(f"hf-local: cannot load model from {str(path)!r}: {msg}") from err
    return HFModel(model.to(dev), f"hf-local:{p}", logit_scale=logit_scale)
