"""The report a reviewer reads (issue 26, items 3 and 4): counts that reconcile with the
headline, each arm's engine and drafter named, every family in its own table, where the law
differs (evidence map, token bars with the tokens as text), the teeth's margins beside the
tooth sizes, one colour per arm, a truthful white-box heading, no warning while rendering,
``spectest report`` leaving the manifest's ``completed`` time alone, and report.html rendered
headless in Chromium (skipped where no Chromium is installed: ``apt-get install
chromium-headless-shell``).

Deterministic: fixed seeds on the analytic toy LM; no statistical false-failure rate (the
buggy candidate's rejections are fixed by the seeds)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from toy_protocol import write_toy

CHROMIUM = next(
    (shutil.which(n) for n in ("chromium-headless-shell", "chromium", "chromium-browser")
     if shutil.which(n)),
    None,
)  # fmt: skip
SMALL = {"alpha": 0.05, "trie": {"depth": 1, "min_count": 50}, "null_permutations": 20}


@pytest.fixture(scope="module")
def buggy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from spectest.protocol import load_protocol
    from spectest.runner import run_protocol

    d = tmp_path_factory.mktemp("buggy")
    proto = load_protocol(
        write_toy(d, seeds={"per_arm": 300}, tests=SMALL, candidate="residual_from_p")
    )
    return Path(run_protocol(proto, out=d / "results" / "toy-buggy").run_dir)


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_the_rejection_counts_reconcile_with_the_headline(buggy_run: Path) -> None:
    s = _summary(buggy_run)
    cand = next(c for c in s["comparisons"] if c["role"] == "candidate")
    assert cand["rejections"] > 0
    assert sum(cand["rejections_by_family"].values()) == cand["rejections"]
    headline_n = int(re.search(r"(\d+) rejection\(s\)", " ".join(s["verdict"]["reasons"]))[1])
    assert headline_n == cand["rejections"]
    table_n = sum(r["rejections"] for r in s["configs"])
    for r in s["configs"]:
        assert sum(r["rejections_by_family"].values()) == r["rejections"]
    md = (buggy_run / "report.md").read_text()
    line = next(ln for ln in md.splitlines() if ln.startswith("candidate rejections:"))
    assert f"{cand['rejections']} in all" in line
    assert f"in the per-config table {table_n} (" in line
    run_level = cand["rejections"] - table_n
    assert f"run-level, in no config {run_level}" in line
    assert "| rejections in this config |" in md


def test_the_header_names_each_arms_engine_and_drafter(buggy_run: Path) -> None:
    md = (buggy_run / "report.md").read_text()
    assert "Arms: reference on builtin (plain decoding, no drafter)" in md
    assert "candidate on builtin (spectest's drafter onehot K=3)" in md
    assert "teeth on builtin (spectest's drafter onehot K=3)" in md


def test_arm_engines_says_an_outside_engine_uses_its_own_drafter(tmp_path: Path) -> None:
    from spectest.decision.header import arm_engines
    from spectest.protocol import load_protocol

    path = write_toy(tmp_path, version=2, engines={"reference": "builtin", "candidate": {
        "name": "command", "command": [sys.executable, "-c", "pass"]}})  # fmt: skip
    arms = arm_engines(load_protocol(path))
    assert arms["candidate"] == "command (the engine's own sampler and drafter)"
    assert arms["reference"] == "builtin (plain decoding, no drafter)"
    assert arms["teeth"] == "builtin (spectest's drafter onehot K=3)"


def test_every_section_is_there_with_each_family_and_the_teeth(buggy_run: Path) -> None:
    md = (buggy_run / "report.md").read_text().replace("\\", "")  # markdown escapes off
    for heading in (
        "## Set-up", "## Summary per config", "## Where the law differs",
        "## How strong the tests were (teeth)", "## Every family that ran", "## Plots",
    ):  # fmt: skip
        assert heading in md, heading
    assert "token χ² per cell-position:" in md and "prefix trie:" in md
    assert "sequence-level (pooled rows):" in md
    # white-box: recorded at generation (the built-in engine), teeth as columns
    assert "White-box tests (target p_t recorded at generation" in md
    assert "teacher-forced" not in md
    wb = md.split("White-box tests")[1]
    assert (
        "| test | reference (control) | candidate | null | eps=0.5 | mutant:always_accept |" in wb
    )
    # the teeth: margins in decades and sizes beside the MDE
    teeth = md.split("## How strong the tests were (teeth)")[1].split("## ")[0]
    assert "decades" in teeth and "× MDE" in teeth and "| tooth | size TV: min |" in teeth
    # worst cells: the toy has no tokenizer, so tokens are ids
    where = md.split("## Where the law differs")[1].split("## ")[0]
    assert re.search(r"#\d+ 0\.\d\d", where)


def test_figures_use_one_colour_per_arm_and_a_qq_legend(buggy_run: Path) -> None:
    import matplotlib.pyplot as plt

    from spectest.report import evidence, plots
    from spectest.store import HISTOGRAMS, TESTS
    from spectest.stored import load_run

    run = load_run(buggy_run)
    tests = run.table(TESTS)
    comps = [c["arm"] for c in run.summary["comparisons"]]
    fig = plots.pvalue_plots(tests, comps)
    qq = fig.axes[1]
    assert [t.get_text() for t in qq.get_legend().get_texts()] == [*comps, "uniform (H0)"]
    colours = {ln.get_label(): ln.get_color() for ln in qq.get_lines()}
    assert colours["candidate"] == plots.arm_style("candidate", comps)["color"]
    assert len({colours[c] for c in comps}) == len(comps)  # one colour per arm
    plt.close(fig)
    fig = plots.tv_by_position(tests, comps)
    by_label = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    for c in comps:
        assert by_label[c].get_color() == plots.arm_style(c, comps)["color"]
        assert by_label[c].get_alpha() < 1 and by_label[c].get_marker() not in (None, "None", "")
    band = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "TV under H0 (permutation null: mean to upper quantile)" in band
    plt.close(fig)
    worst = evidence.worst_cells(tests, "candidate")
    fig = evidence.token_bars(run.table(HISTOGRAMS), worst, "candidate", lambda t: f"#{t}")
    bars = fig.axes[0].patches
    shares = np.array([b.get_height() for b in bars])
    assert np.isclose(shares[: len(bars) // 2].sum(), 1.0)  # reference shares add up (+ other)
    plt.close(fig)


def test_each_figure_is_drawn_once_and_fits_its_canvas(buggy_run: Path) -> None:
    """Issue 32: a figure is laid out once and drawn once (``bbox_inches="tight"`` drew each
    twice, and a layout engine left set makes savefig lay out in a draw of its own), and with
    no cropping to the drawn extent everything must lie inside the canvas (the TV figure's
    legend below the axes included)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from spectest.report import plots
    from spectest.report.sections import Figure, build
    from spectest.stored import load_run

    figures = [b for s in build(load_run(buggy_run)) for b in s.blocks if isinstance(b, Figure)]
    assert len(figures) == 6
    for block in figures:
        fig = block.draw()
        draws: list[object] = []

        def counted(renderer: object, real: object = fig.draw, seen: list = draws) -> None:
            seen.append(renderer)
            real(renderer)  # type: ignore[operator]

        fig.draw = counted
        assert plots.to_base64_png(fig)
        assert len(draws) == 1, block.alt
        del fig.draw
        w, h = fig.get_size_inches()
        box = fig.get_tightbbox(FigureCanvasAgg(fig).get_renderer())  # closed: a new canvas
        tol = 1.0 / fig.dpi  # one pixel
        assert box.x0 >= -tol and box.y0 >= -tol, (block.alt, box)
        assert box.x1 <= w + tol and box.y1 <= h + tol, (block.alt, box)


