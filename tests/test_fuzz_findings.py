"""Regression tests of what the fuzzer (``tools/fuzz.py``) found unclean, each the smallest input
of its class with the outcome its fix gives (results/LOG.md, 2026-12-01 h22).

Before the fixes: a YAML value nested a few hundred levels deep (in the protocol or a ``--set``)
was ``RecursionError`` → exit 4 "internal error"; a 5000-digit integer, a date 2026-13-45 or
``!!timestamp 'x'`` were a constructor's ``ValueError`` / ``AttributeError`` → exit 4; a value
click cannot parse (``--seeds abc``), an unknown or a missing option printed three stderr lines
(usage, hint, error); an acceptor kernel whose return is a tuple / list subclass with a raising
``__len__`` / ``__iter__``, or a tensor subclass whose ``__torch_function__`` raises, or whose
exception's ``__str__`` (or ``sys.exit`` argument's ``__repr__``) raises, was exit 4 "a bug in
spectest"; a p-value plot without a labelled artist put matplotlib's ``UserWarning`` (two more
lines) on the stderr of every such run, beside its one error line.

Everything is exact (no statistics): each run is a tiny toy run whose exit path is the point.
"""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from toy_protocol import write_toy
from typer.testing import CliRunner

from spectest.cli import app
from spectest.engines.acceptor import check_return
from spectest.errors import ConfigError, EngineError, InputError
from spectest.protocol.load import MAX_YAML_DEPTH
from spectest.protocol.load import yaml_load as _yaml_load
from spectest.report.plots import acceptance_by_position, pvalue_plots, tv_by_position

NO_TEETH = {"null_arm": False, "epsilons": [], "mutants": []}


def invoke(*args: object, cwd: Path) -> tuple[int, list[str]]:
    """``spectest ARGS`` in-process (the real boundary); (exit code, non-blank stderr lines)."""
    import os

    old = os.getcwd()
    os.chdir(cwd)
    try:
        r = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
    finally:
        os.chdir(old)
    return r.exit_code, [ln for ln in r.stderr.splitlines() if ln.strip()]


def one_error(lines: list[str]) -> str:
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "internal error" not in lines[0], lines
    return lines[0]


# ----------------------------------------------------------------------------- YAML
@pytest.mark.parametrize("depth", [MAX_YAML_DEPTH + 1, 400, 5000, 50_000])
@pytest.mark.parametrize("shape", ["list", "map"])
def test_deep_yaml_in_a_protocol_is_one_line_exit_2(tmp_path: Path, depth: int, shape: str) -> None:
    proto = write_toy(tmp_path, teeth=NO_TEETH)
    nested = "[" * depth + "]" * depth if shape == "list" else "{a: " * depth + "1" + "}" * depth
    proto.write_text(proto.read_text().replace("description:", "x:") + f"description: {nested}\n")
    code, lines = invoke("run", "--config", proto, "--out", "run", "--no-progress", cwd=tmp_path)
    assert code == 2
    line = one_error(lines)
    assert str(proto) in line and f"nested deeper than {MAX_YAML_DEPTH} levels" in line, line


def test_deep_yaml_in_a_set_override_is_one_line_exit_2(tmp_path: Path) -> None:
    proto = write_toy(tmp_path, teeth=NO_TEETH)
    nested = "[" * 3000 + "]" * 3000
    code, lines = invoke("run", "--config", proto, "--set", f"description={nested}", cwd=tmp_path)
    assert code == 2
    assert "--set description" in one_error(lines)


def test_yaml_nesting_below_the_cap_still_parses() -> None:
    depth = MAX_YAML_DEPTH - 1  # one level is the top-level mapping
    value = _yaml_load("a: " + "[" * depth + "]" * depth, "f.yaml")["a"]
    for _ in range(depth - 1):
        (value,) = value
    assert value == []


