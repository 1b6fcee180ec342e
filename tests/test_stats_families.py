"""A test family is one class plus one registration (``spectest.stats.families``,
``spectest.stats.battery.FAMILIES``): a family added to the registry takes its share of α, shows
in the analysis, the comparison, the verdict's lines, summary.json and every report — with no
other edit. Exact checks (the toy family's decision is a deterministic function of the data)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_stats_sim import samples_frame, zipf

from spectest import runner
from spectest.decision.comparison import compare_arm
from spectest.decision.summary import verdict_lines
from spectest.decision.verdict import decide
from spectest.errors import ConfigError
from spectest.plan import Arm, SeedRange
from spectest.protocol import load_protocol
from spectest.stats.families import Failure, FamilyInputs, FamilyResult, empty_frame
from tests.toy_protocol import write_toy

# the module itself (the package re-exports the function ``analyze`` under its name)
an = importlib.import_module("spectest.stats.battery")


class FirstTokenFamily:
    """A toy family: per cell, is the candidate's first token ever ``token``, which the
    reference never emits there? (A support check on position 0; it rejects exactly then.)"""

    name = "first_token"
    label = "first-token support (toy)"

    def __init__(self, token: int = 0) -> None:
        self.token = token

    def active(self, inputs: FamilyInputs) -> bool:
        return inputs.enc.n_positions >= 1

    def run(self, inputs: FamilyInputs, alpha: float) -> FamilyResult:
        rows = []
        for c in range(inputs.enc.n_cells):
            lo, hi = int(inputs.enc.cell_start[c]), int(inputs.enc.cell_start[c + 1])
            first = inputs.enc.tokens[lo:hi, 0]  # [n_c]
            arm = inputs.enc.seq_arm[lo:hi]
            hits = int((first[arm == 1] == self.token).sum())
            ref_hits = int((first[arm == 0] == self.token).sum())
            ids = {k: v[0] for k, v in inputs.cell_ids(np.array([c])).items()}
            reject = alpha > 0 and hits > 0 and ref_hits == 0
            rows.append({**ids, "hits": hits, "reject": reject})
        df = pd.DataFrame(rows) if rows else empty_frame(["prompt_id", "config_id"])
        rej = df[df["reject"]]
        return FamilyResult(
            name=self.name,
            label=self.label,
            alpha=alpha,
            table=df,
            rejected=bool(len(rej)),
            n_tested=len(df),
            n_untestable=0,
            resolution=0.5,
            resolution_unit="toy units",
            failing=tuple(
                Failure(
                    0.0, f"first token {self.token} in {r.prompt_id}/{r.config_id}", r.config_id
                )
                for r in rej.itertuples(index=False)
            ),
            verdict_line=f"first-token support: {int(df['hits'].sum())} hit(s)",
        )


def _frame(rng: np.random.Generator, plant: bool) -> pd.DataFrame:
    law = zipf(50, 1.2)
    arms = {}
    for prompt, config in (("p", "a"), ("p", "b")):
        ref = rng.choice(np.arange(1, 51), size=(200, 3), p=law)  # never token 0
        cand = rng.choice(np.arange(1, 51), size=(200, 3), p=law)
        if plant and config == "b":
            cand[:3, 0] = 0  # three candidate sequences start with a token the reference lacks
        arms[(prompt, config, "reference")], arms[(prompt, config, "candidate")] = ref, cand
    return samples_frame(arms)


OPTS = an.AnalysisOptions(null_permutations=19, trie_depth=1, trie_min_count=30)


@pytest.mark.parametrize("plant", [False, True])
def test_a_registered_family_takes_its_share_and_shows_everywhere(plant: bool) -> None:
    df = _frame(np.random.default_rng(0), plant)
    fams = (*an.FAMILIES, FirstTokenFamily())
    a = an.analyze(df, reference="reference", candidate="candidate", options=OPTS, families=fams)
    base = an.analyze(df, reference="reference", candidate="candidate", options=OPTS)
    # α: one more active family (cells, trie, sequence and it: white-box has no columns here)
    assert list(a.families) == [*base.families, "first_token"]
    assert a.families["first_token"].alpha == pytest.approx(0.05 / 4)
    assert base.families["cells"].alpha == pytest.approx(0.05 / 3)
    # the other families' tables are unchanged: only their α differs
    assert a.table("cells")["statistic"].equals(base.table("cells")["statistic"])
    assert a.rejected == (plant or base.rejected) and a.families["first_token"].rejected == plant
    s = a.summary()
    assert s["alpha_first_token"] == pytest.approx(0.05 / 4)
    assert s["first_token_rejected"] == plant
    json.dumps(s)
    c = compare_arm(a, Arm("candidate", "candidate", None, SeedRange(0, 1), "subject"))
    scope = {f.name: f for f in c.families}["first_token"]
    assert (scope.label, scope.n_tested, scope.mde, scope.mde_unit) == (
        "first-token support (toy)", 2, 0.5, "toy units")  # fmt: skip
    toy_lines = [f for f in c.failing if f.startswith("first token")]
    assert toy_lines == (["first token 0 in p/b"] if plant else [])
    if plant:  # its key 0.0 sorts it first; its config counts it
        assert c.failing[0] == "first token 0 in p/b"
        by = {cs.config_id: cs.rejections for cs in c.by_config}
        cells = a.table("cells")
        assert by["b"] == 1 + int(cells.loc[cells["config_id"] == "b", "reject"].sum())
    v = decide([c], max_mde_tv=1.0, kind="compare")
    assert "first-token support (toy) (2)" in v.scope.tested_line()
    assert "first-token support (toy) 0.5 toy units" in v.scope.resolution_line()
    lines = verdict_lines(json.loads(json.dumps(v.to_dict())))
    assert f"  first-token support: {3 if plant else 0} hit(s)" in lines
    assert (v.decision == "different") == a.rejected


def test_the_registry_needs_the_cell_family_and_distinct_names() -> None:
    df = _frame(np.random.default_rng(1), False)
    kw = dict(reference="reference", candidate="candidate", options=OPTS)
    with pytest.raises(ConfigError, match="one 'cells' family"):
        an.analyze(df, families=an.FAMILIES[1:], **kw)
    with pytest.raises(ConfigError, match="distinct names"):
        an.analyze(df, families=(*an.FAMILIES, FirstTokenFamily(), FirstTokenFamily()), **kw)


def test_one_registration_reaches_a_real_run(tmp_path: Path, monkeypatch) -> None:
    """The toy protocol run end to end with the family registered (one line: the registry) and
    nothing else changed: its verdict line is in summary.json, report.md and the JUnit file, its
    α share in the details, and the stored tables are the built-in families' only."""
    monkeypatch.setattr(an, "FAMILIES", (*an.FAMILIES, FirstTokenFamily(token=15)))
    proto = load_protocol(write_toy(tmp_path, seeds={"per_arm": 60}))
    junit = tmp_path / "junit.xml"
    res = runner.run_protocol(proto, out=tmp_path / "out", junit=junit)
    summary = json.loads((res.run_dir / "summary.json").read_text())
    fams = {f["name"]: f for f in summary["verdict"]["scope"]["families"]}
    line = fams["first_token"]["verdict_line"]
    assert line.startswith("first-token support: ") and fams["first_token"]["ran"]
    assert "first-token support (toy)" in summary["verdict"]["scope"]["tested"]
    assert all(d["alpha_first_token"] > 0 for d in summary["details"].values())
    assert line in (res.run_dir / "report.md").read_text()
    assert line in junit.read_text()
    assert not list(res.run_dir.glob("first_token*"))
