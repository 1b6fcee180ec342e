"""Issue 19, the hostile CI user: plug-ins and ids that tried to take over the exit code
(section 2), integrity bypassed then laundered by ``report`` (3), security (6: remote code,
report.md / JUnit injection) and disk-full messages that named no file (7). Each situation is
the issue's exact input, run as a real ``python -m spectest`` subprocess wherever the process's
exit code is the point (a ``sys.exit`` inside the process is exactly what an in-process runner
would hide).

Before this module's fixes (results/LOG.md, 2026-12-01 h15): a kernel's ``sys.exit(0)`` ended
the run with exit 0 and no output, ``SystemExit(1)`` with 1, ``KeyboardInterrupt`` with 130, an
``argparse`` at import printed its own usage (2); a BYO ``config_id`` of ``[/]`` crashed rich
after the run was complete (exit 4 while summary.json said 3); a deleted manifest entry let
``analyze`` accept edited samples and ``report`` bless them; ``hf-local`` with ``auto_map`` ran
the directory's code on a ``y``; report.md passed ``<script>`` through and the JUnit file did
not parse; ENOSPC said "error: No space left on device" without the file.

Nothing here is statistical except where a docstring states the outcome's (fixed-seed)
reason: the toy runs have teeth off and only their exit path matters.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from toy_protocol import write_toy

from spectest.report.escape import md_code, md_text, one_line, printable, xml_text
from spectest.store import MANIFEST, SAMPLES, SUMMARY, TESTS

ROOT = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    "OMP_NUM_THREADS": "1",
    "SPECTEST_NO_PROGRESS": "1",
}
ZIPF = np.array([1 / k for k in range(1, 9)]) / sum(1 / k for k in range(1, 9))
NO_TEETH = {"null_arm": False, "epsilons": [], "mutants": []}


def spectest(
    *args: object, cwd: Path, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spectest", *map(str, args)],
        cwd=cwd, env={**ENV, **(env or {})}, capture_output=True, text=True, timeout=600,
        input=stdin,
    )  # fmt: skip


def one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def stored_summary(run: Path) -> dict:
    return json.loads((run / SUMMARY).read_text())


def byo(
    path: Path, seeds: range, ids: list[tuple[str, str]], probs: np.ndarray = ZIPF, T: int = 2
) -> Path:
    rng = np.random.default_rng(seeds.start)
    rows = [
        (pid, cid, s, t, int(rng.choice(len(probs), p=probs)))
        for pid, cid in ids
        for s in seeds
        for t in range(T)
    ]
    cols = ["prompt_id", "config_id", "seed", "position", "token_id"]
    pd.DataFrame(rows, columns=cols).to_parquet(path, index=False)
    return path


# ----------------------------------------------------------------------------- 2. plug-ins
KERNEL_BODY = {
    "exit0": "sys.exit(0)",
    "exit1": "sys.exit(1)",
    "systemexit_str": "raise SystemExit('bye')",
    "keyboardinterrupt": "raise KeyboardInterrupt",
    "generatorexit": "raise GeneratorExit",
}
IMPORT_BODY = {
    **KERNEL_BODY,
    "argparse": "import argparse\n"
    "p = argparse.ArgumentParser()\np.add_argument('--must', required=True)\np.parse_args()",
}


def hostile_kernel(d: Path, *, at_import: str = "", in_call: str = "") -> Path:
    """A kernel file in the acceptor contract's shape whose import or call escapes."""
    f = d / "hostile_kernel.py"
    f.write_text(
        "import sys\n"
        + (at_import + "\n" if at_import else "")
        + "def accept(draft_probs, draft_token_ids, uniforms, target_probs):\n"
        + textwrap.indent(in_call or "raise RuntimeError('unreachable')", "    ")
        + "\n"
    )
    return f


def toy_run(d: Path, candidate: str, *extra: object) -> subprocess.CompletedProcess[str]:
    proto = write_toy(d / "proto", teeth=NO_TEETH, seeds={"per_arm": 20}, positions=2)
    return spectest(
        "run", "--config", proto, "--out", d / "run", "--set", f"candidate={candidate}",
        "--no-progress", *extra, cwd=d,
    )  # fmt: skip


