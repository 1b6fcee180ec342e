"""``HFGenerateEngine`` and ``HFAssistedEngine``: transformers' decoding as engines of the contract.

Owns the two classes (``hf-generate``: batched plain ``generate``; ``hf-assisted``: one row at a
time, its rounds a readout), their declarations, cross-field rule and provenance. White-box
columns come from ``output_scores`` where ``pinning.SCORES`` allows, else from ``hf.laws``
(``whitebox = "teacher"``). Knows nothing about statistics, files or protocols.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from spectest.engines.base import ArmJob, ArmOutput, Engine
from spectest.engines.hf import pinning
from spectest.engines.hf.decode import hf_assisted_decode, hf_plain_decode
from spectest.engines.hf.laws import hf_teacher_force
from spectest.engines.hf.pinning import HF_ASSISTED, HF_GENERATE, transformers_version
from spectest.errors import ConfigError

WHITEBOX_KIND: Any = "generation" if pinning.SCORES.ok else "teacher"


class _TransformersEngine(Engine):
    """What both engines share: white-box columns where ``generate`` gave no scores (teacher
    forcing with transformers' own warpers), and the provenance of transformers."""

    teacher = "hf"  # teacher mode forces every arm with transformers' warpers

    def scored(self, job: ArmJob) -> bool:
        """Whether ``generate`` records this job's white-box columns from its own scores."""
        return job.whitebox and pinning.SCORES.ok

    def with_whitebox(self, job: ArmJob, out: ArmOutput) -> ArmOutput:
        """``out`` with its white-box columns: the scored ones, else (``pinning.SCORES`` not
        ok) teacher-forced ones — p_t and the processed q_t with transformers' own warpers."""
        if self.scored(job) or not job.whitebox:
            return out
        params = [r.params for r in job.rows]
        wb = hf_teacher_force(
            self.models.target, job.prompt_ids, params, out.tokens, draft=self.models.draft
        )
        return replace(out, whitebox=wb)

    def provenance(self) -> dict[str, Any]:
        how = (
            {"whitebox": "generation (transformers output_scores)"}
            if pinning.SCORES.ok
            else {"whitebox": "teacher", "whitebox_reason": pinning.SCORES.reason}
        )
        return {**super().provenance(), "transformers": transformers_version(), **how}


class HFGenerateEngine(_TransformersEngine):
    """transformers' plain ``generate(do_sample=True)`` (batched; see ``hf_plain_decode``)."""

    name = HF_GENERATE
    needs = "target"
    whitebox = WHITEBOX_KIND
    rounds = "none"
    seeds = "per job"  # a batch is seeded by its first row's key (hf.decode "Randomness")

    def generate(self, job: ArmJob) -> ArmOutput:
        req = job.decode_request(whitebox=self.scored(job))
        out = hf_plain_decode(self.models.target, req, draft=self.models.draft)
        return self.with_whitebox(job, out)


class HFAssistedEngine(_TransformersEngine):
    """transformers' assisted generation (speculative sampling with the protocol's draft,
    K = ``drafter.k``, one row at a time); its rounds are a readout (transformers' own q)."""

    name = HF_ASSISTED
    needs = "draft"
    whitebox = WHITEBOX_KIND
    rounds = "readout"
    max_batch = 1  # transformers: "assisted generate is only supported for batch_size = 1"

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
        out = hf_assisted_decode(
            self.models.target,
            self.models.draft,
            job.decode_request(whitebox=self.scored(job)),
            num_assistant_tokens=job.drafter.k,
            confidence_threshold=self.options.assistant_confidence_threshold,
            draft_teacher=self.models.draft,
        )
        return self.with_whitebox(job, out)
