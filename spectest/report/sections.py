"""The report's sections in order (``SECTIONS``): what each shows, as text, tables and figures.
Computes no statistic; knows no format.

The why and the details: docs/internals.md "spectest/report/sections.py".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from spectest.decision.summary import rejections_account
from spectest.report import evidence, plots, rows
from spectest.report.rows import _fmt
from spectest.store import HISTOGRAMS, ROUNDS, SEQUENCE, TESTS, TOOTH_SIZES, TRIE
from spectest.stored import StoredRun


@dataclass(frozen=True)
class Text:
    """A paragraph of text (escaped by each renderer); ``small``: a note."""

    text: str
    small: bool = False


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass(frozen=True)
class Figure:
    """A figure drawn only by a renderer that shows figures (report.html)."""

    draw: Callable[[], Any]
    alt: str


@dataclass(frozen=True)
class Section:
    title: str
    blocks: list[Text | Table | Figure] = field(default_factory=list)


def _main(stored: StoredRun) -> str:
    comps = [c["arm"] for c in stored.summary.get("comparisons", [])]
    return "candidate" if "candidate" in comps else (comps[0] if comps else "candidate")


def _arms(stored: StoredRun) -> list[str]:
    return ["reference", *[c["arm"] for c in stored.summary.get("comparisons", [])]]


def setup(stored: StoredRun) -> Section | None:
    s = stored.summary
    out: list[Text | Table | Figure] = []
    if s.get("models"):
        m = s["models"]
        out.append(
            Text(
                f"Models: target {m.get('target')}, draft {m.get('draft')} ({m.get('dtype')}, "
                f"{m.get('device')}); candidate sampler {s.get('candidate')}; "
                f"{s.get('positions')} positions; {s.get('seeds_per_arm')} seeds per arm."
            )
        )
        out.append(Text(rows.arms_line(s)))
    a = s.get("analysis") or {}
    if a:
        trie = a.get("trie") or {}
        out.append(
            Text(
                f"Tests: α = {a.get('alpha')} split equally over the families that ran, "
                f"multiplicity {a.get('multiplicity')}, pooled χ² with minimum expected count "
                f"{a.get('min_expected')}, trie depth {trie.get('depth')} (nodes ≥ "
                f"{trie.get('min_count')}), white-box {'on' if a.get('whitebox') else 'off'}, "
                f"{a.get('null_permutations')} permutations for the TV null.",
                small=True,
            )
        )
    return Section("Set-up", out) if out else None


def sequential(stored: StoredRun) -> Section | None:
    line, h, r = rows.sequential_rows(stored.summary)
    return (
        Section("Path of the evidence (sequential looks)", [Text(line), Table(h, r)]) if r else None
    )


def per_config(stored: StoredRun) -> Section | None:
    h, r = rows.config_rows(stored.summary)
    note = Text(
        "Rejections in this config: the tests that belong to the config (cell-positions, trie "
        "nodes, length tables), after correction. White-box and pooled sequence-level tests "
        "are run-level and belong to no config.",
        small=True,
    )
    account = rejections_account(stored.summary)
    return Section("Summary per config", [Table(h, r), note, *([Text(account)] if account else [])])


def where_it_differs(stored: StoredRun) -> Section | None:
    tests = stored.table(TESTS)
    if tests is None or len(tests) == 0:
        return None
    main = _main(stored)
    worst = evidence.worst_cells(tests, main)
    hist = stored.table(HISTOGRAMS)
    text = rows.token_text(stored)
    main_rows = tests[tests["comparison"] == main] if "comparison" in tests.columns else tests
    n_rej = int(main_rows["reject"].astype(bool).sum()) if "reject" in main_rows else 0
    said = (
        f"{n_rej} cell-position(s) of {main} rejected; the worst are shown below"
        if n_rej
        else f"no cell-position of {main} rejected; the least likely under H0 are shown below"
    )
    blocks: list[Text | Table | Figure] = [
        Text(said),
        Figure(lambda: evidence.evidence_map(tests, main), "evidence per prompt and position"),
        Figure(lambda: evidence.token_bars(hist, worst, main, text), "token shares"),
    ]
    if hist is not None and len(worst):
        t_rows = []
        for c in worst.itertuples(index=False):
            at = hist[
                (hist["prompt_id"] == c.prompt_id)
                & (hist["config_id"] == c.config_id)
                & (hist["position"] == c.position)
            ]
            tops = []
            for arm in ("reference", main):
                g = at[at["arm"] == arm].sort_values("count", ascending=False).head(4)
                n = max(int(at.loc[at["arm"] == arm, "count"].sum()), 1)
                tops.append(
                    ", ".join(
                        f"{text(int(t))} {k / n:.2f}"
                        for t, k in zip(g["token_id"], g["count"], strict=True)
                    )
                )
            where = f"{c.prompt_id} / {c.config_id} @ {int(c.position)}"
            t_rows.append([where, f"{float(c.p_adj):.2g}", f"{float(c.tv):.3f}", *tops])
        blocks.append(
            Table(
                ["cell-position", "p adj", "TV", "reference top tokens", f"{main} top tokens"],
                t_rows,
            )
        )
    return Section("Where the law differs", blocks)


def strength(stored: StoredRun) -> Section | None:
    s = stored.summary
    if not s.get("teeth"):
        return None
    h, r = rows.teeth_rows(s)
    blocks: list[Text | Table | Figure] = [
        Table(h, r),
        Text(
            "margin: log10(α of the cell family / the smallest adjusted cell p-value); a tooth "
            "that must be killed needs a margin > 0, the null arm one < 0.",
            small=True,
        ),
    ]
    sh, sr = rows.tooth_size_rows(stored)
    if sr:
        blocks.append(Table(sh, sr))
        tests, sizes = stored.table(TESTS), stored.table(TOOTH_SIZES)
        if tests is not None:
            main, arms = _main(stored), _arms(stored)
            blocks.append(
                Figure(
                    lambda: evidence.sizes_vs_resolution(tests, sizes, main, arms),
                    "tooth sizes and resolution",
                )
            )
    return Section("How strong the tests were (teeth)", blocks)


def failing(stored: StoredRun) -> Section | None:
    lines: list[Text | Table | Figure] = [
        Text(str(f))
        for c in stored.summary.get("comparisons", [])
        if c["role"] == "candidate"
        for f in c["failing"]
    ]
    return Section("Failing tests (candidate, most significant first)", lines) if lines else None


# each family's table: (file, title, columns shown)
FAMILY_TABLES = (
    (
        TESTS,
        "token χ² per cell-position",
        "prompt_id config_id position statistic dof p_adj reject tv tv_null_mean mde_tv status",
    ),
    (
        TRIE,
        "prefix trie",
        "prompt_id config_id kind depth prefix statistic dof p_adj reject n_ref n_cand status",
    ),
    (SEQUENCE, "sequence-level (pooled rows)", "test scope statistic z p_adj reject mde unit"),
)


def _lengths_line(f: dict[str, Any]) -> Text:
    """The sequence-lengths family of the verdict's scope, in one line."""
    ran = f"{'ran' if f.get('ran') else 'did not run'}"
    res = f", resolution {_fmt(f.get('mde'), 3)} {f.get('mde_unit')}" if f.get("ran") else ""
    return Text(
        f"sequence lengths: {ran} ({f.get('n_tested')} tested, {f.get('n_untestable')} "
        f"untestable){res}"
    )


