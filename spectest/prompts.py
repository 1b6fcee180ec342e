"""Prompt sets: ``Prompt``, ``PromptsSpec``, ``load_prompt_set``, ``prompts_jsonl`` and
``prompt_token_ids``.

The why and the details: docs/internals.md "spectest/prompts.py".
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectest.errors import ConfigError
from spectest.files import not_regular, open_input, refused

# NOTE: \A...\Z, not ^...$: "$" also matches before a trailing newline, so "ci\n" passed and
# named a run directory "ci\n-<hash>". Use ``NAME_RE.fullmatch`` (or ``is_name``).
NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}\Z")
NAME_RULE = (
    "a name of letters, digits, '_', '.', '-' (at most 128, starting with a letter or digit)"
)
MAX_PROMPT_TOKENS = 131_072  # above every zoo model's context (40 960); see docs/internals.md
MAX_LINE_BYTES = 8 * 2**20  # one JSONL line; a MAX_PROMPT_TOKENS text fits with escapes
MAX_PROMPT_FILE_BYTES = 64 * 2**20


def is_name(value: object) -> bool:
    """``value`` is a string that is a name (``NAME_RE``, matched in full)."""
    return isinstance(value, str) and NAME_RE.fullmatch(value) is not None


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


def shipped_prompt_sets() -> dict[str, Path]:
    """The prompt sets shipped with spectest (``protocols/prompts/*.jsonl`` of the checkout or
    the wheel): name (file stem) → path; empty when this install has none."""
    from spectest.shipped import shipped_dir

    d = shipped_dir()
    folder = None if d is None else d / "prompts"
    if folder is None or not folder.is_dir():
        return {}
    return {f.stem: f for f in sorted(folder.glob("*.jsonl"))}


def shipped_prompt_file(name: str, source: str) -> Path:
    """The shipped prompt set ``name`` (``prompts: {shipped: NAME}``); ``ConfigError`` naming
    the value and the shipped sets."""
    sets = shipped_prompt_sets()
    if name not in sets:
        raise ConfigError(
            f"{source}: prompts.shipped: no shipped prompt set {name!r}; {_shipped_hint(sets)}"
        )
    return sets[name]


def _shipped_hint(sets: dict[str, Path]) -> str:
    if not sets:
        return "this install ships no prompt sets"
    return (
        f"the shipped prompt sets are {', '.join(sets)} "
        "(name one with prompts: {shipped: NAME} from a protocol anywhere)"
    )


def _find(file: str, base_dir: Path | None, source: str) -> Path:
    """The prompt file: ``file`` relative to ``base_dir`` (the protocol's directory), then to
    the working directory. Something there that is not a regular file, or a path the machine
    will not let us look at, is refused (exit 4) rather than skipped. Not found: one line
    naming each folder looked in once, and the shipped prompt sets."""
    rel = Path(file).expanduser()
    tried = [rel] if rel.is_absolute() else [(base_dir or Path.cwd()) / rel, Path.cwd() / rel]
    for t in tried:
        try:
            mode = t.stat().st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as err:
            raise refused(t, "prompt file", err.strerror or type(err).__name__) from None
        why = not_regular(mode)
        if why is not None:
            raise refused(t, "prompt file", why)
        return t
    folders = dict.fromkeys(str(t.parent.resolve()) for t in tried)  # distinct, in order
    raise ConfigError(
        f"{source}: prompts.file: no such prompt file {file!r} (looked in "
        f"{', '.join(folders)}); {_shipped_hint(shipped_prompt_sets())}"
    )


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of every line, each read with a bounded ``readline`` and decoded
    as UTF-8; one ``ConfigError`` naming the file and line when a line is too long or not
    UTF-8, or the file is larger than ``MAX_PROMPT_FILE_BYTES``."""
    pfile, total = str(path), 0
    with open_input(path, "prompt file") as f:
        for lineno in range(1, 2**62):
            try:
                raw = f.readline(MAX_LINE_BYTES + 1)
            except OSError as err:
                raise refused(path, "prompt file", err.strerror or type(err).__name__) from None
            if not raw:
                return
            total += len(raw)
            if len(raw) > MAX_LINE_BYTES:
                raise ConfigError(
                    f"{pfile}: line {lineno}: longer than {MAX_LINE_BYTES} bytes (a prompt holds "
                    f"at most {MAX_PROMPT_TOKENS} tokens)"
                )
            if total > MAX_PROMPT_FILE_BYTES:
                raise ConfigError(
                    f"{pfile}: larger than {MAX_PROMPT_FILE_BYTES} bytes at line {lineno} (a "
                    "prompt set is at most that)"
                )
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a UTF-8 byte-order mark
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ConfigError(
                    f"{pfile}: line {lineno}: not UTF-8 text (byte 0x{raw[err.start]:02x} at "
                    f"column {err.start + 1}: {err.reason})"
                ) from None
            yield lineno, text.rstrip("\r\n")


def _token_count(pr: Prompt) -> int:
    """Tokens of a prompt: its ids, or (text) its UTF-8 bytes plus BOS — the byte tokenizer's
    count (``prompt_token_ids``), known without encoding it."""
    return len(pr.ids) if pr.ids is not None else len((pr.text or "").encode("utf-8")) + 1


def _json_line(line: str, where: str) -> Any:
    """The JSON value of one line; ``ConfigError`` naming ``where`` when it is not JSON."""
    try:
        obj = json.loads(line)
    # a JSONDecodeError; an int of more than 4300 digits (ValueError); arrays nested past
    # the interpreter's recursion limit (RecursionError)
    except (ValueError, RecursionError) as err:
        why = (
            err.msg
            if isinstance(err, json.JSONDecodeError)
            else ("nested too deep" if isinstance(err, RecursionError) else str(err).split(";")[0])
        )
        raise ConfigError(f"{where}: not valid JSON ({why}): {line[:60]!r}") from None
    return obj


def _prompt(obj: Any, line: str, where: str, seen: set[str]) -> Prompt:
    """The ``Prompt`` of one line's JSON object, its fields checked; its id joins ``seen``."""
    if not isinstance(obj, dict) or not (set(obj) <= {"id", "text", "ids"}) or "id" not in obj:
        raise ConfigError(
            f'{where}: expected {{"id": ..., "text": ...}} or '
            f'{{"id": ..., "ids": [...]}}, got {line[:60]!r}'
        )
    pid = obj["id"]
    if not is_name(pid):
        raise ConfigError(f"{where}: id must be {NAME_RULE}, got {pid!r:.200}")
    if pid in seen:
        raise ConfigError(f"{where}: duplicate prompt id {pid!r}")
    seen.add(pid)
    text, ids = obj.get("text"), obj.get("ids")
    if (text is None) == (ids is None):
        raise ConfigError(f"{where}: give exactly one of 'text' or 'ids' for prompt {pid!r}")
    if text is not None and (not isinstance(text, str) or not text):
        raise ConfigError(f"{where}: text must be a non-empty string, got {text!r:.200}")
    if isinstance(text, str):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:  # a lone surrogate written as a JSON escape
            raise ConfigError(
                f"{where}: text of prompt {pid!r} is not valid Unicode "
                f"({err.reason} at character {err.start + 1})"
            ) from None
    if ids is not None and (
        not isinstance(ids, list)
        or not ids
        or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)
    ):
        raise ConfigError(
            f"{where}: ids must be a non-empty list of integers >= 0, got {ids!r:.200}"
        )
    prompt = Prompt(id=pid, text=text, ids=tuple(ids) if ids is not None else None)
    if (n := _token_count(prompt)) > MAX_PROMPT_TOKENS:
        raise ConfigError(
            f"{where}: prompt {pid!r} is {n} tokens long; a prompt holds at "
            f"most {MAX_PROMPT_TOKENS} (text: UTF-8 bytes + BOS)"
        )
    return prompt


def load_prompt_set(
    file: str,
    *,
    limit: int | None,
    base_dir: Path | None,
    source: str,
    shipped: str | None = None,
) -> PromptsSpec:
    """Load ``file`` (relative to ``base_dir`` — the protocol's directory — then to the working
    directory), or the shipped prompt set ``shipped`` (then ``file`` is ``shipped:NAME``), keep
    the first ``limit`` prompts. ``source`` names the protocol in messages."""
    path = shipped_prompt_file(shipped, source) if shipped else _find(file, base_dir, source)
    items: list[Prompt] = []
    seen: set[str] = set()
    pfile = str(path)
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        where = f"{pfile}: line {lineno}"
        items.append(_prompt(_json_line(line, where), line, where, seen))
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


def model_context(model: Any) -> int | None:
    """The most positions ``model`` attends over: a transformers config's
    ``max_position_embeddings``; None when the model states none (the analytic toy LM reads only
    its last ``order - 1`` tokens, so any length works)."""
    n = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def context_limit(models: Sequence[Any], positions: int) -> tuple[int, str] | None:
    """The longest prompt the models can take while generating ``positions`` tokens — the
    smallest ``model_context`` of ``models`` (target, draft; None entries skipped) minus
    ``positions`` — and the model that sets it; None when no model states a context."""
    known = [
        (c, i, getattr(m, "name", "?"))
        for i, m in enumerate(models)
        if (c := model_context(m)) is not None
    ]
    if not known:
        return None
    ctx, _, name = min(known)  # the target first on a tie
    return ctx - positions, f"{name}: context {ctx} - {positions} generated positions"


def prompt_token_ids(
    prompts: PromptsSpec | Any, vocab_size: int, models: Sequence[Any] = ()
) -> dict[str, list[int]]:
    """Token ids of every prompt. Text prompts use the byte tokenizer (``models.bytetok``,
    BOS first) — the tokenizer of the bundled pair and of any model with ≥ 259 ids; explicit
    ``ids`` are used as given. Every id must be < ``vocab_size``. Accepts a ``PromptsSpec`` or a
    ``Protocol``.

    ``models`` (the loaded target and draft, with a ``Protocol``): every prompt must fit
    ``context_limit(models, protocol.positions)``; the length is checked before the prompt is
    encoded or reaches a model (``ConfigError`` naming the prompt file, the prompt id, its length
    and the limit).
    """
    from spectest.models import bytetok

    spec = prompts if isinstance(prompts, PromptsSpec) else prompts.prompts
    positions = getattr(prompts, "positions", None)
    limit = context_limit(models, int(positions)) if positions is not None else None
    out: dict[str, list[int]] = {}
    pfile = spec.path
    for pr in spec.items:
        if limit is not None and (n := _token_count(pr)) > limit[0]:
            raise ConfigError(
                f"{pfile}: prompt {pr.id!r} is {n} tokens long, longer than the models take: at "
                f"most {max(limit[0], 0)} ({limit[1]})"
            )
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