@pytest.mark.parametrize(
    "scalar, why",
    [
        ("9" * 5000, "Exceeds the limit (4300 digits)"),
        ("-" + "9" * 5000, "Exceeds the limit (4300 digits)"),
        ("2026-13-45", "month must be in 1..12"),
        ("!!timestamp 'x'", "cannot read the value 'x'"),
        ("!!int 'x'", "invalid literal for int()"),
        ("!!float 'x'", "could not convert string to float"),
    ],
)
def test_yaml_scalar_its_constructor_cannot_build_names_the_line(scalar: str, why: str) -> None:
    with pytest.raises(ConfigError, match=r"^f\.yaml: malformed YAML at line 2, column 4: ") as e:
        _yaml_load(f"version: 1\nx: {scalar}\n", "f.yaml")
    assert why in str(e.value) and "\n" not in str(e.value)


def test_huge_integer_in_a_protocol_is_exit_2(tmp_path: Path) -> None:
    proto = write_toy(tmp_path, teeth=NO_TEETH)
    proto.write_text(proto.read_text().replace("positions: 4", "positions: " + "9" * 5000))
    code, lines = invoke("run", "--config", proto, "--no-progress", cwd=tmp_path)
    assert code == 2
    assert "cannot read the value" in one_error(lines)


@pytest.mark.parametrize(("escape", "says"), [("\\ud800", "is not valid Unicode"),
                                            ("\\0", "holds a NUL character")])  # fmt: skip
@pytest.mark.parametrize("via", ["file", "set"])
def test_string_no_file_can_hold_is_exit_2_naming_its_line(
    tmp_path: Path, escape: str, says: str, via: str
) -> None:
    """Fuzz cases protocol-01784 / protocol-02034 (seed 20261203): ``prompts.file: "\\ud800"``
    was exit 4 "UnicodeEncodeError ... surrogates not allowed", ``"\\0"`` exit 4 "embedded null
    byte" (the path reached the filesystem)."""
    proto = write_toy(tmp_path, teeth=NO_TEETH)
    args: list[object] = ["run", "--config", proto, "--no-progress"]
    if via == "file":
        text = proto.read_text()
        assert "file: prompts.jsonl" in text
        proto.write_text(text.replace("file: prompts.jsonl", f'file: "p{escape}.jsonl"'))
        where = "toy.yaml: malformed YAML at line"
    else:
        args += ["--set", f'prompts.file="p{escape}.jsonl"']
        where = "--set prompts.file"
    code, lines = invoke(*args, cwd=tmp_path)
    assert code == 2
    line = one_error(lines)
    assert where in line and says in line, line


@pytest.mark.parametrize("top_k", [2**31, 2**63, 2**64])
def test_top_k_beyond_int32_is_exit_2_naming_it(tmp_path: Path, top_k: int) -> None:
    """Fuzz case protocol-01799 (seed 20261202): ``top_k: 18446744073709551616`` was exit 4,
    "internal error: ValueError: Overflow when unpacking long long" (torch's int64 tensor)."""
    proto = write_toy(tmp_path, teeth=NO_TEETH)
    code, lines = invoke("run", "--config", proto, "--no-progress", "--set",
                         f"configs.a.top_k={top_k}", cwd=tmp_path)  # fmt: skip
    assert code == 2
    line = one_error(lines)
    assert "top_k must be an integer in [0, 2147483647]" in line and str(top_k) in line, line


def test_top_k_at_int32_max_keeps_every_token() -> None:
    from spectest.sampling.params import MAX_TOP_K, SamplingParams, SamplingTensors
    from spectest.sampling.transforms import logits_to_probs

    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(0)).repeat(3, 1)
    rows = [SamplingParams(temperature=0.9, top_k=k) for k in (MAX_TOP_K, 0, 50)]
    probs = logits_to_probs(logits, SamplingTensors.from_params(rows))
    assert torch.equal(probs[0], probs[1]) and torch.equal(probs[0], probs[2])
    assert bool((probs[0] > 0).all())


