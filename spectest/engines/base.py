"""The engine contract: what an engine under test is, in one place.

Owns: ``Engine`` (the base class), its job (``ArmJob``: one arm × one prompt, all its rows), the
one output type of every engine and decode loop (``ArmOutput``), what every decode loop is asked
(``DecodeRequest``), ``RowSpec``, ``DrafterSpec``, ``Models``, option parsing with errors that
name file and field (``parse_options``), ``check_output`` and the conversion to the schema's
samples and rounds tables. Knows nothing about particular engines (``engines.registry``),
protocols, files or statistics; imports no torch. How an engine plugs in and which engine runs
which arm: docs/engines.md "Adding an engine".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import pandas as pd

from spectest import schema
from spectest.errors import ConfigError, InputError
from spectest.schema import DRAFTER_KINDS, PLACEHOLDER_TOKEN_ID, Q_MODES

if TYPE_CHECKING:
    from spectest.models.base import LanguageModel
    from spectest.sampling.params import SamplingParams

Needs = Literal["target", "draft", "none"]
WhiteboxKind = Literal["generation", "teacher", "tokens", "none"]
RoundsKind = Literal["tested", "readout", "none"]
TeacherKind = Literal["spectest", "hf"]
SeedsKind = Literal["per row", "per job", "ignored"]
NEEDS: tuple[Needs, ...] = ("target", "draft", "none")
WHITEBOX_KINDS: tuple[WhiteboxKind, ...] = ("generation", "teacher", "tokens", "none")
ROUNDS_KINDS: tuple[RoundsKind, ...] = ("tested", "readout", "none")
SEEDS_KINDS: tuple[SeedsKind, ...] = ("per row", "per job", "ignored")
Progress = Callable[[int], None]  # rows completed so far in this job
ROUNDS_COLUMNS = ("row", "round", "position", "drafted", "accepted", "emitted")


@dataclass(frozen=True)
class RowSpec:
    """One row of a job: a named sampling config and a seed (the prompt is shared)."""

    config_id: str
    seed: int
    params: SamplingParams


@dataclass(frozen=True)
class DrafterSpec:
    """How the draft proposes: one-hot (greedy argmax) or sampled; the q it reports; K per round.

    The protocol's ``drafter`` section is this type in its YAML spelling: ``kind`` (``onehot`` /
    ``sampled``, ``DRAFTER_KINDS``), ``k`` and ``q`` (``Q_MODES``): ``from_kind`` reads that
    spelling and ``canonical`` writes it (the form the protocol hash is computed from).
    """

    onehot: bool
    q_mode: str = "processed"
    k: int = 4

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ConfigError(f"drafter: k must be an integer >= 1, got {self.k!r}")
        if self.q_mode not in Q_MODES:
            raise ConfigError(f"drafter: q_mode must be one of {Q_MODES}, got {self.q_mode!r}")

    @classmethod
    def from_kind(cls, kind: str, k: int, q: str = "processed") -> DrafterSpec:
        """The protocol's spelling (``kind``, ``k``, ``q``) → a ``DrafterSpec``."""
        if kind not in DRAFTER_KINDS:
            raise ConfigError(f"drafter: kind must be one of {DRAFTER_KINDS}, got {kind!r}")
        return cls(onehot=kind == "onehot", q_mode=q, k=k)

    @property
    def kind(self) -> str:
        """``"onehot"`` or ``"sampled"`` (the protocol's ``drafter.kind``)."""
        return DRAFTER_KINDS[0] if self.onehot else DRAFTER_KINDS[1]

    def canonical(self) -> dict[str, Any]:
        """``{"kind", "k", "q"}``: the protocol's YAML and hashed form."""
        return {"kind": self.kind, "k": self.k, "q": self.q_mode}


@dataclass(frozen=True)
class Models:
    """The protocol's models, loaded once per run by the runner (``draft`` is None when no engine
    of the run needs it)."""

    target: LanguageModel | None
    draft: LanguageModel | None


