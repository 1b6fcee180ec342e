"""transformers ``generate`` and assisted generation as arms of spectest (the ``hf`` backend).

Owns: turning a batch of rows (one prompt; many (config, seed) rows) into emitted tokens by
calling transformers itself — ``model.generate(do_sample=True)`` for the reference arm
(``hf-generate``) and ``generate(..., assistant_model=draft)`` for the candidate arm
(``hf-assisted``, speculative sampling through transformers' ``_speculative_sampling``) — with every
sampling parameter set explicitly, and the per-round telemetry of assisted generation.

Also owns ``HFGenerateEngine`` and ``HFAssistedEngine``: the two as engines of the contract
(``spectest.engines.base``), with white-box columns recorded at generation time from
transformers' own ``output_scores`` (see "White-box columns" below), or by ``hf_teacher``
(transformers' own warpers, teacher forcing) where this transformers does not return them.

Knows nothing about statistics, files or protocols (``hf_teacher`` teacher-forces the local models
along what this module emits).

Works with transformers 4.44 (the hunt venv) and 5.x: version differences are feature-detected
(``GenerationConfig`` attributes), never compared by version number.

What transformers does, and how this module pins it down
--------------------------------------------------------
- ``GenerationConfig`` defaults differ by version (top_k = 50 in both; 5.x fills unset fields from
  ``model.generation_config`` and then from global defaults). ``generation_config`` below sets every
  field that shapes the law: ``top_k=0`` is "off" in both versions (``None`` would be filled with 50
  by 5.x), ``top_p=1.0`` and ``temperature=1.0`` add no warper, ``min_p=0.0`` adds a
  ``MinPLogitsWarper(0.0)`` that removes nothing.
- EOS: ``eos_token_id=[]`` (with ``pad_token_id = V``, see the NOTE in ``generation_config``)
  disables stopping in both versions. ``None`` does *not*: it is filled
  from the model config, and then ``min_new_tokens`` would mask EOS (a different law). Every row
  therefore emits exactly ``num_tokens`` tokens (checked).
- Checkpoint defaults (``model.generation_config``: suppress_tokens, forced BOS, top_h, ...) are
  merged into every unset field by 5.x: ``own_generation_config`` swaps in a blank config for
  the duration of a call, on the target and on the draft.
- Draft length and confidence threshold are read by transformers from
  ``assistant_model.generation_config`` (not from the call's config) in both versions;
  ``assistant_settings`` gives the draft a blank config with ``num_assistant_tokens = K``,
  ``num_assistant_tokens_schedule = "constant"`` and, where the attribute exists (5.x),
  ``assistant_confidence_threshold``, and restores the draft's config afterwards.
- Assisted generation allows batch size 1: the candidate arm loops over rows.
- Per-round telemetry: ``RoundRecorder`` wraps the candidate generator that
  ``target._get_candidate_generator`` returns (an instance attribute, removed afterwards): its
  ``get_candidates`` gives the drafted tokens and the draft scores q transformers uses, its
  ``update_candidate_strategy(input_ids, new_logits, n_matches)`` — called once per round in both
  versions — gives the processed target scores p and the accepted count. Both are the tensors
  ``_speculative_sampling`` consumed, so the recorded ``engine_*`` readouts are transformers' own.

White-box columns (issue 12)
----------------------------
``generate(..., output_scores=True, return_dict_in_generate=True)`` returns, per emitted token,
the *processed* scores transformers sampled it from (read in ``transformers/generation/utils.py``,
5.x and 4.44):

- plain sampling (``_sample``): ``next_token_scores = logits_processor(input_ids, logits)``
  (float32; the custom ``LogitScale`` and every warper included),
  ``scores += (next_token_scores,)``, then
  ``multinomial(softmax(next_token_scores))`` — score t is the law token t was drawn from.
- assisted decoding (``_assisted_decoding``): the verify forward's K + 1 logits are processed
  position by position into ``new_logits``, ``_speculative_sampling`` accepts / recovers / adds
  the bonus from ``softmax(new_logits)``, and ``scores += tuple(new_logits[:, i, :] for i in
  range(n_matches + 1))`` — one entry per emitted token, the target law p_t of its position as the
  sampler used it (the law a correct speculative sampler's output must follow there).

So p_t = softmax(score_t) (float64 of transformers' float32 scores) is *the* law of the engine's
own numerics, in every dtype: the exact one-sample white-box tests apply, as for the built-in
engine, and bf16 no longer needs teacher mode. q_t (which only orders the CDF and defines
A_t = {q > p}; it must be a function of the prefix, nothing more) comes from teacher forcing the
draft (``hf_teacher.draft_probs``), as before. ``scores_support`` checks transformers' source for
those two statements (not its version number); where they are missing the engines declare
``whitebox = "teacher"`` and the reason goes to provenance. ``generate`` then checks every score
tuple (one per token, ``[rows, V]``) and fails with ``EngineError`` otherwise.
NOTE memory: the scores are ``[rows, T, V]`` float32 on the device; with white-box on, a plain
batch holds at most ``SCORES_BUDGET`` elements (``whitebox_batch``) and each batch's scores are
reduced to the five columns (``hf_teacher.hf_teacher_force(target_scores=...)``, chunked) before
the next batch runs. With a Qwen vocabulary (151 936) and 32 positions that is 55 rows per batch;
the batch seeds (row key of a batch's first row) follow the batches.

Randomness
----------
NOTE: transformers draws from torch's *global* generator (``torch.multinomial`` / ``rand_like``
without a generator argument), so randomness cannot be passed in. Each call runs under
``torch.random.fork_rng`` (the caller's global state is restored) after ``torch.manual_seed(s)``
with ``s`` a spectest row key (``spectest.seeding``). Reproducibility: a plain batch is
reproducible per (batch composition, seed range) — its seed is the row key of its first row — not
per row; an assisted row is reproducible per row. Same seed, same torch build, same device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from transformers import LogitsProcessor

from spectest.engines.base import ArmJob, ArmOutput, Engine, Progress, RowSpec, check_rows
from spectest.engines.builtin import EngineOutput
from spectest.errors import ConfigError, EngineError, ModelError
from spectest.sampling.params import SamplingParams
from spectest.seeding import row_key

HF_GENERATE = "hf-generate"  # reference-arm backend name
HF_ASSISTED = "hf-assisted"  # candidate-arm backend name


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
    not (``reason``; empty when ok). See the module docstring, "White-box columns"."""

    ok: bool
    reason: str