def families(stored: StoredRun) -> Section | None:
    """Every family that ran, in its own table (the main comparison's rows)."""
    main = _main(stored)
    blocks: list[Text | Table | Figure] = []
    for fname, title, cols in FAMILY_TABLES:
        df = stored.table(fname)
        if fname == SEQUENCE and df is not None and "scope" in df.columns:
            df = df[df["scope"] == "pooled"]
        h, r, n = rows.family_table_rows(df, main, cols.split())
        if r:
            blocks += [
                Text(f"{title}: {min(n, len(r))} of {n} rows, most significant first"),
                Table(h, r),
            ]
    scope = (stored.summary.get("verdict") or {}).get("scope") or {}
    blocks += [_lengths_line(f) for f in scope.get("families", []) if f.get("name") == "lengths"]
    wh, wr = rows.whitebox_rows(stored)
    if wr:
        blocks += [Text(rows.whitebox_heading(stored)), Table(wh, wr)]
    return Section("Every family that ran", blocks) if blocks else None


def plots_section(stored: StoredRun) -> Section | None:
    tests, rounds = stored.table(TESTS), stored.table(ROUNDS)
    comps, arms = [c["arm"] for c in stored.summary.get("comparisons", [])], _arms(stored)
    blocks: list[Text | Table | Figure] = []
    if tests is not None and len(tests):
        blocks += [
            Figure(lambda: plots.tv_by_position(tests, comps), "TV per position"),
            Figure(lambda: plots.pvalue_plots(tests, comps), "p-values"),
        ]
    blocks.append(Figure(lambda: plots.acceptance_by_position(rounds, arms), "acceptance rate"))
    return Section("Plots (one colour per arm in every figure)", blocks)


