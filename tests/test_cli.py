"""The CLI in-process (Typer's CliRunner): exit codes asserted with the output as the message,
bad input → exit 2 with one line naming the file / field / value, bring-your-own comparisons,
``power``, ``models``, ``analyze`` / ``report`` on stored runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from toy_protocol import TOY, write_toy
from typer.testing import CliRunner

from spectest import __version__
from spectest.cli import app
from spectest.store import MANIFEST
from spectest.stored import load_run

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def flat(text: str) -> str:
    """Whitespace-normalised text (help and tables wrap at the terminal width)."""
    return " ".join(text.split())


def err_line(result) -> str:
    """The one error line (stderr)."""
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_version_help_models_power() -> None:
    r = invoke("--version")
    assert r.exit_code == 0 and __version__ in r.stdout, r.output
    r = invoke("--help")
    assert r.exit_code == 0 and "3 inconclusive" in flat(r.stdout), r.output
    r = invoke("run", "--help")
    assert r.exit_code == 0 and "Exit codes: 0" in flat(r.stdout) and "--summary-md" in r.stdout, (
        r.output
    )
    r = invoke("models")
    assert r.exit_code == 0 and "bundled:target" in r.stdout, r.output
    from spectest.stats.power import mde_tv, seeds_for_tv

    r = invoke("power", "--tv", "0.05")
    assert r.exit_code == 0 and f": {seeds_for_tv(0.05, 10)}\n" in r.stdout, r.output
    r = invoke("power", "--seeds", "256", "--df", "20")
    assert r.exit_code == 0 and f"{float(mde_tv(256, 256, 20)):.4f}" in r.stdout, r.output
    r = invoke("power")
    assert r.exit_code == 2 and "exactly one of --tv or --seeds" in err_line(r), r.output


@pytest.mark.parametrize(
    ("edit", "pattern"),
    [
        (lambda p: p.write_text("version: 1\nname: x: y\n"), "malformed YAML at line 2"),
        (
            lambda p: p.write_text(p.read_text() + "surprise: 1\n"),
            "surprise: unknown key 'surprise'",
        ),
        (
            lambda p: p.write_text(p.read_text().replace("positions: 4", "positions: four")),
            "positions: expected an integer",
        ),
        (
            lambda p: (p.parent / "prompts.jsonl").unlink(),
            "prompts.file: no such prompt file 'prompts.jsonl'",
        ),
        (
            lambda p: p.write_text(
                p.read_text().replace("toy:V=16,order=2,scale=1.0,seed=4", "hf-local:/no/model")
            ),
            "models.draft: no such model directory 'hf-local:/no/model'",
        ),
        (
            lambda p: p.write_text(p.read_text().replace("- always_accept", "- always_acept")),
            "teeth.mutants[0]: unknown sampler variant 'always_acept'",
        ),
    ],
)
def test_run_bad_protocols_exit_2_with_one_line(tmp_path: Path, edit, pattern: str) -> None:
    f = write_toy(tmp_path)
    edit(f)
    r = invoke("run", "--config", f, "--out", tmp_path / "out", "--no-progress")
    assert r.exit_code == 2, r.output
    line = err_line(r)
    assert pattern in line and str(f) in line, line
    assert not (tmp_path / "out" / MANIFEST).exists()


def test_cuda_without_cuda_exits_2(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    f = write_toy(tmp_path)
    r = invoke("run", "--config", f, "--device", "cuda", "--out", tmp_path / "o", "--no-progress")
    assert r.exit_code == 2 and "models.device: 'cuda' requested but torch" in err_line(r), r.output
    assert not (tmp_path / "o").exists()


def test_bad_override_and_missing_file(tmp_path: Path) -> None:
    f = write_toy(tmp_path)
    r = invoke("run", "--config", f, "--set", "tests.alpha=2", "--no-progress")
    line = err_line(r)
    assert r.exit_code == 2 and "tests.alpha: expected a number in (0, 0.5], got 2" in line, (
        r.output
    )
    r = invoke("run", "--config", tmp_path / "nope.yaml")
    assert r.exit_code == 2 and "no such protocol file" in err_line(r), r.output
    r = invoke("run", "--config", f, "--seeds", "1", "--no-progress")
    assert r.exit_code == 2 and "seeds.per_arm: expected an integer >= 2, got 1" in err_line(r), (
        r.output
    )


# ----------------------------------------------------------------------------- compare
def byo(
    rng: np.random.Generator,
    probs: np.ndarray,
    seeds: range,
    cells=(("p0", "c0"), ("p1", "c0")),
    T: int = 3,
):
    """Samples whose tokens are iid draws from ``probs`` at every position (a known law)."""
    rows = []
    for pid, cid in cells:
        toks = rng.choice(len(probs), size=(len(seeds), T), p=probs)
        for i, s in enumerate(seeds):
            for t in range(T):
                rows.append((pid, cid, s, t, int(toks[i, t])))
    return pd.DataFrame(rows, columns=["prompt_id", "config_id", "seed", "position", "token_id"])


ZIPF = np.array([1 / k for k in range(1, 9)]) / sum(1 / k for k in range(1, 9))
SHIFTED = np.roll(ZIPF, 1)  # TV(ZIPF, SHIFTED) ≈ 0.31


def test_compare_same_law_exit_0_and_analyze_report(tmp_path: Path) -> None:
    """Both files are iid draws from one law. Fixed seed; for an arbitrary seed this fails with
    probability ≤ α = 0.01 (the run-level false-alarm bound of ``analyze``)."""
    rng = np.random.default_rng(20261129)
    ref, cand = tmp_path / "ref.csv", tmp_path / "cand.parquet"
    byo(rng, ZIPF, range(400)).to_csv(ref, index=False)
    byo(rng, ZIPF, range(400, 800)).to_parquet(cand, index=False)
    out = tmp_path / "cmp"
    r = invoke(
        "compare",
        "--reference",
        ref,
        "--candidate",
        cand,
        "--alpha",
        "0.01",
        "--max-mde-tv",
        "0.2",
        "--out",
        out,
        "--no-progress",
    )
    assert r.exit_code == 0, r.output
    assert "EQUIVALENT (exit 0): no difference found: a per-cell TV of 0.189 or more" in r.stdout
    assert "teeth are sound" not in r.stdout and "no teeth ran (compare has" in r.stdout
    stored = load_run(out)
    assert stored.summary["verdict"]["decision"] == "equivalent"
    assert stored.summary["configs"][0]["cells_tested"] == 6
    # analyze recomputes the same decision from the stored Parquet
    r = invoke("analyze", out, "--no-progress")
    assert r.exit_code == 0 and "re-analysed from stored samples" in r.stdout, r.output
    # report re-renders (even over a stale or edited report) and leaves a true manifest
    (out / "report.md").write_text("edited by hand\n")
    r = invoke("report", out, "--junit", tmp_path / "j.xml", "--summary-md", tmp_path / "s.md")
    assert r.exit_code == 0, r.output
    stored = load_run(out)
    assert stored.manifest["files"]["report.md"]["bytes"] == (out / "report.md").stat().st_size
    assert "edited by hand" not in (out / "report.md").read_text()
    assert "data:image/png;base64," in (out / "report.html").read_text()
    assert "equivalent" in (tmp_path / "s.md").read_text()
    junit = (tmp_path / "j.xml").read_text()
    assert 'failures="0"' in junit and '<testcase classname="spectest.' in junit
    assert 'name="resolution" value="resolution (α 0.01, power 80 %): per-cell TV 0.189' in junit
    for text in ((out / "report.md").read_text(), (tmp_path / "s.md").read_text()):
        assert "EQUIVALENT (exit 0): no difference found: a per-cell TV of 0.189" in text
        assert "required per-cell TV ≤ 0.2 (--max-mde-tv)" in text


def test_compare_poor_resolution_exits_3_by_default(tmp_path: Path) -> None:
    """Issue 9: same law, 400 sequences per cell: the median per-cell MDE is TV 0.189, worse
    than the default 0.15 that applies when no tooth shows the power → exit 3 with the reason
    (never EQUIVALENT). The MDE depends on the sizes and the pooled bins only; a chance
    rejection (rate ≤ α = 0.01) would print DIFFERENT instead (fixed seed)."""
    rng = np.random.default_rng(20261129)
    ref, cand = tmp_path / "ref.csv", tmp_path / "cand.csv"
    byo(rng, ZIPF, range(400)).to_csv(ref, index=False)
    byo(rng, ZIPF, range(400, 800)).to_csv(cand, index=False)
    r = invoke(
        "compare", "--reference", ref, "--candidate", cand, "--alpha", "0.01",
        "--out", tmp_path / "o", "--no-progress",
    )  # fmt: skip
    assert r.exit_code == 3, r.output
    assert (
        "INCONCLUSIVE (exit 3): resolution TV 0.189 per cell is worse than the required 0.15"
        in r.stdout
    )
    assert "required per-cell TV ≤ 0.15 (default)" in r.stdout
    scope = load_run(tmp_path / "o").summary["verdict"]["scope"]
    assert scope["required_mde_tv"] == 0.15 and scope["teeth_ran"] == []
    r = invoke("compare", "--reference", ref, "--candidate", cand, "--max-mde-tv", "0")
    assert r.exit_code == 2 and "--max-mde-tv: expected a number in (0, 1], got 0" in err_line(r)


def test_compare_three_samples_of_another_law_is_not_equivalent(tmp_path: Path) -> None:
    """The issue's input: 3 samples per cell, 12 cells × 8 positions, a completely different law
    (TV ≈ 0.31) → 0 of 96 cell-positions tested → exit 3 (it was EQUIVALENT, exit 0).
    Deterministic for the cells: 6 sequences per cell never reach an expected count of 5 per
    arm in two bins. Only the sequence-level family (pooled over the 12 cells, permutation
    calibrated) can test anything here; it does not reject at this seed, and with no
    cell-position tested the resolution is unknown. Every rendering (console, report.md/html,
    JUnit, step summary) carries the same claim."""
    rng = np.random.default_rng(3)
    cells = [(f"p{i}", f"c{j}") for i in range(4) for j in range(3)]
    ref, cand = tmp_path / "ref.csv", tmp_path / "cand.csv"
    byo(rng, ZIPF, range(3), cells=cells, T=8).to_csv(ref, index=False)
    byo(rng, SHIFTED, range(3), cells=cells, T=8).to_csv(cand, index=False)
    out = tmp_path / "o"
    r = invoke("compare", "--reference", ref, "--candidate", cand, "--out", out, "--no-progress")
    assert r.exit_code == 3, r.output
    headline = "INCONCLUSIVE (exit 3): no cell-position was testable, so there is no power claim"
    assert headline in r.stdout
    assert "tested: 0 of 96 cell-positions (96 untestable)" in r.stdout
    assert "EQUIVALENT" not in r.stdout and "teeth are sound" not in r.stdout
    r = invoke("report", out, "--junit", tmp_path / "j.xml", "--summary-md", tmp_path / "s.md")
    assert r.exit_code == 0, r.output
    for text in (
        (out / "report.md").read_text(),
        (out / "report.html").read_text(),
        (tmp_path / "s.md").read_text(),
        (tmp_path / "j.xml").read_text(),
    ):
        assert headline in text
        assert "tested: 0 of 96 cell-positions (96 untestable)" in text
    assert 'failures="1"' in (tmp_path / "j.xml").read_text()


@pytest.mark.parametrize("case", ["positions past 5 missing", "half the sequences truncated"])
def test_compare_early_stopping_candidate_exits_1(tmp_path: Path, case: str) -> None:
    """Issue 9: a candidate whose sequences stop early is DIFFERENT (exit 1), found by the
    sequence-length family (it passed: late positions were just "untestable"). 400 sequences
    per cell, T = 8; the length χ² has p < 1e-30 (cannot fail by chance)."""
    rng = np.random.default_rng(5)
    ref, cand = tmp_path / "ref.csv", tmp_path / "cand.parquet"
    byo(rng, ZIPF, range(400), T=8).to_csv(ref, index=False)
    c = byo(rng, ZIPF, range(400), T=8)
    if case == "positions past 5 missing":
        c = c[c["position"] < 5]
    else:
        cut = (c["seed"] % 2 == 1) & (c["position"] >= 1 + c["seed"] % 7)
        c = c[~cut]
    c.to_parquet(cand, index=False)
    r = invoke(
        "compare", "--reference", ref, "--candidate", cand, "--out", tmp_path / "o", "--no-progress"
    )
    assert r.exit_code == 1, r.output
    assert "DIFFERENT (exit 1)" in r.stdout and "sequence lengths p0/c0 p_adj=" in r.stdout
    assert "sequence lengths (2)" in r.stdout  # the family ran on both cells


def test_compare_shifted_law_exit_1(tmp_path: Path) -> None:
    """TV ≈ 0.31 at 400 sequences per arm: every cell's χ² has power ≈ 1 (fails < 1e-9)."""
    rng = np.random.default_rng(7)
    ref, cand = tmp_path / "ref.csv", tmp_path / "cand.csv"
    byo(rng, ZIPF, range(400)).to_csv(ref, index=False)
    byo(rng, SHIFTED, range(400)).to_csv(cand, index=False)
    r = invoke(
        "compare", "--reference", ref, "--candidate", cand, "--out", tmp_path / "o", "--no-progress"
    )
    assert r.exit_code == 1, r.output
    assert "DIFFERENT" in r.stdout and "p0/c0@0" in r.stdout


