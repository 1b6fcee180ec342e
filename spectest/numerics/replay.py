"""The model and the law ``numerics.drift_table`` replays a run's matched arm on: ``replay_model``
(under ``--fast`` on CUDA the fast engine's static-cache model, else the run's), ``replay_probs``
and ``ReplayStaticModel`` (prompt prefills kept and restored; ``workers`` for ``numerics.alone``).
Knows nothing about rounds, rows or the drift decision. Details: docs/internals.md.
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
    A restored prefill is the computed one copied: bit-identical prompt state for every later
    forward. The last ``PREFILLS_KEPT`` prompts are kept.
    """

    def __init__(self, base: HFModel, **kw: object) -> None:
        super().__init__(base, **kw)  # type: ignore[arg-type]
        self._prefills: dict[tuple[int, ...], tuple[list[torch.Tensor], ...]] = {}
        # the workers beside this one, the first worker (``workers``): not itself, so no
        # reference cycle keeps its pools past the replay
        self._others: list[ReplayStaticModel] = []
        self.workers_made = 0  # this one included, once it is a worker
        # the streams handed out beside this model's work and its workers' (``streams_apart``)
        self._apart: list[torch.cuda.Stream] = []

    def prefill_shared(self, prompt: torch.Tensor, batch_size: int) -> tuple[Cache, torch.Tensor]:
        assert prompt.dim() == 1, prompt.shape
        key = tuple(int(t) for t in prompt.tolist())
        self.snapshot(key, prompt)
        return self.restore(key, batch_size)

    def snapshot(self, key: tuple[int, ...], prompt: torch.Tensor) -> None:
        """Compute and keep ``prompt``'s one-row prefill (``key``: its ids) unless kept already."""
        if key in self._prefills:
            return
        L = int(prompt.shape[0])
        one = self.new_cache(1)
        logits = self._forward(one, prompt[None, :], graphs=False)[0]  # [L, V] eager
        keys = [k[:, :, :L].clone() for k in one.kv.keys]
        values = [v[:, :, :L].clone() for v in one.kv.values]
        while len(self._prefills) >= PREFILLS_KEPT:
            self._prefills.pop(next(iter(self._prefills)))
        self._prefills[key] = (keys, values, [one.valid.clone()], [logits])

    def restore(self, key: tuple[int, ...], batch_size: int) -> tuple[Cache, torch.Tensor]:
        """A ``batch_size``-row cache holding the kept prefill ``key`` and its logits ``[L, V]``:
        device copies only, no host sync (``snapshot`` first)."""
        keys, values, (valid,), (logits,) = self._prefills[key]
        L = int(keys[0].shape[2])
        cache = self.new_cache(batch_size)
        for src, dst in ((keys, cache.kv.keys), (values, cache.kv.values)):
            for s, d in zip(src, dst, strict=True):
                d[:, :, :L] = s  # broadcast the one row to every row
        cache.kv.shared.fill_(L)  # as ``StaticHFModel.prefill_shared``
        cache.valid = valid.expand(batch_size, -1).clone()  # [B, L]
        return cache, logits

    def workers(self, n: int) -> list[ReplayStaticModel]:
        """``n`` models for concurrent one-row decodes (``numerics.alone``): this one, then models
        on the same weights sharing its kept prefills, each with its own pools, CUDA graphs and
        graph memory, and (on CUDA) each with its own stream, apart from the others' and from
        torch's capture stream (``streams_apart``: its graphs are captured on it, so no two
        workers share a cuBLAS workspace); all at this one's ``max_slots``.

        Notes
        -----
        Built with this model's settings, a worker runs a one-row forward with the same kernels
        at the same shapes: the same bits. Kept prefills are shared, read only while none is
        computed (``alone_logits`` computes them on the caller's stream first).
        """
        cuda = self.device.type == "cuda"
        while self.workers_made < n:
            w = self if not self.workers_made else self._worker()
            if cuda:  # without one (CPU, or no stream apart left): the caller's stream
                w.stream = self.stream_apart()
            if w is not self:
                self._others.append(w)
            self.workers_made += 1
        team = [self, *self._others][:n]
        grow = [w for w in team if w.max_slots < self.max_slots]
        if grow and cuda:
            torch.cuda.synchronize(self.device)  # growing drops graphs: none may be in flight
        for w in grow:
            w.reserve(self.max_slots)
        return team

    def streams_apart(self, n: int) -> list[torch.cuda.Stream]:
        """``n`` streams that share no cuBLAS workspace with any this model or its workers
        handed out before, the caller's stream or torch's capture stream
        (``models.streams.apart``; ``RuntimeError`` when the pool has none left): for a worker,
        and for ``numerics.alone.FloorBranches``' branches and their stream."""
        from spectest.models.streams import apart

        current = torch.cuda.current_stream(self.device)
        if all(int(s.cuda_stream) != int(current.cuda_stream) for s in self._apart):
            self._apart.append(current)  # the caller's stream is in use from here on
        got = apart(self.device, n, avoid=self._apart)
        self._apart.extend(got)
        return got

    def stream_apart(self) -> torch.cuda.Stream | None:
        """One stream as ``streams_apart`` hands out, or None when the pool has none left (the
        caller then issues on its own stream, one thing after another)."""
        try:
            return self.streams_apart(1)[0]
        except RuntimeError:
            return None

    def _worker(self) -> ReplayStaticModel:
        w = ReplayStaticModel(
            self.base,
            max_slots=self.max_slots,
            cuda_graphs=self.cuda_graphs,
            packed_gqa=self.packed_gqa,
            native_logits=self.native_logits,
            fused_norms=self.fused_norms,
            fused_rotary=self.fused_rotary,
            decode_kernel=self.decode_kernel,
        )
        w._prefills = self._prefills
        w._apart = self._apart  # one record of the streams in use
        return w


def replay_probs(*, fast: bool) -> ProbsFn:
    """The processed law the drift's TV is taken between (docs/internals.md)."""
    return FAST.probs if fast else REFERENCE.probs
