"""Row keys and a counter-based RNG (Philox4x32-10 in int64 torch ops): every uniform is a pure
function of (key, stream, step, slot); a decode chunk's uniforms in one table (``uniform_table``,
``plain_draws``, ``round_draws``).

The why and the details: docs/internals.md "spectest/seeding.py".
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from spectest.errors import InputError

STREAM_PLAIN = 1
STREAM_SPEC = 2

KEY_BITS = 62
# the decode loops' draws per chunk come from one ``uniform_table`` of at most this many values
# (0: one ``uniforms`` call per step, the same values; ``plain_draws``, ``round_draws``)
TABLE_ELEMENTS = 1 << 22
_M32 = 0xFFFFFFFF
_PHILOX_M = (0xD2511F53, 0xCD9E8D57)  # round multipliers
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)  # key bumps (golden ratio, sqrt(3) - 1)
_ROUNDS = 10


# ----------------------------------------------------------------------------- row keys


def _hash62(*fields: str | int) -> int:
    """blake2b of length-prefixed fields (no two field lists share an encoding) → [0, 2^62)."""
    h = hashlib.blake2b(digest_size=8, person=b"spectest-key")
    for f in fields:
        b = f.encode("utf-8") if isinstance(f, str) else str(int(f)).encode("ascii")
        h.update(len(b).to_bytes(8, "little") + (b"s" if isinstance(f, str) else b"i") + b)
    return int.from_bytes(h.digest(), "little") >> (64 - KEY_BITS)


def run_key_from(text: str) -> int:
    """A run key in [0, 2^62) from any text (e.g. the protocol hash)."""
    if not isinstance(text, str):
        raise InputError(f"run_key_from: text must be a str, got {text!r}")
    return _hash62("run", text)


def row_key(run_key: int, prompt_id: str, config_id: str, seed: int) -> int:
    """The key of one (prompt, config, seed) row of a run: a stable blake2b hash in [0, 2^62)."""
    for name, v, typ in (("run_key", run_key, int), ("seed", seed, int)):
        if isinstance(v, bool) or not isinstance(v, typ) or v < 0:
            raise InputError(f"row_key: {name} must be an integer >= 0, got {v!r}")
    for name, s in (("prompt_id", prompt_id), ("config_id", config_id)):
        if not isinstance(s, str):
            raise InputError(f"row_key: {name} must be a str, got {s!r}")
    return _hash62("row", run_key, prompt_id, config_id, seed)


# ----------------------------------------------------------------------------- Philox (torch)


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit words of ``a * b`` for a constant ``a`` and ``b < 2^32``, no overflow."""
    a_hi, a_lo = a >> 16, a & 0xFFFF
    b_hi, b_lo = b >> 16, b & 0xFFFF
    mid = a_lo * b_hi + a_hi * b_lo  # < 2^33
    lo_full = a_lo * b_lo + ((mid & 0xFFFF) << 16)  # < 2^33
    lo = lo_full & _M32
    hi = a_hi * b_hi + (mid >> 16) + (lo_full >> 32)  # < 2^32 (exact high word)
    return hi, lo