@dataclass(frozen=True)
class ArmJob:
    """One arm × one prompt: every (config, seed) row of the arm for that prompt.

    ``role`` is the arm's role (reference, candidate, null, eps, mutant; ``reference`` for the
    floor arm and a plain null: the engine's plain decode); ``variant`` the built-in
    sampler variant of a speculative arm (``None`` for a plain arm); ``whitebox`` asks for
    white-box columns (only set for engines whose ``whitebox`` is not ``"none"``); ``capture``
    the rows whose verify-schedule logits to keep (``DecodeRequest.capture``).
    """

    arm: str
    role: str
    variant: str | None
    prompt_id: str
    prompt_ids: tuple[int, ...]
    rows: tuple[RowSpec, ...]
    num_positions: int
    run_key: int
    batch_size: int
    drafter: DrafterSpec
    whitebox: bool = False
    progress: Progress | None = field(default=None, compare=False, repr=False)
    capture: tuple[int, ...] = ()

    def tick(self, done: int) -> None:
        if self.progress is not None:
            self.progress(done)

    def decode_request(self, **extra: Any) -> DecodeRequest:
        """This job as a decode loop's request (``extra``: ``whitebox_roles`` ...)."""
        fields = dict(
            batch_size=self.batch_size,
            progress=self.tick,
            whitebox=self.whitebox,
            capture=self.capture,
        )
        return DecodeRequest(
            self.prompt_ids,
            self.rows,
            self.num_positions,
            self.run_key,
            self.prompt_id,
            **{**fields, **extra},
        )


@dataclass(frozen=True)
class DecodeRequest:
    """What every decode loop is asked (``builtin``, ``fast``, ``hf.decode``): one prompt's rows.

    ``prompt``: token ids; ``rows``: one (config, seed, params) per output row; ``num_positions``:
    tokens per row; ``run_key`` and ``prompt_id`` key each row's randomness
    (``seeding.row_key``); ``batch_size``: rows per chunk; ``progress``: called with the rows
    done; ``whitebox``: record the white-box columns; ``whitebox_roles``: with them, each token's
    role and round offset (built-in loops only); ``capture``: ascending indices of ``rows`` whose
    logits under the verify schedule a speculative built-in loop keeps (``ArmOutput.verify``;
    claim (b)'s matched drift reads them instead of replaying the rounds). The loops check the
    values.
    """

    prompt: Sequence[int]
    rows: Sequence[RowSpec]
    num_positions: int
    run_key: int
    prompt_id: str
    batch_size: int = 256
    progress: Progress | None = field(default=None, compare=False, repr=False)
    whitebox: bool = False
    whitebox_roles: bool = False
    capture: Sequence[int] = ()

    def tick(self, done: int) -> None:
        if self.progress is not None:
            self.progress(done)


@dataclass(frozen=True)
class ArmOutput:
    """What an engine returns for a job, and what every decode loop returns for its rows
    (``builtin.plain_decode``, ``hf.decode.hf_plain_decode`` ...): one type at every level.

    ``tokens``: int64 numpy ``[B, T]`` in ``job.rows`` order; ``-1`` (``PLACEHOLDER_TOKEN_ID``) =
    no token (the sequence stopped before ``T``; only as a suffix of a row). ``rounds``: per-round
    telemetry with ``ROUNDS_COLUMNS`` (``row`` indexes ``job.rows``; extra columns allowed), or
    None. ``rounds_tested``: the rounds follow spectest's draft law and are tested (acceptance vs
    Σ min(p, q)); False = a readout, stored but not tested (must agree with ``Engine.rounds``:
    checked). ``whitebox``: white-box columns (``wb_*``, one row per token, row-major) recorded
    at generation time, or None. ``reported``: float64 ``[B, T, 2]`` the engine's own claim of
    each token's target probability and the mass below its id (``p``, ``cdf_lo``; NaN = not
    reported) and optionally, third, the mass of the top-n list it reported (``[B, T, 3]``;
    NaN = the full law), or None (``engines.reported``; docs/engines-reported-p.md).
    ``verify``: with ``capture``, the captured rows' logits ``[len(capture), T, V]`` (the
    model's own dtype; a ``ScaledLogits`` where its logits are), each position's from the verify
    round that committed it, or None (an engine that keeps none: claim (b) replays).
    """

    tokens: np.ndarray  # [B, T] int64
    rounds: pd.DataFrame | None = None
    rounds_tested: bool = True
    whitebox: pd.DataFrame | None = None
    reported: np.ndarray | None = None  # [B, T, 2 or 3] float64
    verify: Any = None  # [len(capture), T, V] on the model's device


