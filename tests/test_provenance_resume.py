"""Issue 33, item 2: a resume must not reuse shards made by another program. Editing the kernel
file (or an engine program named by path) and re-running into the same ``--out`` printed
``shards: 0 generated, N resumed`` with the old verdict: the protocol hash covers the path, not
what it runs. Each arm's fingerprint (``spectest.fingerprint``) is in run.json; a changed one
regenerates that arm's shards and says so. A shard rewritten after it was written is refused
against its digest. Real files, a real acceptor kernel, real command programs; fixed seeds."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from toy_protocol import write_toy
from typer.testing import CliRunner

from spectest.cli import app
from spectest.fingerprint import UNFINGERPRINTED, arm_fingerprint
from spectest.models import decode_attention

REPO = Path(__file__).resolve().parents[1]
KERNELS = REPO / "tests" / "acceptor_plugins" / "toy_acceptors.py"
runner = CliRunner()


def run(proto: Path, out: Path, *args: str) -> tuple[int, str, dict]:
    r = runner.invoke(
        app, ["run", "--config", str(proto), "--out", str(out), "--no-progress", *args],
        catch_exceptions=False,
    )  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    return r.exit_code, r.output, summary


def test_an_edited_kernel_file_regenerates_its_arm(tmp_path: Path) -> None:
    """The correct kernel passes (exit 0); the same file rewritten with a buggy body is
    re-run into the same --out: the candidate's shards are regenerated (the reference's and the
    teeth's resumed) and the bug is seen (exit 1). Today's tree resumed every shard: exit 0."""
    k = tmp_path / "k.py"
    shutil.copy(KERNELS, k)
    proto = write_toy(
        tmp_path, candidate=f"acceptor:{k}:accept",
        teeth={"null_arm": False, "epsilons": [], "mutants": []},
    )  # fmt: skip
    out = tmp_path / "run"
    code, output, s = run(proto, out)
    assert code == 0, output
    fps = json.loads((out / "run.json").read_text())["fingerprints"]
    assert f"file:{k.resolve()}" in fps["candidate"] and fps["reference"] == {}
    assert s["fingerprints"] == fps
    k.write_text(KERNELS.read_text() + "\naccept = always_accept  # edited after the run\n")
    code, output, s = run(proto, out)
    assert code == 1, output
    note = next(n for n in s["notes"] if n.startswith("provenance: arm 'candidate'"))
    assert f"{k.resolve()} (" in note and note.endswith("shard(s) are regenerated"), note
    assert "provenance: arm 'candidate'" in output
    assert not any(n.startswith("shards: 0 generated") for n in s["notes"]), s["notes"]
    # unchanged again: everything resumes
    code, output, s = run(proto, out)
    assert code == 1 and not any(n.startswith("provenance:") for n in s["notes"]), s["notes"]
    assert s["notes"][0].startswith("shards: 0 generated"), s["notes"]


def test_a_rewritten_shard_is_refused_against_its_digest(tmp_path: Path) -> None:
    """A valid Parquet shard rewritten after the run (one token changed) is refused on resume,
    naming the file (exit 2). Today's tree read it without complaint."""
    proto = write_toy(tmp_path, teeth={"null_arm": False, "epsilons": [], "mutants": []})
    out = tmp_path / "run"
    code, output, _ = run(proto, out)
    assert code == 0, output
    shard = sorted((out / "shards").glob("candidate__*.samples.parquet"))[0]
    assert shard.with_name(shard.name.replace(".samples.parquet", ".digest.json")).is_file()
    table = pq.read_table(shard)
    df = table.to_pandas()
    df.loc[0, "token_id"] = (int(df.loc[0, "token_id"]) + 1) % 16
    import pyarrow as pa

    pq.write_table(pa.Table.from_pandas(df, schema=table.schema, preserve_index=False), shard)
    r = runner.invoke(
        app, ["run", "--config", str(proto), "--out", str(out), "--no-progress"],
        catch_exceptions=False,
    )  # fmt: skip
    assert r.exit_code == 2, r.output
    assert shard.name in r.output and "modified after it was written" in r.output