def philox4x32(
    ctr: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    key: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32-10 on int64 tensors holding 32-bit lanes (values in [0, 2^32)), broadcasting."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for r in range(_ROUNDS):
        if r > 0:
            k0 = (k0 + _PHILOX_W[0]) & _M32
            k1 = (k1 + _PHILOX_W[1]) & _M32
        hi0, lo0 = _mulhilo(_PHILOX_M[0], c0)
        hi1, lo1 = _mulhilo(_PHILOX_M[1], c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def uniforms(
    keys: torch.Tensor,
    stream: int,
    step: torch.Tensor | int,
    num_slots: int,
    *,
    slot_offset: int = 0,
) -> torch.Tensor:
    """Uniforms ``[B, num_slots]`` float64 strictly inside (0, 1) for slots ``slot_offset + j``.

    Parameters
    ----------
    keys : int64 ``[B]`` row keys (any int64; ``row_key`` gives [0, 2^62)).
    stream : one of the ``STREAM_*`` constants (any int in [0, 2^32)).
    step : int64 ``[B]`` or a Python int >= 0 (a position).
    num_slots, slot_offset : the slots drawn, ``slot_offset .. slot_offset + num_slots - 1``.

    Notes
    -----
    Row ``b`` depends only on ``(keys[b], stream, step[b], slot)``: batch composition and order
    never matter. Verified bit-equal to the pure-Python ``uniforms_reference`` on a few hundred
    inputs, Philox known answers from Random123, and a KS uniformity check (tests/test_seeding.py).
    """
    _check_args("uniforms", keys, stream, num_slots, slot_offset)
    B = int(keys.shape[0])
    dev = keys.device
    if isinstance(step, int):
        if isinstance(step, bool) or step < 0:
            raise InputError(f"uniforms: step must be an int >= 0, got {step!r}")
        step_t = torch.full((B,), step, dtype=torch.int64, device=dev)  # [B]
    else:
        if step.shape != keys.shape or step.dtype != torch.int64:
            raise InputError(
                f"uniforms: step must be int64 of shape {tuple(keys.shape)}, "
                f"got {step.dtype} {tuple(step.shape)!r}"
            )
        step_t = step.to(dev)  # [B]
    slot = torch.arange(slot_offset, slot_offset + num_slots, dtype=torch.int64, device=dev)  # [S]
    return _philox_uniforms(keys[:, None], stream, step_t[:, None], slot[None, :])  # [B, S]


def uniform_table(
    keys: torch.Tensor, stream: int, num_steps: int, num_slots: int, *, first_step: int = 0
) -> torch.Tensor:
    """``uniforms`` at steps ``first_step .. first_step + num_steps - 1`` in one call:
    ``[B, num_steps, num_slots]`` float64, ``out[:, s] == uniforms(keys, stream, first_step + s,
    num_slots)`` bit for bit.

    Notes
    -----
    The same integer operations on the same (key, stream, step, slot) words, broadcast over one
    more dimension: each uniform is a pure function of them, so the table is bit-equal to the
    per-step calls by construction (tests/test_seeding.py checks it). A decode loop draws its
    whole chunk's uniforms with ~300 small ops instead of ~300 per step (issue 32).
    """
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise InputError(f"uniform_table: num_steps must be an int >= 1, got {num_steps!r}")
    if isinstance(first_step, bool) or not isinstance(first_step, int) or first_step < 0:
        raise InputError(f"uniform_table: first_step must be an int >= 0, got {first_step!r}")
    _check_args("uniform_table", keys, stream, num_slots, 0)
    dev = keys.device
    step = torch.arange(first_step, first_step + num_steps, dtype=torch.int64, device=dev)  # [T]
    slot = torch.arange(num_slots, dtype=torch.int64, device=dev)  # [S]
    return _philox_uniforms(keys[:, None, None], stream, step[None, :, None], slot[None, None, :])


def _check_args(where: str, keys: torch.Tensor, stream: int, num_slots: int, offset: int) -> None:
    """``InputError`` on keys that are not 1-D int64 or a stream / slot range outside 2^32."""
    if keys.dim() != 1 or keys.dtype != torch.int64:
        raise InputError(
            f"{where}: keys must be a 1-D int64 tensor, got {keys.dtype} {tuple(keys.shape)!r}"
        )
    for name, v in (("stream", stream), ("num_slots", num_slots), ("slot_offset", offset)):
        if isinstance(v, bool) or not isinstance(v, int) or not (0 <= v < 2**32):
            raise InputError(f"{where}: {name} must be an int in [0, 2^32), got {v!r}")
    if offset + num_slots > 2**32:
        raise InputError(f"{where}: slots beyond 2^32 (slot_offset {offset!r} + {num_slots!r})")


def _philox_uniforms(
    keys: torch.Tensor, stream: int, step: torch.Tensor, slot: torch.Tensor
) -> torch.Tensor:
    """The uniforms of broadcastable int64 ``keys``, ``step`` and ``slot`` (the counter layout of
    docs/internals.md: ``(slot, step lo, step hi, stream)`` under key ``(key lo, key hi)``)."""
    shape = torch.broadcast_shapes(keys.shape, step.shape, slot.shape)
    c0 = slot.expand(shape)
    c1 = (step & _M32).expand(shape)
    c2 = ((step >> 32) & _M32).expand(shape)
    c3 = torch.full(shape, stream, dtype=torch.int64, device=keys.device)
    k0 = keys & _M32
    k1 = (keys >> 32) & _M32
    x0, x1, _, _ = philox4x32((c0, c1, c2, c3), (k0, k1))  # 32-bit lanes
    m = (x0 << 20) | (x1 >> 12)  # 52 bits, < 2^52
    return (2 * m + 1).to(torch.float64) * 2.0**-53  # in (0, 1), exact


# ----------------------------------------------------------------------------- a chunk's draws


def plain_draws(keys: torch.Tensor, T: int) -> Callable[[int], torch.Tensor]:
    """Plain decode's draws for a chunk: ``t ↦ uniforms(keys, STREAM_PLAIN, t, 1)[:, 0]`` ``[B]``,
    from tables of as many steps as ``TABLE_ELEMENTS`` allows (one per chunk at P1's sizes)."""
    B = int(keys.shape[0])
    if TABLE_ELEMENTS < B:
        return lambda t: uniforms(keys, STREAM_PLAIN, t, 1)[:, 0]
    block = max(1, min(T, TABLE_ELEMENTS // max(1, B)))
    tables: dict[int, torch.Tensor] = {}

    def at(t: int) -> torch.Tensor:
        lo = t - t % block
        if lo not in tables:
            tables.clear()
            n = min(block, T - lo)
            table = uniform_table(keys, STREAM_PLAIN, n, 1, first_step=lo)  # [B, n, 1]
            tables[lo] = table[:, :, 0].T.contiguous()  # [n, B]
        return tables[lo][t - lo]

    return at


def round_draws(
    keys: torch.Tensor, T: int, K: int, num_slots: int
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A speculative chunk's draws: ``pos ↦ uniforms(keys, STREAM_SPEC, pos, num_slots)``
    ``[B, num_slots]`` for positions ``pos`` ``[B]`` in ``[0, T + K]`` (a finished row's position
    stays below ``T + K + 1``), gathered from one table when it fits ``TABLE_ELEMENTS``."""
    B = int(keys.shape[0])
    if B * (T + K + 1) * num_slots > TABLE_ELEMENTS:
        return lambda pos: uniforms(keys, STREAM_SPEC, pos, num_slots)
    table = uniform_table(keys, STREAM_SPEC, T + K + 1, num_slots)  # [B, T+K+1, S]
    rows = torch.arange(B, device=keys.device)  # [B]
    return lambda pos: table[rows, pos]


# ----------------------------------------------------------------------------- reference


def philox4x32_reference(
    ctr: tuple[int, int, int, int], key: tuple[int, int]
) -> tuple[int, int, int, int]:
    """Pure-Python Philox4x32-10 (Random123 ``philox4x32_R(10, ...)``), the slow reference."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for r in range(_ROUNDS):
        if r > 0:
            k0, k1 = (k0 + _PHILOX_W[0]) & _M32, (k1 + _PHILOX_W[1]) & _M32
        p0, p1 = _PHILOX_M[0] * c0, _PHILOX_M[1] * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & _M32, (p0 >> 32) ^ c3 ^ k1, p0 & _M32
    return c0, c1, c2, c3


def uniforms_reference(
    key: int, stream: int, step: int, num_slots: int, slot_offset: int = 0
) -> list[float]:
    """Pure-Python uniforms of one row (same counter layout as ``uniforms``)."""
    out = []
    for slot in range(slot_offset, slot_offset + num_slots):
        ctr = (slot, step & _M32, (step >> 32) & _M32, stream)
        x0, x1, _, _ = philox4x32_reference(ctr, (key & _M32, (key >> 32) & _M32))
        m = (x0 << 20) | (x1 >> 12)
        out.append((2 * m + 1) * 2.0**-53)
    return out


# ----------------------------------------------------------------------------- slot layout


@dataclass(frozen=True)
class SlotLayout:
    """Which ``STREAM_SPEC`` slots a round of ``K`` draft tokens uses (docs/internals.md)."""

    K: int
    drafter_onehot: bool
    num_slots: int  # 2K + 1 (sampled drafter) or K + 1 (one-hot drafter)
    draft: slice | None  # draft draws; None for a one-hot drafter (argmax needs no uniform)
    accept: slice  # K acceptance uniforms
    final: int  # the recovered-or-bonus uniform


def spec_slots(K: int, drafter_onehot: bool) -> SlotLayout:
    """The slot layout of one speculative round with ``K`` draft tokens."""
    if isinstance(K, bool) or not isinstance(K, int) or K < 0:
        raise InputError(f"spec_slots: K must be an integer >= 0, got {K!r}")
    if drafter_onehot:
        return SlotLayout(K, True, K + 1, None, slice(0, K), K)
    return SlotLayout(K, False, 2 * K + 1, slice(0, K), slice(K, 2 * K), 2 * K)
