"""spectest's fuzzer: hostile protocols, bring-your-own files, engine replies and plug-ins, each
run through the real boundary, each outcome judged against the exit-code contract.

    python tools/fuzz.py --cases 10000 --seed 0 --out results/fuzz
    python tools/fuzz.py --replay results/fuzz/failures/protocol-00042/case.json

Owns: the driver — cases from ``tools/fuzzing`` (``make_case``: a pure function of seed, kind
and index), run in worker processes that keep torch imported (``fuzzing.worker``, one per
``--workers``, restarted every ``RESTART_EVERY`` cases, killed and restarted when a case
outlives its bound: a hang), judged by ``fuzzing.oracle``; a seeded sample re-run as a real
``python -m spectest`` subprocess to confirm that the in-process outcome is the process's; the
record of every outcome (``outcomes.jsonl``, ``summary.json``); the failing cases saved as
replayable files (``failures/<id>/case.json``, ``outcome.json`` and the case's directory as it
was left); ``--replay`` of saved cases, in-process and as a subprocess.

Knows nothing about how spectest decides (``fuzzing.oracle`` reads run directories through
``spectest.store`` only). Each worker's address space is capped (``MEMORY_LIMIT``), so a
blow-up is a ``MemoryError`` inside the case, never the machine's OOM killer.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
sys.path.insert(0, str(TOOLS))
from fuzzing import KINDS, make_case, schedule  # noqa: E402
from fuzzing.oracle import agree, error_lines, judge  # noqa: E402

DEFAULT_WEIGHTS = {
    "protocol": 0.35,
    "byo": 0.25,
    "reply": 0.3,
    "plugin": 0.06,
    "plugin_death": 0.01,
    "plugin_hang": 0.01,
    "resume": 0.01,
    "claim": 0.01,
}
WORKER_SLACK_S = 30.0  # beyond a case's bound before its worker is killed as hung
RESTART_EVERY = 400  # cases per worker process (bounds what a long run accumulates)
MEMORY_LIMIT = 8 * 2**30  # a worker's address space: a blow-up is a MemoryError, not the OOM killer
ENV = {
    "PYTHONPATH": os.pathsep.join([str(ROOT), str(TOOLS), os.environ.get("PYTHONPATH", "")]),
    "OMP_NUM_THREADS": "1",
    "SPECTEST_NO_PROGRESS": "1",
    "PYTHONHASHSEED": "0",
}


# ----------------------------------------------------------------------------- running cases
def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _no_outcome(t0: float, **why: Any) -> dict[str, Any]:
    """The observation of a case the worker never answered: no exit, the wall time, and why."""
    empty = {"exit": None, "stdout": "", "stderr": "", "exception": None}
    return {**empty, "wall": time.monotonic() - t0, **why}


class Worker:
    """One ``fuzzing.worker`` process; ``run`` sends a case and waits for its report until the
    case's bound plus ``WORKER_SLACK_S``, killing the process when it outlives that."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.served = 0

    def start(self) -> None:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fuzzing.worker",
                "--requests-fd",
                str(req_r),
                "--reports-fd",
                str(rep_w),
                "--log",
                str(self.log),
            ],
            pass_fds=(req_r, rep_w),
            env={**os.environ, **ENV},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_limit_memory,
            start_new_session=True,
        )
        os.close(req_r)
        os.close(rep_w)
        self.requests = os.fdopen(req_w, "w", encoding="utf-8", buffering=1)
        self.reports = os.fdopen(rep_r, "r", encoding="utf-8")
        self.served = 0
        ready = self._read(600.0)
        if ready is None or not ready.get("ready"):
            raise RuntimeError(f"the fuzz worker did not start; see {self.log}")

    def _read(self, timeout: float) -> dict[str, Any] | None:
        import select

        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([self.reports], [], [], left)
            if r:
                line = self.reports.readline()
                if not line:
                    raise EOFError("the fuzz worker died")
                return json.loads(line)

    def stop(self) -> None:
        if self.proc is not None:
            import signal

            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            for f in (self.requests, self.reports):
                try:
                    f.close()
                except OSError:
                    pass
            self.proc = None

    def run(self, case: dict[str, Any], d: Path) -> dict[str, Any]:
        if self.proc is None or self.served >= RESTART_EVERY:
            self.stop()
            self.start()
        self.served += 1
        t0 = time.monotonic()
        try:
            self.requests.write(json.dumps({"case": case, "dir": str(d)}) + "\n")
            rep = self._read(case["bound_s"] + WORKER_SLACK_S)
        except (EOFError, BrokenPipeError, OSError) as err:
            self.stop()
            why = f"the worker process died during the case ({err}): a crash, an os._exit or "
            why += "the OOM killer"
            return _no_outcome(t0, harness_error=why)
        if rep is None:
            self.stop()
            return _no_outcome(t0, hung=True)
        return rep


