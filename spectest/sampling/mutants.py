"""The ``SpecVariant`` catalogue (the exact sampler, mutants that mirror shipped bugs, exact but
suspicious designs): the hooks an engine calls to run any variant, ``get_variant`` and each
variant's observability rule (``may_differ``). Knows nothing about engines, models or statistics.
The q_modes and the bug each mutant mirrors: docs/bugs.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from spectest.errors import ConfigError, InputError
from spectest.sampling import mutant_rounds as mr
from spectest.sampling.draw import argmax_tokens
from spectest.sampling.mutant_rounds import SampleFn
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.rejection import rejection_sample
from spectest.sampling.transforms import logits_to_probs
from spectest.schema import Q_MODES

VerifyFn = Callable[[torch.Tensor, SamplingTensors], torch.Tensor]
DraftFn = Callable[
    [torch.Tensor, SamplingTensors, bool, str], tuple[torch.Tensor, torch.Tensor | None]
]
DiffersFn = Callable[[SamplingParams, bool, int, str], bool]


@dataclass(frozen=True)
class SpecVariant:
    """One speculative sampler design. The flags say which hooks are the pipeline's own (all False
    unless declared): ``exact_verify`` (``verify_probs`` is the plain law p), ``truthful_draft``
    (the draft is drawn from the ``q_mode`` law and that law is reported) and
    ``round_on_shortlist`` (the round is ``rejection.rejection_sample`` on those two hooks, so it
    may run on shortlist laws; a replaced ``sample_fn`` must leave it False, unless it is
    ``rejection_sample`` at an ``accept_scale`` other than 1: the ε tooth's, whose dense form
    ``sample_fn`` keeps)."""

    name: str
    mirrors: str  # bug references from docs/bugs.md ("" for exact)
    description: str
    exact: bool  # True: the law equals plain sampling and the harness must PASS it
    verify_fn: VerifyFn = field(repr=False)
    draft_fn: DraftFn = field(repr=False)
    sample_fn: SampleFn = field(repr=False)
    differs_fn: DiffersFn = field(repr=False)
    exact_verify: bool = False
    truthful_draft: bool = False
    round_on_shortlist: bool = False
    accept_scale: float = 1.0  # the round on shortlist laws: rejection_sample(accept_scale=)

    def verify_probs(self, target_logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
        """The target law the verifier uses: float64 probs of the shape of ``target_logits``
        (``[B, K+1, V]`` or ``[B, V]``)."""
        return self.verify_fn(target_logits, params)

    def draft_law(
        self, draft_logits: torch.Tensor, params: SamplingTensors, *, onehot: bool, q_mode: str
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(sample_probs [B, V], q_reported [B, V] | None)`` for draft logits ``[B, V]``.

        ``sample_probs`` is the law the draft token is drawn from (one-hot at the argmax for a
        greedy drafter); ``q_reported`` is what the verifier is told (``None`` = one-hot δ(x)).
        """
        if q_mode not in Q_MODES:
            raise ConfigError(f"draft q_mode must be one of {Q_MODES}, got {q_mode!r}")
        assert draft_logits.dim() == 2, tuple(draft_logits.shape)  # [B, V]
        return self.draft_fn(draft_logits, params, onehot, q_mode)

    @property
    def sample(self) -> SampleFn:
        """One round; same contract as ``rejection.rejection_sample``."""
        return self.sample_fn

    def may_differ(self, params: SamplingParams, *, onehot: bool, K: int, q_mode: str) -> bool:
        """False when this variant provably coincides with ``exact`` in that setting (so a tooth
        built on it cannot bite there); True when it may differ. Always False for exact variants."""
        return not self.exact and self.differs_fn(params, onehot, K, q_mode)


# ----------------------------------------------------------------------------- shared hooks


def _unit(params: SamplingTensors, *, keep_temperature: bool) -> SamplingTensors:
    """The same rows with filters off (and temperature 1 unless ``keep_temperature``)."""
    t = params.temperature if keep_temperature else torch.ones_like(params.temperature)
    return SamplingTensors(
        t,
        torch.zeros_like(params.top_k),
        torch.ones_like(params.top_p),
        torch.zeros_like(params.min_p),
    )


def draft_q(draft_logits: torch.Tensor, params: SamplingTensors, q_mode: str) -> torch.Tensor:
    """The drafter's law ``[B, V]`` float64 under ``q_mode`` (docs/bugs.md: the variant hooks)."""
    if q_mode == "processed":
        return logits_to_probs(draft_logits, params)
    if q_mode == "temperature":
        return logits_to_probs(draft_logits, _unit(params, keep_temperature=True))
    if q_mode == "raw":
        return logits_to_probs(draft_logits, _unit(params, keep_temperature=False))
    raise ConfigError(f"draft q_mode must be one of {Q_MODES}, got {q_mode!r}")