def test_a_command_engines_program_and_argument_files_are_hashed(tmp_path: Path) -> None:
    """A command engine's argv: the program found on PATH, the program file named by path and a
    file among its arguments are hashed by content (a real program run before and after an
    edit); a URL engine says it cannot be fingerprinted."""
    prog = tmp_path / "eng.py"
    cfg = tmp_path / "table.json"
    prog.write_text("import sys\nprint(open(sys.argv[1]).read())\n")
    cfg.write_text('{"k": 1}\n')
    opts = {"command": (sys.executable, str(prog), "--table=table.json"), "cwd": str(tmp_path)}
    import subprocess

    assert subprocess.run([*opts["command"][:2], str(cfg)], check=True, capture_output=True)
    a = arm_fingerprint("command", opts, None).to_dict()
    assert {f"file:{prog.resolve()}", f"file:{cfg.resolve()}"} <= set(a)
    assert f"file:{Path(sys.executable).resolve()}" in a and UNFINGERPRINTED not in a
    cfg.write_text('{"k": 2}\n')
    b = arm_fingerprint("command", opts, None).to_dict()
    assert a[f"file:{cfg.resolve()}"] != b[f"file:{cfg.resolve()}"]
    assert a[f"file:{prog.resolve()}"] == b[f"file:{prog.resolve()}"]
    # a bare program name is found on PATH and hashed
    c = arm_fingerprint("command", {"command": ("python3", "-c", "pass")}, None).to_dict()
    assert any(k.startswith("file:") for k in c)
    # the engine's declared version is part of it
    assert arm_fingerprint("command", opts, "2.1").to_dict()["engine-version:command"] == "2.1"
    remote = arm_fingerprint("http", {"url": "http://10.0.0.1:8080", "server": ()}, None)
    assert remote.unfingerprinted is not None and "cannot be hashed" in remote.unfingerprinted


def test_a_resume_across_fast_generates_the_fast_arms_again(tmp_path: Path) -> None:
    """``--fast`` runs the built-in arms on the fast engine, whose bf16 numerics (static model,
    kernels) give other tokens: a run resumed with ``--fast`` after one without (or the reverse)
    generates those arms again and says so, where it resumed them all before; the same flag
    again resumes everything. (The toy model on CPU: the tokens happen to be equal here.)"""
    proto = write_toy(tmp_path, teeth={"null_arm": False, "epsilons": [], "mutants": []})
    out = tmp_path / "run"
    code, output, s = run(proto, out)
    assert code == 0, output
    assert json.loads((out / "run.json").read_text())["fingerprints"]["candidate"] == {}
    code, output, s = run(proto, out, "--fast")
    assert code == 0, output
    fps = json.loads((out / "run.json").read_text())["fingerprints"]
    kernels = decode_attention.settings()
    want = {"engine-variant:builtin": "fast", "engine-kernels:builtin": kernels}
    assert fps["candidate"] == fps["reference"] == want
    notes = [n for n in s["notes"] if n.startswith("provenance: arm")]
    assert len(notes) == 2 and all("shard(s) are regenerated" in n for n in notes), s["notes"]
    code, output, s = run(proto, out, "--fast")
    assert not any(n.startswith("provenance: arm") for n in s["notes"]), s["notes"]
    assert any(n.startswith("shards: 0 generated") for n in s["notes"]), s["notes"]


def test_a_resume_across_kernel_switches_generates_the_fast_arms_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast engine's kernel switches (``SPECTEST_ATTN_PV``, ``SPECTEST_NO_KERNELS``) change
    a CUDA run's tokens: a ``--fast`` run resumed under another setting generates its fast arms
    again, and resumes everything under the same one."""
    monkeypatch.delenv("SPECTEST_NO_KERNELS", raising=False)
    monkeypatch.setenv("SPECTEST_ATTN_PV", "half")
    proto = write_toy(tmp_path, teeth={"null_arm": False, "epsilons": [], "mutants": []})
    out = tmp_path / "run"
    code, output, s = run(proto, out, "--fast")
    assert code == 0, output
    fps = json.loads((out / "run.json").read_text())["fingerprints"]
    assert fps["candidate"]["engine-kernels:builtin"] == "kernels=on,attention_pv=half"
    for env, value in (("SPECTEST_ATTN_PV", "split"), ("SPECTEST_NO_KERNELS", "1")):
        monkeypatch.setenv(env, value)
        code, output, s = run(proto, out, "--fast")
        assert code == 0, output
        notes = [n for n in s["notes"] if n.startswith("provenance: arm")]
        assert len(notes) == 2 and all("regenerated" in n for n in notes), (env, s["notes"])
    code, output, s = run(proto, out, "--fast")
    assert any(n.startswith("shards: 0 generated") for n in s["notes"]), s["notes"]