def samples(stored: StoredRun) -> Section | None:
    dec = rows.decoded_samples(stored)
    if not dec:
        return None
    r = [[d["arm"], d["prompt_id"], d["config_id"], d["seed"], repr(d["text"])] for d in dec]
    return Section("A few samples", [Table(["arm", "prompt", "config", "seed", "text"], r)])


def provenance(stored: StoredRun) -> Section | None:
    s, prov = stored.summary, stored.provenance
    if not prov:
        return None
    pk = ", ".join(f"{k} {x}" for k, x in sorted((prov.get("packages") or {}).items()))
    return Section(
        "Provenance",
        [
            Text(
                f"protocol hash {s.get('protocol_hash')} · git {prov.get('git_sha')} · device "
                f"{prov.get('device')} · spectest {prov.get('spectest_version')} · {pk}",
                small=True,
            ),
            Text(f"Seed ranges per arm: {seed_ranges_text(prov.get('seed_ranges'))}", small=True),
        ],
    )


def seed_ranges_text(ranges: Any) -> str:
    """``{arm: [start, stop)}`` (the manifest's ``seed_ranges``) as ``reference 0–399 ·
    null 400–799`` (inclusive), in order of their first seed; anything else as it is."""
    if not isinstance(ranges, dict) or not ranges:
        return str(ranges)
    parts = []

    def start(item: tuple[Any, Any]) -> tuple[Any, ...]:
        r = item[1]
        first = r[0] if isinstance(r, (list, tuple)) and r and isinstance(r[0], int) else 0
        return (first, item[0] != "reference", str(item[0]))

    for arm, r in sorted(ranges.items(), key=start):
        ok = isinstance(r, (list, tuple)) and len(r) == 2 and all(isinstance(x, int) for x in r)
        parts.append(f"{arm} {r[0]}–{r[1] - 1}" if ok and r[1] > r[0] else f"{arm} {r}")
    return " · ".join(parts) + " (seeds, inclusive)"


# the report's sections, in order (a new one: a function above and an entry here)
SECTIONS: list[Callable[[StoredRun], Section | None]] = [
    setup,
    sequential,
    per_config,
    where_it_differs,
    strength,
    failing,
    families,
    plots_section,
    samples,
    provenance,
]


def build(stored: StoredRun) -> list[Section]:
    """The sections of ``stored`` that have something to show, in order."""
    return [sec for make in SECTIONS if (sec := make(stored)) is not None]
