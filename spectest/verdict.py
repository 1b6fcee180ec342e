"""The decision: test results of each arm against the reference, plus the teeth → one verdict.

Owns: what counts as a tooth that bit, the order in which reasons override one another, and the
exit code. Knows nothing about how the tests were computed: it reads the per-comparison summary
(``Comparison``) that ``summarize_comparison`` extracts from an ``Analysis`` — whether the
analysis rejected, its cell table's counts and TV columns, its MDE — and nothing else.

Decision rules (the exit codes of ``spectest.errors.ExitCode``)
---------------------------------------------------------------
1. A null arm (the exact sampler on seeds disjoint from the reference's) that rejects means the
   harness's false-alarm control failed for this run: **inconclusive (3)**, whatever the
   candidate did — a rejection of the candidate cannot be trusted when the null rejects too.
   So does a white-box test of the *reference* (plain) arm that rejects in the main comparison
   (the candidate's, else the first tooth's): spectest's own p_t would then be wrong.
2. Otherwise, a candidate that rejects: **different (1)**. A rejection is evidence whatever the
   power: an unkilled mutant says the test is weak, not that a detection is false.
3. Otherwise, an ε arm or a required mutant that was not killed, or a run MDE (TV) above the
   protocol's ``tests.power.max_mde_tv``: **inconclusive (3)** — "no difference found" would
   not mean much.
4. Otherwise **equivalent (0)**: no difference detected and the teeth are sound.

A teeth-only run (``spectest teeth``, no candidate) decides **sound (0)** or **inconclusive (3)**
by rules 1 and 3.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from spectest.errors import ExitCode

Decision = Literal["equivalent", "different", "inconclusive", "sound"]


@dataclass(frozen=True)
class ConfigStats:
    """One sampling config of one comparison: what the summary table prints."""

    config_id: str
    cells_tested: int
    cells_untestable: int
    rejections: int  # after the multiplicity correction
    max_tv_excess: float | None  # max over cells/positions of plug-in TV minus its null mean
    max_tv_where: str | None  # "prompt_id@position" of that maximum
    mde_tv: float | None  # smallest TV detected with 80 % power (median over cells)


@dataclass(frozen=True)
class Comparison:
    """One arm compared with the reference."""

    arm: str
    role: str  # candidate | null | eps | mutant
    expect: str  # subject | pass | fail
    rejected: bool
    cells_tested: int
    rejections: int
    min_qvalue: float | None
    mde_tv: float | None
    failing: tuple[str, ...]  # human-readable failing cells / families, most significant first
    by_config: tuple[ConfigStats, ...] = field(default=())
    control_failed: bool = False  # a white-box test of the *reference* arm rejected

    @property
    def is_tooth(self) -> bool:
        return self.role in ("null", "eps", "mutant")


@dataclass(frozen=True)
class ToothVerdict:
    """Whether one tooth behaved: the null must pass, ε and mutants must be killed (rejected)."""

    arm: str
    role: str
    expect: str
    rejected: bool
    sound: bool

    @property
    def label(self) -> str:
        if self.expect == "pass":
            return "passed (sound)" if self.sound else "REJECTED (unsound)"
        return "killed" if self.sound else "NOT KILLED"


@dataclass(frozen=True)
class Verdict:
    """The run's decision and exit code, with every reason that led to it."""

    decision: Decision
    exit_code: ExitCode
    reasons: tuple[str, ...]
    candidate: Comparison | None
    teeth: tuple[ToothVerdict, ...]
    mde_tv: float | None
    max_mde_tv: float | None

    @property
    def power_ok(self) -> bool | None:
        if self.max_mde_tv is None or self.mde_tv is None:
            return None
        return self.mde_tv <= self.max_mde_tv

    def to_dict(self) -> dict:
        return {
            "decision": self.decision,
            "exit_code": int(self.exit_code),
            "reasons": list(self.reasons),
            "mde_tv": self.mde_tv,
            "max_mde_tv": self.max_mde_tv,
            "power_ok": self.power_ok,
            "teeth": [
                {
                    "arm": t.arm,
                    "role": t.role,
                    "expect": t.expect,
                    "rejected": t.rejected,
                    "sound": t.sound,
                    "label": t.label,
                }
                for t in self.teeth
            ],
        }


def judge_tooth(c: Comparison) -> ToothVerdict:
    """A null is sound when it does not reject; an ε arm or mutant when it does."""
    assert c.is_tooth, c
    sound = (not c.rejected) if c.expect == "pass" else c.rejected
    return ToothVerdict(arm=c.arm, role=c.role, expect=c.expect, rejected=c.rejected, sound=sound)


