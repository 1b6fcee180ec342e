"""``example-spec``: speculative sampling written from scratch in numpy, as a spectest engine.

An engine under test is any code that turns a job (one prompt, many (config, seed) rows) into
token ids. This one drives spectest's model zoo for logits (an inference engine would call its
own kernels here) and does its own sampling in float64 numpy with its own RNG:

- the reference arm (``job.role == "reference"``) samples plainly: x ~ p, one token per step;
- the candidate arm samples speculatively (Leviathan et al. 2023): the draft proposes
  ``K = job.drafter.k`` tokens from q (sampled, or its argmax for a one-hot drafter, q = δ(x));
  the target scores them in one pass; draft i is accepted with probability min(1, p(x)/q(x));
  at the first rejection a token is drawn from normalize(max(0, p − q)) and the round ends;
  if all K are accepted a bonus token is drawn from p. The emitted tokens have exactly the
  law of plain sampling from p, which is what ``spectest run`` checks.

p and q are the target's and the draft's laws after temperature → top-k → top-p → min-p, taken
from ``spectest.sampling.transforms.logits_to_probs`` (the protocol's order). Seeds: every row
has its own ``numpy.random.Generator`` seeded with spectest's row key (run key, prompt, config,
seed), so a row's tokens do not depend on the batch it runs in (``seeds = "per row"``).

The contract this class fills (``spectest.engines.base.Engine``): ``name`` (the entry point's
name), ``needs`` (the models it reads), ``whitebox`` (``"none"``: it records no white-box
columns; a run can still teacher-force its tokens), ``rounds`` (``"readout"``: its round
telemetry is stored, not tested), ``uses_variant`` (False: it runs its own sampler, so a
protocol's ``candidate`` must be ``exact``), ``seeds``, ``Options`` (its protocol options) and
``generate(job) -> ArmOutput``; ``check_protocol``, ``provenance`` and ``close`` are optional.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from spectest.engines.base import ArmJob, ArmOutput, Engine, rounds_from_tuples
from spectest.errors import ConfigError
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.transforms import logits_to_probs
from spectest.seeding import row_key

VERSION = "0.1.0"
NO_TOKEN = -1  # spectest's "no token": past the end of a sequence that stopped early


class ExampleEngine(Engine):
    """Plain sampling for the reference arm, speculative sampling for the candidate arm."""

    name = "example-spec"
    needs = "draft"
    whitebox = "none"
    rounds = "readout"
    uses_variant = False
    seeds = "per row"

    @dataclass(frozen=True)
    class Options:
        """``stop_token``: a token id that ends a sequence when emitted (an EOS; -1 = none). A
        sequence that ends early is a shorter sequence in spectest's tables."""

        stop_token: int = -1

        def __post_init__(self) -> None:
            if self.stop_token < -1:
                raise ConfigError(
                    f"stop_token: expected -1 (none) or a token id, got {self.stop_token}"
                )

    @classmethod
    def check_protocol(
        cls, options: Any, *, role: str, variant: str, drafter_kind: str, drafter_q: str
    ) -> tuple[str, str] | None:
        """This sampler reports the processed q it drew from; other q modes are refused."""
        refusal = super().check_protocol(
            options, role=role, variant=variant, drafter_kind=drafter_kind, drafter_q=drafter_q
        )
        if refusal is None and drafter_kind == "sampled" and drafter_q != "processed":
            return "drafter.q", f"{cls.name} proposes from the processed q, not {drafter_q!r}"
        return refusal

    def generate(self, job: ArmJob) -> ArmOutput:
        B, T = len(job.rows), job.num_positions
        tokens = np.full((B, T), NO_TOKEN, dtype=np.int64)  # [B, T]
        rounds: list[tuple[int, int, int, int, int, int]] = []  # ROUNDS_COLUMNS, row = i
        for i, r in enumerate(job.rows):
            rng = np.random.default_rng(row_key(job.run_key, job.prompt_id, r.config_id, r.seed))
            prompt = list(job.prompt_ids)
            if job.role == "reference":
                seq = self._plain(prompt, r.params, T, rng)
            else:
                seq, row_rounds = self._speculative(prompt, r.params, T, job.drafter, rng)
                rounds += [(i, n, *rd) for n, rd in enumerate(row_rounds)]
            tokens[i, : len(seq)] = seq
            job.tick(i + 1)  # rows done: a run's progress bar
        return ArmOutput(tokens, rounds_from_tuples(rounds), rounds_tested=False)

    # ------------------------------------------------------------------------- the samplers
    def _probs(self, model: Any, seq: list[int], params: SamplingParams, n: int = 1) -> np.ndarray:
        """The law of the next token after each of the last ``n`` prefixes of ``seq``: [n, V]."""
        logits = model.logits_full(torch.tensor([seq]))[0, -n:]  # [n, V] float32
        st = SamplingTensors.from_params([params] * n)
        return logits_to_probs(logits, st).cpu().numpy()  # [n, V] float64

    def _stopped(self, out: list[int], T: int) -> bool:
        return len(out) >= T or (self.options.stop_token >= 0 and self.options.stop_token in out)

    def _finish(self, out: list[int], T: int) -> list[int]:
        """Truncate to ``T`` tokens, and just after the stop token when it was emitted."""
        out = out[:T]
        stop = self.options.stop_token
        return out[: out.index(stop) + 1] if stop >= 0 and stop in out else out

    def _plain(self, prompt: list[int], params: SamplingParams, T: int, rng: Any) -> list[int]:
        out: list[int] = []
        while not self._stopped(out, T):
            out.append(_draw(self._probs(self.models.target, prompt + out, params)[0], rng))
        return self._finish(out, T)

    def _speculative(
        self, prompt: list[int], params: SamplingParams, T: int, drafter: Any, rng: Any
    ) -> tuple[list[int], list[tuple[int, int, int, int]]]:
        """The sequence and its rounds: (position, drafted, accepted, emitted) each."""
        target, draft, K = self.models.target, self.models.draft, drafter.k
        out: list[int] = []
        rounds: list[tuple[int, int, int, int]] = []
        while not self._stopped(out, T):
            # the draft proposes K tokens, each from q after the tokens before it
            drafts, qs = [], []
            for _ in range(K):
                q = self._probs(draft, prompt + out + drafts, params)[0]  # [V]
                if drafter.onehot:
                    x = int(np.argmax(q))
                    q = np.eye(len(q))[x]  # a greedy drafter's q is δ(x)
                else:
                    x = _draw(q, rng)
                drafts.append(x)
                qs.append(q)
            # the target scores every draft position and the bonus one in one forward
            p = self._probs(target, prompt + out + drafts, params, n=K + 1)  # [K + 1, V]
            accepted, emitted = 0, []
            for j, x in enumerate(drafts):
                if rng.random() < min(1.0, p[j, x] / qs[j][x]):  # accept w.p. min(1, p/q)
                    accepted += 1
                    emitted.append(x)
                    continue
                residual = np.maximum(p[j] - qs[j], 0.0)  # the mass q under-proposed
                emitted.append(_draw(residual / residual.sum(), rng))
                break
            else:
                emitted.append(_draw(p[K], rng))  # every draft accepted: a bonus token
            position = len(out)
            out += emitted
            kept = len(self._finish(out, T)) - position  # what this round adds to the sequence
            rounds.append((position, K, accepted, kept))
        return self._finish(out, T), rounds

    def provenance(self) -> dict[str, Any]:
        return {**super().provenance(), "version": VERSION, "numpy": np.__version__}

    def close(self) -> None:
        return None  # nothing held: no process, no server, no device memory of its own


def _draw(probs: np.ndarray, rng: Any) -> int:
    """One token from ``probs [V]`` by inverse CDF on one uniform of ``rng``."""
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(cdf) - 1))
