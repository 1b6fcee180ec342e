"""transformers' ``generate`` pinned down to the protocol's law, on every supported version.

Owns which transformers this is (``transformers_version``, ``has_confidence_threshold``,
``SCORES``, read from its source), the spectest → transformers model mapping (``hf_model_of``,
``logit_scale_of``) and every setting that leaves nothing to its defaults
(``generation_config``, ``own_generation_config``, ``assistant_settings``). Knows nothing about
rows, seeds, engines or statistics. Why each setting: docs/engines-hf.md "Pinning generate down".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from transformers import LogitsProcessor

from spectest.errors import ConfigError, ModelError
from spectest.sampling.params import SamplingParams

HF_GENERATE = "hf-generate"  # reference-arm engine name
HF_ASSISTED = "hf-assisted"  # candidate-arm engine name


def transformers_version() -> str:
    import transformers

    return str(transformers.__version__)


def has_confidence_threshold() -> bool:
    """Whether this transformers has ``assistant_confidence_threshold`` (added in 4.4x/5.x)."""
    from transformers import GenerationConfig

    return hasattr(GenerationConfig(), "assistant_confidence_threshold")


@dataclass(frozen=True)
class ScoresSupport:
    """Whether ``output_scores`` gives the law each emitted token was drawn from (``ok``), and why
    not (``reason``; empty when ok). docs/engines-hf.md "White-box columns"."""

    ok: bool
    reason: str


# the statements of transformers' decode loops that make score t the law of token t
# (docs/engines-hf.md "White-box columns")
SCORES_STATEMENTS = {
    "_sample": ("scores += (next_token_scores,)", "softmax(next_token_scores"),
    "_assisted_decoding": ("scores += tuple(new_logits[:, i, :] for i in range(",),
}


def scores_support() -> ScoresSupport:
    """Read this transformers' ``GenerationMixin`` decode loops: ok when both keep, per emitted
    token, the processed scores they sample from (``SCORES_STATEMENTS``). A check of the code,
    not of the version number."""
    import inspect

    from transformers.generation.utils import GenerationMixin

    for fn, statements in SCORES_STATEMENTS.items():
        method = getattr(GenerationMixin, fn, None)
        if method is None:
            return ScoresSupport(False, f"transformers {transformers_version()} has no {fn}")
        try:
            src = inspect.getsource(method)
        except (OSError, TypeError) as e:
            return ScoresSupport(False, f"cannot read transformers' {fn}: {e}")
        for st in statements:
            if st not in src:
                return ScoresSupport(
                    False, f"transformers {transformers_version()} {fn} lacks {st!r}"
                )
    return ScoresSupport(True, "")


SCORES = scores_support()


def hf_model_of(model: Any) -> Any:
    """The ``transformers.PreTrainedModel`` behind a spectest model (``HFModel.model``) or itself.

    Raises ``ModelError`` for models transformers cannot run (the toy LM).
    """
    from transformers import PreTrainedModel

    if isinstance(model, PreTrainedModel):
        return model
    inner = getattr(model, "model", None)  # spectest.models.hf.HFModel.model
    if isinstance(inner, PreTrainedModel) and hasattr(inner, "generate"):
        return inner
    name = getattr(model, "name", type(model).__name__)
    raise ModelError(f"hf backend: model {name!r} is not a transformers model")


def logit_scale_of(model: Any) -> float:
    """``HFModel.logit_scale`` (1.0 for a bare transformers model)."""
    return float(getattr(model, "logit_scale", 1.0))


class LogitScale(LogitsProcessor):
    """Multiplies the raw logits by ``scale`` before every other processor.

    Reproduces ``HFModel.logit_scale`` (the entropy knob of random-init zoo models) inside
    ``generate``. Only built when the scale differs from 1.
    """

    def __init__(self, scale: float) -> None:
        self.scale = float(scale)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores * self.scale


def generation_config(
    params: SamplingParams, num_tokens: int, vocab_size: int, output_scores: bool = False
) -> Any:
    """A ``GenerationConfig`` that leaves nothing to defaults: the protocol decides the law.

    Greedy (``temperature == 0``) is ``do_sample=False``. Everything that could add a processor
    (repetition penalty, typical-p, ε/η cutoffs, bad words, forced tokens, renormalization) is
    set to its "off" value, so only temperature → top-k → top-p → min-p remain, in that order.
    """
    from transformers import GenerationConfig

    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
        raise ConfigError(f"hf backend: num_tokens must be an integer >= 1, got {num_tokens!r}")
    sample = not params.is_greedy
    fields: dict[str, Any] = dict(do_sample=sample)
    if sample:  # greedy leaves them unset: unused there, and 4.44 warns about "off" values
        fields.update(
            temperature=float(params.temperature),
            top_k=int(params.top_k),  # 0 = off in 4.44 and 5.x (None would become 50 in 5.x)
            top_p=float(params.top_p),
            min_p=float(params.min_p),
        )
    fields.update(
        typical_p=1.0,
        epsilon_cutoff=0.0,
        eta_cutoff=0.0,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        encoder_repetition_penalty=1.0,
        renormalize_logits=False,
        num_beams=1,
        num_return_sequences=1,
        max_new_tokens=int(num_tokens),
        min_new_tokens=None,
        eos_token_id=[],  # no stopping (None would be filled from the model config)
        pad_token_id=int(vocab_size),  # an id no model emits (docs/engines-hf.md)
        use_cache=True,
        return_dict_in_generate=True,
        output_scores=bool(output_scores),  # the processed scores sampled from (white-box)
        output_logits=False,
    )
    return GenerationConfig(**fields)


def processors(target: Any, draft: Any | None) -> list[Any]:
    """Custom logits processors passed to ``generate``: the zoo's logit scale, if any."""
    from transformers import LogitsProcessorList

    scale = logit_scale_of(target)
    if draft is not None and logit_scale_of(draft) != scale:
        # NOTE: transformers hands the target's custom processors to the assistant too, so one
        # scale is all that can be expressed.
        raise ModelError(
            f"hf backend: target and draft logit_scale differ "
            f"({scale!r} vs {logit_scale_of(draft)!r})"
        )
    return LogitsProcessorList([LogitScale(scale)] if scale != 1.0 else [])