def assert_no_result(run: Path) -> None:
    """Nothing half-written is presented as a result: no manifest, no complete summary."""
    assert not (run / MANIFEST).exists()
    if (run / SUMMARY).exists():
        assert stored_summary(run)["complete"] is False


@pytest.mark.parametrize("case", sorted(KERNEL_BODY))
def test_kernel_that_exits_or_interrupts_is_exit_2_naming_it(tmp_path: Path, case: str) -> None:
    f = hostile_kernel(tmp_path, in_call=KERNEL_BODY[case])
    r = toy_run(tmp_path, f"acceptor:{f}:accept")
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    line = one_error_line(r)
    assert line.startswith(f"error: acceptor {f}:accept: the kernel "), line
    want = {
        "exit0": "called sys.exit(0) (SystemExit)",
        "exit1": "called sys.exit(1) (SystemExit)",
        "systemexit_str": "called sys.exit('bye') (SystemExit)",
        "keyboardinterrupt": "raised KeyboardInterrupt (no Ctrl-C was pressed)",
        "generatorexit": "raised GeneratorExit",
    }[case]
    assert want in line, line
    assert r.stdout == ""
    assert_no_result(tmp_path / "run")


@pytest.mark.parametrize("case", sorted(IMPORT_BODY))
def test_kernel_that_exits_at_import_is_exit_2_naming_it(tmp_path: Path, case: str) -> None:
    f = hostile_kernel(tmp_path, at_import=IMPORT_BODY[case])
    r = toy_run(tmp_path, f"acceptor:{f}:accept")
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    line = one_error_line(r)  # argparse's usage text is held, not printed beside it
    assert line.startswith(f"error: acceptor {f}:accept: cannot import the kernel ("), line
    if case == "argparse":
        assert "called sys.exit(2) (SystemExit)" in line
        assert "it printed " in line and "the following arguments are required: --must" in line
    assert "usage:" not in r.stderr
    assert_no_result(tmp_path / "run")


