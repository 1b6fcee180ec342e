"""Issue 32: an acceptor arm under ``--fast`` runs the user's kernel in the fast loop
(``engines.fast.FastAcceptorEngine``, registered as ``fast-acceptor``): the same kernel, called
the same way, on the fast engine's models (the static cache) and laws — the loop and forwards the
matched arm (spectest's exact sampler on ``FastEngine``) runs. Checked on CPU in float32 with the
static cache: the tokens equal the acceptor engine's on the built-in loop."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from spectest.engines.acceptor import AcceptorEngine
from spectest.engines.base import ArmJob, DrafterSpec, Models, RowSpec
from spectest.engines.fast import FastAcceptorEngine, FastEngine, as_fast
from spectest.engines.registry import engine_class
from spectest.generation import _class_for
from spectest.models.derive import first_layers
from spectest.models.hf import from_preset
from spectest.models.static import StaticHFModel
from spectest.sampling.params import SamplingParams

KERNELS = Path(__file__).resolve().parent / "acceptor_plugins" / "toy_acceptors.py"


def test_fast_runs_an_acceptor_arm_on_the_fast_acceptor_engine() -> None:
    assert _class_for("acceptor", fast=True) is FastAcceptorEngine
    assert _class_for("acceptor", fast=False) is AcceptorEngine
    assert engine_class("fast-acceptor") is FastAcceptorEngine
    assert issubclass(FastAcceptorEngine, FastEngine) and issubclass(
        FastAcceptorEngine, AcceptorEngine
    )
    # the acceptor's contract, not the built-in engine's: no variant of its own, a draft always
    assert not FastAcceptorEngine.uses_variant and FastAcceptorEngine.needs_draft(None)
    assert FastAcceptorEngine.Options is AcceptorEngine.Options


def test_kernel_in_the_fast_loop_equals_the_built_in_loop() -> None:
    target = from_preset("qwen3-tiny", seed=5, logit_scale=12.0, num_hidden_layers=3)
    draft = first_layers(target, 1)
    opts = AcceptorEngine.parse_options({"kernel": f"{KERNELS}:accept"}, "test")
    params = [
        SamplingParams(temperature=0.8, top_p=0.95),
        SamplingParams(temperature=1.0, top_k=50),
    ]
    rows = tuple(RowSpec(f"c{i}", s, p) for i, p in enumerate(params) for s in range(10))
    job = ArmJob(
        "candidate", "candidate", None, "p0", (1, 2, 3), rows, 8, 12345, 20,
        DrafterSpec(onehot=False, q_mode="processed", k=3), whitebox=True,
    )  # fmt: skip
    slow = AcceptorEngine(opts, Models(target, draft))
    fast = FastAcceptorEngine(opts, Models(target, draft))
    fast.fast_models = Models(as_fast(target, static=True), as_fast(draft, static=True))
    assert isinstance(fast.decode_models().target, StaticHFModel)
    want, got = slow.generate(job), fast.generate(job)
    assert np.array_equal(got.tokens, want.tokens)
    assert got.rounds is not None and want.rounds is not None and got.rounds.equals(want.rounds)
    assert float(got.rounds["accepted"].mean()) > 0  # rounds accept: the kernel's commits matter
    prov = fast.provenance()
    assert prov["kernel_sha256"] and "cuda_graphs" in prov
