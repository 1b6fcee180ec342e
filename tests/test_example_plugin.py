"""The example engine plug-in (examples/plugin), installed the way a user installs it: pip into a
fresh virtual environment (``--system-site-packages`` for spectest's dependencies, ``--no-index
--no-build-isolation --no-deps``: nothing downloaded), then, from that environment, the
conformance check (``spectest conformance``), the benchmark (``spectest bench``) and the
plug-in's own pytest. The plug-in's law is tested by a run in
tests/test_engine_seam.py::test_entry_point_engine_registers_and_runs. Exact checks only (no
statistics); about a minute on two cores."""

from __future__ import annotations

import json
import os
import subprocess
import venv
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # a real install and four spectest processes

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "examples" / "plugin"
TOY = ["--target", "toy:V=16,order=2,scale=2.0,seed=3",
       "--draft", "toy:V=16,order=2,scale=1.0,seed=4"]  # fmt: skip
TINY = ["--target", "realistic:qwen3-tiny,draft_layers=1,num_hidden_layers=3",
        "--draft", "derived:first_layers,layers=1"]  # fmt: skip


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A venv with the plug-in pip-installed from its directory; spectest is this checkout."""
    root = tmp_path_factory.mktemp("plugin-venv")
    # no pip of its own: the system pip and setuptools (which builds wheels) install into it
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(root / "venv")
    py = root / "venv" / "bin" / "python"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PIP_NO_INDEX": "1",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}  # fmt: skip
    res = subprocess.run(
        [str(py), "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-deps",
         "--quiet", str(PLUGIN)],
        env=env, capture_output=True, text=True, timeout=300, cwd=root,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    return py, env


def _run(plugin_env: tuple[Path, dict[str, str]], *args: str, cwd: Path) -> Any:
    py, env = plugin_env
    return subprocess.run(
        [str(py), *args], env=env, capture_output=True, text=True, timeout=600, cwd=cwd
    )


def test_installed_plugin_is_a_registered_engine(plugin_env, tmp_path) -> None:
    code = (
        "from spectest.engines import registry; import spectest_example_engine as m; "
        "print(registry.target_of('example-spec'), registry.engine_class('example-spec').name, "
        "m.__file__)"
    )
    res = _run(plugin_env, "-c", code, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    target, name, where = res.stdout.split()
    assert (target, name) == ("spectest_example_engine.engine:ExampleEngine", "example-spec")
    assert "site-packages" in where  # the installed copy, not the source tree


def test_conformance_cli_passes_and_refuses_what_it_should(plugin_env, tmp_path) -> None:
    res = _run(plugin_env, "-m", "spectest", "conformance", "example-spec", *TOY, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[-1].startswith("CONFORMS (exit 0): engine example-spec honours the contract")
    for check in ("same seeds [candidate]", "batch composition [candidate]", "rounds [candidate]"):
        assert any(ln.startswith("PASS") and check in ln for ln in lines), check
    # a bad option is one line naming the field, exit 2 (the options check)
    res = _run(plugin_env, "-m", "spectest", "conformance", "example-spec", *TOY,
               "--options", "{stop_token: -7}", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    assert "FAIL  options: engines.example-spec: stop_token: expected -1 (none)" in res.stdout


def test_bench_times_the_plugin_beside_transformers(plugin_env, tmp_path) -> None:
    out = tmp_path / "bench.jsonl"
    res = _run(
        plugin_env, "-m", "spectest", "bench", *TINY, "--rows", "3", "--positions", "3",
        "--k", "2", "--drafter", "sampled", "--arms", "example-spec,example-spec:plain",
        "--peak-tflops", "1", "--engine-options", "example-spec={stop_token: -1}",
        "--out", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "example-spec:plain" in res.stdout and "hf-generate (baseline)" in res.stdout
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["arm"], r["engine"], r["mode"]) for r in recs] == [
        ("example-spec", "example-spec", "spec"),
        ("example-spec:plain", "example-spec", "plain"),
        ("hf-generate", "hf-generate", "plain"),
    ]
    assert recs[-1].get("baseline") is True and recs[-1]["ratio_to_hf_generate"] == 1.0
    spec, plain, base = recs
    assert spec["mean_accepted"] is not None and plain["mean_accepted"] is None
    for r in recs:
        assert r["mfu"] == pytest.approx(r["tokens_per_s"] * r["flops_per_token"] / 1e12)
        assert r["ratio_to_hf_generate"] == pytest.approx(r["rows_per_s"] / base["rows_per_s"])
    assert recs[0]["engines"]["example-spec"]["version"] == "0.1.0"  # the engine's provenance


def test_the_plugins_own_tests_pass(plugin_env) -> None:
    """examples/plugin/tests: spectest.conformance.check from the plug-in author's pytest."""
    res = _run(plugin_env, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests",
               cwd=PLUGIN)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "4 passed" in res.stdout, res.stdout
