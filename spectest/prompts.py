"""Prompt sets: the JSONL file format, its loading and serialising, and prompts → token ids.

Owns: ``Prompt``, ``PromptsSpec``, ``load_prompt_set`` (one ``ConfigError`` line naming the file,
the line and the value for every problem), ``prompts_jsonl`` and ``prompt_token_ids`` (text
through the byte tokenizer of the bundled pair, BOS first; explicit ids as given).
Knows nothing about protocols beyond the file name it reports, nor about models beyond a
vocabulary size.

Format: one JSON object per line, ``{"id": "p0", "text": "..."}`` or ``{"id": "p0", "ids": [1,
2]}``; ids are names (letters, digits, ``_ . -``), unique in the file; blank lines are ignored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectest.errors import ConfigError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_NAME_RE = NAME_RE


@dataclass(frozen=True)
class Prompt:
    """One prompt: an id and either text (tokenised by the model pair) or explicit token ids."""

    id: str
    text: str | None
    ids: tuple[int, ...] | None


@dataclass(frozen=True)
class PromptsSpec:
    """The prompt set: a JSONL file (lines ``{"id": ..., "text": ...}`` or ``{"id": ..., "ids":
    [...]}``), resolved relative to the protocol file (then the working directory), and an
    optional limit (the first ``limit`` prompts)."""

    file: str
    limit: int | None
    path: str  # resolved absolute path
    items: tuple[Prompt, ...]


def load_prompt_set(
    file: str, *, limit: int | None, base_dir: Path | None, source: str
) -> PromptsSpec:
    """Load ``file`` (relative to ``base_dir`` — the protocol's directory — then to the working
    directory), keep the first ``limit`` prompts. ``source`` names the protocol in messages."""
    rel = Path(file).expanduser()
    tried = [rel] if rel.is_absolute() else [(base_dir or Path.cwd()) / rel, Path.cwd() / rel]
    path = next((p for p in tried if p.is_file()), None)
    if path is None:
        where = ", ".join(str(t.parent) for t in tried)
        raise ConfigError(
            f"{source}: prompts.file: no such prompt file {file!r} (looked in {where})"
        )
    items: list[Prompt] = []
    seen: set[str] = set()
    pfile = str(path)
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(
                f"{pfile}: line {lineno}: not valid JSON ({err.msg}): {line[:60]!r}"
            ) from None
        if not isinstance(obj, dict) or not (set(obj) <= {"id", "text", "ids"}) or "id" not in obj:
            raise ConfigError(
                f'{pfile}: line {lineno}: expected {{"id": ..., "text": ...}} or '
                f'{{"id": ..., "ids": [...]}}, got {line[:60]!r}'
            )
        pid = obj["id"]
        if not isinstance(pid, str) or not _NAME_RE.match(pid):
            raise ConfigError(
                f"{pfile}: line {lineno}: id must be a name of letters, digits, "
                f"'_', '.', '-', got {pid!r}"
            )
        if pid in seen:
            raise ConfigError(f"{pfile}: line {lineno}: duplicate prompt id {pid!r}")
        seen.add(pid)
        text, ids = obj.get("text"), obj.get("ids")
        if (text is None) == (ids is None):
            raise ConfigError(
                f"{pfile}: line {lineno}: give exactly one of 'text' or 'ids' for prompt {pid!r}"
            )
        if text is not None and (not isinstance(text, str) or not text):
            raise ConfigError(
                f"{pfile}: line {lineno}: text must be a non-empty string, got {text!r}"
            )
        if ids is not None and (
            not isinstance(ids, list)
            or not ids
            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)
        ):
            raise ConfigError(
                f"{pfile}: line {lineno}: ids must be a non-empty list of integers >= 0, "
                f"got {ids!r}"
            )
        items.append(Prompt(id=pid, text=text, ids=tuple(ids) if ids is not None else None))
    if not items:
        raise ConfigError(f"{source}: prompts.file: prompt file {pfile!r} holds no prompts")
    if limit is not None:
        items = items[:limit]
    return PromptsSpec(file=file, limit=limit, path=str(path.resolve()), items=tuple(items))


def prompts_jsonl(prompts: PromptsSpec | Any) -> str:
    """The (limited) prompt set as JSONL text, one ``{"id", "text"|"ids"}`` object per line.
    Accepts a ``PromptsSpec`` or anything with a ``.prompts`` one (a ``Protocol``)."""
    spec = prompts if isinstance(prompts, PromptsSpec) else prompts.prompts
    lines = []
    for pr in spec.items:
        obj: dict[str, Any] = {"id": pr.id}
        if pr.text is not None:
            obj["text"] = pr.text
        else:
            obj["ids"] = list(pr.ids or ())
        lines.append(json.dumps(obj, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def prompt_token_ids(prompts: PromptsSpec | Any, vocab_size: int) -> dict[str, list[int]]:
    """Token ids of every prompt. Text prompts use the byte tokenizer (``models.bytetok``,
    BOS first) — the tokenizer of the bundled pair and of any model with ≥ 259 ids; explicit
    ``ids`` are used as given. Every id must be < ``vocab_size``. Accepts a ``PromptsSpec`` or a
    ``Protocol``."""
    from spectest.models import bytetok

    spec = prompts if isinstance(prompts, PromptsSpec) else prompts.prompts
    out: dict[str, list[int]] = {}
    pfile = spec.path
    for pr in spec.items:
        if pr.ids is not None:
            ids = list(pr.ids)
        else:
            if vocab_size < bytetok.VOCAB_SIZE:
                raise ConfigError(
                    f"{pfile}: prompt {pr.id!r} is text but the model's vocabulary has only "
                    f"{vocab_size} ids (byte tokenizer needs {bytetok.VOCAB_SIZE}): give 'ids'"
                )
            ids = bytetok.encode(pr.text or "")
        bad = [i for i in ids if i >= vocab_size]
        if bad:
            raise ConfigError(
                f"{pfile}: prompt {pr.id!r}: token id {bad[0]!r} is outside the vocabulary "
                f"(size {vocab_size})"
            )
        out[pr.id] = ids
    return out
