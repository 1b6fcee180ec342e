"""Numpy simulators the statistics tests share, and the tests that the simulators are right.

Owns: Zipf laws, a small Markov sequence model (target p and draft q per state), exact and
ε-biased speculative sampling on it (token level, and in K-draft rounds with the rounds table),
the exact output law of the ε-biased acceptor, the white-box columns along emitted sequences,
and ``samples_frame``. Imported by the other tests/test_stats_*.py (pytest puts tests/ on
sys.path). No torch: the stats engine is tested without the model stack.

The ε-biased acceptor (docs/statistics.md): accept the draft x with probability
min(1, (1 + ε)·p(x)/q(x)), residual unchanged. Its output law o has
o(y) = q(y)·min(1, (1 + ε)p(y)/q(y)) on A = {q > p} and o(y) = q(y) + P(reject)·r(y) off A,
r = normalize(max(0, p − q)); TV(o, p) ≈ ε·p(A) before the cap at 1 binds (docs/statistics.md:
0.0232 simulated vs 0.05 × 0.47 predicted).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats


def zipf(vocab: int, s: float = 1.5) -> np.ndarray:
    """Zipf(s) law over ``vocab`` tokens, most likely first: [V]."""
    w = 1.0 / np.arange(1, vocab + 1) ** s
    return w / w.sum()


def perturbed(p: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """A draft-like law: p·exp(σ·N(0,1)) renormalized: [..., V]."""
    q = p * np.exp(sigma * rng.standard_normal(p.shape))
    return q / q.sum(axis=-1, keepdims=True)


def draw(probs: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF draw per row: probs [n, V], u [n] → [n] token ids."""
    cdf = np.cumsum(probs, axis=-1)
    idx = (cdf < u[:, None] * cdf[:, -1:]).sum(axis=-1)
    return np.minimum(idx, probs.shape[-1] - 1)


def acceptor_law(p: np.ndarray, q: np.ndarray, eps: float) -> np.ndarray:
    """Exact output law of the ε-biased one-draft acceptor (module docstring): [V]."""
    with np.errstate(divide="ignore", invalid="ignore"):
        acc = np.where(q > 0, np.minimum(1.0, (1.0 + eps) * p / q), 0.0)
    accepted = q * acc  # [V]
    reject = 1.0 - accepted.sum()
    resid = np.maximum(p - q, 0.0)
    r = resid / resid.sum() if resid.sum() > 0 else np.zeros_like(p)
    return accepted + reject * r


def spec_step(p: np.ndarray, q: np.ndarray, rng: np.random.Generator, eps: float = 0.0):
    """One speculative token per row: draft x ~ q, accept w.p. min(1, (1+ε)p/q), else residual.

    p, q: [n, V]. Returns (tokens [n], accepted [n] bool).
    """
    n = p.shape[0]
    x = draw(q, rng.random(n))
    rows = np.arange(n)
    ratio = np.where(q[rows, x] > 0, p[rows, x] / np.maximum(q[rows, x], 1e-300), 0.0)
    accepted = rng.random(n) < np.minimum(1.0, (1.0 + eps) * ratio)
    resid = np.maximum(p - q, 0.0)
    empty = resid.sum(axis=1) <= 0
    resid[empty] = p[empty]  # NOTE: p == q: rejection has probability 0; any law will do
    y = draw(resid, rng.random(n))
    return np.where(accepted, x, y), accepted


@dataclass(frozen=True)
class Markov:
    """Target p and draft q of a first-order Markov model; state V is the start state."""

    p: np.ndarray  # [V+1, V] next-token law per previous token (row V: start)
    q: np.ndarray  # [V+1, V]

    @property
    def vocab(self) -> int:
        return int(self.p.shape[1])


def markov(vocab: int, rng: np.random.Generator, s: float = 1.2, sigma: float = 0.6) -> Markov:
    """Rows are Zipf(s) over a random permutation per state; q = perturbed(p, σ)."""
    base = zipf(vocab, s)
    p = np.stack([base[rng.permutation(vocab)] for _ in range(vocab + 1)])
    return Markov(p, perturbed(p, sigma, rng))