@pytest.mark.parametrize(
    ("mutate", "pattern"),
    [
        (lambda d: d.drop(columns=["token_id"]), r"missing column\(s\) token_id"),
        (lambda d: d.assign(seed="s"), r"column seed: expected integers, got 's' at row 0"),
        (
            lambda d: d[d["prompt_id"] == "p0"],
            r"cell \(prompt_id, config_id\) = \('p1', 'c0'\) is not in",
        ),
    ],
)
def test_compare_bad_files_exit_2(tmp_path: Path, mutate, pattern: str) -> None:
    rng = np.random.default_rng(0)
    ref, cand = tmp_path / "ref.csv", tmp_path / "cand.csv"
    byo(rng, ZIPF, range(20)).to_csv(ref, index=False)
    mutate(byo(rng, ZIPF, range(20))).to_csv(cand, index=False)
    r = invoke(
        "compare", "--reference", ref, "--candidate", cand, "--out", tmp_path / "o", "--no-progress"
    )
    assert r.exit_code == 2, r.output
    line = err_line(r)
    assert re.search(pattern, line), line
    assert ("cand.csv" in line) or ("ref.csv" in line)


def test_compare_corrupt_parquet_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1garbagePAR1")
    r = invoke("compare", "--reference", bad, "--candidate", bad, "--no-progress")
    assert r.exit_code == 2 and "bad.parquet: not a readable Parquet file" in err_line(r), r.output


