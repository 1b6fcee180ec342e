"""The round telemetry of transformers' assisted generation, as transformers itself ran it.

Owns ``RoundRecord``, ``RoundRecorder`` / ``record_rounds`` (a wrapper of one call's candidate
generator) and ``rounds_frame_of`` (→ ``ROUNDS_COLUMNS`` plus ``ROUND_EXTRA_COLUMNS``). Knows
nothing about rows, seeds or files. How the wrapper reaches into transformers:
docs/engines-hf.md "Round telemetry".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from spectest.engines.hf.pinning import hf_model_of


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
    """Collects ``RoundRecord`` s of one assisted ``generate`` call (module docstring)."""

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


ROUND_EXTRA_COLUMNS = ("verified", "engine_accept_prob", "engine_overlap")


def rounds_frame_of(row: int, rounds: Sequence[RoundRecord]) -> pd.DataFrame:
    """One row's records as the ``ROUNDS_COLUMNS`` frame (``row`` = ``row``) plus
    ``ROUND_EXTRA_COLUMNS``: verified draft positions, and the sums over them of transformers'
    own ``engine_accept_prob`` and ``engine_overlap``."""
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