class Engine:
    """Base class of every engine under test: its class attributes are docs/engines.md
    "Adding an engine"."""

    name: ClassVar[str] = ""

    @dataclass(frozen=True)
    class Options:
        pass

    needs: ClassVar[Needs] = "target"
    whitebox: ClassVar[WhiteboxKind] = "none"
    rounds: ClassVar[RoundsKind] = "none"
    uses_variant: ClassVar[bool] = False
    teacher: ClassVar[TeacherKind] = "spectest"
    fast_variant: ClassVar[str | None] = None
    seeds: ClassVar[SeedsKind] = "per row"
    max_batch: ClassVar[int | None] = None

    def __init__(self, options: Any, models: Models) -> None:
        self.options = options
        self.models = models

    @classmethod
    def parse_options(cls, raw: Mapping[str, Any], where: str, base_dir: Path | None = None) -> Any:
        """``raw`` (the protocol's mapping minus ``name``) → ``cls.Options``; ``where`` is
        ``"FILE: engines.candidate"``-style context for messages; ``base_dir`` the protocol's
        directory (for relative paths). Override for richer forms."""
        return parse_options(cls.Options, raw, where)

    @classmethod
    def needs_draft(cls, variant: str | None) -> bool:
        """Whether an arm of this engine with this sampler variant needs the draft model."""
        return cls.needs == "draft"

    @classmethod
    def check_protocol(
        cls, options: Any, *, role: str, variant: str, drafter_kind: str, drafter_q: str
    ) -> tuple[str, str] | None:
        """Cross-field rules of this engine: ``(field path, message)`` for a protocol it cannot
        run, else None. ``variant`` is the protocol's ``candidate`` sampler variant."""
        if not cls.uses_variant and role == "candidate" and variant != "exact":
            return "candidate", f"engine {cls.name} runs its own sampler, got {variant!r}"
        return None

    def generate(self, job: ArmJob) -> ArmOutput:
        raise NotImplementedError(f"engine {self.name!r} does not implement generate")

    def seeds_claim(self) -> SeedsKind:
        """What this instance's seeds determine (``seeds``; a command engine reads its
        program's hello line, so ask after the first ``generate``)."""
        return self.seeds

    def provenance(self) -> dict[str, Any]:
        """Versions and settings recorded in the run's provenance (JSON values)."""
        return {"name": self.name, "options": options_dict(self.options)}

    def close(self) -> None:
        """Release processes, servers or memory; called once at the end of a run."""
        return None


# ----------------------------------------------------------------------------- options
def options_dict(options: Any) -> dict[str, Any]:
    """An engine's parsed options as plain JSON values (the protocol's canonical form); a field
    marked ``metadata={"omit_default": True}`` is left out at its default, so adding it moves
    no existing protocol's hash."""
    if dataclasses.is_dataclass(options) and not isinstance(options, type):
        out = dataclasses.asdict(options)
        for f in dataclasses.fields(options):
            if f.metadata.get("omit_default") and out.get(f.name) == f.default:
                del out[f.name]
        return out
    return {}