@contextlib.contextmanager
def own_generation_config(model: Any, **fields: Any) -> Iterator[None]:
    """Replace ``model.generation_config`` by a blank ``GenerationConfig(**fields)``; restore
    after: a checkpoint's defaults would add processors the protocol never asked for
    (docs/engines-hf.md "Pinning generate down")."""
    from transformers import GenerationConfig

    inner = hf_model_of(model)
    saved = inner.generation_config
    inner.generation_config = GenerationConfig(**fields)
    try:
        yield
    finally:
        inner.generation_config = saved


@contextlib.contextmanager
def assistant_settings(
    draft: Any, num_assistant_tokens: int, confidence_threshold: float = 0.0
) -> Iterator[None]:
    """Give the draft a blank generation config with only K, a constant schedule, the threshold.

    transformers reads these three from ``assistant_model.generation_config`` (not from the call)
    in both versions. ``confidence_threshold`` > 0 needs a transformers that has it
    (``has_confidence_threshold``); 0 means "off" and is set explicitly where the attribute exists
    (its 5.x default is 0.4). The draft's own config is restored afterwards.
    """
    if (
        isinstance(num_assistant_tokens, bool)
        or not isinstance(num_assistant_tokens, int)
        or num_assistant_tokens < 1
    ):
        raise ConfigError(
            "hf backend: num_assistant_tokens must be an integer >= 1, "
            f"got {num_assistant_tokens!r}"
        )
    if not (isinstance(confidence_threshold, (int, float)) and 0.0 <= confidence_threshold < 1.0):
        raise ConfigError(
            f"hf backend: confidence_threshold must be in [0, 1), got {confidence_threshold!r}"
        )
    has_thr = has_confidence_threshold()
    if confidence_threshold > 0 and not has_thr:
        raise ConfigError(
            f"hf backend: confidence_threshold={confidence_threshold!r} but transformers "
            f"{transformers_version()} has no assistant_confidence_threshold"
        )
    fields: dict[str, Any] = dict(
        num_assistant_tokens=int(num_assistant_tokens), num_assistant_tokens_schedule="constant"
    )
    if has_thr:
        fields["assistant_confidence_threshold"] = float(confidence_threshold)
    with own_generation_config(draft, **fields):
        yield
