"""The byte tokenizer of the bundled pair: id layout, exact UTF-8 round trip, display decoding."""

from __future__ import annotations

import pytest
import torch

from spectest.errors import InputError
from spectest.models import bytetok

TEXTS = [
    "",
    "hello, world",
    'The "assert" statement\n\tis *simple*.',
    "naïve café – “quotes” … ß π 😀",
    "\x00\x7f control bytes",
    "日本語のテキスト",
]


def test_id_layout() -> None:
    assert bytetok.NUM_BYTES == 256
    assert {bytetok.BOS_ID, bytetok.EOS_ID, bytetok.PAD_ID} == {256, 257, 258}
    assert bytetok.VOCAB_SIZE == 259  # exactly the rows of the models' lm_head: no unused ids


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_exact(text: str) -> None:
    ids = bytetok.encode(text)
    assert ids[0] == bytetok.BOS_ID
    assert ids[1:] == list(text.encode("utf-8"))
    assert all(0 <= i < 256 for i in ids[1:])
    assert bytetok.decode(ids) == text
    assert bytetok.decode(bytetok.encode(text, bos=False, eos=True)) == text


def test_bos_eos_flags() -> None:
    assert bytetok.encode("ab", bos=False) == [97, 98]
    assert bytetok.encode("ab", bos=True, eos=True) == [256, 97, 98, 257]


def test_every_byte_value_decodes() -> None:
    """All 256 single bytes: ASCII decode to themselves, the rest to U+FFFD (display only)."""
    for b in range(256):
        out = bytetok.decode([b])
        assert out == (chr(b) if b < 128 else "\ufffd"), b


def test_specials_skip_and_show() -> None:
    ids = [bytetok.BOS_ID, 72, 105, bytetok.EOS_ID, bytetok.PAD_ID]
    assert bytetok.decode(ids) == "Hi"
    assert bytetok.decode(ids, specials="show") == "<bos>Hi<eos><pad>"


def test_invalid_utf8_is_replaced_not_raised() -> None:
    # a 3-byte character cut after 2 bytes, then "A": one replacement char, then A
    euro = "€".encode()
    assert bytetok.decode([*euro[:2], 65]) == "\ufffdA"
    # a special inside a multi-byte character splits it (no silent joining across specials)
    assert "€" not in bytetok.decode([euro[0], bytetok.EOS_ID, euro[1], euro[2]])


def test_decode_accepts_tensors_and_numpy_ints() -> None:
    ids = torch.tensor(bytetok.encode("tensor"))
    assert bytetok.decode(ids) == "tensor"
    assert bytetok.decode(ids.numpy()) == "tensor"


@pytest.mark.parametrize("bad", [-1, 259, 1000, 2.5, True])
def test_decode_rejects_bad_ids(bad: object) -> None:
    with pytest.raises(InputError, match="token id must be an integer"):
        bytetok.decode([65, bad])  # type: ignore[list-item]


def test_encode_rejects_non_text() -> None:
    with pytest.raises(InputError, match="text must be a str"):
        bytetok.encode(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="not encodable"):
        bytetok.encode("lone \ud800 surrogate")


def test_decode_rejects_bad_specials_mode() -> None:
    with pytest.raises(InputError, match="specials must be"):
        bytetok.decode([65], specials="keep")
