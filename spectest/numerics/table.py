"""Numerics drift (claim (b)): the target's law under the verify schedule vs one-position plain
decode along the matched arm's emitted sequences, beside the batch floor: ``measure_drift`` (one
prompt's rows) and ``drift_table`` (every prompt → the per-token table of ``numerics.parquet``).
The decision is ``spectest.stats.drift``'s; nothing here is random. Details: docs/internals.md.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from spectest import schema
from spectest.models.base import LanguageModel
from spectest.numerics.alone import FloorBranches
from spectest.numerics.decode import decode_and_alone
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.pipeline import ProbsFn
from spectest.sampling.transforms import logits_to_probs
from spectest.stats.options import DEFAULT_FLOOR_SEQUENCES, DEFAULT_NUMERICS_SEQUENCES

MIN_FLOOR_ROWS_PER_CELL = 2  # ... but at least this many per cell
# the matched arm's verify-schedule logits kept at generation (``capture_fits``) while, on CUDA,
# at least this share of the device stays free beside them; off CUDA up to this many bytes
CAPTURE_FREE = 0.10
CAPTURE_HOST_BYTES = 2**31
# logits per call of the drift's laws (``_tvs``): 2**27 is 1 GiB of float64 laws a side, ~28 rows
# of 32 positions at V = 151 936 (the call per position before: one host read each)
TV_ELEMENTS = 2**27
COLUMNS = (
    schema.PROMPT_ID,
    schema.CONFIG_ID,
    schema.SEED,
    schema.POSITION,
    "tv",
    "flip",
    "floor_tv",
)


def _tv(
    a_logits: torch.Tensor,
    b_logits: torch.Tensor,
    params: SamplingTensors,
    probs: ProbsFn = logits_to_probs,
) -> torch.Tensor:
    """TV ``[B]`` of the processed laws (``probs``) of two logits ``[B, V]``, and nothing else."""
    pa = probs(a_logits, params)
    pb = probs(b_logits, params)
    return 0.5 * (pa - pb).abs().sum(-1)


def prompt_rows(
    ps: pd.DataFrame, configs: Sequence[tuple[str, SamplingParams]], positions: int
) -> tuple[list[tuple[str, int]], np.ndarray] | None:
    """One prompt's rows in the run's order (configs in protocol order, seeds ascending) as
    (config_id, seed) keys and their tokens ``[R, T]``; None when a sequence ended early."""
    order = {cid: i for i, (cid, _) in enumerate(configs)}
    wide = ps.pivot_table(
        index=[schema.CONFIG_ID, schema.SEED],
        columns=schema.POSITION,
        values=schema.TOKEN_ID,
        aggfunc="first",
    )
    keys = sorted(wide.index, key=lambda k: (order[k[0]], k[1]))
    wide = wide.loc[keys]
    if wide.shape[1] != positions or wide.isna().any().any():
        return None
    return [(str(c), int(s)) for c, s in keys], wide.to_numpy(dtype=np.int64)


def _flip(a_logits: torch.Tensor, b_logits: torch.Tensor) -> torch.Tensor:
    return a_logits.argmax(-1) != b_logits.argmax(-1)


def _tvs(
    a_logits: torch.Tensor,  # [M, T, V]
    b_logits: torch.Tensor,  # [M, T, V]
    params: Sequence[SamplingParams],  # [M] each row's, for all its positions
    probs: ProbsFn,
) -> tuple[np.ndarray, np.ndarray]:
    """``_tv`` and ``_flip`` ``[M, T]`` of every row and position, ``TV_ELEMENTS`` logits at a
    time (whole rows: ``[m * T, V]`` views, no copies; one host read per call, not per
    position). The laws are row-wise: a row's law does not depend on the rows beside it."""
    M, T, V = a_logits.shape
    step = max(1, TV_ELEMENTS // max(1, T * V))  # rows per call
    tvs, flips = [], []
    for lo in range(0, M, step):
        hi = min(M, lo + step)
        a = a_logits[lo:hi].reshape(-1, V)  # [m * T, V] row-major: row i, position t at i*T + t
        b = b_logits[lo:hi].reshape(-1, V)
        st = _tensors(tuple(p for p in params[lo:hi] for _ in range(T)), a_logits.device)
        tvs.append(_tv(a, b, st, probs).view(hi - lo, T))
        flips.append(_flip(a, b).view(hi - lo, T))
    return torch.cat(tvs).cpu().numpy(), torch.cat(flips).cpu().numpy()


@functools.lru_cache(maxsize=64)
def _tensors(params: tuple[SamplingParams, ...], device: torch.device) -> SamplingTensors:
    """``SamplingTensors.from_params(params)`` on ``device``, one object per composition: a
    prompt's TV calls repeat the last prompt's (the same configs in the same order), and a
    parameter object reads its host flags once (``shortlist._host_flags``), not once per call."""
    return SamplingTensors.from_params(list(params), device=device)


@torch.no_grad()
def _verify_logits(
    model: LanguageModel,
    prompt: torch.Tensor,
    tokens: torch.Tensor,
    commits: Sequence[Sequence[int]],
    K: int,
    keep: torch.Tensor,
) -> torch.Tensor:
    """The verify schedule replayed (docs/internals.md): float32 logits ``[len(keep), T, V]``
    of the rows ``keep``, each position's from the round that committed it. ``commits[b]``:
    row b's committed count per round (accepted + 1), in round order."""
    B, T = int(tokens.shape[0]), int(tokens.shape[1])
    dev = model.device
    model.reserve(len(prompt) + T * (K + 1))
    cache, _ = model.prefill_shared(prompt[:-1], B)
    last = prompt[-1:].expand(B).clone()
    pos = torch.zeros(B, dtype=torch.int64, device=dev)
    padded = torch.cat([tokens, torch.zeros((B, K + 1), dtype=torch.int64, device=dev)], 1)
    j = torch.arange(K + 1, device=dev)
    out = torch.full((len(keep), T, model.vocab_size), float("nan"), device=dev)
    rounds = max(len(c) for c in commits)
    n_all = torch.full((rounds, B), K + 1, dtype=torch.int64)
    for b, c in enumerate(commits):
        n_all[: len(c), b] = torch.tensor(list(c), dtype=torch.int64)
    # the rounds until every kept row is complete (later ones commit nothing kept), from the
    # host's counts: no host read of the device per round
    done = (n_all[:, keep.cpu()].cumsum(0) >= T).all(1)  # [rounds]
    needed = int(done.int().argmax()) + 1 if bool(done.any()) else rounds
    n_all = n_all.to(dev)
    m = torch.arange(len(keep), device=dev)
    for r in range(needed):
        n = n_all[r]
        active = pos < T
        idx = (pos[:, None] + j[None, :K]).clamp(max=T + K)  # [B, K]
        inputs = torch.cat([last[:, None], padded.gather(1, idx)], 1)  # [B, K+1]
        logits = model.forward(cache, inputs)  # [B, K+1, V]
        committed = (j[None, :] < n[:, None]) & active[:, None]  # [B, K+1] the loop's commit
        write_committed(out, logits[keep], m, pos[keep], committed[keep])
        n0 = cache.num_slots - (K + 1)
        hole = torch.zeros((B, cache.num_slots), dtype=torch.bool, device=dev)
        hole[:, n0:] = j[None, :] >= n[:, None]
        cache.invalidate(hole)
        nxt = (pos + n - 1).clamp(max=T - 1)
        last = torch.where(active, tokens.gather(1, nxt[:, None])[:, 0], last)
        pos = pos + torch.where(active, n, 0)
    return out


def write_committed(
    out: torch.Tensor,  # [M, T, V] written
    x: torch.Tensor,  # [M, K+1, V] one verify round's logits of the rows
    m: torch.Tensor,  # [M] arange(M)
    pos: torch.Tensor,  # [M] each row's position before the round
    committed: torch.Tensor,  # [M, K+1] bool: slot j committed position pos + j
) -> None:
    """Each row's slot ``j`` to ``out[row, pos + j]`` where it was committed and that position is
    below ``T``, cast to ``out``'s dtype; everything else as it was. One masked write of one (row,
    position) per row per slot: no duplicates. The verify replay's and ``engines.recorder.
    VerifyCapture``'s (the logits kept at generation): one writer, the same places."""
    T = int(out.shape[1])
    for jj in range(int(x.shape[1])):  # the rows that committed position pos + jj write it
        ok = committed[:, jj] & (pos + jj < T)  # [M]
        at = (pos + jj).clamp(max=T - 1)  # [M]
        out[m, at] = torch.where(ok[:, None], x[:, jj].to(out.dtype), out[m, at])


def measure_drift(
    target: LanguageModel,
    prompt_ids: Sequence[int],
    tokens: np.ndarray,
    commits: Sequence[Sequence[int]],
    params: Sequence[SamplingParams],
    measured: Sequence[int],
    alone: Sequence[int],
    *,
    K: int,
    batch_size: int,
    probs: ProbsFn = logits_to_probs,
    streams: int = 1,
    branches: FloorBranches | None = None,
    verify: torch.Tensor | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One prompt's rows, as the run batched them (``batch_size`` rows in order).

    ``tokens`` ``[R, T]``: the emitted tokens of every row; ``commits[r]``: row r's committed
    count per round; ``measured``: the rows measured; ``alone``: those of them decoded alone
    too. Returns, for the measured rows in order, ``tv`` ``[M, T]`` (verify vs decode, the
    batch's), ``flip`` ``[M, T]`` (their argmax differs) and ``floor_tv`` ``[M, T]`` (decode in
    the batch vs alone; NaN for rows not in ``alone``); TVs between the laws ``probs`` gives.
    ``streams`` / ``branches``: rows decoded alone at once (``decode.decode_and_alone``).
    ``verify``: the measured rows' verify-schedule logits ``[M, T, V]`` kept at generation
    (``engines.recorder.VerifyCapture``), read instead of replaying the rounds (``commits``
    then unused)."""
    dev = target.device
    R, T = tokens.shape
    prompt = torch.tensor(list(prompt_ids), dtype=torch.int64, device=dev)
    tv = np.full((len(measured), T), np.nan)
    flip = np.zeros((len(measured), T), dtype=bool)
    floor = np.full((len(measured), T), np.nan)
    where = {r: i for i, r in enumerate(measured)}
    alone_set = set(alone)
    for lo in range(0, R, batch_size):
        hi = min(R, lo + batch_size)
        mine = [r for r in measured if lo <= r < hi]
        if not mine:
            continue
        toks = torch.tensor(tokens[lo:hi], dtype=torch.int64, device=dev)
        keep = torch.tensor([r - lo for r in mine], dtype=torch.int64, device=dev)
        at = [where[r] for r in mine]
        if verify is not None:  # kept at generation: the values the replay would compute
            ver = verify[at[0] : at[-1] + 1].float()  # [m, T, V] float32, as the replay's
        else:
            ver = _verify_logits(target, prompt, toks, commits[lo:hi], K, keep)
        ones = [(i, r) for i, r in enumerate(mine) if r in alone_set]
        mine_alone = [r - lo for _, r in ones]
        args = (target, prompt, prompt_ids, toks, keep, mine_alone)
        dec, alone_rows = decode_and_alone(*args, streams=streams, branches=branches)
        tv[at], flip[at] = _tvs(ver, dec, [params[r] for r in mine], probs)
        for (i, r), one in zip(ones, alone_rows, strict=True):  # one: [T, V]
            s1 = _tensors((params[r],) * T, dev)  # [T] one row's params
            floor[where[r]] = _tv(one, dec[i], s1, probs).cpu().numpy()
        del ver, dec
    return tv, flip, floor


def drift_table(
    target: LanguageModel,
    samples: pd.DataFrame,
    rounds: pd.DataFrame,
    prompts: Mapping[str, Sequence[int]],
    configs: Sequence[tuple[str, SamplingParams]],
    *,
    arm: str,
    K: int,
    batch_size: int,
    positions: int,
    rows_per_cell: int = DEFAULT_NUMERICS_SEQUENCES,
    floor_rows_per_cell: int | None = None,
    floor_sequences: int = DEFAULT_FLOOR_SEQUENCES,
    fast: bool = False,
    streams: int | None = None,
    branches: bool | None = None,
    verify: Mapping[str, tuple[list[tuple[str, int]], torch.Tensor]] | None = None,
) -> pd.DataFrame:
    """The per-token drift table of arm ``arm`` (``COLUMNS``: one row per measured sequence and
    position): every prompt's rows rebuilt in the run's order (configs in protocol order, seeds
    ascending: ``generation.generate_shard``), batched as the run batched them; of each cell's
    ``rows_per_cell`` measured rows, ``floor_rows_per_cell`` (None: ``floor_sequences`` over the
    cells, ``_spread``) decoded alone too. ``fast``: replayed on the fast engine's model and law
    (``numerics.replay``). Floor rows at once: on ``streams`` (None: ``alone.FLOOR_STREAMS``),
    or as ``branches`` of one graph per step (``alone.FloorBranches``; None: on a replay model
    with CUDA graphs, unless ``streams`` > 1). ``verify``: by prompt, the (config, seed) keys
    and verify-schedule logits of rows kept at generation; a prompt's are read instead of its
    verify replay where they are its measured rows."""
    from spectest.numerics.replay import replay_model, replay_probs

    target, probs = replay_model(target, fast=fast), replay_probs(fast=fast)
    at_once = _at_once(target, streams, branches)  # measure_drift's streams= and branches=
    s = samples[samples[schema.ARM] == arm]
    r = rounds[rounds[schema.ARM] == arm]
    parts = []
    if floor_rows_per_cell is None:
        floor_rows_per_cell = _spread(floor_sequences, s[schema.PROMPT_ID].nunique() * len(configs))
    cfg = dict(configs)
    for pid, ps in s.groupby(schema.PROMPT_ID, sort=False):
        built = prompt_rows(ps, configs, positions)
        if built is None:
            continue  # a sequence that ended early: not replayed (the built-in loop has none)
        keys, tokens = built
        measured, alone = _measured_rows(keys, cfg, rows_per_cell, floor_rows_per_cell)
        kept = (verify or {}).get(str(pid))  # its measured rows kept at generation, or None
        ver = kept[1] if kept and kept[0] == [keys[i] for i in measured] else None
        # the rounds are read only to replay them
        commits = _commits(r[r[schema.PROMPT_ID] == pid], keys, K) if ver is None else []
        args = (prompts[str(pid)], tokens, commits, [cfg[k[0]] for k in keys], measured, alone)
        tv, flip, floor = measure_drift(
            target, *args, K=K, batch_size=batch_size, probs=probs, verify=ver, **at_once
        )
        parts.append(_drift_frame(str(pid), [keys[i] for i in measured], tv, flip, floor))
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype=float) for c in COLUMNS})
    return pd.concat(parts, ignore_index=True)


def _at_once(target: LanguageModel, streams: int | None, branches: bool | None) -> dict[str, Any]:
    """``drift_table``'s ``streams`` and ``branches`` for the replay model ``target``."""
    from spectest.numerics.alone import FLOOR_STREAMS, concurrent

    if streams is None:
        streams = FLOOR_STREAMS if target.device.type == "cuda" else 1
    if branches is None:  # on a replay model with CUDA graphs
        branches = concurrent(target) and target.cuda_graphs
    on = branches and streams == 1  # streams > 1: the rows on streams instead
    floor_branches = FloorBranches(target) if on and concurrent(target) else None
    return {"streams": streams, "branches": floor_branches}


def _spread(sequences: int, cells: int) -> int:
    """Floor rows per cell: ``sequences`` over ``cells``, at least ``MIN_FLOOR_ROWS_PER_CELL``."""
    return max(MIN_FLOOR_ROWS_PER_CELL, -(-sequences // max(1, cells)))


def _commits(pr: pd.DataFrame, keys: list[tuple[str, int]], K: int) -> list[list[int]]:
    """Each row's tokens committed per round (accepted + 1; ``K + 1`` per round when unreported)."""
    pr = pr.sort_values([schema.CONFIG_ID, schema.SEED, "round"])
    by_row = {
        k: (g["accepted"].to_numpy() + 1).tolist()
        for k, g in pr.groupby([schema.CONFIG_ID, schema.SEED], sort=False)
    }
    return [by_row.get(k, [K + 1]) for k in keys]


def measured_rows(keys: list[tuple[str, int]], configs: Sequence[str], per_cell: int) -> list[int]:
    """The indices of the rows ``drift_table`` measures among one prompt's rows ``keys`` (config,
    seed) in the run's order: each config's first ``per_cell``."""
    return _measured_rows(keys, configs, per_cell, 0)[0]


def capture_fits(device: torch.device, need: float, held: float) -> bool:
    """Whether ``need`` more bytes of kept verify logits fit (``held`` kept already): on CUDA
    while ``CAPTURE_FREE`` of the device stays free beside them, else up to
    ``CAPTURE_HOST_BYTES`` in all. Where they do not, claim (b) replays those rows."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return free - need >= CAPTURE_FREE * total
    return held + need <= CAPTURE_HOST_BYTES


def _measured_rows(
    keys: list[tuple[str, int]],
    cfg: Iterable[str],
    per_cell: int,
    alone_per_cell: int,
) -> tuple[list[int], list[int]]:
    """``(measured, alone)``: the first ``per_cell`` rows of each config, the first
    ``alone_per_cell`` of them also decoded alone."""
    measured, alone, seen = [], [], dict.fromkeys(cfg, 0)
    for i, (cid, _) in enumerate(keys):
        if seen[cid] < per_cell:
            measured.append(i)
            if seen[cid] < alone_per_cell:
                alone.append(i)
            seen[cid] += 1
    return measured, alone


def _drift_frame(
    pid: str, keys: list[tuple[str, int]], tv: np.ndarray, flip: np.ndarray, floor: np.ndarray
) -> pd.DataFrame:
    """One prompt's ``COLUMNS`` rows from its measured rows' ``[R, T]`` drift arrays."""
    T = tv.shape[1]
    return pd.DataFrame(
        {
            schema.PROMPT_ID: pid,
            schema.CONFIG_ID: np.repeat([k[0] for k in keys], T),
            schema.SEED: np.repeat([int(k[1]) for k in keys], T),
            schema.POSITION: np.tile(np.arange(T, dtype=np.int64), len(keys)),
            "tv": tv.reshape(-1),
            "flip": flip.reshape(-1),
            "floor_tv": floor.reshape(-1),
        }
    )
