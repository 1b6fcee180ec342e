"""Opening a run's directory (``open_run_dir``): ``RunDir.open`` with the protocol's files,
and under ``spectest run --reuse DIR`` the generation of another run directory copied in, when
that run's protocol differs only in settings decided after generation, so a claim (b) with more
sequences, another α or margin is re-measured and re-decided without generating again. Knows no
statistics and no engines. docs/run-directory.md "Reusing another run's generation".
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from spectest.errors import ConfigError, InputError
from spectest.plan import Plan
from spectest.prompts import prompts_jsonl
from spectest.protocol import Protocol, load_protocol, to_raw
from spectest.stats.options import options
from spectest.store import (
    FINGERPRINTS_KEY,
    PROMPTS_FILE,
    PROTOCOL_FILE,
    RUN_INFO,
    SHARD_DIGEST,
    SHARDS_DIR,
    SUMMARY,
    RunDir,
    read_object,
)

# ``tests`` settings that change what is generated: the white-box columns, the matched arm
GENERATION_SETTINGS = ("whitebox", "numerics")


def _after_generation_options() -> list[tuple[str, Any]]:
    """The protocol's ``tests`` settings decided after generation: ``(field, Option)``."""
    return [
        (name, opt)
        for name, opt in options()
        if opt.yaml is not None and name not in GENERATION_SETTINGS
    ]


def after_generation() -> tuple[str, ...]:
    """The protocol's ``tests`` settings a reused generation may differ in (their YAML paths)."""
    return tuple(str(opt.yaml) for _, opt in _after_generation_options())


def open_run_dir(
    path: Path, info: dict[str, Any], protocol: Protocol, plan: Plan, reuse: Path | None
) -> RunDir:
    """``path`` opened for ``protocol``'s run (created, or resumed: ``RunDir.open``, which
    refuses another protocol's directory), with its ``protocol.yaml`` and prompts; with
    ``reuse``, that run directory checked first (``reusable``: nothing is created when it does
    not qualify), then its shards copied in (``copy_shards``), their notes added to the run
    directory's."""
    source = None if reuse is None else reusable(reuse, protocol)  # its run.json
    raw = to_raw(protocol, prompts_file=PROMPTS_FILE)
    rd = RunDir.open(
        path,
        info,
        protocol_yaml=yaml.safe_dump(raw, sort_keys=False, allow_unicode=True),
        prompts=prompts_jsonl(protocol),
    )
    if reuse is None or source is None:
        return rd
    try:
        notes = copy_shards(rd, reuse, source, plan, info.get(FINGERPRINTS_KEY) or {})
    except BaseException:
        rd.release()
        raise
    return dataclasses.replace(rd, notes=(*rd.notes, *notes))


def reusable(source: Path, protocol: Protocol) -> dict[str, Any]:
    """``source``'s ``run.json`` when it is a run directory (``spectest run``) of a protocol
    equal to ``protocol`` but for the settings ``after_generation`` names; else an
    ``InputError`` (not a run's directory) or a ``ConfigError`` naming the sections that
    differ."""
    info, old = _source(source)
    probe = _with_settings_of(protocol, old)
    if probe.hash != old.hash:
        a, b = old.canonical(), probe.canonical()
        differ = sorted(k for k in {*a, *b} if a.get(k) != b.get(k))
        raise ConfigError(
            f"--reuse: {str(source)!r} ran a protocol that differs from this one in "
            f"{', '.join(differ)}; only {', '.join(after_generation())} may differ"
        )
    return info


def copy_shards(
    rd: RunDir, source: Path, info: Mapping[str, Any], plan: Plan, fingerprints: Mapping[str, Any]
) -> tuple[str, ...]:
    """Copy into ``rd`` every completed shard of ``source`` (``info``: its ``run.json``) that
    the plan has, ``rd`` lacks, and whose arm runs the same thing there (its fingerprint, as a
    resume compares them, and its seeds); the notes to print. Each shard is copied with its
    digest, the digest last (the completion mark), and checked against it when read, as a
    resumed shard is."""
    before = info.get(FINGERPRINTS_KEY) or {}
    ranges = info.get("seed_ranges") or {}
    copied, changed = 0, set()
    for shard in plan.shards:
        src = source / SHARDS_DIR / f"{shard.key}.{SHARD_DIGEST}"
        if rd.shard_done(shard.key) or not src.is_file():
            continue
        same_seeds = ranges.get(shard.arm) == plan.seed_ranges.get(shard.arm)
        if before.get(shard.arm) != fingerprints.get(shard.arm) or not same_seeds:
            changed.add(shard.arm)
            continue
        _copy_shard(source / SHARDS_DIR, rd.path / SHARDS_DIR, shard.key)
        copied += 1
    notes = [f"shards: {copied} reused from {source} (--reuse: copied here, then resumed)"]
    if _claim_b(source) == "unresolved":
        notes.append(
            f"--reuse: claim (b) is decided again on the tokens of {source}, where it was "
            "unresolved: a second look, so over both a wrong decision has probability up to "
            "the sum of the two runs' tests.alpha (docs/run-directory.md)"
        )
    notes += [
        f"--reuse: arm {arm!r} runs something else than in {source} (its fingerprint or "
        "seeds): its shards are generated"
        for arm in sorted(changed)
    ]
    return tuple(notes)


def _claim_b(source: Path) -> str | None:
    """The decision of claim (b) in ``source``'s summary (None: no summary, no claim (b))."""
    try:
        numerics = read_object(source / SUMMARY).get("verdict", {}).get("numerics")
    except (InputError, OSError):
        return None
    return numerics.get("decision") if isinstance(numerics, dict) else None


def _source(source: Path) -> tuple[dict[str, Any], Protocol]:
    """``source``'s ``run.json`` and protocol (its hash checked against ``run.json``'s)."""
    where = f"--reuse: {str(source)!r}"
    if not (source / RUN_INFO).is_file() or not (source / PROTOCOL_FILE).is_file():
        raise InputError(f"{where}: not a spectest run directory (no {RUN_INFO})")
    info = read_object(source / RUN_INFO)
    if info.get("kind") != "run":
        raise InputError(f"{where}: a {info.get('kind')!r} directory, not a run's")
    old = load_protocol(source / PROTOCOL_FILE)
    if old.hash != info.get("protocol_hash"):
        raise InputError(f"{where}: its {PROTOCOL_FILE} does not hash to its {RUN_INFO}'s")
    return info, old


def _with_settings_of(protocol: Protocol, old: Protocol) -> Protocol:
    """``protocol`` with ``old``'s settings decided after generation (the hash to compare)."""
    kept = {name: getattr(old.tests, name) for name, _ in _after_generation_options()}
    return dataclasses.replace(protocol, tests=dataclasses.replace(protocol.tests, **kept))


def _copy_shard(src: Path, dst: Path, key: str) -> None:
    """The shard's tables its digest lists, then the digest: each through a temporary that the
    run directory's opening removes if a copy dies midway (``.NAME.tmp``)."""
    dst.mkdir(parents=True, exist_ok=True)
    digest = f"{key}.{SHARD_DIGEST}"
    tables = [f"{key}.{table}.parquet" for table in sorted(read_object(src / digest))]
    for name in [*tables, digest]:
        tmp = dst / f".{name}.tmp"
        shutil.copyfile(src / name, tmp)
        os.replace(tmp, dst / name)