# ----------------------------------------------------------------------------- usage errors
@pytest.mark.parametrize(
    "args, says",
    [
        (["run", "--config", "toy.yaml", "--seeds", "abc"], "Invalid value for '--seeds'"),
        (["run", "--config", "toy.yaml", "--threads", "abc"], "Invalid value for '--threads'"),
        (["run", "--config", "toy.yaml", "--positions", "٣x"], "Invalid value for '--positions'"),
        (["run", "--nope"], "No such option: --nope"),
        (["run"], "Missing option '--config'"),
        (["run", "--config", "toy.yaml", "--set"], "Option '--set' requires an argument"),
        (["run", "--config", "toy.yaml", "extra"], "Got unexpected extra argument"),
        (["compare", "--reference", "a.csv"], "Missing option '--candidate'"),
        (["power", "--tv", "x"], "Invalid value for '--tv'"),
        (["nope"], "No such command 'nope'"),
    ],
)
def test_usage_error_is_one_line_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    write_toy(tmp_path, teeth=NO_TEETH)
    code, lines = invoke(*args, cwd=tmp_path)
    assert code == 2
    assert says in one_error(lines), lines


def test_help_and_version_keep_their_output(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["run", "--help"])
    assert r.exit_code == 0 and "--config" in r.stdout and not r.stderr
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout.startswith("spectest ")
    r = CliRunner().invoke(app, [])  # no command: the help, on stderr, exit 2 (click's own)
    assert r.exit_code == 2 and "Usage:" in r.stderr


# ----------------------------------------------------------------------------- plug-ins
def _inputs(B: int = 3, K: int = 2) -> tuple[torch.Tensor, ...]:
    drafts = torch.tensor([[1, 2]] * B)[:, :K]
    out = torch.cat([drafts, torch.full((B, 1), 5)], 1)  # every draft accepted, bonus 5
    n = torch.full((B,), K)
    return drafts, out, n


class _LenRaises(tuple):  # type: ignore[type-arg]
    def __len__(self) -> int:
        raise RuntimeError("len")