def run_subprocess(case: dict[str, Any], d: Path) -> dict[str, Any]:
    """The case as a real ``python -m spectest`` process (command-line cases only)."""
    from fuzzing.worker import expand, materialize

    materialize(case, d)
    t0 = time.monotonic()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "spectest", *expand(case["argv"], d)],
            cwd=d,
            env={**os.environ, **ENV},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=case["bound_s"] + WORKER_SLACK_S,
            preexec_fn=_limit_memory,
        )
    except subprocess.TimeoutExpired:
        return {
            "exit": None,
            "stdout": "",
            "stderr": "",
            "exception": None,
            "wall": time.monotonic() - t0,
            "hung": True,
        }
    return {
        "exit": p.returncode,
        "stdout": p.stdout.decode("utf-8", "replace")[-20_000:],
        "stderr": p.stderr.decode("utf-8", "replace")[-20_000:],
        "exception": None,
        "wall": time.monotonic() - t0,
    }


@dataclass
class Tally:
    cases: Counter[str] = field(default_factory=Counter)
    exits: dict[str, Counter[str]] = field(default_factory=dict)
    unclean: list[dict[str, Any]] = field(default_factory=list)
    notes: list[dict[str, Any]] = field(default_factory=list)
    subprocess_runs: int = 0
    subprocess_agree: int = 0


def save_failure(
    out: Path, case: dict[str, Any], obs: dict[str, Any], d: Path, problems: list[str]
) -> Path:
    dest = out / "failures" / case["id"]
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    (dest / "case.json").write_text(json.dumps(case, indent=1))
    (dest / "outcome.json").write_text(json.dumps({"problems": problems, "obs": obs}, indent=1))
    if d.is_dir():
        shutil.copytree(
            d,
            dest / "dir",
            symlinks=True,
            ignore_dangling_symlinks=True,
            ignore=lambda p, names: [n for n in names if Path(p, n).is_fifo()],
        )
    return dest


def _one_case(
    case: dict[str, Any], worker: Worker, work: Path, sub_pick: bool, keep: bool
) -> tuple[dict[str, Any], list[str], list[str], dict[str, Any] | None, Path]:
    """Run, judge and (when ``sub_pick``) re-run one case as a subprocess."""
    d = work / "cases" / case["id"]
    # a case that ends or hangs its process runs only as a real process (not in the worker)
    obs = run_subprocess(case, d) if case.get("process_only") else worker.run(case, d)
    problems = judge(case, obs, d)
    notes: list[str] = []
    sub = None
    if case["mode"] == "cli" and sub_pick and not case.get("process_only"):
        ds = work / "sub" / case["id"]
        sub = run_subprocess(case, ds)
        problems += [f"(subprocess) {p}" for p in judge(case, sub, ds)]
        ap, notes = agree(case, obs, d, sub, ds)
        problems += ap
        if not keep:
            shutil.rmtree(ds, ignore_errors=True)
    return obs, problems, notes, sub, d


def _record(
    case: dict[str, Any], obs: dict[str, Any], problems: list[str], sub: dict[str, Any] | None
) -> dict[str, Any]:
    """A case's line of outcomes.jsonl."""
    return {
        "id": case["id"],
        "kind": case["kind"],
        "mode": case["mode"],
        "exit": obs["exit"],
        "wall": round(obs["wall"], 3),
        "problems": problems,
        "notes": case["notes"],
        "subprocess_exit": None if sub is None else sub["exit"],
        "error": (error_lines(obs.get("stderr") or "") or [""])[0][:300],
    }


def _count(
    tally: Tally,
    case: dict[str, Any],
    obs: dict[str, Any],
    problems: list[str],
    notes: list[str],
    sub: dict[str, Any] | None,
    saved: Path | None,
) -> None:
    """A judged case into the tally (exits by kind, subprocess agreement, unclean, notes)."""
    kind = case["kind"]
    tally.cases[kind] += 1
    label = "hang" if obs.get("hung") else str(obs["exit"])
    tally.exits.setdefault(kind, Counter())[label] += 1
    if sub is not None:
        tally.subprocess_runs += 1
        tally.subprocess_agree += not any(p.startswith("oracle") for p in problems)
    if problems:
        tally.unclean.append({"id": case["id"], "problems": problems, "saved": str(saved)})
        print(f"UNCLEAN {case['id']}: {problems[0][:200]}", flush=True)
    if notes:
        tally.notes.append({"id": case["id"], "notes": notes})


def _keep_outcome(
    out: Path,
    case: dict[str, Any],
    obs: dict[str, Any],
    problems: list[str],
    sub: dict[str, Any] | None,
    d: Path,
    keep: bool,
) -> tuple[dict[str, Any], Path | None]:
    """The case's outcome record and where an unclean case was saved (None: clean); the case's
    directory is removed unless ``keep``."""
    rec = _record(case, obs, problems, sub)
    saved = save_failure(out, case, obs, d, problems) if problems else None
    if not keep:
        shutil.rmtree(d, ignore_errors=True)
    return rec, saved


