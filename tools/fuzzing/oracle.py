"""The fuzzer's oracle: is one outcome clean?

Owns: ``judge`` (the unclean things about an outcome: a traceback — an exception that escaped
the boundary, or the text of one on stdout / stderr —; an exit code outside {0, 1, 2, 3, 4, 130,
143}; an exit 1 that is not a verdict — 1 must come with a complete run directory whose summary
says ``different`` —; an exit 0 / 1 / 3 without a complete run directory — manifest present
and verified by ``spectest.stored.load_run``, summary complete, the summary's exit code the
process's —; a run directory presented as complete after an exit 2 / 4, or a summary that says
complete with no manifest; an error (exit 2 / 4) that is not exactly one ``error:`` line on
stderr, or that says "internal error", a bug in spectest by its own words; a wall time past the
case's bound — its stated timeout where it has one — or a case killed for outliving it, a hang;
an exit code the case does not allow, ``expect``: a valid input must give a verdict, a kernel
that raises must be exit 2), and ``agree`` (the in-process outcome against the same case run
as a real ``python -m spectest`` process: the same exit code; stderr lines compared after
normalising paths, hashes and durations, differences noted).

Knows nothing about how spectest decides: it reads run directories through ``spectest.store``
and ``summary.json`` only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from fuzzing.common import PLUGIN_MARK

DOCUMENTED = {0, 1, 2, 3, 4, 130, 143}
INFO_LINES = ("using the shipped protocol ",)  # stderr lines spectest prints on success too


def error_lines(stderr: str) -> list[str]:
    """stderr's lines that are spectest's: blank lines, the documented informational lines and a
    plug-in's own prints (marked ``PLUGIN_MARK``) left out."""
    return [
        ln
        for ln in stderr.splitlines()
        if ln.strip() and not ln.startswith(INFO_LINES) and PLUGIN_MARK not in ln
    ]


def _run_dir_state(run: Path | None) -> tuple[str, dict[str, Any] | None]:
    """("absent" | "incomplete" | "complete" | "broken: why", the summary when complete)."""
    from spectest.errors import SpectestError
    from spectest.store import MANIFEST, SUMMARY
    from spectest.stored import load_run

    if run is None or not run.is_dir():
        return "absent", None
    if not (run / MANIFEST).exists():
        if (run / SUMMARY).is_file():
            try:
                s = json.loads((run / SUMMARY).read_text())
            except ValueError:
                return "incomplete", None
            if isinstance(s, dict) and s.get("complete") is True:
                return "broken: summary.json says complete but there is no manifest", None
        return "incomplete", None
    try:
        stored = load_run(run)
    except SpectestError as err:
        return f"broken: {str(err)[:200]}", None
    return "complete", stored.summary


def judge(case: dict[str, Any], obs: dict[str, Any], d: Path) -> list[str]:
    """The unclean things about one outcome (empty: clean)."""
    problems: list[str] = []
    if obs.get("harness_error"):
        return [f"harness error (a fuzzer bug): {obs['harness_error'][-300:]}"]
    if obs.get("hung"):
        return [
            f"hang: still running {obs['wall']:.0f} s after the start "
            f"(bound {case['bound_s']:.0f} s)"
        ]
    code = obs["exit"]
    if obs.get("exception"):
        problems.append(f"traceback: an exception escaped: {obs['exception'].strip()[-400:]}")
    text = (obs.get("stdout") or "") + (obs.get("stderr") or "")
    if "Traceback (most recent call last)" in text:
        problems.append("traceback text on stdout/stderr")
    if code not in DOCUMENTED:
        problems.append(f"exit {code}: outside the documented codes {sorted(DOCUMENTED)}")
    if obs["wall"] > case["bound_s"]:
        problems.append(f"slow: {obs['wall']:.1f} s past the bound {case['bound_s']:.1f} s")
    lines = error_lines(obs.get("stderr") or "")
    if code in (2, 4):
        if len(lines) != 1 or not lines[0].startswith("error: "):
            shown = " | ".join(lines)[:300]
            problems.append(
                f"exit {code} with {len(lines)} stderr line(s), not one 'error:': {shown!r}"
            )
        if any("internal error" in ln for ln in lines):
            problems.append(f"exit {code} is an internal error: {lines[0][:300]!r}")
    if case["mode"] in ("cli", "resume") and case.get("out") is not None and code in DOCUMENTED:
        problems += _run_dir_checks(d / case["out"], code)
    elif code == 1:  # no run directory to hold a verdict (an engine case): 1 is never right
        problems.append("exit 1 that is not a verdict (no run directory)")
    if case.get("process_only"):
        problems += _process_checks(case, code, lines, d)
    problems += judge_claim(d / case["out"]) if case.get("out") and code in (0, 1, 3) else []
    problems += judge_resume(case, obs, d) if case["mode"] == "resume" else []
    if case.get("expect") is not None and code in DOCUMENTED and code not in case["expect"]:
        why = lines[0][:200] if lines else ""
        problems.append(f"exit {code}, expected one of {case['expect']}: {why!r}")
    return problems


def _run_dir_checks(run: Path, code: int) -> list[str]:
    """A run directory matches its exit: complete with summary.json's verdict on 0/1/3 (and 1
    only as "different"), never broken, never complete on 2/4."""
    problems: list[str] = []
    state, summary = _run_dir_state(run)
    if state.startswith("broken"):
        problems.append(f"run directory {state}")
    if code in (0, 1, 3):
        if state != "complete":
            problems.append(f"exit {code} without a complete run directory ({state})")
        elif summary is not None:
            verdict = summary.get("verdict") or {}
            if verdict.get("exit_code") != code:
                problems.append(
                    f"exit {code} but summary.json's verdict says {verdict.get('exit_code')!r}"
                )
            if code == 1 and verdict.get("decision") != "different":
                problems.append(
                    f"exit 1 that is not a verdict: decision {verdict.get('decision')!r}"
                )
    elif code in (2, 4) and state == "complete":
        problems.append(f"exit {code} but the run directory is complete (presented as a result)")
    return problems


