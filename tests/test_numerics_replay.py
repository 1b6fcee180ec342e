"""Issue 32: the numerics replay on the fast engine's model (``spectest.numerics.replay``).

Exact checks: replayed on the model the fast engine ran (the static-cache model), the verify
schedule gives every emitted token the very probability the run recorded in its white-box column;
replayed on the loaded (dynamic-cache) model — what ``drift_table`` did before — it does not (the
static cache attends over masked slots: float32 rounding apart). The same on CUDA in bfloat16 with
CUDA graphs (``-m gpu``, skipped without CUDA), where the whole drift table is built too."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from spectest import schema
from spectest.engines.base import DecodeRequest, DrafterSpec, RowSpec, rounds_frame, samples_frame
from spectest.engines.fast import as_fast, speculative_decode_fast
from spectest.models.base import LanguageModel
from spectest.models.derive import first_layers
from spectest.models.hf import HFModel, from_preset
from spectest.models.static import StaticHFModel
from spectest.models.toy import ToyLM
from spectest.numerics.replay import replay_model, replay_probs
from spectest.numerics.table import _verify_logits, drift_table
from spectest.sampling.mutants import get_variant
from spectest.sampling.params import SamplingParams, SamplingTensors
from spectest.sampling.scaled import ScaledLogits

PROMPT = [1, 2, 3, 4]
PARAMS = [
    SamplingParams(temperature=0.8, top_p=0.95),
    SamplingParams(temperature=1.0, top_k=50),
    SamplingParams(temperature=0.7, top_k=20, top_p=0.9),
]
K, T = 3, 10


def _run(target: HFModel, draft: HFModel, static: bool, batch: int, capture=()):
    """The matched arm as ``--fast`` runs it: samples (white-box) and rounds frames (and, with
    ``capture``, the captured rows' verify logits)."""
    rows = [RowSpec(f"c{i}", s, p) for i, p in enumerate(PARAMS) for s in range(8)]
    out = speculative_decode_fast(
        as_fast(target, static=static),
        as_fast(draft, static=static),
        DecodeRequest(
            PROMPT,
            rows,
            num_positions=T,
            run_key=5,
            prompt_id="p0",
            batch_size=batch,
            whitebox=True,
            capture=capture,
        ),
        drafter=DrafterSpec(onehot=True, k=K),
        variant=get_variant("exact"),
    )
    samples = samples_frame(np.asarray(out.tokens), "p0", rows, "matched", out.whitebox)
    if capture:
        return rows, samples, rounds_frame(out.rounds, "p0", rows, "matched"), out.verify
    return rows, samples, rounds_frame(out.rounds, "p0", rows, "matched")


def _replayed(model: LanguageModel, rows, samples, rounds, batch: int):
    """Per batch of the run: the rows' tokens ``[b, T]`` and replayed verify logits."""
    key = [schema.CONFIG_ID, schema.SEED]
    order = [(r.config_id, r.seed) for r in rows]
    toks = samples.pivot_table(index=key, columns=schema.POSITION, values=schema.TOKEN_ID)
    toks = torch.tensor(toks.loc[order].to_numpy(), dtype=torch.int64, device=model.device)
    by_row = {k: (g.sort_values("round")["accepted"] + 1).tolist() for k, g in rounds.groupby(key)}
    commits = [by_row[k] for k in order]
    for lo in range(0, len(rows), batch):  # the run's batches
        part = toks[lo : lo + batch]
        keep = torch.arange(len(part), device=model.device)
        prompt = torch.tensor(PROMPT, device=model.device)
        yield lo, part, _verify_logits(model, prompt, part, commits[lo : lo + batch], K, keep)


def _replayed_p(model: LanguageModel, rows, samples, rounds, batch: int) -> np.ndarray:
    """The replayed verify law's probability of each emitted token ``[rows, T]``."""
    got = []
    for lo, part, logits in _replayed(model, rows, samples, rounds, batch):
        st = SamplingTensors.from_params([r.params for r in rows[lo : lo + batch]], model.device)
        p = replay_probs(fast=True)(logits, st)
        got.append(p.gather(2, part[:, :, None])[..., 0].cpu().numpy())
    return np.concatenate(got)


def _recorded_p(rows, samples) -> np.ndarray:
    key = [schema.CONFIG_ID, schema.SEED]
    wb = samples.pivot_table(index=key, columns=schema.POSITION, values=schema.WB_P)
    return wb.loc[[(r.config_id, r.seed) for r in rows]].to_numpy()


@pytest.fixture(scope="module")
def pair() -> tuple[HFModel, HFModel]:
    target = from_preset("qwen3-tiny", seed=5, logit_scale=12.0, num_hidden_layers=3)
    return target, first_layers(target, 1)


def test_replay_model_is_the_fast_engines() -> None:
    tiny = from_preset("qwen3-tiny")
    assert replay_model(tiny, fast=False) is tiny
    assert replay_model(tiny, fast=True) is tiny  # on CPU the fast engine runs it as it is
    static = replay_model(tiny, fast=True, static=True)
    assert isinstance(static, StaticHFModel) and static.base is tiny
    assert static.max_slots == as_fast(tiny, static=True).max_slots  # the same windows
    toy = ToyLM(12, 2, 2.0, seed=1)
    assert replay_model(toy, fast=True, static=True) is toy
    assert replay_model(static, fast=True) is static


def test_replay_on_the_static_model_gives_the_runs_own_p(pair) -> None:
    """Exact: the fast run's recorded white-box p, token for token, from the replay on the model
    the fast engine ran; the loaded model's replay (the old behaviour) differs in the last bits."""
    target, draft = pair
    rows, samples, rounds = _run(target, draft, static=True, batch=12)
    want = _recorded_p(rows, samples)
    got = _replayed_p(replay_model(target, fast=True, static=True), rows, samples, rounds, 12)
    np.testing.assert_array_equal(got, want)
    old = _replayed_p(target, rows, samples, rounds, 12)
    np.testing.assert_allclose(old, want, rtol=1e-4)  # the same law up to float32 rounding ...
    assert not np.array_equal(old, want)  # ... but not the run's own numbers


@pytest.mark.parametrize("static, dtype", [(False, "float32"), (True, "bfloat16")])
def test_captured_verify_logits_are_the_replays(static: bool, dtype: str) -> None:
    """``DecodeRequest.capture``: the rows' logits kept by the speculative loop
    (``recorder.VerifyCapture``) equal, bit for bit, what ``_verify_logits`` replays for them:
    the loaded model in float32 and the static model in bfloat16, whose logits are a
    ``ScaledLogits`` (kept native, scaled when read). Captured rows across batches of 5."""
    target = from_preset("qwen3-tiny", seed=5, logit_scale=12.0, num_hidden_layers=3,
                         dtype=getattr(torch, dtype))  # fmt: skip
    draft, capture = first_layers(target, 1), (0, 3, 4, 5, 9, 16, 23)
    rows, samples, rounds, kept = _run(target, draft, static, 5, capture)
    assert kept.shape == (len(capture), T, target.vocab_size)
    assert isinstance(kept, ScaledLogits) == static
    model = replay_model(target, fast=True, static=static)
    replayed = torch.cat([v for _, _, v in _replayed(model, rows, samples, rounds, 5)])
    got, want = kept.float(), replayed[list(capture)]
    assert not want.isnan().any() and torch.equal(got, want)
    other = replayed[[i for i in range(len(rows)) if i not in capture]]
    assert not torch.equal(other[: len(capture)], want)  # the rows kept are the rows asked for


def test_drift_table_fast_on_cpu_equals_the_eager_replay(pair) -> None:
    """On CPU the fast engine runs the loaded model itself: ``fast=True`` changes nothing."""
    target, draft = pair
    _rows, samples, rounds = _run(target, draft, static=False, batch=24)
    cfg = [(f"c{i}", p) for i, p in enumerate(PARAMS)]
    kw = dict(arm="matched", K=K, batch_size=24, positions=T, rows_per_cell=4,
              floor_rows_per_cell=2)  # fmt: skip
    fast = drift_table(target, samples, rounds, {"p0": PROMPT}, cfg, fast=True, **kw)
    slow = drift_table(target, samples, rounds, {"p0": PROMPT}, cfg, **kw)
    pd.testing.assert_frame_equal(fast, slow)
    assert len(fast) == 3 * 4 * T and fast["floor_tv"].notna().sum() == 3 * 2 * T


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bf16_replay_gives_the_runs_own_p_and_a_drift_table() -> None:
    """On CUDA in bfloat16 with CUDA graphs: the replay on ``replay_model`` (a second static
    model, as ``drift_table(fast=True)`` builds it) gives the fast run's recorded p exactly."""
    target = from_preset("qwen3-tiny", seed=5, device="cuda", dtype=torch.bfloat16,
                         logit_scale=12.0, num_hidden_layers=3)  # fmt: skip
    draft = first_layers(target, 1)
    rows, samples, rounds = _run(target, draft, static=True, batch=12)
    model = replay_model(target, fast=True)
    assert isinstance(model, StaticHFModel) and model.cuda_graphs
    got = _replayed_p(model, rows, samples, rounds, 12)
    np.testing.assert_array_equal(got, _recorded_p(rows, samples))
    cfg = [(f"c{i}", p) for i, p in enumerate(PARAMS)]
    table = drift_table(
        target, samples, rounds, {"p0": PROMPT}, cfg, arm="matched", K=K, batch_size=12,
        positions=T, rows_per_cell=4, floor_rows_per_cell=2, fast=True,
    )  # fmt: skip
    assert len(table) == 3 * 4 * T and np.isfinite(table["tv"]).all()
    assert table["floor_tv"].notna().sum() == 3 * 2 * T
    # the rows kept at generation (CUDA graphs, ScaledLogits) are the replay's, and the table
    # that reads them is the table that replays
    measured = [i for i in range(len(rows)) if rows[i].seed < 4]  # each config's first 4
    *_, kept = _run(target, draft, static=True, batch=12, capture=tuple(measured))
    replayed = torch.cat([v for _, _, v in _replayed(model, rows, samples, rounds, 12)])
    assert torch.equal(kept.float(), replayed[measured])
    keys = [(rows[i].config_id, rows[i].seed) for i in measured]
    read = drift_table(
        target, samples, rounds, {"p0": PROMPT}, cfg, arm="matched", K=K, batch_size=12,
        positions=T, rows_per_cell=4, floor_rows_per_cell=2, fast=True, verify={"p0": (keys, kept)},
    )  # fmt: skip
    pd.testing.assert_frame_equal(read, table, check_exact=True)


def test_restored_prompt_prefill_gives_the_computed_logits(pair) -> None:
    """The replay model computes a prompt's one-row prefill once and restores it for every later
    prefill of that prompt (each floor row): the logits of every decode are bit-identical to a
    plain static model's, which prefills each time."""
    from spectest.numerics.decode import decode_logits

    target = pair[0]
    model, ref = replay_model(target, fast=True, static=True), StaticHFModel(target)
    assert type(model).__name__ == "ReplayStaticModel"
    prompt = torch.tensor(PROMPT)
    toks = torch.tensor([[5, 6, 7, 8, 9], [9, 8, 7, 6, 5], [1, 1, 2, 3, 5]])
    for rows in (toks, toks[:1], toks[1:2], toks[2:3], toks):
        keep = torch.arange(len(rows))
        assert torch.equal(decode_logits(model, prompt, rows, keep),
                           decode_logits(ref, prompt, rows, keep))  # fmt: skip
    assert list(model._prefills) == [tuple(PROMPT)]  # one prefill computed, then restored


def test_verify_replay_of_a_subset_stops_early_and_equals_the_whole_batch(pair) -> None:
    """``_verify_logits`` stops once every kept row is complete: the kept rows' logits equal
    those of the whole batch's replay."""
    target, draft = pair
    rows, samples, rounds = _run(target, draft, static=False, batch=24)
    key = [schema.CONFIG_ID, schema.SEED]
    order = [(r.config_id, r.seed) for r in rows]
    toks = samples.pivot_table(index=key, columns=schema.POSITION, values=schema.TOKEN_ID)
    toks = torch.tensor(toks.loc[order].to_numpy(), dtype=torch.int64)
    by_row = {k: (g.sort_values("round")["accepted"] + 1).tolist() for k, g in rounds.groupby(key)}
    commits = [by_row[k] for k in order]
    prompt = torch.tensor(PROMPT)
    full = _verify_logits(target, prompt, toks, commits, K, torch.arange(24))
    short = min(range(24), key=lambda i: len(commits[i]))  # the row that finished first
    assert len(commits[short]) < max(len(c) for c in commits)
    sub = torch.tensor([short])
    got = _verify_logits(target, prompt, toks, commits, K, sub)
    assert torch.equal(got, full[sub]) and not got.isnan().any()


def test_console_prints_the_numerics_phase() -> None:
    import io

    from rich.console import Console

    from spectest.cli.printing import _print_timings

    buf = io.StringIO()
    _print_timings(Console(file=buf, width=300), {"load": 1.0, "numerics": 23.4, "analyze": 2.0})
    assert "numerics 23.4" in buf.getvalue()


def test_a_run_reads_its_kept_rows_instead_of_replaying(tmp_path) -> None:
    """A single-stage matched run keeps claim (b)'s measured rows at generation
    (``EngineSet.capture_rows``) and replays the verify schedule of none of its prompts; every
    table equals that of the same run whose rows did not fit (``capture_fits`` False), which
    replays both prompts."""
    import json

    from toy_protocol import TOY, write_toy

    from spectest import runner
    from spectest.numerics import table as nt
    from spectest.protocol import load_protocol

    models = {**TOY["models"], "target": TOY["models"]["target"] + ",numerics=0.0065"}
    tests = {**TOY["tests"], "numerics": "matched"}
    calls, real = [], nt._verify_logits

    def spy(*a, **k):
        calls.append(1)
        return real(*a, **k)

    replays = {}
    for name, fits in (("kept", True), ("replayed", False)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(nt, "_verify_logits", spy)
            if not fits:
                mp.setattr(nt, "capture_fits", lambda device, need, held: False)
            calls.clear()
            path = write_toy(tmp_path / name, models=models, tests=tests, positions=6)
            runner.run_protocol(load_protocol(path), out=tmp_path / name / "run")
            replays[name] = len(calls)
    assert replays == {"kept": 0, "replayed": 2}  # two prompts
    for t in ("numerics", "samples", "rounds", "tests", "whitebox", "sequence"):
        pd.testing.assert_frame_equal(
            pd.read_parquet(tmp_path / "kept" / "run" / f"{t}.parquet"),
            pd.read_parquet(tmp_path / "replayed" / "run" / f"{t}.parquet"),
            check_exact=True,
        )
    kept, replayed = (
        json.loads((tmp_path / n / "run" / "summary.json").read_text()) for n in replays
    )
    assert kept["verdict"] == replayed["verdict"]
    assert len(pd.read_parquet(tmp_path / "kept" / "run" / "numerics.parquet"))