def test_analyze_incomplete_or_corrupt_runs_exit_2(tmp_path: Path) -> None:
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "run.json").write_text(json.dumps({"kind": "run", "protocol_hash": "x"}))
    r = invoke("analyze", tmp_path / "half")
    assert r.exit_code == 2 and "no manifest.json: the run is incomplete" in err_line(r), r.output
    r = invoke("report", tmp_path / "half")
    assert r.exit_code == 2, r.output
    r = invoke("analyze", tmp_path / "nowhere")
    assert r.exit_code == 2 and "no such run directory" in err_line(r), r.output


def test_toy_constant_is_a_valid_protocol(tmp_path: Path) -> None:
    """The helper protocol the e2e tests rely on validates (guards the helper itself)."""
    from spectest.protocol import load_protocol

    p = load_protocol(write_toy(tmp_path))
    assert p.seeds.per_arm == TOY["seeds"]["per_arm"]
    assert yaml.safe_load((tmp_path / "toy.yaml").read_text())["name"] == "toy"


def _hf_dir(path: Path, *, weights: str) -> Path:
    """A real tiny HF Llama directory, saved with safetensors or as a pickle ``.bin``."""
    from spectest.models.zoo import load_model

    model = load_model("hf-preset:llama-tiny", device="cpu", dtype="float32")
    model.model.save_pretrained(path)  # the transformers module inside spectest's HFModel
    if weights == "bin":  # the same weights as a pickle (transformers 5 writes safetensors only)
        import torch
        from safetensors.torch import load_file

        (st,) = path.glob("*.safetensors")
        torch.save(load_file(st), path / "pytorch_model.bin")
        st.unlink()
    assert any(path.glob("*.safetensors")) == (weights == "safetensors")
    return path