# the statements of transformers' decode loops that make score t the law of token t
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
# white-box with output_scores: at most this many float32 score elements per plain batch (1 GiB)
SCORES_BUDGET = 1 << 28


def whitebox_batch(batch_size: int, num_tokens: int, vocab_size: int) -> int:
    """Rows per plain ``generate`` call when its scores are kept (``SCORES_BUDGET``)."""
    return max(1, min(batch_size, SCORES_BUDGET // max(1, num_tokens * vocab_size)))


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
        # NOTE: pad = vocab_size, an id no model emits. Nothing is ever padded (one prompt, no EOS),
        # but transformers 5.x re-infers the assistant's attention mask from pad tokens in its
        # input: with a real id as pad (we first used 0), emitted tokens equal to it were masked
        # out of the draft's context (measured: q no longer matched the draft's law along the
        # emitted prefix). 5.x also requires some pad when eos_token_id == [].
        pad_token_id=int(vocab_size),
        use_cache=True,
        return_dict_in_generate=True,
        output_scores=bool(output_scores),  # the processed scores sampled from (white-box)
        output_logits=False,
    )
    return GenerationConfig(**fields)


def _processors(target: Any, draft: Any | None) -> list[Any]:
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
    """Replace ``model.generation_config`` by a blank ``GenerationConfig(**fields)``; restore after.

    NOTE: transformers fills every field the call leaves unset from ``model.generation_config``
    (5.x) — a checkpoint's ``suppress_tokens``, ``forced_bos_token_id``, ``top_h``,
    ``bad_words_ids``... would add processors the protocol never asked for (measured: they do,
    tests/test_engine_hf.py). A blank config leaves only transformers' global defaults, which
    ``generation_config`` overrides one by one. The assistant's ``generate`` merges the *draft's*
    config the same way, so the draft gets a blank one too (``assistant_settings``).
    """
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


# ----------------------------------------------------------------------------- round telemetry
@dataclass(frozen=True)
class RoundRecord:
    """One assisted-generation round as transformers ran it.

    ``position``: first generated position of the round (0 = first new token); ``drafted``:
    candidate tokens proposed; ``accepted``: transformers' ``n_matches``; ``emitted`` =
    ``accepted + 1``. Per verified draft position (``accepted + (accepted < drafted)`` of them):
    ``engine_accept_prob`` = min(1, p(x)/q(x)) and ``engine_overlap`` = Σ_v min(p(v), q(v)), both
    with transformers' own p (processed target scores) and q (softmax of the draft scores it
    returned).
    """

    position: int
    drafted: int
    accepted: int
    emitted: int
    engine_accept_prob: tuple[float, ...]
    engine_overlap: tuple[float, ...]


@dataclass
class RoundRecorder:
    """Collects ``RoundRecord`` s of one assisted ``generate`` call (see module docstring)."""

    prompt_len: int
    keep_scores: bool = False
    rounds: list[RoundRecord] = field(default_factory=list)
    # with keep_scores: per round (position, drafted [d], q scores [d, V], p scores [d + 1, V])
    scores: list[tuple[int, torch.Tensor, torch.Tensor | None, torch.Tensor]] = field(
        default_factory=list
    )
    _pending: tuple[int, torch.Tensor, torch.Tensor | None] | None = None
    # with output_scores: processed target scores of the emitted tokens [1, T, V]
    emitted: torch.Tensor | None = None

    def on_candidates(
        self, input_ids: torch.Tensor, cand_ids: torch.Tensor, cand_logits: Any
    ) -> None:
        cur = int(input_ids.shape[1])
        drafted = cand_ids[0, cur:].clone()  # [drafted]
        q_scores = (
            None if cand_logits is None else cand_logits[0].detach().float().clone()
        )  # [drafted, V]
        self._pending = (cur, drafted, q_scores)

    def on_update(self, input_ids: torch.Tensor, scores: torch.Tensor, n_matches: Any) -> None:
        assert self._pending is not None, "update_candidate_strategy before get_candidates"
        cur, drafted, q_scores = self._pending
        self._pending = None
        n = int(n_matches)
        d = 0 if q_scores is None else int(drafted.shape[0])
        acc_prob: tuple[float, ...] = ()
        overlap: tuple[float, ...] = ()
        if d > 0 and q_scores is not None:
            verified = n + (1 if n < d else 0)
            # NOTE: float64 softmax of the float32 scores transformers used; transformers itself
            # takes the softmax in float32 — the difference is ~1e-7, far below any readout.
            p = torch.softmax(scores[0, :verified].double(), dim=-1)  # [verified, V]
            q = torch.softmax(q_scores[:verified].double(), dim=-1)  # [verified, V]
            x = drafted[:verified].to(p.device)  # [verified]
            px = p.gather(1, x[:, None])[:, 0]
            qx = q.gather(1, x[:, None])[:, 0]
            acc_prob = tuple(torch.clamp(px / qx, max=1.0).tolist())
            overlap = tuple(torch.minimum(p, q).sum(-1).tolist())
        self.rounds.append(RoundRecord(cur - self.prompt_len, d, n, n + 1, acc_prob, overlap))
        if self.keep_scores:
            p_scores = scores[0].detach().float().cpu().clone()  # [d + 1, V]
            self.scores.append((cur - self.prompt_len, drafted.cpu(), q_scores, p_scores))


@contextlib.contextmanager
def record_rounds(
    target: Any, prompt_len: int, keep_scores: bool = False
) -> Iterator[RoundRecorder]:
    """Wrap the candidate generator of ``target.generate(..., assistant_model=...)`` (one call)."""
    hf = hf_model_of(target)
    rec = RoundRecorder(prompt_len, keep_scores)
    original = hf._get_candidate_generator  # bound method of the class

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        gen = original(*args, **kwargs)
        get_c, upd = gen.get_candidates, gen.update_candidate_strategy

        def get_candidates(input_ids: torch.Tensor, *a: Any, **k: Any) -> Any:
            cand_ids, cand_logits = get_c(input_ids, *a, **k)
            rec.on_candidates(input_ids, cand_ids, cand_logits)
            return cand_ids, cand_logits

        def update(input_ids: torch.Tensor, scores: torch.Tensor, num_matches: Any) -> Any:
            rec.on_update(input_ids, scores, num_matches)
            return upd(input_ids, scores, num_matches)

        gen.get_candidates = get_candidates
        gen.update_candidate_strategy = update
        return gen

    hf._get_candidate_generator = wrapped  # instance attribute shadows the method
    try:
        yield rec
    finally:
        del hf._get_candidate_generator


# ----------------------------------------------------------------------------- the two arms
def _check_prompt(prompt_ids: torch.Tensor, vocab_size: int) -> None:
    assert prompt_ids.dim() == 1 and prompt_ids.dtype == torch.int64, (
        prompt_ids.shape,
        prompt_ids.dtype,
    )
    if prompt_ids.numel() == 0:
        raise ConfigError("hf backend: the prompt is empty (transformers needs at least one token)")
    if int(prompt_ids.min()) < 0 or int(prompt_ids.max()) >= vocab_size:
        raise ConfigError(
            f"hf backend: prompt token ids must be in [0, {vocab_size}), "
            f"got {prompt_ids.tolist()!r}"
        )


def _fork_devices(device: torch.device) -> list[torch.device]:
    return [device] if device.type == "cuda" else []


def emitted_scores(out: Any, rows: int, num_tokens: int, where: str) -> torch.Tensor:
    """``out.scores`` of ``generate(output_scores=True)`` as ``[rows, num_tokens, V]`` float32.

    Checks what the white-box columns rely on: one score tensor per emitted token, each
    ``[rows, V]`` (``EngineError`` otherwise: this transformers' scores are not per token).
    """
    scores = getattr(out, "scores", None)
    if scores is None or len(scores) != num_tokens:
        n = None if scores is None else len(scores)
        raise EngineError(
            f"{where}: output_scores returned {n!r} score tensors for {num_tokens} emitted tokens "
            "(one per token expected): this transformers' scores cannot give white-box columns"
        )
    shapes = {tuple(sc.shape) for sc in scores}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2 or next(iter(shapes))[0] != rows:
        raise EngineError(
            f"{where}: output_scores shapes {sorted(shapes)!r}, expected one [{rows}, V] per token"
        )
    return torch.stack([sc.float() for sc in scores], dim=1)  # [rows, T, V]


def generate_plain(
    model: Any,
    prompt_ids: torch.Tensor,
    params: SamplingParams,
    num_tokens: int,
    batch_size: int,
    seed: int,
) -> torch.Tensor:
    """One batched ``model.generate`` call: ``batch_size`` rows of the same prompt and params.

    Parameters
    ----------
    prompt_ids : torch.Tensor
        ``[L]`` int64.
    seed : int
        ``torch.manual_seed`` argument for this batch (a spectest row key).

    Returns
    -------
    torch.Tensor
        ``[batch_size, num_tokens]`` int64 emitted tokens (on CPU).
    """
    return generate_plain_scored(model, prompt_ids, params, num_tokens, batch_size, seed)[0]


def generate_plain_scored(
    model: Any,
    prompt_ids: torch.Tensor,
    params: SamplingParams,
    num_tokens: int,
    batch_size: int,
    seed: int,
    output_scores: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``generate_plain``, and with ``output_scores`` the processed scores each token was drawn
    from: ``[batch_size, num_tokens, V]`` float32 on the model's device (``emitted_scores``)."""
    hf = hf_model_of(model)
    V = int(hf.config.vocab_size)
    _check_prompt(prompt_ids, V)
    dev = hf.device
    L = int(prompt_ids.shape[0])
    ids = prompt_ids.to(dev)[None, :].expand(batch_size, L).contiguous()  # [B, L]
    gc = generation_config(params, num_tokens, V, output_scores)
    with (
        own_generation_config(model),
        torch.random.fork_rng(devices=_fork_devices(dev)),
        torch.inference_mode(),
    ):
        torch.manual_seed(int(seed))
        out = hf.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            generation_config=gc,
            logits_processor=_processors(model, None),
        )
    seq = out.sequences  # [B, L + T]
    if tuple(seq.shape) != (batch_size, L + num_tokens):
        raise ModelError(
            f"hf-generate: expected sequences of shape {(batch_size, L + num_tokens)!r}, "
            f"got {tuple(seq.shape)!r}"
        )
    scores = emitted_scores(out, batch_size, num_tokens, HF_GENERATE) if output_scores else None
    return seq[:, L:].cpu(), scores  # [B, T], [B, T, V] | None


def generate_assisted(
    target: Any,
    draft: Any,
    prompt_ids: torch.Tensor,
    params: SamplingParams,
    num_tokens: int,
    num_assistant_tokens: int,
    seed: int,
    confidence_threshold: float = 0.0,
    keep_scores: bool = False,
    output_scores: bool = False,
) -> tuple[torch.Tensor, RoundRecorder]:
    """One assisted ``generate`` call (batch size 1) with the round telemetry.

    With ``output_scores``, ``recorder.emitted`` holds the processed target scores of every
    emitted token, ``[1, num_tokens, V]`` float32 (``emitted_scores``; module docstring).

    Returns
    -------
    tokens : torch.Tensor
        ``[num_tokens]`` int64 (CPU).
    recorder : RoundRecorder
        ``.rounds`` (one ``RoundRecord`` per round) and, with ``keep_scores``, ``.scores``.
    """
    hf_t, hf_d = hf_model_of(target), hf_model_of(draft)
    V = int(hf_t.config.vocab_size)
    if int(hf_d.config.vocab_size) != V:
        raise ModelError(
            f"hf-assisted: vocabulary mismatch: target V={V!r}, "
            f"draft V={int(hf_d.config.vocab_size)!r}"
        )
    _check_prompt(prompt_ids, V)
    dev = hf_t.device
    L = int(prompt_ids.shape[0])
    ids = prompt_ids.to(dev)[None, :]  # [1, L]
    gc = generation_config(params, num_tokens, V, output_scores)
    procs = _processors(target, draft)
    with (
        own_generation_config(target),
        assistant_settings(draft, num_assistant_tokens, confidence_threshold),
        record_rounds(target, L, keep_scores) as rec,
        torch.random.fork_rng(devices=_fork_devices(dev)),
        torch.inference_mode(),
    ):
        torch.manual_seed(int(seed))
        out = hf_t.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            generation_config=gc,
            assistant_model=hf_d,
            logits_processor=procs,
        )
    seq = out.sequences  # [1, L + T]
    if tuple(seq.shape) != (1, L + num_tokens):
        raise ModelError(
            f"hf-assisted: expected sequences of shape {(1, L + num_tokens)!r}, "
            f"got {tuple(seq.shape)!r}"
        )
    emitted = sum(r.emitted for r in rec.rounds)
    if emitted != num_tokens:
        raise ModelError(
            f"hf-assisted: round telemetry accounts for {emitted!r} tokens, expected {num_tokens!r}"
        )
    if output_scores:
        rec.emitted = emitted_scores(out, 1, num_tokens, HF_ASSISTED)
    return seq[0, L:].cpu(), rec


