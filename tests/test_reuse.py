"""``spectest run --reuse DIR`` (``spectest.reuse``): a run that takes another run directory's
generation re-decides with settings decided after generation and writes the very tables a fresh
run of its protocol writes; anything else that differs is refused before anything is written;
an arm that runs something else is generated, not copied. The toy LM in matched numerics mode
(claim (b) replays on every machine). Exact comparisons on fixed seeds: no false-failure rate.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from toy_protocol import TOY, write_toy

from spectest import runner
from spectest.errors import ConfigError, InputError
from spectest.generation import RunOptions
from spectest.protocol import load_protocol
from spectest.reuse import after_generation

TABLES = ("samples", "histograms", "tests", "trie", "whitebox", "sequence", "numerics")
MODELS = {**TOY["models"], "target": TOY["models"]["target"] + ",numerics=0.0065"}  # type: ignore[index]


def _protocol(tmp_path: Path, name: str, **tests: Any) -> Path:
    """The matched toy protocol (80 seeds, 6 positions, one ε tooth), ``tests`` set on top."""
    return write_toy(
        tmp_path / name,
        models=MODELS,
        tests={**TOY["tests"], "numerics": "matched", **tests},  # type: ignore[dict-item]
        seeds={"per_arm": 80},
        positions=6,
        teeth={"null_arm": True, "epsilons": [0.5], "mutants": []},
    )


def _run(path: Path, out: Path, reuse: Path | None = None) -> runner.RunResult:
    return runner.run_protocol(load_protocol(path), out=out, options=RunOptions(reuse=reuse))


def _tables(run: Path) -> dict[str, pd.DataFrame]:
    return {
        t: pd.read_parquet(run / f"{t}.parquet") for t in TABLES if (run / f"{t}.parquet").is_file()
    }


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run to reuse: the defaults (32 drift sequences a cell, 64 floor sequences)."""
    tmp = tmp_path_factory.mktemp("reuse")
    _run(_protocol(tmp, "a"), tmp / "a" / "run")
    return tmp / "a" / "run"


def test_a_reusing_run_writes_what_a_fresh_run_writes(first: Path, tmp_path: Path) -> None:
    """More claim (b) sequences and another margin: nothing generated, every shard reused, and
    every table, the verdict and claim (b) equal to a fresh run of the new protocol's; the
    numerics table has the new counts (2 prompts × 2 configs: 12 measured a cell, 40 floor
    sequences over 4 cells: 10 a cell)."""
    new = _protocol(tmp_path, "b", numerics_sequences=12, numerics_floor_sequences=40,
                    numerics_margin=0.003)  # fmt: skip
    reused = _run(new, tmp_path / "reused", reuse=first)
    fresh = _run(new, tmp_path / "fresh")
    assert reused.shards_generated == 0 and fresh.shards_generated > 0
    a, b = _tables(tmp_path / "reused"), _tables(tmp_path / "fresh")
    assert set(a) == set(TABLES) and set(a) == set(b)
    for t in TABLES:
        pd.testing.assert_frame_equal(a[t], b[t], obj=t)
    sa, sb = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("reused", "fresh"))
    assert sa["verdict"] == sb["verdict"] and sa["protocol_hash"] == sb["protocol_hash"]
    assert any(f"reused from {first}" in n for n in sa["notes"])
    per = a["numerics"].groupby(["prompt_id", "config_id", "seed"])["floor_tv"]
    assert per.size().groupby(level=[0, 1]).size().eq(12).all()
    assert per.apply(lambda x: x.notna().all()).groupby(level=[0, 1]).sum().eq(10).all()
    old = pd.read_parquet(first / "samples.parquet")
    pd.testing.assert_frame_equal(old, a["samples"])  # the same tokens, bit for bit