def test_load_failures_name_the_protocol_file_and_field(tmp_path: Path) -> None:
    """Issue 9: a vocabulary mismatch, a model directory with pickle weights only and one with
    damaged weights are each one line naming the protocol file and ``models.<field>``, exit 2."""
    f = write_toy(tmp_path)
    text = f.read_text()
    # a draft whose vocabulary differs from the toy target's V=16
    f.write_text(text.replace("toy:V=16,order=2,scale=1.0,seed=4", "toy:V=17,order=2,seed=4"))
    r = invoke("run", "--config", f, "--out", tmp_path / "o1", "--no-progress")
    line = err_line(r)
    assert r.exit_code == 2 and str(f) in line and "models.draft: vocabulary mismatch" in line, line
    # hf-local with pytorch_model.bin only: refused before anything is unpickled
    binary = _hf_dir(tmp_path / "bin-model", weights="bin")
    f.write_text(text.replace("toy:V=16,order=2,scale=1.0,seed=4", f"hf-local:{binary}"))
    r = invoke("run", "--config", f, "--out", tmp_path / "o2", "--no-progress")
    line = err_line(r)
    assert r.exit_code == 2 and str(f) in line and "models.draft: hf-local:" in line, line
    assert "no *.safetensors weights" in line, line
    # hf-local with damaged safetensors: transformers' failure, named
    broken = _hf_dir(tmp_path / "broken-model", weights="safetensors")
    for w in broken.glob("*.safetensors"):
        w.write_bytes(b"not a safetensors file")
    f.write_text(text.replace("toy:V=16,order=2,scale=1.0,seed=4", f"hf-local:{broken}"))
    r = invoke("run", "--config", f, "--out", tmp_path / "o3", "--no-progress")
    line = err_line(r)
    assert r.exit_code == 2 and str(f) in line, line
    assert "models.draft: hf-local: cannot load model from" in line, line
