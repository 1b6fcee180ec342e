"""Issue 33, item 4 (the small ones): ``--set tests.alpha=1e-12`` (YAML 1.1 reads a float
without a dot as a string) accepted; sup-CDF resolutions of 1 or more (the DKW bound at few
tokens) printed as "no resolution", a white-box excess below float precision as a floor; a NUL
byte in a protocol named by line and column; a U+202E in a JUnit test case's name escaped.
Each assertion failed on the tree before the change."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spectest.cli import app
from spectest.decision.comparison import Comparison, FamilyScope
from spectest.decision.verdict import decide
from spectest.errors import ConfigError
from spectest.protocol import load_protocol
from spectest.report.junit import render_junit
from spectest.stats.family_whitebox import sup_cdf_words

ROOT = Path(__file__).resolve().parents[1]
CI = ROOT / "protocols" / "ci.yaml"


@pytest.mark.parametrize("text", ["1e-12", "1E-12", "+1e-12"])
def test_a_float_without_a_dot_is_a_number(text: str) -> None:
    p = load_protocol(CI, sets=[f"tests.alpha={text}"])
    assert p.tests.alpha == 1e-12
    assert p.hash == load_protocol(CI, sets=["tests.alpha=1.0e-12"]).hash
    with pytest.raises(ConfigError, match=r"tests\.alpha: expected a number"):
        load_protocol(CI, sets=["tests.alpha=1e-12x"])  # still refused when not a number


def test_a_tiny_alpha_at_two_seeds_states_no_resolution_above_one(tmp_path: Path) -> None:
    """`run --config ci --set tests.alpha=1e-12 --seeds 2`: was exit 2 (the alpha refused);
    the role PIT's DKW bounds there (2.29, 2.95) printed as resolutions."""
    out = tmp_path / "run"
    r = CliRunner().invoke(
        app, ["run", "--config", str(CI), "--set", "tests.alpha=1e-12", "--seeds", "2",
              "--out", str(out), "--no-progress"], catch_exceptions=False,
    )  # fmt: skip
    assert r.exit_code == 3, r.output
    res = json.loads((out / "summary.json").read_text())["verdict"]["scope"]["resolution"]
    assert "α 1e-12" in res
    assert "no resolution (too few tokens)" in res, res
    import re

    shown = re.findall(r"(?:accepted|recovered|bonus) ([0-9.]+)", res)
    assert all(float(x) < 1 for x in shown), res


def test_resolution_words() -> None:
    assert sup_cdf_words(2.18) == sup_cdf_words(1.0) == "no resolution (too few tokens)"
    assert sup_cdf_words(float("nan")) == "no resolution (too few tokens)"
    assert sup_cdf_words(0.146) == "0.146"
    fam = FamilyScope(
        name="whitebox", n_tested=6, n_untestable=0, alpha=0.05, mde=1.34e-84,
        mde_unit="excess mass on {q > p} per token (directed z)", rejected=False,
        label="white-box",
    )  # fmt: skip
    cand = Comparison("c", "candidate", "subject", False, 4, 0, None, 0.2, (), families=(fam,))
    line = decide([cand]).scope.resolution_line()
    assert "white-box < 1e-06 excess mass" in line and "e-84" not in line


def test_a_nul_byte_is_named_by_line_and_column(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(CI.read_text().replace("name: ci", "name: c\x00i", 1))
    line = 1 + CI.read_text().split("name: ci")[0].count("\n")
    with pytest.raises(ConfigError) as err:
        load_protocol(f)
    assert f"malformed YAML at line {line}, column 8: character U+0000" in str(err.value)
    assert "at ?" not in str(err.value)


def test_a_bidi_override_in_a_junit_name_is_escaped() -> None:
    summary = {
        "name": "x\u202ey",
        "comparisons": [{
            "role": "candidate", "failing": [],
            "by_config": [{"config_id": "c\u202e1", "rejections": 0}],
        }],
        "teeth": [{"arm": "mutant:\u2066m", "label": "killed", "sound": True, "expect": "fail"}],
        "verdict": {"decision": "equivalent", "reasons": [], "headline": "h", "scope": {}},
    }  # fmt: skip
    text = render_junit(summary)
    assert "\u202e" not in text and "\u2066" not in text
    names = {tc.get("name") for tc in ET.fromstring(text.split("\n", 1)[1]).iter("testcase")}
    assert r"c\u202e1" in names and r"mutant:\u2066m" in names