def parse_options(cls: type, raw: Mapping[str, Any], where: str) -> Any:
    """Build the frozen dataclass ``cls`` from ``raw`` checking keys and scalar types
    (bool, int, float, str fields); every error names ``where`` and the field."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            allowed = ", ".join(["name", *fields]) if fields else "name"
            raise ConfigError(f"{where}.{key}: unknown key {key!r} (allowed: {allowed})")
        want = fields[key].type
        want = want if isinstance(want, str) else getattr(want, "__name__", str(want))
        ok = {
            "bool": isinstance(value, bool),
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, (int, float)) and not isinstance(value, bool),
            "str": isinstance(value, str) and bool(value),
        }.get(want, True)
        if not ok:
            raise ConfigError(f"{where}.{key}: expected type {want}, got {value!r}")
        kwargs[key] = float(value) if want == "float" else value
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from None


# ----------------------------------------------------------------------------- outputs
def check_rows(rows: Sequence[RowSpec], T: Any, batch_size: Any) -> None:
    """The checks every engine makes on its rows, positions and batch size."""
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        raise ConfigError(f"num_positions must be an integer >= 1, got {T!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if len(rows) == 0:
        raise InputError("rows: at least one RowSpec is needed, got none")
    for r in rows:
        if not isinstance(r, RowSpec):
            raise InputError(f"rows must be RowSpec objects, got {r!r}")


def rounds_from_tuples(rounds: Sequence[tuple[int, ...]]) -> pd.DataFrame | None:
    """Round telemetry as tuples in ``ROUNDS_COLUMNS`` order → the frame ``ArmOutput`` takes
    (None when there is none)."""
    return pd.DataFrame(list(rounds), columns=list(ROUNDS_COLUMNS)) if rounds else None


def _check_tokens(toks: np.ndarray, hi: int, bad: Callable[..., Exception]) -> None:
    """Ids in ``[0, hi]``, a first token in every row, ``-1`` only as a row's suffix."""
    ids = f"a token id in [0, {hi}]"
    wrong = (toks < PLACEHOLDER_TOKEN_ID) | (toks > hi)
    if wrong.any():
        r, t = (int(i) for i in np.argwhere(wrong)[0])
        raise bad(
            f"tokens[{r}, {t}]", f"{ids} (or -1 after the sequence's end)", int(toks[r, t]), r
        )
    pad = toks == PLACEHOLDER_TOKEN_ID
    if pad[:, 0].any():
        r = int(np.flatnonzero(pad[:, 0])[0])
        raise bad(f"tokens[{r}, 0]", f"{ids} (a sequence needs at least one token)", -1, r)
    after = pad[:, :-1] & ~pad[:, 1:]
    if after.any():
        r, t = (int(i) for i in np.argwhere(after)[0])
        why = f"-1 (the sequence ended at position {t}: -1 only as a suffix)"
        raise bad(f"tokens[{r}, {t + 1}]", why, int(toks[r, t + 1]), r)


def _check_rounds(rounds: Any, B: int, bad: Callable[..., Exception]) -> None:
    """``check_output``'s rule for ``rounds``: None, or a DataFrame with ``ROUNDS_COLUMNS`` of
    integers in ``[0, 2^31)`` and row indices in ``[0, B)``."""
    from spectest.engines.replies import I32

    if rounds is None:
        return
    if not isinstance(rounds, pd.DataFrame):
        raise bad("rounds", "a pandas DataFrame or None", type(rounds).__name__)
    for c in ROUNDS_COLUMNS:
        if c not in rounds.columns:
            raise bad(f"rounds.{c}", "a column", f"columns {list(rounds.columns)}")
        col = rounds[c]
        if not pd.api.types.is_integer_dtype(col.dtype) or pd.api.types.is_bool_dtype(col.dtype):
            raise bad(f"rounds.{c}", "a column of integers", f"dtype {col.dtype}")
        vals = col.to_numpy()
        top = B - 1 if c == "row" else I32
        out_of = (vals < 0) | (vals > top)
        if out_of.any():
            i = int(np.flatnonzero(out_of)[0])
            raise bad(f"rounds.{c}[{i}]", f"an int in [0, {top}]", int(vals[i]))