def _progress(done: int, n: int, elapsed_s: float, tally: Tally) -> None:
    print(
        f"{done}/{n} cases, {elapsed_s:.0f} s, unclean {len(tally.unclean)}, "
        f"subprocess {tally.subprocess_agree}/{tally.subprocess_runs} agree",
        flush=True,
    )


def run_cases(
    cases: list[dict[str, Any]],
    out: Path,
    *,
    subprocess_rate: float = 0.0,
    seed: int = 0,
    workers: int = 1,
    log_every: int = 100,
    keep: bool = False,
) -> Tally:
    """Run ``cases`` in ``workers`` worker processes (one thread each feeds its worker), judge
    each, re-run a seeded sample as subprocesses. Which cases are re-run is decided up front,
    so it does not depend on the order in which the workers finish."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="spectest-fuzz-"))
    tally = Tally()
    pick = random.Random(f"{seed}/subprocess")
    subs = [pick.random() < subprocess_rate for _ in cases]
    pool_workers = [Worker(out / f"worker{i}.log") for i in range(workers)]
    free = list(pool_workers)
    lock = threading.Lock()
    t_start = time.monotonic()
    done = 0
    outcomes = open(out / "outcomes.jsonl", "w", encoding="utf-8")

    def task(i: int) -> None:
        nonlocal done
        case = cases[i]
        with lock:
            worker = free.pop()
        try:
            obs, problems, notes, sub, d = _one_case(case, worker, work, subs[i], keep)
        finally:
            with lock:
                free.append(worker)
        rec, saved = _keep_outcome(out, case, obs, problems, sub, d, keep)
        with lock:
            _count(tally, case, obs, problems, notes, sub, saved)
            outcomes.write(json.dumps(rec) + "\n")
            outcomes.flush()
            done += 1
            if log_every and done % log_every == 0:
                _progress(done, len(cases), time.monotonic() - t_start, tally)

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for f in [pool.submit(task, i) for i in range(len(cases))]:
                f.result()
    finally:
        for w in pool_workers:
            w.stop()
        outcomes.close()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    tally.unclean.sort(key=lambda u: u["id"])
    return tally


def generate(seed: int, n: int, start: int, weights: dict[str, float]) -> list[dict[str, Any]]:
    kinds = schedule(seed, start + n, weights)[start:]
    counters: Counter[str] = Counter(schedule(seed, start + n, weights)[:start])
    cases = []
    for kind in kinds:
        cases.append(make_case(seed, counters[kind], kind))
        counters[kind] += 1
    return cases


def parse_weights(text: str) -> dict[str, float]:
    out = {}
    for part in text.split(","):
        k, _, v = part.partition("=")
        if k not in KINDS:
            raise SystemExit(f"--kinds: unknown kind {k!r} (one of {', '.join(KINDS)})")
        out[k] = float(v or 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--start", type=int, default=0, help="skip the first START cases of the schedule"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "fuzz")
    ap.add_argument(
        "--kinds",
        type=parse_weights,
        default=DEFAULT_WEIGHTS,
        help="weights, e.g. protocol=4,byo=2.5,reply=2.5,plugin=1",
    )
    ap.add_argument(
        "--subprocess-rate",
        type=float,
        default=0.01,
        help="share of command-line cases re-run as a real process",
    )
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--keep", action="store_true", help="keep every case's directory")
    ap.add_argument("--replay", type=Path, nargs="*", help="case.json files to run again")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    if a.replay:
        cases = [json.loads(p.read_text()) for p in a.replay]
        tally = run_cases(cases, a.out / "replay", subprocess_rate=1.0, keep=True, log_every=0)
        for c in cases:
            print(c["id"], "notes:", c["notes"])
        for u in tally.unclean:
            print(u["id"], u["problems"])
        print(f"{len(cases)} replayed, {len(tally.unclean)} unclean")
        return 1 if tally.unclean else 0
    cases = generate(a.seed, a.cases, a.start, a.kinds)
    tally = run_cases(
        cases, a.out, subprocess_rate=a.subprocess_rate, seed=a.seed, workers=a.workers
    )
    wall = time.monotonic() - t0
    summary = {
        "command": " ".join(["python", "tools/fuzz.py", *(argv or sys.argv[1:])]),
        "seed": a.seed,
        "start": a.start,
        "workers": a.workers,
        "cases": dict(tally.cases),
        "exits": {k: dict(v) for k, v in tally.exits.items()},
        "wall_s": round(wall, 1),
        "unclean": tally.unclean,
        "subprocess_runs": tally.subprocess_runs,
        "subprocess_agree": tally.subprocess_agree,
        "notes": tally.notes[:200],
    }
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k not in ("unclean", "notes")}))
    print(f"unclean: {len(tally.unclean)} of {sum(tally.cases.values())} cases")
    return 1 if tally.unclean else 0


if __name__ == "__main__":
    sys.exit(main())