def test_a_figure_wider_than_its_canvas_is_saved_whole() -> None:
    """A title wider than the figure (a long prompt id, say) would be cut at the canvas edge:
    ``to_base64_png`` then saves the PNG grown to the content, as every figure was before issue
    32, and a figure inside its canvas is saved at the canvas's size."""
    import base64
    import io

    import matplotlib.pyplot as plt
    from PIL import Image

    from spectest.report import plots

    sizes = []
    for title in ("short", "a title far wider than a two-inch figure " * 3):
        fig, ax = plt.subplots(figsize=(2.0, 2.0))
        ax.set_title(title)
        png = base64.b64decode(plots.to_base64_png(fig, dpi=90))
        sizes.append(Image.open(io.BytesIO(png)).size)
    assert sizes[0] == (180, 180)
    assert sizes[1][0] > 2 * 180


def test_report_leaves_completed_alone_and_warns_nothing(buggy_run: Path) -> None:
    manifest = json.loads((buggy_run / "manifest.json").read_text())
    r = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-m", "spectest", "report", str(buggy_run)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # no matplotlib legend (or any) warning
    after = json.loads((buggy_run / "manifest.json").read_text())
    assert after["completed"] == manifest["completed"]
    assert after["provenance"] == manifest["provenance"]


def test_rendering_raises_no_warning(buggy_run: Path) -> None:
    from spectest.report.html import render_html
    from spectest.stored import load_run

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        html = render_html(load_run(buggy_run))
    assert html.count("data:image/png;base64,") >= 5