def decide(comparisons: Sequence[Comparison], *, max_mde_tv: float | None = None) -> Verdict:
    """Apply the decision rules of the module docstring.

    Parameters
    ----------
    comparisons : every non-reference arm against the reference (at most one candidate).
    max_mde_tv : the protocol's power requirement (``None`` = none).
    """
    cands = [c for c in comparisons if c.role == "candidate"]
    assert len(cands) <= 1, "one candidate per run"
    cand = cands[0] if cands else None
    teeth = tuple(judge_tooth(c) for c in comparisons if c.is_tooth)
    null_bad = [t for t in teeth if t.expect == "pass" and not t.sound]
    main = cand if cand is not None else (comparisons[0] if comparisons else None)
    control_bad = main is not None and main.control_failed
    unkilled = [t for t in teeth if t.expect == "fail" and not t.sound]
    mde = cand.mde_tv if cand is not None else None
    low_power = max_mde_tv is not None and mde is not None and mde > max_mde_tv

    reasons: list[str] = []
    if control_bad:
        reasons.append(
            "white-box control failed: a test of the plain reference arm against spectest's own "
            "p_t rejected"
        )
    for t in null_bad:
        reasons.append(f"null arm {t.arm!r} rejected: the harness's false-alarm control failed")
    if cand is not None and cand.rejected:
        first = cand.failing[0] if cand.failing else "?"
        reasons.append(
            f"candidate differs from the reference: {cand.rejections} rejection(s) "
            f"after correction, most significant: {first}"
        )
    for t in unkilled:
        reasons.append(
            f"tooth {t.arm!r} was not killed: the tests cannot see that bug at this size"
        )
    if low_power:
        reasons.append(f"power too low: MDE (TV) {mde:.4f} > required {max_mde_tv:.4f}")

    decision: Decision
    if null_bad or control_bad:
        decision, code = "inconclusive", ExitCode.INCONCLUSIVE
    elif cand is not None and cand.rejected:
        decision, code = "different", ExitCode.DIFFERENT
    elif unkilled or low_power:
        decision, code = "inconclusive", ExitCode.INCONCLUSIVE
    else:
        decision, code = ("equivalent" if cand is not None else "sound"), ExitCode.OK
        reasons.append(
            "no difference detected and the teeth are sound"
            if cand is not None
            else "every tooth behaved"
        )
    return Verdict(
        decision=decision,
        exit_code=code,
        reasons=tuple(reasons),
        candidate=cand,
        teeth=teeth,
        mde_tv=mde,
        max_mde_tv=max_mde_tv,
    )


# ------------------------------------------------------------------ Analysis → Comparison
def _f(x: Any) -> float | None:
    """A finite float, or None (NaN / missing) — JSON-safe."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def summarize_comparison(analysis: Any, *, arm: str, role: str, expect: str) -> Comparison:
    """Read one ``spectest.stats.analyze.Analysis`` into a ``Comparison``.

    Uses only the documented fields: ``rejected``, ``n_tested``, ``n_rejected``, ``mde_tv``,
    ``support_violation``, ``whitebox_control_failed`` and the tidy tables ``cells`` (status,
    reject, p_adj, tv_excess, mde_tv per prompt × config × position), ``trie`` (reject, p_adj
    per node) and ``whitebox`` (arm, test, reject, p_adj). ``rejections`` counts every rejected
    test of every family (cells, trie rows, the candidate's white-box tests).
    """
    cells = analysis.cells
    trie = analysis.trie
    wb = analysis.whitebox
    cand_name = analysis.candidate
    failing: list[tuple[float, str]] = []
    if len(cells):
        rej = cells[cells["reject"].astype(bool)]
        for r in rej.itertuples(index=False):
            failing.append(
                (
                    float(r.p_adj),
                    f"{r.prompt_id}/{r.config_id}@{int(r.position)} p_adj={float(r.p_adj):.3g} "
                    f"TV={float(r.tv):.3f} (null mean {float(r.tv_null_mean):.3f})",
                )
            )
    trie_rej = trie[trie["reject"].astype(bool)] if len(trie) else trie
    for r in trie_rej.itertuples(index=False) if len(trie_rej) else ():
        failing.append(
            (
                float(r.p_adj),
                f"trie {r.prompt_id}/{r.config_id} {r.kind} depth {r.depth} prefix [{r.prefix}] "
                f"p_adj={float(r.p_adj):.3g}",
            )
        )
    wb_rej = wb[(wb["arm"] == cand_name) & wb["reject"].astype(bool)] if len(wb) else wb
    for r in wb_rej.itertuples(index=False) if len(wb_rej) else ():
        if r.test == "support":
            what = f"{int(r.statistic)} emitted token(s) with target probability 0"
        else:
            what = f"p_adj={float(r.p_adj):.3g} ({r.detail})"
        failing.append((float(r.p_adj), f"white-box {r.test}: {what}"))
    failing.sort(key=lambda t: t[0])
    by_config = []
    if len(cells):
        for cid, g in cells.groupby("config_id", sort=False):
            ok = g["status"] == "ok"
            exc = g["tv_excess"].astype(float)
            where = None
            max_exc = None
            if exc.notna().any():
                i = exc.idxmax()
                max_exc = _f(exc.loc[i])
                where = f"{g.loc[i, 'prompt_id']}@{int(g.loc[i, 'position'])}"
            n_trie = int(trie_rej["config_id"].eq(cid).sum()) if len(trie_rej) else 0
            mde = g.loc[ok, "mde_tv"].astype(float).dropna()
            by_config.append(
                ConfigStats(
                    config_id=str(cid),
                    cells_tested=int(ok.sum()),
                    cells_untestable=int((~ok).sum()),
                    rejections=int(g["reject"].astype(bool).sum()) + n_trie,
                    max_tv_excess=max_exc,
                    max_tv_where=where,
                    mde_tv=_f(mde.median()) if len(mde) else None,
                )
            )
    p_adj = cells["p_adj"].astype(float) if len(cells) else None
    return Comparison(
        arm=arm,
        role=role,
        expect=expect,
        rejected=bool(analysis.rejected),
        cells_tested=int(analysis.n_tested),
        rejections=int(analysis.n_rejected) + len(trie_rej) + len(wb_rej),
        min_qvalue=_f(p_adj.min()) if p_adj is not None and p_adj.notna().any() else None,
        mde_tv=_f(analysis.mde_tv),
        failing=tuple(f for _, f in failing),
        by_config=tuple(by_config),
        control_failed=bool(analysis.whitebox_control_failed),
    )
