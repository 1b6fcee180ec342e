"""The fast engine: the built-in engine's decode loops on a static KV cache, CUDA graphs for the
decode steps, and the fast sampling pipeline — same RNG protocol, same tokens.

Owns: ``as_fast`` (a model as this engine runs it: ``models.static.StaticHFModel`` on CUDA), the
entry points ``plain_decode_fast`` / ``speculative_decode_fast``, ``FastEngine`` (``fast``; what
``spectest run --fast`` runs every built-in arm on) and ``FastAcceptorEngine``
(``fast-acceptor``: an acceptor arm under ``--fast``). Knows nothing about statistics, files or
which sampler is correct. Why its tokens are the built-in engine's: docs/internals-engines.md.
"""

from __future__ import annotations

from typing import Any

from spectest.engines import builtin
from spectest.engines.acceptor import AcceptorEngine
from spectest.engines.base import ArmOutput, DecodeRequest, Models
from spectest.engines.builtin import BuiltinEngine
from spectest.models import decode_attention
from spectest.models.base import LanguageModel
from spectest.models.hf import HFModel
from spectest.models.static import StaticHFModel
from spectest.sampling.pipeline import FAST


def as_fast(
    model: LanguageModel,
    *,
    max_slots: int = 256,
    cuda_graphs: bool = True,
    static: bool | None = None,
) -> LanguageModel:
    """``model`` for this engine: an ``HFModel`` gets the static cache and CUDA graphs when
    ``static`` (default: on CUDA only — on CPU a static cache only adds masked attention work, so
    the fast engine there is the built-in loops on the fast pipeline); other models (the toy LM)
    are returned as they are."""
    if isinstance(model, StaticHFModel):
        return model
    if static is None:
        static = model.device.type == "cuda"
    if isinstance(model, HFModel) and static:
        return StaticHFModel(model, max_slots=max_slots, cuda_graphs=cuda_graphs)
    return model


def plain_decode_fast(model: LanguageModel, req: DecodeRequest, **kw: Any) -> ArmOutput:
    """``builtin.plain_decode`` on the fast pipeline and (for an ``as_fast`` model) the static
    cache: the same loop, the same tokens under the same keys (docs/internals-engines.md), and
    with ``whitebox`` the same generation-time white-box columns."""
    return builtin.plain_decode(model, req, pipeline=FAST, **kw)


def speculative_decode_fast(
    target: LanguageModel, draft: LanguageModel, req: DecodeRequest, **kw: Any
) -> ArmOutput:
    """``builtin.speculative_decode`` with ``fast_variant(variant)`` and (for ``as_fast`` models)
    the static cache: the same loop, tokens and telemetry under the same keys."""
    return builtin.speculative_decode(target, draft, req, pipeline=FAST, **kw)


# ----------------------------------------------------------------------------- the engine


class FastEngine(BuiltinEngine):
    """The built-in engine's arms (plain for the reference, the arm's ``SpecVariant`` otherwise)
    on the fast loops: registered as ``fast``, and what ``spectest run --fast`` runs every
    built-in arm on (teeth included). White-box columns recorded at generation time, as the
    built-in engine records them."""

    name = "fast"

    def __init__(self, options: Any, models: Models) -> None:
        super().__init__(options, models)
        t, d = models.target, models.draft
        self.fast_models = Models(
            None if t is None else as_fast(t), None if d is None else as_fast(d)
        )

    def decode_models(self) -> Models:
        return self.fast_models

    plain_loop = staticmethod(plain_decode_fast)
    speculative_loop = staticmethod(speculative_decode_fast)

    def provenance(self) -> dict[str, Any]:
        t = self.fast_models.target
        graphs = isinstance(t, StaticHFModel) and t.cuda_graphs
        error = t.graph_error if isinstance(t, StaticHFModel) else None
        packed = isinstance(t, StaticHFModel) and t.packed_gqa
        kernel = isinstance(t, StaticHFModel) and t.decode_kernel
        return {
            **super().provenance(),
            "cuda_graphs": graphs,
            "graph_error": error,
            "packed_gqa": packed,
            "decode_kernel": kernel,
            # how the kernel rounds P before P·V (``SPECTEST_ATTN_PV``); None without the kernel
            "attention_pv": decode_attention.pv_mode() if kernel else None,
            "fused_rotary": isinstance(t, StaticHFModel) and t.fused_rotary,
        }


class FastAcceptorEngine(FastEngine, AcceptorEngine):
    """The acceptor engine's arm (the user's verification kernel, ``engines.acceptor``) on the fast
    loop: registered as ``fast-acceptor``, what ``spectest run --fast`` runs an acceptor arm on
    (``AcceptorEngine.fast_variant``). The kernel receives the fast engine's dense p and q (the
    fast pipeline's law, equal to the exact pipeline's up to float64 reduction order) from the
    static model's forwards — the forwards the matched arm, spectest's exact sampler on
    ``FastEngine``, runs — so matched mode's numerics cancel for the kernel as they do for the
    built-in samplers (docs/numerics.md). The kernel call is ``acceptor.kernel_sampler``, unchanged.
    """

    name = "fast-acceptor"