def test_sequence_resolution_says_it_depends_on_the_data(buggy_run: Path) -> None:
    from spectest.decision.comparison import Comparison, FamilyScope
    from spectest.decision.verdict import decide

    fams = _summary(buggy_run)["verdict"]["scope"]["families"]
    seq = next(f for f in fams if f["name"] == "sequence")
    m = re.fullmatch(r"estimated from this run's permutation null, so it moves with the data; "
                     r"([\d.]+)–([\d.]+) from the B = 20 permutations alone \(95 %\)",
                     seq["mde_note"])  # fmt: skip
    assert m, seq
    assert float(m[1]) < seq["mde"] < float(m[2])
    cells = FamilyScope("cells", 4, 0, 0.025, 0.2, "TV per cell-position", False)
    ran = FamilyScope("sequence", 3, 0, 0.025, 0.1, "TV of x", False, "seq", "", "moves")
    cand = Comparison(
        "c", "candidate", "subject", False, 4, 0, None, 0.2, (), families=(cells, ran)
    )
    assert "seq 0.1 TV of x (moves)" in decide([cand]).scope.resolution_line()


def screenshot(html: Path, png: Path, height: int = 6000) -> None:
    """report.html as a PNG, headless Chromium (also how results/report-*.png are made)."""
    subprocess.run(
        [CHROMIUM, "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--window-size=1200,{height}", f"--screenshot={png}", html.resolve().as_uri()],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip


@pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium (apt-get install chromium-headless-shell)"
)
def test_report_html_renders_in_chromium(buggy_run: Path, tmp_path: Path) -> None:
    from PIL import Image

    png = tmp_path / "report.png"
    screenshot(buggy_run / "report.html", png)
    img = np.asarray(Image.open(png).convert("RGB"), dtype=np.int16)
    assert img.shape[1] == 1200 and img.shape[0] >= 3000
    # the figures are there: red (the candidate) and the reference's grey are drawn
    red = (img[..., 0] > 180) & (img[..., 1] < 110) & (img[..., 2] < 110)
    assert red.sum() > 2000
    assert img.std() > 20  # not a blank page


def test_power_config_sizes_the_run_as_it_is_made(buggy_run: Path) -> None:
    """``spectest power --config`` against the MDE of a real run of that size: within 3 % at
    the run's median dof (the run's figure is the median of per-cell MDEs, each at its own dof;
    MDE rises with dof, so the median cell's dof gives the median MDE, up to the two middle
    cells of an even count). The old sizing (α unsplit, one test) misses by far more."""
    import pandas as pd

    from spectest.protocol import load_protocol
    from spectest.sizing import size_protocol
    from spectest.stats.power import mde_tv

    proto = load_protocol(buggy_run / "protocol.yaml")
    tests = pd.read_parquet(buggy_run / "tests.parquet")
    cand = tests[(tests["comparison"] == "candidate") & (tests["status"] == "ok")]
    assert len(cand) == len(proto.prompts.items) * len(proto.configs) * proto.positions
    df = round(float(cand["dof"].median()))
    size = size_protocol(proto, df=df)
    assert size.families == {"cells": True, "trie": True, "whitebox": True, "sequence": True,
                             "lengths": False}  # fmt: skip
    run_mde = _summary(buggy_run)["verdict"]["mde_tv"]
    assert abs(size.mde_tv() - run_mde) / run_mde < 0.03, (size.mde_tv(), run_mde)
    old = float(mde_tv(size.seeds_per_arm, size.seeds_per_arm, df, 0.05, 0.8))
    assert abs(old - run_mde) / run_mde > 0.2
    n = size.seeds_for(run_mde)
    assert size.mde_tv(n) <= run_mde < size.mde_tv(n - 1)
    r = subprocess.run(
        [sys.executable, "-m", "spectest", "power", "--config", str(buggy_run / "protocol.yaml"),
         "--df", str(df)], capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "split over 4 active families (cells, trie, whitebox, sequence)" in r.stdout
    assert f"{size.mde_tv():.4f}" in r.stdout