# ----------------------------------------------------------------------------- rows → EngineOutput
def _check_rows(
    model: Any, prompt: Sequence[int], rows: Sequence[RowSpec], T: Any, batch_size: Any
) -> torch.Tensor:
    check_rows(rows, T, batch_size)
    ids = [int(t) for t in prompt]
    prompt_t = torch.tensor(ids, dtype=torch.int64)  # [L]
    _check_prompt(prompt_t, int(hf_model_of(model).config.vocab_size))
    return prompt_t


def plain_batches(rows: Sequence[RowSpec], batch_size: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` slices of ``rows``: consecutive rows with equal params, at most ``batch_size``.

    One ``generate`` call takes one ``GenerationConfig``, so a batch never mixes params.
    """
    out: list[tuple[int, int]] = []
    lo = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or i - lo == batch_size or rows[i].params != rows[lo].params:
            out.append((lo, i))
            lo = i
    return out


def hf_plain_decode(
    model: Any,
    prompt: Sequence[int],
    rows: Sequence[RowSpec],
    *,
    num_positions: int,
    run_key: int,
    prompt_id: str,
    batch_size: int = 256,
    progress: Progress | None = None,
    whitebox: bool = False,
    draft: Any | None = None,
) -> EngineOutput:
    """Reference arm ``hf-generate``: batched ``model.generate(do_sample=True)``.

    Same signature and output as ``builtin.plain_decode``. Batch seed = the row key of the
    batch's first row (reproducible per batch composition, see module docstring). With
    ``whitebox``, the white-box columns from transformers' own scores (p_t) and the teacher-forced
    ``draft`` (q_t, or none), each batch reduced before the next (``whitebox_batch`` rows).
    """
    prompt_t = _check_rows(model, prompt, rows, num_positions, batch_size)
    if whitebox:
        batch_size = whitebox_batch(
            batch_size, num_positions, int(hf_model_of(model).config.vocab_size)
        )
    chunks, wb = [], []
    for lo, hi in plain_batches(rows, batch_size):
        first = rows[lo]
        seed = row_key(run_key, prompt_id, first.config_id, first.seed)
        toks, scores = generate_plain_scored(
            model, prompt_t, first.params, num_positions, hi - lo, seed, output_scores=whitebox
        )
        chunks.append(toks)
        if scores is not None:
            wb.append(_scored_whitebox(model, draft, prompt, rows[lo:hi], toks, scores))
        if progress is not None:
            progress(hi)
    frame = pd.concat(wb, ignore_index=True) if whitebox else None
    return EngineOutput(torch.cat(chunks, dim=0), None, frame)


def _scored_whitebox(
    target: Any,
    draft: Any | None,
    prompt: Sequence[int],
    rows: Sequence[RowSpec],
    tokens: torch.Tensor,
    scores: torch.Tensor,
) -> pd.DataFrame:
    """White-box columns of ``tokens [b, T]`` with p_t = softmax(``scores [b, T, V]``)."""
    from spectest.engines.hf_teacher import hf_teacher_force

    return hf_teacher_force(
        target, prompt, [r.params for r in rows], tokens, draft=draft, target_scores=scores
    )


ROUND_EXTRA_COLUMNS = ("verified", "engine_accept_prob", "engine_overlap")


def hf_assisted_decode(
    target: Any,
    draft: Any,
    prompt: Sequence[int],
    rows: Sequence[RowSpec],
    *,
    num_positions: int,
    num_assistant_tokens: int,
    run_key: int,
    prompt_id: str,
    confidence_threshold: float = 0.0,
    progress: Progress | None = None,
    whitebox: bool = False,
    draft_teacher: Any | None = None,
) -> EngineOutput:
    """Candidate arm ``hf-assisted``: one assisted ``generate`` per row (batch size 1).

    With ``whitebox``: the white-box columns with p_t from transformers' own scores of each
    emitted token and q_t from teacher forcing ``draft_teacher`` (or none).

    Output as ``builtin.speculative_decode``: ``rounds`` has ``row, round, position, drafted,
    accepted, emitted`` plus ``ROUND_EXTRA_COLUMNS`` (per round: verified draft positions, and the
    sums over them of transformers' own ``engine_accept_prob`` and ``engine_overlap``, see
    ``RoundRecord``). Each row's seed is its row key: reproducible per row.
    """
    prompt_t = _check_rows(target, prompt, rows, num_positions, 1)
    toks = []
    frames = []
    scored: list[torch.Tensor] = []  # [1, T, V] each, reduced every ``whitebox_batch`` rows
    wb: list[pd.DataFrame] = []
    every = whitebox_batch(len(rows), num_positions, int(hf_model_of(target).config.vocab_size))
    for i, r in enumerate(rows):
        seed = row_key(run_key, prompt_id, r.config_id, r.seed)
        t, rec = generate_assisted(
            target,
            draft,
            prompt_t,
            r.params,
            num_positions,
            num_assistant_tokens,
            seed,
            confidence_threshold,
            output_scores=whitebox,
        )
        toks.append(t[None, :])  # [1, T]
        frames.append(_rounds_of(i, rec.rounds))
        if rec.emitted is not None:
            scored.append(rec.emitted)
            if len(scored) == every or i + 1 == len(rows):
                lo = i + 1 - len(scored)
                done = torch.cat(toks[lo:], dim=0)  # [b, T]
                s_b = torch.cat(scored, dim=0)  # [b, T, V]
                part = rows[lo : i + 1]
                wb.append(_scored_whitebox(target, draft_teacher, prompt, part, done, s_b))
                scored = []
        if progress is not None:
            progress(i + 1)
    frame = pd.concat(wb, ignore_index=True) if whitebox else None
    return EngineOutput(torch.cat(toks, dim=0), pd.concat(frames, ignore_index=True), frame)


def _rounds_of(row: int, rounds: Sequence[RoundRecord]) -> pd.DataFrame:
    n = len(rounds)
    return pd.DataFrame(
        {
            "row": np.full(n, row, dtype=np.int64),
            "round": np.arange(n, dtype=np.int64),
            "position": np.array([r.position for r in rounds], dtype=np.int64),
            "drafted": np.array([r.drafted for r in rounds], dtype=np.int64),
            "accepted": np.array([r.accepted for r in rounds], dtype=np.int64),
            "emitted": np.array([r.emitted for r in rounds], dtype=np.int64),
            "verified": np.array([len(r.engine_overlap) for r in rounds], dtype=np.int64),
            "engine_accept_prob": np.array(
                [sum(r.engine_accept_prob) for r in rounds], dtype=np.float64
            ),
            "engine_overlap": np.array([sum(r.engine_overlap) for r in rounds], dtype=np.float64),
        }
    )


# ----------------------------------------------------------------------------- the engines


WHITEBOX_KIND: Any = "generation" if SCORES.ok else "teacher"


def _whitebox_provenance() -> dict[str, Any]:
    if SCORES.ok:
        return {"whitebox": "generation (transformers output_scores)"}
    return {"whitebox": "teacher", "whitebox_reason": SCORES.reason}


def _hf_whitebox(engine: Engine, job: ArmJob, tokens: torch.Tensor) -> pd.DataFrame | None:
    """Teacher-forced columns (the fallback when ``SCORES`` is not ok)."""
    if not job.whitebox:
        return None
    from spectest.engines.hf_teacher import hf_teacher_force

    # NOTE: p_t (and the processed q_t) with transformers' own warpers: its plain law
    return hf_teacher_force(
        engine.models.target,
        job.prompt_ids,
        [r.params for r in job.rows],
        tokens,
        draft=engine.models.draft,
    )


class HFGenerateEngine(Engine):
    """transformers' plain ``generate(do_sample=True)`` (batched; see ``hf_plain_decode``)."""

    name = HF_GENERATE
    needs = "target"
    whitebox = WHITEBOX_KIND
    rounds = "none"

    def generate(self, job: ArmJob) -> ArmOutput:
        scored = job.whitebox and SCORES.ok
        out = hf_plain_decode(
            self.models.target, job.prompt_ids, job.rows, num_positions=job.num_positions,
            run_key=job.run_key, prompt_id=job.prompt_id, batch_size=job.batch_size,
            progress=job.tick, whitebox=scored, draft=self.models.draft,
        )  # fmt: skip
        wb = out.whitebox if scored else _hf_whitebox(self, job, out.tokens)
        return ArmOutput(out.tokens.numpy(), None, False, wb)

    def provenance(self) -> dict[str, Any]:
        return {
            **super().provenance(),
            "transformers": transformers_version(),
            **_whitebox_provenance(),
        }


class HFAssistedEngine(Engine):
    """transformers' assisted generation (speculative sampling with the protocol's draft,
    K = ``drafter.k``, one row at a time); its rounds are a readout (transformers' own q)."""

    name = HF_ASSISTED
    needs = "draft"
    whitebox = WHITEBOX_KIND
    rounds = "readout"

    @dataclass(frozen=True)
    class Options:
        """``assistant_confidence_threshold``: transformers' draft early-stop (0 = off, 5.x)."""

        assistant_confidence_threshold: float = 0.0

        def __post_init__(self) -> None:
            t = self.assistant_confidence_threshold
            if not 0.0 <= t < 1.0:
                raise ConfigError(
                    f"assistant_confidence_threshold: expected a number in [0, 1), got {t!r}"
                )

    @classmethod
    def check_protocol(
        cls, options: Any, *, role: str, variant: str, drafter_kind: str, drafter_q: str
    ) -> tuple[str, str] | None:
        if role == "candidate" and variant != "exact":
            return "candidate", (
                f"engine hf-assisted runs transformers' own sampler, got {variant!r}"
            )
        if (drafter_kind, drafter_q) != ("sampled", "processed"):
            return "drafter", (
                "engine hf-assisted is teacher-forced with the processed sampled draft law: "
                f"use kind: sampled, q: processed, got {drafter_kind!r}, {drafter_q!r}"
            )
        return None

    def generate(self, job: ArmJob) -> ArmOutput:
        scored = job.whitebox and SCORES.ok
        out = hf_assisted_decode(
            self.models.target, self.models.draft, job.prompt_ids, job.rows,
            num_positions=job.num_positions, num_assistant_tokens=job.drafter.k,
            run_key=job.run_key, prompt_id=job.prompt_id,
            confidence_threshold=self.options.assistant_confidence_threshold, progress=job.tick,
            whitebox=scored, draft_teacher=self.models.draft,
        )  # fmt: skip
        wb = out.whitebox if scored else _hf_whitebox(self, job, out.tokens)
        return ArmOutput(out.tokens.numpy(), out.rounds, False, wb)

    def provenance(self) -> dict[str, Any]:
        return {
            **super().provenance(),
            "transformers": transformers_version(),
            **_whitebox_provenance(),
        }
