"""Time a stored run's report rendering by part (imports, sections, report.md, report.html with
its figures) in CPU seconds, for two checkouts side by side: each checkout renders the same run
in a fresh process, alternating, ``--reps`` times; one JSON line per render.

    python tools/bench_report.py RUN_DIR --before /work/main --after . --reps 3 \
        --out results/bench/issue32_h82_report.jsonl

Nothing is written into RUN_DIR (the views are rendered in memory).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

# run in the child, from the checkout's root (its spectest first on sys.path)
_CHILD = r"""
import json, os, sys, time
t = time.process_time
t0 = t()
import spectest
from spectest.report.html import render_html
from spectest.report.markdown import render_markdown
from spectest.report.sections import build
from spectest.stored import load_run
t1 = t()
stored = load_run(sys.argv[1], require_manifest=False)
shared = "sections" in render_html.__code__.co_varnames  # a checkout that builds them once
secs = build(stored) if shared else None
t2 = t()
md = render_markdown(stored, secs) if shared else render_markdown(stored)
t3 = t()
html = render_html(stored, secs) if shared else render_html(stored)
t4 = t()
print(json.dumps({"spectest": os.path.dirname(spectest.__file__), "import_s": t1 - t0,
    "sections_s": t2 - t1, "markdown_s": t3 - t2, "html_s": t4 - t3, "render_s": t4 - t1,
    "md_chars": len(md), "html_chars": len(html), "pngs": html.count("data:image/png")}))
"""


def render_once(checkout: Path, run_dir: Path) -> dict[str, object]:
    """One render of ``run_dir`` by ``checkout``'s spectest in a fresh process, its times."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(run_dir)],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    row = json.loads(out.stdout.strip().splitlines()[-1])
    sha = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    row["git"] = sha + ("+dirty" if _dirty(checkout) else "")
    if not str(row["spectest"]).startswith(str(checkout)):
        raise SystemExit(f"{checkout}: imported spectest from {row['spectest']}")
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}


def _dirty(checkout: Path) -> bool:
    """Whether ``checkout``'s spectest/ differs from its HEAD (the row's sha would mislead)."""
    r = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "spectest"],
                       capture_output=True, text=True, check=False)  # fmt: skip
    return bool(r.stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    for rep in range(args.reps):
        for side, checkout in (("before", args.before), ("after", args.after)):
            row = {"bench": "report", "side": side, "rep": rep, "run_dir": str(args.run_dir)}
            row |= render_once(checkout.resolve(), args.run_dir.resolve())
            line = json.dumps(row)
            print(line, flush=True)
            if args.out is not None:
                with args.out.open("a", encoding="utf-8") as f:
                    f.write(line + "\n")


if __name__ == "__main__":
    main()