def test_kernel_interrupt_is_exit_2_when_sigint_is_ignored(tmp_path: Path) -> None:
    """Started as a background job (bash gives ``cmd &`` SIGINT ignored; ``nohup`` too), no
    Ctrl-C can arrive, so a kernel's ``KeyboardInterrupt`` is still the kernel's: exit 2 naming
    it, never 130. Found by tools/fuzz.py, whose workers ran as such a job."""
    f = hostile_kernel(tmp_path, in_call=KERNEL_BODY["keyboardinterrupt"])
    proto = write_toy(tmp_path / "proto", teeth=NO_TEETH, seeds={"per_arm": 20}, positions=2)
    r = subprocess.run(
        [sys.executable, "-m", "spectest", "run", "--config", str(proto), "--out",
         str(tmp_path / "run"), "--set", f"candidate=acceptor:{f}:accept", "--no-progress"],
        cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    line = one_error_line(r)
    assert "raised KeyboardInterrupt (no Ctrl-C was pressed)" in line, line
    assert_no_result(tmp_path / "run")


def test_the_users_ctrl_c_is_still_130(tmp_path: Path) -> None:
    """A real SIGINT while the kernel runs is the user's: 130, completed shards kept."""
    started = tmp_path / "started"
    f = hostile_kernel(
        tmp_path,
        in_call=f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(120)",
    )
    proto = write_toy(tmp_path / "proto", teeth=NO_TEETH, seeds={"per_arm": 20}, positions=2)
    p = subprocess.Popen(
        [sys.executable, "-m", "spectest", "run", "--config", str(proto), "--out",
         str(tmp_path / "run"), "--set", f"candidate=acceptor:{f}:accept", "--no-progress"],
        cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # SIGINT as a terminal's foreground process has it, even where the test runner was
        # started as a background job (SIGINT ignored, inherited: the SIGINT below would be
        # ignored and the test time out, as it did under `nohup bash .ci/run &`)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not started.exists():
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    # below the kernel's 120 s sleep, so an ignored SIGINT still fails here; 60 s timed out
    # once in a fresh-clone CI run beside two fuzz workers and a compiler (load ~10)
    out, err = p.communicate(timeout=110)
    assert p.returncode == 130, (out, err)
    assert err.strip() == "interrupted: completed shards are kept; re-run to resume"


ENGINE_MODULE = """
import sys
from dataclasses import dataclass

from spectest.engines.base import Engine

MODE = {mode!r}
if MODE == "import":
    sys.exit(0)


class Hostile(Engine):
    name = "hostile"
    needs = "target"
    whitebox = "none"
    rounds = "none"

    @dataclass(frozen=True)
    class Options:
        pass

    def __init__(self, options, models):
        super().__init__(options, models)
        if MODE == "init":
            raise KeyboardInterrupt

    def generate(self, job):
        if MODE == "generate":
            sys.exit(0)
        raise RuntimeError("unreachable")
"""


def _engine_distribution(root: Path, mode: str) -> Path:
    """A real installed distribution on a path entry (dist-info + entry_points.txt)."""
    (root / "hostile_engine").mkdir(parents=True)
    (root / "hostile_engine" / "__init__.py").write_text(ENGINE_MODULE.format(mode=mode))
    info = root / "hostile_engine-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hostile-engine\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[spectest.engines]\nhostile = hostile_engine:Hostile\n")
    return root


@pytest.mark.parametrize("mode", ["import", "init", "generate"])
def test_entry_point_engine_that_exits_is_exit_2_naming_it(tmp_path: Path, mode: str) -> None:
    """An entry-point engine's ``sys.exit(0)`` at import (contained by the registry), a
    ``KeyboardInterrupt`` in its constructor or a ``sys.exit(0)`` in ``generate`` (contained by
    the CLI boundary, which names the file and line that raised): exit 2, never 0 or 130."""
    site = _engine_distribution(tmp_path / "site", mode)
    (tmp_path / "p.jsonl").write_text('{"id": "p0", "ids": [1, 2, 3]}\n')
    body = {
        "version": 2, "name": "hostile",
        "models": {"target": "toy:V=16,order=2,scale=2.0,seed=3",
                   "draft": "toy:V=16,order=2,scale=1.0,seed=4"},
        "drafter": {"kind": "sampled", "k": 3}, "prompts": {"file": "p.jsonl"},
        "configs": {"a": {"temperature": 0.8}}, "seeds": {"per_arm": 20}, "positions": 2,
        "teeth": NO_TEETH, "tests": {"whitebox": False},
        "engines": {"candidate": {"name": "hostile"}},
    }  # fmt: skip
    proto = tmp_path / "proto.yaml"
    proto.write_text(yaml.safe_dump(body))
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}
    r = spectest("run", "--config", proto, "--out", tmp_path / "run", "--no-progress",
                 cwd=tmp_path, env=env)  # fmt: skip
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    line = one_error_line(r)
    module = site / "hostile_engine" / "__init__.py"
    if mode == "import":
        assert "engine 'hostile': importing 'hostile_engine:Hostile' called sys.exit(0)" in line
    elif mode == "init":
        assert line.startswith(f"error: code outside spectest (a plug-in) at {module}:"), line
        assert "raised KeyboardInterrupt (no Ctrl-C was pressed)" in line
    else:
        assert line.startswith(f"error: code outside spectest (a plug-in) at {module}:"), line
        assert "called sys.exit(0) (SystemExit)" in line
    assert_no_result(tmp_path / "run")