class _IterRaises(list):  # type: ignore[type-arg]
    def __iter__(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("iter")


class _TorchFunctionRaises(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        raise RuntimeError("torch function")


@pytest.mark.parametrize(
    "wrap, says",
    [
        (lambda o, a, e: _LenRaises((o, a, e)), "cannot be read: raised RuntimeError: len"),
        (lambda o, a, e: _IterRaises([o, a, e]), "cannot be read: raised RuntimeError: iter"),
        (lambda o, a, e: [o, a, e], None),  # a list is read as a tuple: the contract allows it
        (lambda o, a, e: (o.as_subclass(_TorchFunctionRaises), a, e),
         "output_token_ids must be a plain torch.Tensor, got the subclass _TorchFunctionRaises"),
        (lambda o, a, e: (o, a, e, o), "got a tuple of 4 items"),
    ],
)  # fmt: skip
def test_kernel_return_of_hostile_objects_names_the_plugin(wrap, says) -> None:  # type: ignore[no-untyped-def]
    drafts, out, n = _inputs()
    ret = wrap(out, n, n)
    if says is None:
        got = check_return(ret, "k.py:accept", drafts, 16, torch.device("cpu"))
        assert all(type(t) is torch.Tensor for t in got)
        return
    with pytest.raises(EngineError, match=r"^acceptor k\.py:accept: ") as e:
        check_return(ret, "k.py:accept", drafts, 16, torch.device("cpu"))
    assert says in str(e.value)


KERNELS = {
    "iter_raises": (
        "class L(list):\n    def __iter__(self): raise RuntimeError('it')\n"
        "def accept(draft_probs, draft_token_ids, uniforms, target_probs):\n"
        "    return L([1, 2, 3])\n",
        "its return value cannot be read: raised RuntimeError: it",
    ),
    "str_raises": (
        "class E(Exception):\n    def __str__(self): raise RuntimeError('no str')\n"
        "def accept(draft_probs, draft_token_ids, uniforms, target_probs):\n    raise E()\n",
        "the kernel raised E: (its message could not be printed)",
    ),
    "exit_repr_raises": (
        "class R:\n    def __repr__(self): raise RuntimeError('no repr')\n"
        "def accept(draft_probs, draft_token_ids, uniforms, target_probs):\n"
        "    raise SystemExit(R())\n",
        "called sys.exit(<a R that cannot be printed>) (SystemExit)",
    ),
    "import_str_raises": (
        "class E(Exception):\n    def __str__(self): raise RuntimeError('no str')\nraise E()\n",
        "cannot import the kernel ((its message could not be printed))",
    ),
    "torch_function": (
        textwrap.dedent(
            """\
            import torch
            class S(torch.Tensor):
                @classmethod
                def __torch_function__(cls, f, t, a=(), k=None):
                    raise RuntimeError('torch function')
            def accept(draft_probs, draft_token_ids, uniforms, target_probs):
                B, K = draft_token_ids.shape
                out = torch.cat([draft_token_ids, draft_token_ids[:, :1]], 1)
                n = torch.full((B,), K)
                return out.as_subclass(S), n, n
            """
        ),
        "output_token_ids must be a plain torch.Tensor, got the subclass S",
    ),
}


@pytest.mark.parametrize("case", sorted(KERNELS))
def test_kernel_whose_objects_raise_is_exit_2_naming_it(tmp_path: Path, case: str) -> None:
    body, says = KERNELS[case]
    (tmp_path / "kernel.py").write_text(body)
    proto = write_toy(tmp_path, teeth=NO_TEETH, seeds={"per_arm": 4}, positions=2)
    code, lines = invoke(
        "run", "--config", proto, "--out", "run", "--no-progress",
        "--set", "candidate=acceptor:kernel.py:accept", cwd=tmp_path,
    )  # fmt: skip
    assert code == 2, lines
    line = one_error(lines)
    assert line.startswith(f"error: acceptor {tmp_path / 'kernel.py'}:accept: "), line
    assert says in line, line
    assert not (tmp_path / "run" / "manifest.json").exists()


# ----------------------------------------------------------------------------- report plots
def test_plots_without_labelled_artists_warn_nothing() -> None:
    """A p-value plot of comparisons whose p-values are all missing (nothing testable), a TV plot
    of no prompt and an acceptance plot of rounds that drafted nothing have no labelled artist:
    matplotlib's "No artists with labels" ``UserWarning`` went to the run's stderr."""
    tests = pd.DataFrame(
        {
            "comparison": ["candidate"] * 2,
            "prompt_id": ["p0", "p0"],
            "config_id": ["a", "a"],
            "position": [0, 1],
            "pvalue": [np.nan, np.nan],
            "tv": [np.nan, np.nan],
        }
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fig in (pvalue_plots(tests, ["candidate"]), tv_by_position(tests.iloc[:0])):
            if fig is not None:
                import matplotlib.pyplot as plt

                plt.close(fig)
        rounds = pd.DataFrame(
            {"arm": ["candidate"], "position": [0], "drafted": [0], "accepted": [0]}
        )
        fig = acceptance_by_position(rounds)
        if fig is not None:
            import matplotlib.pyplot as plt

            plt.close(fig)


# ----------------------------------------------------------------------------- prompts, --config
@pytest.mark.parametrize(
    "ids, why",
    [
        ("[" * 100_000 + "]" * 100_000, "not valid JSON (nested too deep)"),
        ("[" + "9" * 5000 + "]", "not valid JSON (Exceeds the limit (4300 digits)"),
    ],
)
def test_prompt_line_json_cannot_read_is_exit_2_naming_the_line(
    tmp_path: Path, ids: str, why: str
) -> None:
    proto = write_toy(tmp_path, teeth=NO_TEETH)
    (tmp_path / "prompts.jsonl").write_text(
        '{"id": "p0", "ids": [1]}\n{"id": "p1", "ids": ' + ids + "}\n"
    )
    code, lines = invoke("run", "--config", proto, "--no-progress", cwd=tmp_path)
    assert code == 2
    line = one_error(lines)
    assert f"{tmp_path / 'prompts.jsonl'}: line 2: {why}" in line, line


@pytest.mark.parametrize("config", ["", ".", "/", "./"])
def test_config_that_names_a_directory_is_exit_4_naming_it(tmp_path: Path, config: str) -> None:
    """``Path('.').with_name(...)`` raised ``ValueError`` (exit 4, "internal error"); click makes
    ``--config ''`` the path ``.``, a directory like ``--config ..`` (exit 4 naming it)."""
    code, lines = invoke("run", "--config", config, "--no-progress", cwd=tmp_path)
    assert code == 4
    assert "cannot read the protocol file: is a directory" in one_error(lines)


@pytest.mark.parametrize("option", ["--junit", "--summary-md"])
def test_empty_output_option_note_never_joins_an_error_line(tmp_path: Path, option: str) -> None:
    """``--junit ''`` is skipped with a note — printed after a result only: a run that fails
    (here a CUDA protocol on a machine without CUDA) prints its one error line alone (found by
    tools/fuzz.py: the note and the error were two stderr lines)."""
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    proto = write_toy(tmp_path, teeth=NO_TEETH)
    code, lines = invoke(
        "run", "--config", proto, "--out", tmp_path / "run", option, "", "--no-progress",
        "--set", 'models.device="cuda"', cwd=tmp_path,
    )  # fmt: skip
    assert code in (2, 4)
    assert "cuda" in one_error(lines).lower()


def test_parquet_with_damaged_pandas_metadata_is_exit_2_naming_it(tmp_path: Path) -> None:
    """A samples file whose pandas metadata lost a key (one flipped byte in the fuzzer's case
    byo-00827): ``to_pandas`` raised ``KeyError: 'pandas_type'`` (exit 4, "internal error")."""
    import json as _json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from spectest.files import read_table

    t = pa.Table.from_pandas(pd.DataFrame({"prompt_id": ["p0"], "seed": [0]}))
    meta = _json.loads(t.schema.metadata[b"pandas"])
    for c in meta["columns"]:
        c.pop("pandas_type", None)
    f = tmp_path / "damaged.parquet"
    pq.write_table(t.replace_schema_metadata({b"pandas": _json.dumps(meta).encode()}), f)
    with pytest.raises(InputError, match=r"damaged\.parquet: not a readable Parquet file"):
        read_table(f)


@pytest.mark.parametrize("token", [2**31 - 1, 2**31 - 2])
def test_compare_with_a_token_id_at_int32_max_reaches_a_verdict(tmp_path: Path, token: int) -> None:
    """Fuzz case byo-02075 (seed 20261203): one stored token id of 2**31 - 1 made the sequence
    family's pair codes overflow the table keys: exit 4, "OverflowError: stratum x token key
    does not fit int64". A law over a few ids and one huge id is a verdict like any other."""
    g = np.random.default_rng(7)
    rows = []
    for arm, seeds in (("reference", range(80)), ("candidate", range(1000, 1080))):
        for s in seeds:
            toks = g.choice(4, size=3, p=[0.4, 0.3, 0.2, 0.1])
            rows += [(arm, "p0", "a", s, t, int(toks[t])) for t in range(3)]
    df = pd.DataFrame(rows, columns=["arm", "prompt_id", "config_id", "seed", "position",
                                     "token_id"])  # fmt: skip
    df.loc[(df.arm == "candidate") & (df.position == 1) & (df.seed == 1007), "token_id"] = token
    for arm in ("reference", "candidate"):
        df[df.arm == arm].drop(columns="arm").to_parquet(tmp_path / f"{arm}.parquet")
    args = ["--reference", "reference.parquet", "--candidate", "candidate.parquet", "--out", "run"]
    code, lines = invoke("compare", *args, "--no-progress", cwd=tmp_path)
    assert code in (0, 1, 3), lines
    assert (tmp_path / "run" / "summary.json").is_file()