def check_output(out: Any, job: ArmJob, vocab_size: int | None, engine: str) -> None:
    """An engine's output against the contract of ``ArmOutput`` (token ids in ``[0, vocab_size)``,
    ``< 2^31`` when no vocabulary is known; rounds' integers in ``[0, 2^31)``); one ``ReplyError``
    (exit 2) naming the engine, the arm, the prompt, the row and seed, the field and the value
    otherwise."""
    from spectest.engines.replies import TOKEN_ID_MAX, ReplyError, short, where

    base = where(engine, arm=job.arm, prompt=job.prompt_id)

    def bad(field: str, expected: str, value: Any, row: int | None = None) -> ReplyError:
        ctx = base
        if row is not None:
            ctx = where(engine, arm=job.arm, prompt=job.prompt_id, row=row, seed=job.rows[row].seed)
        return ReplyError(f"{ctx}: field {field!r}: expected {expected}, got {short(value)}")

    if not isinstance(out, ArmOutput):
        raise bad("generate()", "an ArmOutput", out)
    toks = out.tokens
    B, T = len(job.rows), job.num_positions
    if not isinstance(toks, np.ndarray) or toks.dtype != np.int64 or toks.shape != (B, T):
        shape = getattr(toks, "shape", None)
        dtype = getattr(toks, "dtype", type(toks).__name__)
        raise ReplyError(
            f"{base}: field 'tokens': expected an int64 numpy array of shape {(B, T)}, "
            f"got {dtype} {shape}"
        )
    _check_tokens(toks, (vocab_size if vocab_size is not None else TOKEN_ID_MAX + 1) - 1, bad)
    if not isinstance(out.rounds_tested, bool):
        raise bad("rounds_tested", "true or false", out.rounds_tested)
    _check_rounds(out.rounds, B, bad)
    wb = out.whitebox
    if wb is not None and (not isinstance(wb, pd.DataFrame) or len(wb) != B * T):
        got = f"{len(wb)} rows" if isinstance(wb, pd.DataFrame) else type(wb).__name__
        raise bad("whitebox", f"a DataFrame of {B * T} rows (one per row and position)", got)
    rep = out.reported
    shaped = isinstance(rep, np.ndarray) and rep.ndim == 3 and rep.shape[2] in (2, 3)
    if rep is not None and not (shaped and rep.shape[:2] == (B, T)):
        got = f"shape {rep.shape}" if isinstance(rep, np.ndarray) else type(rep).__name__
        raise bad("reported", f"a float array of shape {(B, T, 2)} or {(B, T, 3)}", got)


def samples_frame(
    tokens: np.ndarray,
    prompt_id: str,
    rows: Sequence[RowSpec],
    arm: str,
    columns: pd.DataFrame | None = None,
) -> Any:
    """The schema's samples table: one row per emitted token, row-major then position; a
    sequence that ended early (``-1``) has no row past its end. ``columns`` (white-box columns,
    one row per (row, position) like ``tokens``) are aligned before the ended positions are
    dropped."""
    B, T = tokens.shape
    if B != len(rows):
        raise InputError(f"samples_frame: {B} token rows but {len(rows)} RowSpecs")
    if columns is not None and len(columns) != B * T:
        raise InputError(f"samples_frame: {len(columns)} column rows but {B * T} tokens")
    flat = tokens.reshape(-1).astype(np.int64)
    df = pd.DataFrame(
        {
            schema.PROMPT_ID: np.full(B * T, prompt_id, dtype=object),
            schema.CONFIG_ID: np.repeat(np.array([r.config_id for r in rows], dtype=object), T),
            schema.ARM: np.full(B * T, arm, dtype=object),
            schema.SEED: np.repeat(np.array([r.seed for r in rows], dtype=np.int64), T),
            schema.POSITION: np.tile(np.arange(T, dtype=np.int32), B),
            schema.TOKEN_ID: flat,
        }
    )
    if columns is not None:
        df = pd.concat([df, columns.reset_index(drop=True)], axis=1)
    present = flat != PLACEHOLDER_TOKEN_ID
    if not present.all():
        df = df[present].reset_index(drop=True)
    return df


def rounds_frame(rounds: pd.DataFrame, prompt_id: str, rows: Sequence[RowSpec], arm: str) -> Any:
    """The schema's rounds table from an engine's telemetry (``ROUNDS_COLUMNS``)."""
    r = rounds
    idx = r["row"].to_numpy()
    return pd.DataFrame(
        {
            schema.PROMPT_ID: np.full(len(r), prompt_id, dtype=object),
            schema.CONFIG_ID: np.array([rows[i].config_id for i in idx], dtype=object),
            schema.ARM: np.full(len(r), arm, dtype=object),
            schema.SEED: np.array([rows[i].seed for i in idx], dtype=np.int64),
            "round": r["round"].to_numpy().astype(np.int32),
            schema.POSITION: r["position"].to_numpy().astype(np.int32),
            "drafted": r["drafted"].to_numpy().astype(np.int32),
            "accepted": r["accepted"].to_numpy().astype(np.int32),
            "emitted": r["emitted"].to_numpy().astype(np.int32),
        }
    )