def _process_checks(case: dict[str, Any], code: int, lines: list[str], d: Path) -> list[str]:
    """A case run as a real process (a plug-in that dies or hangs): its exit 2 names what the
    case did (``expect_error``), the run directory's lock is free and no process it started
    is left (its directory in no live command line)."""
    import fcntl
    import os

    problems = []
    want = case.get("expect_error")
    if want and code == 2 and lines and want not in lines[0]:
        problems.append(f"exit 2 whose line does not say {want!r}: {lines[0][:200]!r}")
    lock = d / (case.get("out") or "run") / ".lock"
    if lock.exists():
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            problems.append("the run directory's lock is still held after the process ended")
        finally:
            os.close(fd)
    mark = str(d).encode()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (
                mark in (proc / "cmdline").read_bytes() or os.readlink(proc / "cwd") == str(d)
            ):
                problems.append(f"an orphan process is left: pid {proc.name}")
        except OSError:
            continue
    return problems


def judge_claim(run: Path) -> list[str]:
    """Issue 33.3 / 34.1 on any verdict: an exit 0 with a candidate rests on a known per-cell
    MDE within the requirement with cell-positions tested — never on a tooth's size — and a
    tooth killed by the support check alone says so in its label."""
    try:
        s = json.loads((run / "summary.json").read_text())
    except (OSError, ValueError):
        return []
    v, problems = s.get("verdict") or {}, []
    claim, scope = v.get("power_claim") or {}, v.get("scope") or {}
    if v.get("decision") == "equivalent":
        tv, req = claim.get("tv"), v.get("max_mde_tv")
        if claim.get("source") != "mde" or tv is None or req is None or tv > req:
            problems.append(f"exit 0 on a power claim that is not an MDE within {req}: {claim}")
        if not scope.get("cells_tested"):
            problems.append("exit 0 with no cell-position tested (no power claim)")
    if "as the killed tooth" in str(v.get("headline")):
        problems.append(f"a headline claims by a tooth: {v.get('headline')!r}")
    for t in v.get("teeth") or []:
        if t.get("support_only") and "support check only" not in str(t.get("label")):
            problems.append(
                f"tooth {t.get('arm')} killed by support only, label {t.get('label')!r}"
            )
    return problems


def judge_resume(case: dict[str, Any], obs: dict[str, Any], d: Path) -> list[str]:
    """Issue 33.2: what the second run of a ``resume`` case must do (``expect_resume``)."""
    from fuzzing.provenance import expect_resume

    if obs.get("first_exit") not in (0, 1, 3):
        return []  # the first run gave no verdict: nothing to resume from
    want, code = expect_resume(case["edit"]["op"]), obs["exit"]
    try:
        notes = json.loads((d / case["out"] / "summary.json").read_text()).get("notes") or []
    except (OSError, ValueError):
        notes = []
    regen = any(str(n).startswith("provenance: arm 'candidate'") for n in notes)
    if want == "refuse" and obs.get("touched"):
        err = " ".join(error_lines(obs.get("stderr") or ""))
        if code != 2 or obs["touched"] not in err:
            return [f"a rewritten shard was not refused naming it: exit {code}, {err[:200]!r}"]
    elif want == "regenerate":
        if code not in (0, 1, 3) or not regen:
            return [f"an edited kernel did not regenerate its arm: exit {code}, notes {notes}"]
        if any(str(n).startswith("shards: 0 generated") for n in notes):
            return [f"an edited kernel resumed every shard: {notes}"]
    elif want == "resume" and (regen or code != obs["first_exit"]):
        return [f"an unchanged kernel: exit {code} (first {obs['first_exit']}), notes {notes}"]
    return []


_NORMALISE = [
    (re.compile(r"spectest_kernel_[0-9a-f]{12}"), "spectest_kernel_<hash>"),
    (re.compile(r"/tmp/[^\s'\"]*?/(cases|sub)/[a-z]+-\d{5}"), "<dir>"),
    (re.compile(r"\d+(\.\d+)? s\b"), "<t> s"),
    (re.compile(r"pid \d+"), "pid <n>"),
]


def normalise(line: str, d: Path) -> str:
    line = line.replace(str(d), "<dir>")
    for rx, rep in _NORMALISE:
        line = rx.sub(rep, line)
    return line


def agree(
    case: dict[str, Any], a: dict[str, Any], da: Path, b: dict[str, Any], db: Path
) -> tuple[list[str], list[str]]:
    """(problems, notes) of the in-process outcome ``a`` against the subprocess outcome ``b``."""
    if a.get("hung") or b.get("hung"):
        return [], []
    problems, notes = [], []
    if a["exit"] != b["exit"]:
        problems.append(
            f"oracle disagreement: in-process exit {a['exit']}, subprocess exit {b['exit']}"
        )
    la = [normalise(x, da) for x in error_lines(a.get("stderr") or "")]
    lb = [normalise(x, db) for x in error_lines(b.get("stderr") or "")]
    if la != lb and not case.get("nondeterministic"):
        notes.append(f"stderr differs: {la[:1]!r} vs {lb[:1]!r}")
    return problems, notes
