"""The numerics replay on the model the run decoded with: the model and the law
pipeline ``numerics.drift_table`` replays a ``--fast`` run's matched arm on.

Owns: ``replay_model`` (under ``--fast`` on CUDA the static-cache model with CUDA graphs,
``models.static.StaticHFModel``, built with the fast engine's defaults; the run's loaded model
otherwise) and ``replay_probs`` (the processed law the drift's TV is taken between: the fast
pipeline's ``logits_to_probs_fast`` under ``--fast``, the exact ``logits_to_probs`` otherwise).
Knows nothing about rounds, rows or the drift decision (``numerics``, ``stats.drift``).

The why and the details: docs/internals.md "spectest/numerics/replay.py".
"""

from __future__ import annotations

import torch

from spectest.models.base import Cache, LanguageModel
from spectest.models.hf import HFModel
from spectest.models.static import StaticHFModel
from spectest.sampling.pipeline import FAST, REFERENCE, ProbsFn

PREFILLS_KEPT = 2  # one-row prompt prefills kept: the verify's (prompt[:-1]) and the decode's


def replay_model(target: LanguageModel, *, fast: bool, static: bool | None = None) -> LanguageModel:
    """The model the replay runs on: ``target`` itself unless ``fast``; under ``fast`` what the
    fast engine ran — an ``HFModel`` as ``StaticHFModel(target)`` when ``static`` (default: on
    CUDA, as ``engines.fast.as_fast`` decides), anything else as it is.

    Notes
    -----
    ``StaticHFModel``'s defaults are the fast engine's (``as_fast`` passes ``max_slots=256``,
    ``cuda_graphs=True``): the same ``max_slots`` gives the same attended windows, hence the same
    graphs and kernels (docs/internals.md). Weights are shared, not copied.
    """
    if not fast or isinstance(target, StaticHFModel):
        return target
    if static is None:
        static = target.device.type == "cuda"
    if isinstance(target, HFModel) and static:
        return ReplayStaticModel(target, max_slots=256, cuda_graphs=True)
    return target


class ReplayStaticModel(StaticHFModel):
    """``StaticHFModel`` whose one-row prompt prefill is computed once per prompt and then
    restored (keys, values, validity and logits copied back into the one-row pool) for every
    later prefill of that prompt: the batch decode's and each floor row's (decoded alone, batch
    1), so the floor costs one eager prompt forward per prompt instead of one per row.

    Notes
    -----
    A restored prefill is the computed one copied, so every later forward sees bit-identical
    prompt state (tests/test_numerics_replay.py); the last ``PREFILLS_KEPT`` prompts are kept.
    """

    def __init__(self, base: HFModel, **kw: object) -> None:
        super().__init__(base, **kw)  # type: ignore[arg-type]
        self._prefills: dict[tuple[int, ...], tuple[list[torch.Tensor], ...]] = {}

    def prefill_shared(self, prompt: torch.Tensor, batch_size: int) -> tuple[Cache, torch.Tensor]:
        assert prompt.dim() == 1, prompt.shape
        key, L = tuple(int(t) for t in prompt.tolist()), int(prompt.shape[0])
        one = self.new_cache(1)
        snap = self._prefills.get(key)
        if snap is None:
            logits = self._forward(one, prompt[None, :], graphs=False)[0]  # [L, V] eager
            keys = [k[:, :, :L].clone() for k in one.kv.keys]
            values = [v[:, :, :L].clone() for v in one.kv.values]
            snap = (keys, values, [one.valid.clone()], [logits])
            while len(self._prefills) >= PREFILLS_KEPT:
                self._prefills.pop(next(iter(self._prefills)))
            self._prefills[key] = snap
        keys, values, (valid,), (logits,) = snap
        cache = one if batch_size == 1 else self.new_cache(batch_size)
        for src, dst in ((keys, cache.kv.keys), (values, cache.kv.values)):
            for s, d in zip(src, dst, strict=True):
                d[:, :, :L] = s  # broadcast the one row to every row
        cache.valid = valid.expand(batch_size, -1).clone()  # [B, L]
        return cache, logits


def replay_probs(*, fast: bool) -> ProbsFn:
    """The processed law the drift's TV is taken between (docs/internals.md)."""
    return FAST.probs if fast else REFERENCE.probs
