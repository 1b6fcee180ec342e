"""User text made safe for a terminal, markdown and XML (``md_text``, ``md_code``, ``xml_text``,
...). Not rich markup (``cli.common.u``).

The why and the details: docs/internals.md "spectest/report/escape.py".
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls, and the bidirectional overrides / isolates ("Trojan source")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# characters XML 1.0 does not allow at all (§2.2 Char): C0 but tab/LF/CR, surrogates, FFFE/FFFF
_XML_FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
# bidirectional overrides / isolates: valid XML, but a CI page that shows a JUnit name would
# reorder it ("Trojan source"): shown as their escapes there too
_BIDI = re.compile("[\u202a-\u202e\u2066-\u2069]")
# characters with a meaning in CommonMark / GFM inline text that user text must not get
_MD_PUNCT = re.compile(r"([\\`*_\[\]|~])")
_MD_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def _show(match: re.Match[str]) -> str:
    c = match.group(0)
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def printable(text: object) -> str:
    """``text`` with every control character (tab and newline included) shown as its escape:
    one line a terminal prints as it is."""
    return _CONTROL.sub(_show, str(text))


def one_line(text: object) -> str:
    """Whitespace runs (newlines included) as one space, then ``printable``: for messages."""
    return printable(" ".join(str(text).split()))


def md_text(text: object) -> str:
    """Inline markdown that renders as the literal text: control characters shown, ``& < >``
    as entities (no HTML), the markdown punctuation backslash-escaped (no link, image, code
    span, emphasis, strikethrough or table cell break)."""
    s = printable(text)
    s = "".join(_MD_ENTITIES.get(c, c) for c in s)
    return _MD_PUNCT.sub(r"\\\1", s)


def md_code(text: object, *, in_table: bool = False) -> str:
    """A code span holding ``text`` literally: fenced by more backticks than any run inside
    (CommonMark §6.1), control characters shown (``in_table``: ``|`` escaped, as GFM needs)."""
    s = printable(text)
    if in_table:
        s = s.replace("|", "\\|")
    runs = [len(r) for r in re.findall("`+", s)]
    fence = "`" * (max(runs, default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or runs else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def xml_text(text: object) -> str:
    """``text`` with the characters XML 1.0 forbids shown as their escapes (ElementTree escapes
    ``& < > "`` itself, but writes a forbidden character raw: the file would not parse), and
    the bidirectional overrides and isolates shown as escapes too (a CI page shows them)."""
    return _BIDI.sub(_show, _XML_FORBIDDEN.sub(_show, str(text)))


def xml_attr(text: object) -> str:
    """An XML attribute (a JUnit test case's name, a property's value): ``xml_text``, and every
    control character (tab, newline) shown as its escape: one line, as a CI page lists it."""
    return printable(xml_text(text))