def test_a_protocol_that_generates_otherwise_is_refused_before_writing(
    first: Path, tmp_path: Path
) -> None:
    """Positions, seeds, white-box recording: refused, one line naming the sections and what may
    differ, and the new directory is not created."""
    for name, kw in (("pos", {"positions": 5}), ("wb", {"tests": {"whitebox": False}})):
        if "tests" in kw:
            path = _protocol(tmp_path, name, whitebox=False)
        else:
            path = write_toy(tmp_path / name, models=MODELS, positions=5,
                             tests={**TOY["tests"], "numerics": "matched"})  # type: ignore[dict-item]  # fmt: skip
        with pytest.raises(ConfigError, match=r"--reuse: .* differs from this one in") as err:
            _run(path, tmp_path / name / "run", reuse=first)
        assert ("positions" if name == "pos" else "tests") in str(err.value)
        assert "tests.numerics_floor_sequences" in str(err.value)
        assert not (tmp_path / name / "run").exists()
    assert "tests.whitebox" not in after_generation() and "tests.numerics" not in after_generation()
    with pytest.raises(InputError, match="not a spectest run directory"):
        _run(_protocol(tmp_path, "c"), tmp_path / "c" / "run", reuse=tmp_path)


def test_an_arm_that_runs_something_else_is_generated(first: Path, tmp_path: Path) -> None:
    """The reused run recorded another fingerprint for the candidate (an engine changed since):
    its shards are generated, the others copied, the note says so, and the tables are still the
    fresh run's."""
    import shutil

    source = tmp_path / "source"
    shutil.copytree(first, source)
    info = json.loads((source / "run.json").read_text())
    info["fingerprints"]["candidate"] = {"file:/elsewhere/kernel.py": "0" * 64}
    (source / "run.json").write_text(json.dumps(info))
    new = _protocol(tmp_path, "b", numerics_floor_sequences=40)
    reused = _run(new, tmp_path / "reused", reuse=source)
    prompts = len(load_protocol(new).prompts.items)
    assert reused.shards_generated == prompts  # the candidate's shards only
    notes = json.loads((tmp_path / "reused" / "summary.json").read_text())["notes"]
    assert any("arm 'candidate' runs something else" in n for n in notes)
    fresh = _run(new, tmp_path / "fresh")
    for t in ("samples", "tests", "numerics"):
        pd.testing.assert_frame_equal(
            _tables(tmp_path / "reused")[t], _tables(tmp_path / "fresh")[t]
        )
    assert fresh.verdict.decision == reused.verdict.decision


def test_the_cli_flag(first: Path, tmp_path: Path) -> None:
    """``spectest run --reuse``: a real subprocess, exit 2 and one line for a bad source."""
    path = _protocol(tmp_path, "b", numerics_floor_sequences=40)
    bad = subprocess.run(
        [sys.executable, "-m", "spectest", "run", "--config", str(path), "--reuse",
         str(tmp_path), "--out", str(tmp_path / "x"), "--no-progress"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 2, bad.stderr
    assert "not a spectest run directory" in bad.stderr and not (tmp_path / "x").exists()


def test_deciding_again_after_an_unresolved_claim_b_says_it_is_a_second_look(
    tmp_path: Path,
) -> None:
    """The source's claim (b) unresolved (margin 0.0015: D +0.0019 in [+0.0008, +0.0023]
    straddles it), the reusing run decides it (margin 0.003): its notes say the second look's
    error bound; reusing that decided run gets no such note."""
    src = tmp_path / "a" / "run"
    first = _run(_protocol(tmp_path, "a", numerics_margin=0.0015), src)
    assert first.summary["verdict"]["numerics"]["decision"] == "unresolved"
    again = _run(_protocol(tmp_path, "b", numerics_margin=0.003), tmp_path / "b" / "run", reuse=src)
    notes = again.summary["notes"]
    assert any("a second look" in n and "sum of the two runs' tests.alpha" in n for n in notes)
    third = _run(_protocol(tmp_path, "c", numerics_margin=0.004), tmp_path / "c" / "run",
                 reuse=tmp_path / "b" / "run")  # fmt: skip
    assert not any("a second look" in n for n in third.summary["notes"])