# ----------------------------------------------------------------------------- 2. hostile ids
def test_byo_config_id_markup_exits_with_the_stored_verdict(tmp_path: Path) -> None:
    """The issue's case: rich markup in a BYO ``config_id``. Its exact id ``[/]`` (rich's closing
    tag) holds a ``/``, which BYO ids may not hold (``byo.py``: exit 2 naming file, column and
    value: ``test_byo_separator_in_an_id_is_refused_naming_it``); the same markup without a
    separator, ``[bold]x[red]``, must print literally. Same law in both files at 300 seeds × 3
    positions: whatever the verdict (here 3: the median per-cell MDE is worse than the default
    0.15 — fixed seeds), the process exits with the code summary.json stores, and ``analyze``
    works and agrees."""
    ids = [("p0", "[bold]x[red]")]
    ref = byo(tmp_path / "ref.parquet", range(300), ids, T=3)
    cand = byo(tmp_path / "cand.parquet", range(300, 600), ids, T=3)
    out = tmp_path / "cmp"
    r = spectest("compare", "--reference", ref, "--candidate", cand, "--out", out,
                 "--no-progress", cwd=tmp_path)  # fmt: skip
    stored = stored_summary(out)
    assert stored["complete"] is True
    assert r.returncode == stored["verdict"]["exit_code"], (r.stdout, r.stderr)
    assert r.returncode in (0, 1, 3) and r.stderr == "", r.stderr
    assert "│ [bold]x[red]" in r.stdout  # the table cell, literally
    r2 = spectest("analyze", out, "--no-progress", cwd=tmp_path)
    assert r2.returncode == r.returncode and r2.stderr == "", r2.stderr
    assert "│ [bold]x[red]" in r2.stdout


@pytest.mark.parametrize("value", ["[/]", "c\x1b[31m\x0b:x:"])
def test_byo_separator_in_an_id_is_refused_naming_it(tmp_path: Path, value: str) -> None:
    """The issue's exact ``[/]`` and an id with ANSI / C0 control characters: refused at read
    (exit 2) in one line naming the file and the column; the line itself shows the value
    escaped, so no raw control character reaches the terminal."""
    ref = byo(tmp_path / "ref.parquet", range(300), [("p0", value)], T=3)
    cand = byo(tmp_path / "cand.parquet", range(300, 600), [("p0", value)], T=3)
    r = spectest("compare", "--reference", ref, "--candidate", cand, "--out", tmp_path / "cmp",
                 "--no-progress", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 2, (r.stdout, r.stderr)
    line = one_error_line(r)
    assert "ref.parquet" in line and "config_id" in line, line
    for raw in ("\x1b", "\x0b"):
        assert raw not in r.stdout + r.stderr, repr(raw)
    assert_no_result(tmp_path / "cmp")


def test_control_characters_and_emoji_codes_never_reach_the_terminal(tmp_path: Path) -> None:
    """Markup, ``:x:``, HTML and a bidi override in ids: shown literally or as an escape, never
    rendered or raw (no ❌, no U+202E on stdout); the code is the stored verdict's. (C0 controls
    and separators are refused at read: the test above.)"""
    ids = [("p-x", "c[31m:x:[b]"), ("p\u202e2", "<img src=x onerror=alert(1)>")]
    ref = byo(tmp_path / "ref.parquet", range(300), ids)
    cand = byo(tmp_path / "cand.parquet", range(300, 600), ids, probs=np.roll(ZIPF, 1))
    out = tmp_path / "cmp"
    r = spectest("compare", "--reference", ref, "--candidate", cand, "--out", out,
                 "--no-progress", cwd=tmp_path)  # fmt: skip
    assert r.returncode == stored_summary(out)["verdict"]["exit_code"] == 1, r.stdout + r.stderr
    for bad in ("❌", "\u202e"):
        assert bad not in r.stdout + r.stderr, repr(bad)
    assert "c[31m:x:[b]" in r.stdout and "<img src=x onerror=alert(1)>" in r.stdout
    assert r"p\u202e2" in r.stdout


def test_a_closed_stdout_keeps_the_verdicts_code(tmp_path: Path) -> None:
    """``spectest analyze RUN | true``: the reader is gone long before Python has imported
    torch, so printing fails (broken pipe) after the verdict is known; the code is still the
    stored verdict's (it was 2 here: rich's SystemExit(1) read as a plug-in's, and 1 before the
    boundary knew SystemExit: "different")."""
    ids = [("p0", "c0")]
    ref = byo(tmp_path / "ref.parquet", range(300), ids)
    cand = byo(tmp_path / "cand.parquet", range(300, 600), ids)
    out = tmp_path / "cmp"
    spectest("compare", "--reference", ref, "--candidate", cand, "--out", out,
             "--no-progress", cwd=tmp_path)  # fmt: skip
    code = stored_summary(out)["verdict"]["exit_code"]
    r = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m spectest analyze "{out}" --no-progress '
         '| true; exit "${PIPESTATUS[0]}"'],
        cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == code, (r.returncode, r.stderr)
    assert one_error_line(r).startswith("error: could not print the result (BrokenPipeError")
    assert f"the verdict stands: {stored_summary(out)['verdict']['decision']} (exit {code})" in (
        r.stderr
    )


