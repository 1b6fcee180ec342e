"""The reported-p family's readouts (``stats.reported_p``): its notes, its verdict line, the
words for tokens left out and the line that leaves claim (a) unresolved, all from the numbers
``reported_p`` keeps for summary.json. Knows no statistics, files or engines.
docs/engines-reported-p.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from spectest.stats.families import Failure


def notes(numbers: dict[str, Any], tol: float, floor: float) -> tuple[str, ...]:
    """The family's notes: per arm the tokens reported (and left out, and outside the top-n
    lists), and the cross-check's tolerance beside the floor measured on the reference."""
    out = []
    for who in ("reference", "candidate"):
        n = numbers.get(f"reported_{who}_tokens")
        if n is None:
            continue
        k = numbers[f"reported_{who}_tokens_with_p"]
        line = f"reported p ({who}): {k} of {n} tokens reported"
        if numbers[f"reported_{who}_left_out"]:
            line += f"; {left_out_words(numbers, who)}"
        if numbers.get(f"reported_{who}_mass_outside_mean") is not None:
            mean = numbers[f"reported_{who}_mass_outside_mean"]
            frac = numbers[f"reported_{who}_outside_fraction"]
            line += (
                f"; top-n lists: mass outside the list {mean:.4f} on average, {frac:.2%} of "
                "tokens fell outside it (tested as the coarsened law's rest outcome)"
            )
        out.append(line)
    fl = "not measured (the reference reports no p)" if not np.isfinite(floor) else f"{floor:.3g}"
    out.append(
        f"reported-p cross-check with the teacher: tolerance {tol:.3g} per token "
        f"(floor measured on the reference: {fl}); approximate, not a test at α"
    )
    return tuple(out)


def verdict_line(mine: pd.DataFrame, failing: tuple[Failure, ...], numbers: dict[str, Any]) -> str:
    """The line every verdict output prints for claim (a) from the reported p (``mine``: the
    candidate's rows of the family's table)."""
    n = numbers.get("reported_candidate_tokens_with_p", 0)
    pits = mine[mine["test"].str.startswith(("pit_", "slot_"))] if len(mine) else mine
    head = "differs" if failing else "no difference found"
    what = (
        f"support and PIT on {n} tokens ({len(pits)} tests, exact given the reported law)"
        if len(pits)
        else f"support only on {n} tokens (no PIT: cdf_lo not reported)"
    )
    if (mine["test"] == "crosscheck_teacher").any():
        what += " + cross-check with the teacher (approximate)"
    total = numbers.get("reported_candidate_tokens", 0)
    left = numbers.get("reported_candidate_left_out", 0)
    if n + left < total:
        what += f"; {total - n - left} of {total} tokens not reported"
    if left:
        what += f"; {left_out_words(numbers, 'candidate')}"
    mean = numbers.get("reported_candidate_mass_outside_mean")
    if mean is not None:
        frac = numbers["reported_candidate_outside_fraction"]
        what += f"; top-n lists: mass outside {mean:.3g} on average, {frac:.1%} of tokens outside"
    return f"claim (a) from engine-reported p: {head} — {what}"


def left_out_words(numbers: dict[str, Any], who: str) -> str:
    """How many of ``who``'s tokens were left out (their list does not fix the law) and their
    share of its tokens."""
    left, share = numbers[f"reported_{who}_left_out"], numbers[f"reported_{who}_left_out_share"]
    total = numbers[f"reported_{who}_tokens"]
    return (
        f"{left} of {total} tokens left out ({share:.2%}: a top-n list that does not fix the "
        "law, the normaliser's bracket straddling the nucleus's cut; the rest stay exact)"
    )


def unresolved_why(numbers: dict[str, Any], bound: float) -> str:
    """The line that makes claim (a) unresolved: the candidate's left-out share above ``bound``
    (``tests.left_out_max``); "" when within it."""
    share = numbers.get("reported_candidate_left_out_share", 0.0)
    if not share > bound:
        return ""
    return (
        f"claim (a) from engine-reported p unresolved: {left_out_words(numbers, 'candidate')}, "
        f"more than tests.left_out_max {bound:.2%} of the candidate's tokens (ask a longer list)"
    )
