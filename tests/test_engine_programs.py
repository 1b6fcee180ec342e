"""The shipped engine programs (spectest/engines/programs/): their line-protocol handling against
fake engine objects (the real engines run in tests/test_real_engines_cpu.py, opt-in), and the
rule that they import nothing outside the standard library, their engine and ``_jsonl``.

Every check here is exact (no statistics)."""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

PROGRAMS = Path(__file__).resolve().parents[1] / "spectest" / "engines" / "programs"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_prog_{name}", PROGRAMS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ov = _load("openvino_genai_engine")
mr = _load("mistralrs_engine")
ml = _load("mlx_lm_engine")
jsonl = sys.modules["_jsonl"]  # the sibling the programs imported


def job(jid: int = 0, seeds=(5, 6, 7), **sampling: Any) -> dict[str, Any]:
    s = {"temperature": 0.8, "top_k": 0, "top_p": 0.95, "min_p": 0.0}
    s.update(sampling)
    s["order"] = ["temperature", "top_k", "top_p", "min_p"]
    return {
        "type": "job",
        "id": jid,
        "arm": "candidate",
        "role": "candidate",
        "prompt_id": "f0",
        "prompt": [1, 45, 200, 17],
        "config_id": "c",
        "sampling": s,
        "max_tokens": 4,
        "seeds": list(seeds),
        "row_keys": [1000 + s for s in seeds],
        "run_key": 9,
        "drafter": {"kind": "sampled", "k": 3, "q": "processed"},
    }


def converse(hello: dict[str, Any], decode: Any, jobs: list[dict[str, Any]]) -> list[dict]:
    inp = io.StringIO("".join(json.dumps(j) + "\n" for j in jobs))
    out = io.StringIO()
    assert jsonl.serve(hello, decode, stdin=inp, stdout=out) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