def sample_plain(m: Markov, n: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """Plain decode: [n, T] tokens."""
    out = np.empty((n, length), dtype=np.int64)
    prev = np.full(n, m.vocab)
    for t in range(length):
        out[:, t] = draw(m.p[prev], rng.random(n))
        prev = out[:, t]
    return out


def sample_spec(
    m: Markov, n: int, length: int, rng: np.random.Generator, eps: float = 0.0
) -> np.ndarray:
    """Token-level speculative decode (one draft per token, no bonus): [n, T] tokens."""
    out = np.empty((n, length), dtype=np.int64)
    prev = np.full(n, m.vocab)
    for t in range(length):
        out[:, t], _ = spec_step(m.p[prev], m.q[prev], rng, eps)
        prev = out[:, t]
    return out


def sample_spec_rounds(
    m: Markov, n: int, length: int, k: int, rng: np.random.Generator, always_accept: bool = False
) -> tuple[np.ndarray, pd.DataFrame]:
    """Chain speculative decoding in rounds of ``k`` drafts (Leviathan et al. 2023): accepted
    prefix, then a recovered token (first rejection) or a bonus token (all accepted), capped by
    the length budget. Returns tokens [n, T] and the rounds table (seed = row index)."""
    out = np.full((n, length), -1, dtype=np.int64)
    cur = np.zeros(n, dtype=np.int64)  # next position to fill
    prev = np.full(n, m.vocab)
    recs = []
    r = 0
    while (cur < length).any():
        active = cur < length
        drafts = np.empty((n, k), dtype=np.int64)
        state = prev.copy()
        for j in range(k):
            drafts[:, j] = draw(m.q[state], rng.random(n))
            state = drafts[:, j]
        n_acc = np.zeros(n, dtype=np.int64)
        alive = active.copy()
        state = prev.copy()
        final = np.full(n, -1)
        budget = length - cur
        for j in range(k):
            x = drafts[:, j]
            pq = m.p[state, x] / m.q[state, x]
            ok = rng.random(n) < np.minimum(1.0, pq)
            if always_accept:
                ok[:] = True
            ok &= alive
            rej = alive & ~ok
            resid = np.maximum(m.p[state] - m.q[state], 0.0)
            resid[resid.sum(axis=1) <= 0] = m.p[state][resid.sum(axis=1) <= 0]
            y = draw(resid, rng.random(n))
            final = np.where(rej, y, final)
            n_acc += ok
            alive = ok
            state = np.where(ok, x, state)
        bonus = draw(m.p[state], rng.random(n))
        final = np.where(alive, bonus, final)
        emitted = np.minimum(n_acc + 1, budget)
        for j in range(k + 1):
            tok = drafts[:, j] if j < k else final
            tok = np.where(j < n_acc, tok, final) if j < k else final
            put = active & (j < emitted)
            out[np.flatnonzero(put), cur[put] + j] = tok[put]
        recs.append(
            pd.DataFrame(
                {
                    "seed": np.flatnonzero(active),
                    "round": r,
                    "position": cur[active],
                    "drafted": np.minimum(k, budget[active]),
                    "accepted": np.minimum(n_acc[active], budget[active]),
                    "emitted": emitted[active],
                }
            )
        )
        last = out[np.arange(n), np.minimum(cur + emitted - 1, length - 1)]
        prev = np.where(active, last, prev)
        cur = np.where(active, cur + emitted, cur)
        r += 1
    return out, pd.concat(recs, ignore_index=True)


def whitebox_columns(m: Markov, tokens: np.ndarray) -> dict[str, np.ndarray]:
    """wb_* columns along emitted sequences ([n, T] → each [n*T], row-major), token order by
    p/q descending, ties by id (``spectest.schema``)."""
    n = tokens.shape[0]
    prev = np.concatenate([np.full((n, 1), m.vocab), tokens[:, :-1]], axis=1)  # [n, T]
    ratio = m.p / m.q  # [V+1, V]
    order = np.argsort(-ratio, axis=1, kind="stable")  # [V+1, V]
    rank = np.argsort(order, axis=1)
    cum = np.cumsum(np.take_along_axis(m.p, order, axis=1), axis=1)  # mass up to rank
    lo = np.concatenate([np.zeros((m.vocab + 1, 1)), cum[:, :-1]], axis=1)  # [V+1, V] by rank
    in_a = m.q > m.p
    p_a = np.where(in_a, m.p, 0.0).sum(axis=1)  # [V+1]
    overlap = np.minimum(m.p, m.q).sum(axis=1)
    s, x = prev.ravel(), tokens.ravel()
    return {
        "wb_p": m.p[s, x],
        "wb_cdf_lo": lo[s, rank[s, x]],
        "wb_p_a": p_a[s],
        "wb_in_a": in_a[s, x],
        "wb_overlap": overlap[s],
    }


def samples_frame(
    arms: dict[tuple[str, str, str], np.ndarray], extra: dict | None = None
) -> pd.DataFrame:
    """Samples table from {(prompt_id, config_id, arm): tokens [n, T] (-1 = absent)}."""
    frames = []
    for (prompt, config, arm), tok in arms.items():
        n, length = tok.shape
        seq, pos = np.nonzero(tok >= 0)
        df = pd.DataFrame(
            {
                "prompt_id": prompt,
                "config_id": config,
                "arm": arm,
                "seed": seq.astype(np.int64),
                "position": pos.astype(np.int32),
                "token_id": tok[seq, pos].astype(np.int64),
            }
        )
        if extra and (prompt, config, arm) in extra:
            for k, v in extra[(prompt, config, arm)].items():
                df[k] = np.asarray(v).reshape(n, length)[seq, pos]
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


# ------------------------------------------------------------------------ tests of the simulators
def test_acceptor_law_is_p_at_eps_zero_exactly():
    """Exact (enumeration): the ε = 0 acceptor reproduces p (Leviathan et al. 2023, Thm 1)."""
    rng = np.random.default_rng(0)
    p = zipf(50)
    q = perturbed(p, 0.7, rng)
    np.testing.assert_allclose(acceptor_law(p, q, 0.0), p, rtol=0, atol=1e-15)
    o = acceptor_law(p, q, 0.05)
    assert abs(o.sum() - 1.0) < 1e-12
    tv = 0.5 * np.abs(o - p).sum()
    p_a = p[q > p].sum()
    assert 0.0 < tv <= 0.05 * p_a + 1e-12  # the cap at 1 can only shrink the excess on A


def test_spec_step_samples_the_acceptor_law():
    """GOF χ² of 200 000 simulated ε = 0.3 tokens against the exact law. Fixed seed; the
    false-failure rate of p < 1e-4 is 1e-4."""
    rng = np.random.default_rng(1)
    p = zipf(30)
    q = perturbed(p, 0.7, rng)
    n = 200_000
    tok, _ = spec_step(np.broadcast_to(p, (n, 30)), np.broadcast_to(q, (n, 30)), rng, eps=0.3)
    counts = np.bincount(tok, minlength=30)
    law = acceptor_law(p, q, 0.3)
    assert stats.chisquare(counts, n * law).pvalue > 1e-4


def test_round_sampler_has_the_plain_law_and_a_consistent_rounds_table():
    """The K = 3 round sampler's first two tokens match plain decode's exact joint law (GOF χ²,
    fixed seed, false-failure rate 1e-4), and each round's telemetry is consistent."""
    rng = np.random.default_rng(2)
    m = markov(6, rng)
    tok, rounds = sample_spec_rounds(m, 60_000, 5, 3, rng)
    assert (tok >= 0).all()
    joint = m.p[6][:, None] * m.p[:6]  # [V, V] exact law of (x0, x1)
    counts = np.bincount(tok[:, 0] * 6 + tok[:, 1], minlength=36)
    assert stats.chisquare(counts, 60_000 * joint.ravel()).pvalue > 1e-4
    assert (rounds["accepted"] <= rounds["drafted"]).all()
    assert (rounds.groupby("seed")["emitted"].sum() == 5).all()