# ----------------------------------------------------------------------------- 3. integrity
@pytest.fixture
def completed_compare(tmp_path: Path) -> Path:
    """A completed compare of two samples of one law (2 cells × 3 positions, 600 sequences
    each): exit 0 at these fixed seeds."""
    ids = [("p0", "c0"), ("p1", "c0")]
    ref = byo(tmp_path / "ref.parquet", range(600), ids, T=3)
    cand = byo(tmp_path / "cand.parquet", range(600, 1200), ids, T=3)
    out = tmp_path / "cmp"
    r = spectest("compare", "--reference", ref, "--candidate", cand, "--out", out,
                 "--no-progress", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr  # same law, enough seeds: equivalent
    return out


def test_deleted_manifest_entry_and_edited_samples_are_refused(
    completed_compare: Path,
) -> None:
    """The issue's exact case: delete the samples.parquet entry from manifest.json, edit the
    samples (every candidate token at position 0 set to 0); ``analyze`` → refused, exit 2
    naming the file (it was exit 1 on the tampered law); ``report`` → refused too, and the
    manifest is byte-identical afterwards (it used to re-hash the edit and re-date it)."""
    out = completed_compare
    m = json.loads((out / MANIFEST).read_text())
    del m["files"][SAMPLES]
    (out / MANIFEST).write_text(json.dumps(m, indent=2))
    df = pd.read_parquet(out / SAMPLES)
    df.loc[(df.arm == "candidate") & (df.position == 0), "token_id"] = 0
    df.to_parquet(out / SAMPLES, index=False)
    before = (out / MANIFEST).read_bytes()
    for cmd in ("analyze", "report"):
        r = spectest(cmd, out, cwd=out.parent)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert one_error_line(r) == (
            f"error: {out / SAMPLES}: not listed in manifest.json although the run directory "
            "holds it: the manifest was edited (tampering?); re-run to regenerate the directory"
        )
    assert (out / MANIFEST).read_bytes() == before


@pytest.mark.parametrize("name", [SAMPLES, TESTS, "histograms.parquet", "run.json", SUMMARY])
def test_a_required_file_deleted_with_its_entry_is_refused(
    completed_compare: Path, name: str
) -> None:
    out = completed_compare
    m = json.loads((out / MANIFEST).read_text())
    del m["files"][name]
    (out / MANIFEST).write_text(json.dumps(m, indent=2))
    (out / name).unlink()
    r = spectest("analyze", out, cwd=out.parent)
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_error_line(r)
    # summary.json is read before the manifest is checked: its absence is named as such
    why = "missing from the run directory" if name == SUMMARY else "not listed in manifest.json"
    assert line.startswith(f"error: {out / name}: {why}"), line


def test_an_optional_table_the_summary_lists_is_required(completed_compare: Path) -> None:
    """A table that depends on the data (here the sequence-level family's) is required once
    summary.json (itself verified) says the run wrote it."""
    out = completed_compare
    written = stored_summary(out)["data_files"]
    optional = sorted(set(written) - {SAMPLES, TESTS, "histograms.parquet"})
    assert optional, written
    name = optional[0]
    m = json.loads((out / MANIFEST).read_text())
    del m["files"][name]
    (out / MANIFEST).write_text(json.dumps(m, indent=2))
    (out / name).unlink()
    r = spectest("analyze", out, cwd=out.parent)
    assert r.returncode == 2, r.stdout + r.stderr
    assert one_error_line(r) == (
        f"error: {out / name}: not listed in manifest.json although summary.json says the run "
        "wrote it: the manifest was edited (tampering?); re-run to regenerate the directory"
    )


def test_report_rewrites_only_its_views_entries(completed_compare: Path) -> None:
    """``report`` on an intact run: the re-rendered views are the same bytes, so the manifest
    is byte-identical (``completed`` included); after a hand edit of report.md only that
    entry changes back — every data entry, the provenance and ``completed`` are kept."""
    out = completed_compare
    before = (out / MANIFEST).read_bytes()
    r = spectest("report", out, cwd=out.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (out / MANIFEST).read_bytes() == before
    m0 = json.loads(before)
    (out / "report.md").write_text("edited by hand\n")
    m = json.loads((out / MANIFEST).read_text())
    m["files"]["report.md"] = {"bytes": 15, "sha256": "0" * 64}
    (out / MANIFEST).write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")
    r = spectest("report", out, cwd=out.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((out / MANIFEST).read_text()) == m0
    assert "edited by hand" not in (out / "report.md").read_text()


# ----------------------------------------------------------------------------- 6. security
def _remote_code_dir(d: Path) -> tuple[Path, Path]:
    """A tiny real Llama directory whose config.json asks for its own modelling code
    (``auto_map``), and the file that code would create when run."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    LlamaForCausalLM(cfg).save_pretrained(d)
    c = json.loads((d / "config.json").read_text())
    c["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    c["model_type"] = "evil"
    (d / "config.json").write_text(json.dumps(c))
    marker = d.parent / "REMOTE_CODE_RAN"
    (d / "evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "class EvilConfig(LlamaConfig):\n    model_type = 'evil'\n"
        "class EvilModel(LlamaForCausalLM):\n    config_class = EvilConfig\n"
    )
    return d, marker


def test_hf_local_with_auto_map_is_refused_even_when_stdin_says_yes(tmp_path: Path) -> None:
    """It ran the directory's code when stdin answered "y"; now one line, exit 2, no code."""
    model, marker = _remote_code_dir(tmp_path / "remote")
    proto = write_toy(
        tmp_path / "proto", teeth=NO_TEETH, seeds={"per_arm": 20}, positions=2,
        models={"target": f"hf-local:{model}", "draft": f"hf-local:{model}"},
    )  # fmt: skip
    r = spectest("run", "--config", proto, "--out", tmp_path / "run", "--no-progress",
                 cwd=tmp_path, stdin="y\ny\n")  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_error_line(r)
    assert f"hf-local: '{model / 'config.json'}': has auto_map (" in line, line
    assert "spectest never runs a model directory's code (trust_remote_code=False)" in line
    assert "Do you wish to run the custom code" not in r.stdout + r.stderr
    assert not marker.exists()


def test_every_transformers_load_passes_trust_remote_code_false() -> None:
    """Every ``from_pretrained`` / ``from_config`` call in spectest/ and tools/ says
    ``trust_remote_code=False`` explicitly (a default can change; an explicit False cannot)."""
    calls = []
    files = sorted((ROOT / "spectest").rglob("*.py")) + sorted((ROOT / "tools").rglob("*.py"))
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("from_pretrained", "from_config")
            ):
                kw = {k.arg: k.value for k in node.keywords}
                ok = isinstance(kw.get("trust_remote_code"), ast.Constant) and (
                    kw["trust_remote_code"].value is False  # type: ignore[attr-defined]
                )
                calls.append((f"{f.relative_to(ROOT)}:{node.lineno}", ok))
    assert len(calls) >= 4, calls  # models/hf.py ×2, models/derive.py, tools/pair/pair_card.py
    assert all(ok for _, ok in calls), [c for c, ok in calls if not ok]


# NOTE: BYO ids may not hold "/", "\" or control characters (refused at read: byo.py,
# test_byo_separator_in_an_id_is_refused_naming_it), so the injections here do without them;
# xml_text's handling of control characters is test_escape_rules'.
INJECTION_IDS = [
    ("<img src=x onerror=alert(1)>", "<script>alert(1)<script>"),
    ("[click](javascript:alert(1))", "![x](http:evil.example)"),
    ("p\u202e[31m", "c|`code`*em*_u_~~s~~"),
]


def test_report_md_and_junit_escape_user_text(tmp_path: Path) -> None:
    """HTML / markdown injection in ids reaches report.md, --summary-md and the failing lines
    as text: rendered by a CommonMark renderer (markdown-it, rich's own dependency, GFM tables
    on) no tag, link or image comes out of it; the JUnit file parses as XML. Different laws
    (TV ≈ 0.31, 300 seeds): every config fails (p < 1e-10), so the failing lines carry the ids
    too."""
    from markdown_it import MarkdownIt

    ref = byo(tmp_path / "ref.parquet", range(300), INJECTION_IDS)
    cand = byo(tmp_path / "cand.parquet", range(300, 600), INJECTION_IDS, probs=np.roll(ZIPF, 1))
    out = tmp_path / "cmp"
    r = spectest("compare", "--reference", ref, "--candidate", cand, "--out", out,
                 "--no-progress", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr
    junit, step = tmp_path / "j.xml", tmp_path / "s.md"
    r = spectest("report", out, "--junit", junit, "--summary-md", step, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    md = MarkdownIt("commonmark").enable("table").enable("strikethrough")
    for text in ((out / "report.md").read_text(), step.read_text()):
        html = md.render(text)
        for tag in ("<script", "<img", "<a ", "<code>code", "<em>em", "<s>s"):
            assert tag not in html, (tag, html[:2000])
        assert "&lt;script&gt;alert(1)&lt;script&gt;" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in md.render((out / "report.md").read_text())
    root = ET.parse(junit).getroot()  # valid XML 1.0
    names = {tc.get("name") for tc in root.iter("testcase")}
    assert "<script>alert(1)<script>" in names and "c|`code`*em*_u_~~s~~" in names


def test_escape_rules() -> None:
    assert printable("a\x1b[31m\tb\u202ec\x7f") == r"a\x1b[31m\x09b\u202ec\x7f"
    assert one_line("two\nlines\x00") == r"two lines\x00"
    assert md_text("<b>[x](y) *e* _u_ a|b `c` \\ &amp;") == (
        r"&lt;b&gt;\[x\](y) \*e\* \_u\_ a\|b \`c\` \\ &amp;amp;"
    )
    assert md_code("plain") == "`plain`" and md_code("a`b") == "`` a`b ``"
    assert md_code("a|b", in_table=True) == r"`a\|b`"
    assert xml_text("a\x00b\x0bc\td\ne\ufffe") == "a\\x00b\\x0bc\td\ne\\ufffe"
    ET.fromstring(f"<x a='{xml_text(chr(1))}'>{xml_text(chr(31))}</x>")


# ----------------------------------------------------------------------------- 7. disk full
@pytest.fixture
def tiny_fs(tmp_path: Path):
    """A real 64 KiB tmpfs (needs the right to mount; skipped where there is none)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True
    )
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root / no CAP_SYS_ADMIN)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def _fill(mnt: Path, leave: int = 2048) -> None:
    """Fill the file system up to ``leave`` bytes."""
    st = os.statvfs(mnt)
    try:
        (mnt / "fill").write_bytes(b"\0" * max(st.f_bavail * st.f_frsize - leave, 0))
    except OSError:
        pass  # full a little earlier than statvfs said: full is what is wanted


def test_disk_full_names_the_file_for_run_dir_junit_and_summary_md(
    tmp_path: Path, tiny_fs: Path
) -> None:
    """ENOSPC on each kind of write names the file being written, exit 4: a compare's run
    directory (a Parquet file: Arrow's error names none), ``report --junit`` and
    ``--summary-md`` on a full file system."""
    ids = [("p0", "c0")]
    ref = byo(tmp_path / "ref.parquet", range(3000), ids, T=3)
    cand = byo(tmp_path / "cand.parquet", range(3000, 6000), ids, T=3)
    r = spectest("compare", "--reference", ref, "--candidate", cand, "--out", tiny_fs / "cmp",
                 "--no-progress", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 4, r.stdout + r.stderr
    line = one_error_line(r)
    assert line.startswith(f"error: cannot write {tiny_fs / 'cmp'}/"), line
    assert line.endswith(": No space left on device"), line
    out = tmp_path / "cmp"
    small_ref = byo(tmp_path / "r2.parquet", range(300), ids)
    small_cand = byo(tmp_path / "c2.parquet", range(300, 600), ids)
    spectest("compare", "--reference", small_ref, "--candidate", small_cand, "--out", out,
             "--no-progress", cwd=tmp_path)  # fmt: skip
    before = (out / MANIFEST).read_bytes()
    _fill(tiny_fs, leave=0)
    for opt, name in (("--junit", "j.xml"), ("--summary-md", "s.md")):
        r = spectest("report", out, opt, tiny_fs / name, cwd=tmp_path)
        assert r.returncode == 4, r.stdout + r.stderr
        assert one_error_line(r) == (
            f"error: cannot write {tiny_fs / name}: No space left on device"
        )
    assert (out / MANIFEST).read_bytes() == before


def test_run_whose_junit_cannot_be_written_is_not_complete(tmp_path: Path, tiny_fs: Path) -> None:
    """``run --junit`` on a full file system: exit 4 naming the file, and the run directory is
    not left complete (summary.json ``complete: false``, no manifest) — a complete summary.json
    beside exit 4 would say a verdict the process did not give. The re-run resumes and exits
    with the verdict."""
    _fill(tiny_fs, leave=0)
    junit = tiny_fs / "j.xml"
    r = toy_run(tmp_path, "exact", "--junit", junit)
    assert r.returncode == 4, r.stdout + r.stderr
    assert one_error_line(r) == f"error: cannot write {junit}: No space left on device"
    assert_no_result(tmp_path / "run")
    (tiny_fs / "fill").unlink()
    r = toy_run(tmp_path, "exact", "--junit", junit)
    assert r.returncode == stored_summary(tmp_path / "run")["verdict"]["exit_code"]
    assert r.returncode in (0, 1, 3) and ET.parse(junit).getroot().tag == "testsuite"


def test_read_only_directory_names_the_file(tmp_path: Path) -> None:
    """EACCES / EPERM (``chattr +i`` as root, mode 0500 otherwise): the same one line."""
    ids = [("p0", "c0")]
    ref = byo(tmp_path / "ref.parquet", range(300), ids)
    cand = byo(tmp_path / "cand.parquet", range(300, 600), ids)
    out = tmp_path / "cmp"
    spectest("compare", "--reference", ref, "--candidate", cand, "--out", out,
             "--no-progress", cwd=tmp_path)  # fmt: skip
    ro = tmp_path / "ro"
    ro.mkdir()
    root = os.geteuid() == 0
    if root:
        if subprocess.run(["chattr", "+i", str(ro)], capture_output=True).returncode != 0:
            pytest.skip("running as root on a filesystem without chattr +i")
    else:
        ro.chmod(0o500)
    try:
        r = spectest("report", out, "--junit", ro / "j.xml", cwd=tmp_path)
        assert r.returncode == 4, r.stdout + r.stderr
        line = one_error_line(r)
        assert line.startswith(f"error: cannot write {ro / 'j.xml'}: "), line
        assert line.endswith(("Permission denied", "Operation not permitted")), line
    finally:
        if root:
            subprocess.run(["chattr", "-i", str(ro)], check=True)
        else:
            ro.chmod(0o700)
