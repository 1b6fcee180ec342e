"""The bundled pair's byte-level tokenizer (ids 0-255, then BOS, EOS, PAD): ``encode`` and
``decode``. Knows nothing about models. Why and details: docs/internals.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from spectest.errors import InputError

NUM_BYTES = 256
BOS_ID = 256
EOS_ID = 257
PAD_ID = 258
VOCAB_SIZE = 259
SPECIAL_NAMES = {BOS_ID: "<bos>", EOS_ID: "<eos>", PAD_ID: "<pad>"}


def encode(text: str, bos: bool = True, eos: bool = False) -> list[int]:
    """UTF-8 bytes of ``text`` as ids, ``BOS_ID`` first if ``bos``, ``EOS_ID`` last if ``eos``.

    Raises ``InputError`` when ``text`` is not a ``str`` or is not encodable (lone surrogates).
    """
    if not isinstance(text, str):
        raise InputError(f"bytetok.encode: text must be a str, got {type(text).__name__} {text!r}")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise InputError(f"bytetok.encode: text is not encodable as UTF-8: {text!r}") from err
    ids = list(data)
    if bos:
        ids.insert(0, BOS_ID)
    if eos:
        ids.append(EOS_ID)
    return ids


def _check_ids(ids: Sequence[int]) -> None:
    for i in ids:
        if isinstance(i, bool) or not hasattr(i, "__index__") or not (0 <= int(i) < VOCAB_SIZE):
            raise InputError(
                f"bytetok: token id must be an integer in [0, {VOCAB_SIZE}), got {i!r}"
            )


def decode(ids: Iterable[int], specials: str = "skip") -> str:
    """Text of ``ids``: byte ids are joined and decoded as UTF-8.

    ``specials`` says what happens to BOS/EOS/PAD: ``"skip"`` drops them, ``"show"`` renders
    them as ``<bos>``/``<eos>``/``<pad>``. The round trip ``decode(encode(t)) == t`` is exact for
    every valid ``str``.

    Notes
    -----
    A sampled byte sequence need not be valid UTF-8 (a model can emit half a multi-byte
    character). Such bytes decode with ``errors="replace"`` (U+FFFD): this is for display only,
    never feed decoded text back through ``encode`` to recover ids.
    """
    if specials not in ("skip", "show"):
        raise InputError(f"bytetok.decode: specials must be 'skip' or 'show', got {specials!r}")
    ids = list(ids)
    _check_ids(ids)
    ids = [int(i) for i in ids]
    parts: list[str] = []
    run = bytearray()
    for i in ids:
        if i < NUM_BYTES:
            run.append(i)
            continue
        # NOTE: a special ends the current byte run, so a multi-byte character split by a special
        # decodes as replacement characters rather than silently joining across it.
        parts.append(run.decode("utf-8", errors="replace"))
        run = bytearray()
        if specials == "show":
            parts.append(SPECIAL_NAMES[i])
    parts.append(run.decode("utf-8", errors="replace"))
    return "".join(parts)
