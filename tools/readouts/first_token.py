"""Is an hf engine's first emitted token distributed as the plain law π at the prompt? (issue 31)

A one-sample test of position 0 alone: the first token of ``hf-assisted``
(``engines.hf.decode.generate_assisted``, one row per seed) or of ``hf-generate``
(``generate_plain``, batches of 64 rows, the control) against π = transformers' warpers on the
target's logits at the prompt (``engines.hf.laws``). Models, dtype, prompt, configs, K and the run
key come from a run's protocol.yaml; row ``s`` is seeded as the run seeds it
(``row_key(run key, prompt, config, s)``), so seeds inside a run's candidate range reproduce its
tokens (printed as "matches the run": the tool re-draws the same rows). hf-assisted runs
``K + 1`` new tokens (one full first round of K drafts; the first token is emitted in round 1
whatever follows), hf-generate one.

Usage: python tools/readouts/first_token.py RUN_DIR|PROTOCOL [--engine hf-assisted|hf-generate]
       [--config ID] [--start S] [--count N] [--sims 20000] [--round-one 20] [--save PREFIX]
       [--set KEY=VALUE ...]

Prints one line per (engine, config): n, U1 = ‖mean(e_x) − π‖² − tr Σ / n (unbiased, Σ =
diag π − ππᵀ), its null sd √(2 tr Σ² / (n(n − 1))), its Monte Carlo p (multinomial(n, π) draws,
``sims`` of them, seed 0), the χ² GOF over cells with nπ ≥ 5 (the rest pooled) with its
asymptotic and Monte Carlo p, the plug-in TV and the token furthest from π in sd; then the
exact TV between π and the law at the same position from a forward of ``generate``'s prefill
shape and of the first verify forward's shape (``forward_tv``: numerics, no sampling), and for
hf-assisted the exact law of the first token that transformers' own round-1 tensors imply
(``round_one_tv``, over the first ``--round-one`` seeds).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy import stats

from spectest.engines.hf.decode import generate_assisted, generate_plain
from spectest.engines.hf.laws import draft_law, next_token_logits, processed_probs
from spectest.engines.hf.pinning import hf_model_of, logit_scale_of
from spectest.models.zoo import load_pair
from spectest.prompts import prompt_token_ids
from spectest.protocol import load_protocol
from spectest.seeding import row_key, run_key_from

PLAIN_BATCH = 64


@dataclass(frozen=True)
class FirstTokenGof:
    """One sample of first tokens against π: U1 with its null sd and Monte Carlo p, the pooled
    χ² with its asymptotic and Monte Carlo p, the plug-in TV and the most deviant token."""

    n: int
    u1: float
    sd0: float
    p_u1: float
    chi2: float
    df: int
    p_chi2: float
    p_chi2_mc: float
    tv: float
    worst: int
    worst_z: float

    def line(self) -> str:
        return (
            f"n {self.n}: U1 {self.u1:+.3e} (null sd {self.sd0:.2e}, z {self.u1 / self.sd0:+.2f}, "
            f"MC p {self.p_u1:.4f}); chi2 {self.chi2:.1f} df {self.df} p {self.p_chi2:.3g} "
            f"(MC {self.p_chi2_mc:.4f}); plug-in TV {self.tv:.4f}; worst token {self.worst} "
            f"z {self.worst_z:+.2f}"
        )


def _chi2(counts: np.ndarray, expected: np.ndarray, big: np.ndarray) -> np.ndarray:
    """Pearson χ² of ``counts [..., V]`` with the cells outside ``big`` pooled into one."""
    obs = np.concatenate([counts[..., big], counts[..., ~big].sum(-1, keepdims=True)], -1)
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    return (((obs - exp) ** 2)[..., keep] / exp[keep]).sum(-1)


def first_token_gof(
    tokens: np.ndarray, ids: np.ndarray, pi: np.ndarray, sims: int = 20000, seed: int = 0
) -> FirstTokenGof:
    """Test ``tokens [n]`` against the law ``pi`` on the token ids ``ids`` (sorted or not).

    Notes
    -----
    Assumes the tokens are i.i.d. (one per seed); a token outside ``ids`` is an error (π gives
    it 0: the sampler is wrong outright). Under H0, U1 is a centred weighted sum of χ²₁'s — right
    skewed when few eigenvalues of Σ dominate — so the Monte Carlo p, not z, is the test; the
    Monte Carlo p is (1 + #{sim ≥ observed}) / (1 + sims), valid at any ``sims``.
    """
    pi = np.asarray(pi, dtype=np.float64)
    pos = {int(t): i for i, t in enumerate(ids)}
    bad = sorted({int(t) for t in tokens} - set(pos))
    if bad:
        raise ValueError(f"tokens outside the law's support: {bad[:10]}")
    n = len(tokens)
    c = np.bincount([pos[int(t)] for t in tokens], minlength=len(pi)).astype(np.float64)
    tr = 1 - (pi * pi).sum()
    tr2 = (pi * pi).sum() - 2 * (pi**3).sum() + (pi * pi).sum() ** 2

    def u1(cc: np.ndarray) -> np.ndarray:
        return ((cc / n - pi) ** 2).sum(-1) - tr / n

    e = n * pi
    big = e >= 5
    sim = np.random.default_rng(seed).multinomial(n, pi, size=sims).astype(np.float64)
    U, X2 = float(u1(c)), float(_chi2(c, e, big))
    df = int(big.sum()) + int(e[~big].sum() > 0) - 1
    z = (c - e) / np.sqrt(np.maximum(e * (1 - pi), 1e-300))
    w = int(np.argmax(np.abs(z)))
    return FirstTokenGof(
        n=n,
        u1=U,
        sd0=float(np.sqrt(2 * tr2 / (n * (n - 1)))),
        p_u1=float((1 + (u1(sim) >= U).sum()) / (1 + sims)),
        chi2=X2,
        df=df,
        p_chi2=float(stats.chi2.sf(X2, df)),
        p_chi2_mc=float((1 + (_chi2(sim, e, big) >= X2 - 1e-9).sum()) / (1 + sims)),
        tv=float(0.5 * np.abs(c / n - pi).sum()),
        worst=int(ids[w]),
        worst_z=float(z[w]),
    )


def draw_first(
    engine: str, target, draft, prompt: torch.Tensor, params, keys: list[int], k: int
) -> np.ndarray:
    """First tokens, one per key: hf-assisted one ``generate`` per key (K + 1 tokens), hf-generate
    one batch of ``PLAIN_BATCH`` rows per key (1 token each)."""
    if engine == "hf-assisted":
        out = [
            int(generate_assisted(target, draft, prompt, params, k + 1, k, s)[0][0]) for s in keys
        ]
        return np.array(out, dtype=np.int64)
    parts = [generate_plain(target, prompt, params, 1, PLAIN_BATCH, s)[0][:, 0] for s in keys]
    return torch.cat(parts).numpy()


def _run_tokens(run: Path, cid: str, seeds: range) -> dict[int, int]:
    """The run's candidate first tokens ``{seed: token}`` for ``seeds`` (empty if none)."""
    f = run / "samples.parquet"
    if not f.exists():
        return {}
    s = pd.read_parquet(f, columns=["arm", "config_id", "seed", "position", "token_id"])
    s = s[(s.arm == "candidate") & (s.config_id == cid) & (s.position == 0)]
    s = s[s.seed.isin(list(seeds))]
    return dict(zip(s.seed.astype(int), s.token_id.astype(int), strict=True))


def forward_tv(target: Any, prompt: torch.Tensor, params: Any, k: int) -> tuple[float, float]:
    """Exact TV between π at the prompt (``laws.next_token_logits``: one forward over the prompt
    and one more token) and the same position's law from a forward over the prompt alone
    (``generate``'s prefill) and over the prompt and ``k`` more tokens (the shape of assisted
    generation's first verify forward). 0 up to float rounding in float32; in bfloat16 a
    forward of another length can round otherwise (docs/engines-hf.md "Teacher forcing")."""
    L = len(prompt)
    hf, scale = hf_model_of(target), logit_scale_of(target)
    laws = []
    for extra in (1, 0, k):
        if extra:
            seq = torch.cat([prompt, torch.zeros(extra, dtype=torch.int64)])[None]
            lg = next_token_logits(target, seq, L)[:, :1]  # [1, 1, V]
        else:
            with torch.inference_mode():
                ids = prompt[None].to(hf.device)
                lg = hf(input_ids=ids, use_cache=False).logits[:, -1:].float().cpu() * scale
        laws.append(processed_probs(lg, params)[0, 0])
    return (
        0.5 * float((laws[0] - laws[1]).abs().sum()),
        0.5 * float((laws[0] - laws[2]).abs().sum()),
    )


def round_one_tv(
    target: Any, draft: Any, prompt: torch.Tensor, params: Any, k: int, keys: list[int]
) -> tuple[float, float]:
    """The largest, over one assisted call per key, of (1) the exact TV between π and the first
    token's law that round 1 implies, and (2) the TV between round 1's q and the draft's law
    with the warpers applied twice (what 5.x's assistant samples from, docs/engines-hf.md).

    Notes
    -----
    (1) uses the tensors ``_speculative_sampling`` consumed (``hf.rounds.RoundRecorder`` with
    ``keep_scores``): p = softmax of the processed target scores at position 0 of the verify
    forward, q = softmax of the draft's first scores. Draft 1 is accepted with min(1, p/q), else
    the token is drawn from (p − q)₊ normalised, so the first token's law is min(p, q) + (p − q)₊
    — p itself when q is the law the draft token was drawn from, which (2) checks.
    """
    seq = torch.cat([prompt, torch.zeros(1, dtype=torch.int64)])[None]
    pi = processed_probs(next_token_logits(target, seq, len(prompt)), params)[0, 0]
    q2 = draft_law(next_token_logits(draft, seq, len(prompt)), params, "processed_twice")[0, 0]
    worst = (0.0, 0.0)
    for key in keys:
        rec = generate_assisted(target, draft, prompt, params, k + 1, k, key, keep_scores=True)[1]
        pos, _, q_scores, p_scores = rec.scores[0]
        assert pos == 0 and q_scores is not None, "round 1 drafted nothing"
        p = torch.softmax(p_scores[0].double().cpu(), dim=-1)  # the scores stay on the model's
        q = torch.softmax(q_scores[0].double().cpu(), dim=-1)  # device; π is on the CPU
        law = torch.minimum(p, q) + torch.clamp(p - q, min=0)
        tv = (0.5 * float((law - pi).abs().sum()), 0.5 * float((q - q2).abs().sum()))
        worst = (max(worst[0], tv[0]), max(worst[1], tv[1]))
    return worst


def _one(a: argparse.Namespace, models: tuple, prompt: torch.Tensor, cid: str, params: Any) -> str:
    """The printed line of one config: draws, test, match with the run, forward TVs."""
    target, draft, rk, pid, k = models
    seq = torch.cat([prompt, torch.zeros(1, dtype=torch.int64)])[None]
    pi = processed_probs(next_token_logits(target, seq, len(prompt)), params)[0, 0].numpy()
    sup = np.flatnonzero(pi > 0)
    step = 1 if a.engine == "hf-assisted" else PLAIN_BATCH
    seeds = range(a.start, a.start + a.count, step)
    t0 = time.time()
    keys = [row_key(rk, pid, cid, s) for s in seeds]
    toks = draw_first(a.engine, target, draft, prompt, params, keys, k)
    g = first_token_gof(toks, sup, pi[sup], a.sims)
    if a.save:
        np.save(a.save.with_name(f"{a.save.name}.{a.engine}.{cid}.npy"), toks)
    old = _run_tokens(a.run, cid, seeds) if a.engine == "hf-assisted" else {}
    same = sum(int(toks[i]) == old[s] for i, s in enumerate(seeds) if s in old)
    tv_prefill, tv_verify = forward_tv(target, prompt, params, k)
    if a.engine == "hf-assisted" and a.round_one > 0:
        tv_law, tv_q = round_one_tv(target, draft, prompt, params, k, keys[: a.round_one])
        tail = (
            f"; round 1 over {a.round_one} calls: TV(law, pi) {tv_law:.2e}, TV(q, twice) {tv_q:.2e}"
        )
    else:
        tail = ""
    return (
        f"{a.engine} {cid} seeds {a.start}..{a.start + a.count - 1} {g.line()}; matches the run "
        f"{same}/{len(old)}; {time.time() - t0:.0f} s; exact TV of pi vs prefill "
        f"{tv_prefill:.2e}, vs a prompt+{k} forward {tv_verify:.2e}{tail}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a run directory, or a protocol file")
    ap.add_argument("--engine", default="hf-assisted", choices=["hf-assisted", "hf-generate"])
    ap.add_argument("--config", action="append", help="config id (default: all)")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--count", type=int, default=2000, help="draws (hf-generate: rounded up)")
    ap.add_argument("--sims", type=int, default=20000)
    ap.add_argument("--round-one", type=int, default=20, help="calls for round_one_tv")
    ap.add_argument("--save", type=Path, help="keep the tokens: SAVE.ENGINE.CONFIG.npy")
    ap.add_argument("--set", action="append", default=[], help="protocol override, as spectest run")
    a = ap.parse_args()
    if a.run.is_dir() or a.run.suffix not in (".yaml", ".yml"):
        pr = load_protocol(a.run / "protocol.yaml", sets=a.set)
    else:
        pr, a.run = load_protocol(a.run, sets=a.set), a.run.parent
    m = pr.models
    target, draft = load_pair(m.target, m.draft, device=m.device, dtype=m.dtype)
    pid, ids = next(iter(prompt_token_ids(pr, target.vocab_size).items()))
    prompt = torch.tensor(ids, dtype=torch.int64)
    models = (target, draft, run_key_from(pr.seeds.key), pid, int(pr.drafter.k))
    for cid, params in pr.configs:
        if not a.config or cid in a.config:
            print(_one(a, models, prompt, cid, params), flush=True)


if __name__ == "__main__":
    main()