def _onehot_argmax(draft_logits: torch.Tensor) -> torch.Tensor:
    """``[B, V]`` float64 one-hot at the argmax (lowest id on ties; equal for raw and processed)."""
    tok = argmax_tokens(draft_logits)  # [B]
    out = torch.zeros(draft_logits.shape, dtype=torch.float64, device=draft_logits.device)
    return out.scatter_(-1, tok[:, None], 1.0)


def _verify_pipeline(target_logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    return logits_to_probs(target_logits, params)


def truthful_draft(processed: VerifyFn) -> DraftFn:
    """The truthful draft hook on a pipeline whose processed law is ``processed``: the argmax
    (q = δ(x), reported as ``None``) for a one-hot drafter, else the ``q_mode`` law."""

    def draft(
        draft_logits: torch.Tensor, params: SamplingTensors, onehot: bool, q_mode: str
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if onehot:
            return _onehot_argmax(draft_logits), None
        if q_mode == "processed":
            q = processed(draft_logits, params)
        else:
            q = draft_q(draft_logits, params, q_mode)
        return q, q

    return draft


_draft_truthful = truthful_draft(logits_to_probs)


def _nontrivial(p: SamplingParams) -> bool:
    return p.temperature != 1.0 or p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0


# ----------------------------------------------------------------------------- mutant draft laws


def _draft_raw_q(
    draft_logits: Tensor, params: SamplingTensors, onehot: bool, q_mode: str
) -> tuple[Tensor, Tensor | None]:
    raw = draft_q(draft_logits, params, "raw")
    sample = _onehot_argmax(draft_logits) if onehot else draft_q(draft_logits, params, q_mode)
    return sample, raw


def _draft_onehot_softmax_q(
    draft_logits: Tensor, params: SamplingTensors, onehot: bool, q_mode: str
) -> tuple[Tensor, Tensor | None]:
    return _onehot_argmax(draft_logits), draft_q(draft_logits, params, q_mode)


def _draft_raw_consistent(
    draft_logits: Tensor, params: SamplingTensors, onehot: bool, q_mode: str
) -> tuple[Tensor, Tensor | None]:
    if onehot:
        return _onehot_argmax(draft_logits), None
    raw = draft_q(draft_logits, params, "raw")
    return raw, raw


def _verify_unprocessed(target_logits: Tensor, params: SamplingTensors) -> Tensor:
    return logits_to_probs(target_logits, _unit(params, keep_temperature=False))


def _verify_swapped(target_logits: Tensor, params: SamplingTensors) -> Tensor:
    return logits_to_probs(target_logits, params, order="top_p_then_top_k")


# ----------------------------------------------------------------------------- the catalogue


def _hot(p: SamplingParams) -> bool:
    return p.temperature > 0


def _make(
    name: str,
    mirrors: str,
    description: str,
    *,
    exact: bool = False,
    verify: VerifyFn | None = None,
    draft: DraftFn | None = None,
    sample: SampleFn | None = None,
    differs: DiffersFn = lambda p, onehot, K, q_mode: False,
) -> SpecVariant:
    """A catalogue entry: a hook left ``None`` is the exact sampler's (and its flag says so)."""
    return SpecVariant(
        name,
        mirrors,
        description,
        exact,
        verify or _verify_pipeline,
        draft or _draft_truthful,
        sample or rejection_sample,
        differs,
        exact_verify=verify is None,
        truthful_draft=draft is None,
        round_on_shortlist=verify is None and draft is None and sample is None,
    )


def _q_differs_from_raw(p: SamplingParams, onehot: bool, q_mode: str) -> bool:
    if onehot:
        return True
    return (q_mode == "processed" and _nontrivial(p)) or (
        q_mode == "temperature" and p.temperature != 1.0
    )


_CATALOGUE: dict[str, Callable[[], SpecVariant]] = {
    "exact": lambda: _make(
        "exact", "", "Algorithm 1 of arXiv 2211.17192 (rejection.rejection_sample).", exact=True
    ),
    "residual_from_p": lambda: _make(
        "residual_from_p",
        "no exact docs/bugs.md row: the textbook resample-from-p error; closest vllm-ascend #2881 "
        "(p modified before the residual)",
        "At the first rejection the recovered token is drawn from p, not norm(max(0, p - q)). "
        "Observable at T > 0 with K >= 1 (one-hot too: p vs p without x).",
        sample=mr.sample_residual_from_p,
        differs=lambda p, onehot, K, q: _hot(p) and K >= 1,
    ),
    "bonus_wrong_row": lambda: _make(
        "bonus_wrong_row",
        "FlashInfer #425; TensorRT-LLM #15098; openvino.genai #4190",
        "On full acceptance the bonus is drawn from position K (index K-1) instead of K+1. "
        "Observable when K >= 1 and per-position targets differ (even at T = 0).",
        sample=mr.sample_bonus_wrong_row,
        differs=lambda p, onehot, K, q: K >= 1,
    ),
    "target_unprocessed": lambda: _make(
        "target_unprocessed",
        "vLLM #9834 -> #10198",
        "The verifier's p is softmax(logits) at T = 1 without top-k/top-p/min-p while plain "
        "decode applies them. Observable unless params are T = 1 with no filter (any K, even 0).",
        verify=_verify_unprocessed,
        differs=lambda p, onehot, K, q: _nontrivial(p),
    ),
    "raw_q": lambda: _make(
        "raw_q",
        "transformers #47932 (PR #47961 closed)",
        "Draft token drawn from the processed draft law, q reported = softmax(raw logits). "
        "Sampled drafter: observable iff the q_mode law differs from raw (processing active). "
        "One-hot drafter: reports softmax(raw) for the argmax token (like onehot_softmax_q).",
        draft=_draft_raw_q,
        differs=lambda p, onehot, K, q: _hot(p) and K >= 1 and _q_differs_from_raw(p, onehot, q),
    ),
    "onehot_softmax_q": lambda: _make(
        "onehot_softmax_q",
        "transformers #32867 -> fix #33534; jaymody/speculative-sampling #3",
        "The draft token is the argmax, but q reported = the drafter's softmax law (q_mode). "
        "Observable at T > 0 with K >= 1 (the onehot flag is ignored: the bug is greedy drafting).",
        draft=_draft_onehot_softmax_q,
        differs=lambda p, onehot, K, q: _hot(p) and K >= 1,
    ),
    "reuse_accept_uniform": lambda: _make(
        "reuse_accept_uniform",
        "FlashInfer #424; SGLang #7207",
        "The recovered draw reuses the acceptance uniform of the rejected position (given a "
        "rejection it is U(p/q, 1), not U(0, 1)). Observable at T > 0, K >= 1, residual with >= 2 "
        "tokens.",
        sample=mr.sample_reuse_accept_uniform,
        differs=lambda p, onehot, K, q: _hot(p) and K >= 1,
    ),
    "bonus_reuse_accept_uniform": lambda: _make(
        "bonus_reuse_accept_uniform",
        "issue 22 (a plug-in author's bonus drawn with the last acceptance coin); the bonus-side "
        "twin of FlashInfer #424 / SGLang #7207",
        "On full acceptance the bonus is drawn with the last acceptance uniform u_K (given the "
        "acceptance it is U(0, p/q), not U(0, 1): the bonus sits low in its CDF). Observable at "
        "T > 0 with K >= 1; only bonus tokens are touched.",
        sample=mr.sample_bonus_reuse_accept_uniform,
        differs=lambda p, onehot, K, q: _hot(p) and K >= 1,
    ),
    "commit_on_telemetry": lambda: _make(
        "commit_on_telemetry",
        "seed 001 (openinfer #534 review): emitted vs accepted counter confusion",
        "Commits num_accepted_any drafted tokens (hypothetical acceptances past the first "
        "rejection included), then the exact round's final token. Observable at T > 0, K >= 2.",
        sample=mr.sample_commit_on_telemetry,
        differs=lambda p, onehot, K, q: _hot(p) and K >= 2,
    ),
    "greedy_verify": lambda: _make(
        "greedy_verify",
        "SGLang #31214, #32922, #37134; ROCm/ATOM #2318",
        "Accept iff the draft equals argmax p; emit argmax p at the stop (bonus included): "
        "greedy output at T > 0. Observable at T > 0 (any K).",
        sample=mr.sample_greedy_verify,
        differs=lambda p, onehot, K, q: _hot(p),
    ),
    "always_accept": lambda: _make(
        "always_accept",
        "vllm-ascend #13730/#13470 (u = 0); transformers #28508",
        "Every drafted token is accepted, then a bonus from p. Observable with K >= 1 unless the "
        "drafter equals the target.",
        sample=mr.sample_always_accept,
        differs=lambda p, onehot, K, q: K >= 1,
    ),
    "swapped_filter_order": lambda: _make(
        "swapped_filter_order",
        "SGLang #36173; fastllm #737/#738",
        "The verifier applies top-p before top-k (plain decode: top-k then top-p). Observable "
        "only at T > 0 with both top_k > 0 and top_p < 1, and only for some logits (any K).",
        verify=_verify_swapped,
        differs=lambda p, onehot, K, q: _hot(p) and p.top_k > 0 and p.top_p < 1.0,
    ),
    "bf16_ratio": lambda: _make(
        "bf16_ratio",
        "DeepSpec #31; SGLang #42568",
        "p(x) and q(x) rounded to bfloat16 (8-bit mantissa) before the ratio: a small bias "
        "(~2^-9 relative), needs large N. Observable at T > 0 with K >= 1.",
        sample=mr.sample_bf16_ratio,
        differs=lambda p, onehot, K, q: _hot(p) and K >= 1,
    ),
    "draft_raw_consistent": lambda: _make(
        "draft_raw_consistent",
        "docs/bugs.md 'designs that look suspicious but are exact'",
        "The drafter samples from softmax(raw logits) and reports exactly that q: lower "
        "acceptance, same law (must PASS). Coincides with exact for a one-hot drafter.",
        exact=True,
        draft=_draft_raw_consistent,
    ),
}


def _eps_variant(eps: float) -> SpecVariant:
    """``eps_biased:<ε>``: accept with min(1, (1 + ε) p/q), residual unchanged (ε = 0: exact).
    docs/statistics.md: TV ≈ ε · P_p(q > p) for one draft token."""
    variant = _make(
        f"eps_biased:{eps:g}",
        "docs/bugs.md: lossy modes (SGLang accept thresholds, vLLM typical acceptance); "
        "the ε tooth",
        f"Accept with min(1, (1 + {eps:g}) p/q); residual unchanged. Observable at T > 0, K >= 1.",
        exact=eps == 0.0,
        sample=None if eps == 0.0 else mr.sample_eps(eps),
        differs=lambda p, onehot, K, q: eps != 0.0 and _hot(p) and K >= 1,
    )
    # on shortlist laws the same round is the chain sampler at accept_scale 1 + ε (the dense
    # ``sample_eps`` above is its reference: tests/test_mutants_eps.py)
    return replace(variant, round_on_shortlist=True, accept_scale=1.0 + eps)


DEFAULT_EPS = 0.1
VARIANT_NAMES: tuple[str, ...] = ("exact", "eps_biased", *[n for n in _CATALOGUE if n != "exact"])


def get_variant(spec: str) -> SpecVariant:
    """``"exact"``, ``"eps_biased:0.1"`` (bare ``"eps_biased"`` = ε 0.1), ``"always_accept"`` ...

    Raises ``ConfigError`` naming the bad spec and listing the valid names.
    """
    if not isinstance(spec, str):
        raise ConfigError(f"variant must be a string, got {spec!r}")
    name, sep, arg = spec.strip().partition(":")
    if name == "eps_biased":
        try:
            eps = float(arg) if sep else DEFAULT_EPS
        except ValueError:
            raise ConfigError(
                f"variant {spec!r}: ε must be a number, e.g. 'eps_biased:0.1'"
            ) from None
        if not math.isfinite(eps) or eps <= -1.0:
            raise ConfigError(f"variant {spec!r}: ε must be finite and > -1, got {eps!r}")
        return _eps_variant(eps)
    if name not in _CATALOGUE:
        raise ConfigError(f"unknown variant {spec!r}; valid: {', '.join(VARIANT_NAMES)}")
    if sep:
        raise ConfigError(f"variant {spec!r}: {name!r} takes no argument")
    return _CATALOGUE[name]()


def eps_of(spec: str | None) -> float | None:
    """The ε of an ``eps_biased[:<ε>]`` spec (bare = ``DEFAULT_EPS``), else ``None``."""
    if spec is None:
        return None
    name, sep, arg = spec.strip().partition(":")
    if name != "eps_biased":
        return None
    try:
        return float(arg) if sep else DEFAULT_EPS
    except ValueError:
        return None


def stack_q(qs: list[torch.Tensor | None]) -> torch.Tensor | None:
    """Stack per-position ``q_reported`` ``[B, V]`` into ``draft_probs`` ``[B, K, V]`` (None if
    all are None: a one-hot drafter). Mixed None/tensor is an ``InputError``."""
    if all(q is None for q in qs):
        return None
    if any(q is None for q in qs):
        raise InputError("stack_q: q_reported is None at some positions and a tensor at others")
    return torch.stack([q for q in qs if q is not None], dim=1)