# ----------------------------------------------------------------------------- OpenVINO
class FakeOVPipe:
    """The two methods of ``openvino_genai.LLMPipeline`` the program uses."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.configs: list[Any] = []
        self.inputs: list[Any] = []
        self.fail_on = fail_on

    def get_generation_config(self) -> Any:
        return SimpleNamespace(repetition_penalty=1.3, do_sample=False)  # a model's own defaults

    def generate(self, inputs: Any, config: Any) -> Any:
        if self.fail_on is not None and config.rng_seed == self.fail_on:
            raise RuntimeError("Check 'content_length <= prompt_ids.size()' failed")
        self.inputs.append(inputs)
        self.configs.append(config)
        toks = [(config.rng_seed + i) % 512 for i in range(config.max_new_tokens + 2)]
        metrics = SimpleNamespace(get_num_draft_tokens=lambda: 6, get_num_accepted_tokens=lambda: 4)
        return SimpleNamespace(tokens=[toks], extended_perf_metrics=metrics)


def test_openvino_program_answers_every_seed_with_its_row_key_as_rng_seed() -> None:
    pipe = FakeOVPipe()
    runner = ov.OVRunner(pipe, lambda ids: ("tensor", tuple(ids)), assistant_tokens=3)
    lines = converse({"engine": "openvino-genai", "version": "x"}, runner.decode, [job()])
    assert lines[0] == {
        "type": "hello",
        "protocol": "spectest-jsonl/1",
        "engine": "openvino-genai",
        "version": "x",
    }
    results = lines[1:]
    assert [r["seed"] for r in results] == [5, 6, 7]
    assert all(r["type"] == "result" and r["id"] == 0 for r in results)
    for r in results:  # rng_seed = row key; max_new_tokens = max_tokens; surplus cut
        assert r["tokens"] == [(1000 + r["seed"] + i) % 512 for i in range(4)]
        assert r["rounds"] == [{"drafted": 6, "accepted": 4, "emitted": 4}]
    c = pipe.configs[0]
    assert (c.do_sample, c.temperature, c.top_p, c.top_k, c.min_p) == (True, 0.8, 0.95, 0, 0.0)
    assert (c.max_new_tokens, c.ignore_eos, c.num_assistant_tokens) == (4, True, 3)
    assert c.repetition_penalty == 1.0  # the model's default penalty is reset
    assert [c.rng_seed for c in pipe.configs] == [1005, 1006, 1007]
    assert pipe.inputs[0] == ("tensor", (1, 45, 200, 17))


def test_openvino_program_plain_mode_has_no_rounds_and_no_assistant_tokens() -> None:
    pipe = FakeOVPipe()
    runner = ov.OVRunner(pipe, list, assistant_tokens=None)
    lines = converse({}, runner.decode, [job(top_p=1.0, top_k=50, temperature=1.0)])
    assert all("rounds" not in r for r in lines[1:])
    c = pipe.configs[0]
    assert not hasattr(c, "num_assistant_tokens")
    assert (c.top_k, c.top_p, c.temperature) == (50, 1.0, 1.0)


def test_openvino_program_refuses_two_filters_and_reports_engine_errors_per_job() -> None:
    pipe = FakeOVPipe(fail_on=1006)
    runner = ov.OVRunner(pipe, list, assistant_tokens=3)
    lines = converse({}, runner.decode, [job(0, top_k=50), job(1), job(2, seeds=(8,))])[1:]
    assert lines[0]["type"] == "error" and lines[0]["id"] == 0
    assert "own order" in lines[0]["message"] and "top_k, top_p" in lines[0]["message"]
    assert lines[1]["type"] == "result" and lines[1]["seed"] == 5  # streamed before the failure
    assert lines[2]["type"] == "error" and lines[2]["id"] == 1
    assert "content_length" in lines[2]["message"]  # the engine's own words reach spectest
    assert lines[3] == {
        "type": "result",
        "id": 2,
        "seed": 8,
        "tokens": [(1008 + i) % 512 for i in range(4)],
        "rounds": [{"drafted": 6, "accepted": 4, "emitted": 4}],
    }


def test_openvino_program_override_is_applied_after_the_job() -> None:
    pipe = FakeOVPipe()
    over = jsonl.parse_overrides(["repetition_penalty=1.5", "name=x"])
    assert over == {"repetition_penalty": 1.5, "name": "x"}
    runner = ov.OVRunner(pipe, list, assistant_tokens=None, overrides=over)
    converse({}, runner.decode, [job()])
    assert pipe.configs[0].repetition_penalty == 1.5


def test_programs_refuse_zero_temperature_and_ignore_non_job_lines() -> None:
    runner = ov.OVRunner(FakeOVPipe(), list, assistant_tokens=None)
    inp = io.StringIO(
        '{"type": "log", "message": "x"}\n\nnot json\n' + json.dumps(job(temperature=0.0)) + "\n"
    )
    out = io.StringIO()
    jsonl.serve({}, runner.decode, stdin=inp, stdout=out)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [x["type"] for x in lines] == ["hello", "error", "error"]
    assert "not a JSON line" in lines[1]["message"]
    assert "temperature must be > 0" in lines[2]["message"]


# ----------------------------------------------------------------------------- mistral.rs
class FakeMistral:
    """``Runner.send_completion_request``: answers with the words of fixed token ids, one more
    than asked (as mistral.rs 0.5.0 does)."""

    def __init__(self, words: list[str] | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.words = words

    def send_completion_request(self, req: dict[str, Any]) -> Any:
        self.requests.append(req)
        n = int(req["max_tokens"]) + 1
        words = self.words or [f"t{(len(self.requests) * 7 + i) % 512}" for i in range(n)]
        return SimpleNamespace(
            choices=[SimpleNamespace(text=" ".join(words), finish_reason="length")]
        )


def test_mistralrs_program_text_round_trip_burn_in_and_filters() -> None:
    fake = FakeMistral()
    runner = mr.MistralRunner(fake, lambda **kw: kw, vocab=512)
    lines = converse({"seeds": "ignored"}, runner.decode, [job(top_p=1.0, top_k=50), job(1)])
    burn, *reqs = fake.requests
    assert burn["max_tokens"] == 1 + 1005 % mr.BURN_MOD and burn["temperature"] == 1.0
    assert burn["top_k"] is None and burn["top_p"] == 1.0
    assert len(reqs) == 6 and all(r["prompt"] == "t1 t45 t200 t17" for r in reqs)
    assert reqs[0]["top_k"] == 50 and reqs[0]["top_p"] == 1.0 and reqs[0]["max_tokens"] == 4
    assert reqs[3]["top_k"] is None and reqs[3]["top_p"] == 0.95
    results = lines[1:]
    assert [r["seed"] for r in results] == [5, 6, 7, 5, 6, 7]
    for n, r in enumerate(results, start=2):  # request n's words, first max_tokens of them
        assert r["tokens"] == [(n * 7 + i) % 512 for i in range(4)]
        assert "rounds" not in r
    assert mr.prompt_text([1, 2, 511]) == "t1 t2 t511"


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["t3", "hello"], "no token: 'hello'"),
        (["t3", "t512"], "no token: 't512'"),
        (["t3"], "returned 1 of 4 tokens"),
    ],
)
def test_mistralrs_program_refuses_text_that_is_not_the_tokens(words, message) -> None:
    runner = mr.MistralRunner(FakeMistral(words), lambda **kw: kw, vocab=512)
    lines = converse({}, runner.decode, [job()])
    assert lines[1]["type"] == "error" and message in lines[1]["message"]


# ----------------------------------------------------------------------------- MLX-LM
def test_mlx_rounds_from_draft_flags() -> None:
    f = ml.rounds_from_flags
    # round 1: 2 of 3 accepted + target token; round 2: 0 accepted + target; round 3: last slot
    assert f([True, True, False, False, True], k=3, max_tokens=5) == [
        {"drafted": 3, "accepted": 2, "emitted": 3},
        {"drafted": 2, "accepted": 0, "emitted": 1},
        {"drafted": 1, "accepted": 1, "emitted": 1},
    ]
    assert f([True, True, True, False], k=3, max_tokens=4) == [
        {"drafted": 3, "accepted": 3, "emitted": 4}
    ]
    assert f([True, True], k=3, max_tokens=2) == [{"drafted": 2, "accepted": 2, "emitted": 2}]
    assert sum(r["emitted"] for r in f([False] * 6, k=3, max_tokens=6)) == 6


class FakeMX:
    """``mlx.core`` as the program uses it: ``array`` and ``random.seed``."""

    def __init__(self) -> None:
        self.seeds: list[int] = []
        self.random = SimpleNamespace(seed=self.seeds.append)

    def array(self, xs: list[int]) -> tuple[int, ...]:
        return tuple(xs)


def test_mlx_program_seeds_every_sequence_with_its_row_key() -> None:
    mx = FakeMX()
    calls: list[dict[str, Any]] = []

    def spec_step(prompt, target, draft, num_draft_tokens, max_tokens, sampler):
        calls.append({"prompt": prompt, "k": num_draft_tokens, "max": max_tokens})
        seed = mx.seeds[-1]
        return [(seed + i, None, i % 2 == 0) for i in range(max_tokens)]

    su = SimpleNamespace(make_sampler=lambda **kw: ("mlx-sampler", kw))
    gen = SimpleNamespace(speculative_generate_step=spec_step)
    runner = ml.MLXRunner(mx, gen, su, "T", "D", 3, "mlx")
    lines = converse({}, runner.decode, [job(top_p=0.9)])[1:]
    assert mx.seeds == [1005, 1006, 1007]
    assert [r["tokens"] for r in lines] == [[k + i for i in range(4)] for k in (1005, 1006, 1007)]
    assert all(sum(x["emitted"] for x in r["rounds"]) == 4 for r in lines)
    assert calls[0] == {"prompt": (1, 45, 200, 17), "k": 3, "max": 4}
    assert runner.sampler(job(top_p=0.9)["sampling"]) == (
        "mlx-sampler",
        {"temp": 0.8, "top_p": 0.9, "min_p": 0.0, "top_k": 0},
    )


# ----------------------------------------------------------------------------- imports
# the example programs of the command engine run spectest's own loop under spectest's python
# (docs/engines-command.md): they are the exception, and say so in their docstrings
EXAMPLES = {
    "builtin_engine.py",
    "topp_before_temperature.py",
    "reporting_engine.py",
    "numerics_engine.py",  # spectest's own loops in another batch shape (issue 31)
}


def test_programs_import_only_stdlib_their_engine_and_jsonl() -> None:
    """The real-engine programs run under their engine's own venv: stdlib, their engine, _jsonl."""
    allowed = {"openvino", "openvino_genai", "numpy", "mistralrs", "mlx", "_jsonl"}
    for f in sorted(PROGRAMS.glob("*.py")):
        if f.name == "__init__.py" or f.name in EXAMPLES:
            continue
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for n in names:
                top = n.split(".")[0]
                assert top in sys.stdlib_module_names or top in allowed, (f.name, n)
                assert top != "spectest", f.name
