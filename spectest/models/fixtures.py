"""Model fixtures for real engines: a deterministic tiny Llama pair (``FIXTURES``) as HF
directories (``build_hf``) and GGUF files (``build_gguf``), cached by content key. Knows nothing
about sampling, protocols or engines. Why and details: docs/internals.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spectest.errors import ConfigError, ModelError
from spectest.files import sha256_file
from spectest.models.configs import TINY_LLAMA_FIXTURE

FORMAT_VERSION = 1
ROLES = ("target", "draft")
FIXTURE_FILE = "fixture.json"
TOKENIZER_FILE = "tokenizer.model"


@dataclass(frozen=True)
class FixtureSpec:
    """Everything that determines a fixture's bytes."""

    description: str
    config: dict[str, Any]  # transformers LlamaConfig fields (vocab_size = tokenizer pieces)
    seed: int
    logit_scale: float  # baked into lm_head
    draft_noise: float  # derive.noised: w + noise * rms(w) * N(0, 1)
    draft_seed: int
    tokenizer_vocab: int
    extra: dict[str, Any] = field(default_factory=dict)


FIXTURES: dict[str, FixtureSpec] = {
    "tiny-llama": FixtureSpec(
        description="random-init Llama, V=512 SentencePiece BPE, 2 layers, hidden 128, head_dim 32",
        config=TINY_LLAMA_FIXTURE,
        seed=0,
        logit_scale=16.0,
        draft_noise=0.1,
        draft_seed=1,
        tokenizer_vocab=512,
    ),
}


# ----------------------------------------------------------------------------- locations
def cache_root() -> Path:
    """``$SPECTEST_CACHE`` or ``~/.cache/spectest``."""
    env = os.environ.get("SPECTEST_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "spectest"


def spec_of(name: str) -> FixtureSpec:
    if name not in FIXTURES:
        raise ConfigError(f"unknown model fixture {name!r}; valid: {', '.join(FIXTURES)}")
    return FIXTURES[name]


def fixture_key(name: str) -> str:
    """sha256 (hex) of the spec, the format version and torch's major.minor."""
    import torch

    torch_mm = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    blob = json.dumps(
        {"name": name, "spec": asdict(spec_of(name)), "format": FORMAT_VERSION, "torch": torch_mm},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def fixture_dir(name: str) -> Path:
    """``<cache>/fixtures/<name>-<key[:12]>`` (may not exist yet)."""
    return cache_root() / "fixtures" / f"{name}-{fixture_key(name)[:12]}"


def parse_fixture_spec(head: str) -> tuple[str, str]:
    """``"tiny-llama/target"`` → ``("tiny-llama", "target")``."""
    name, _, role = head.partition("/")
    if role not in ROLES:
        raise ConfigError(
            f"fixture spec {head!r}: expected NAME/target or NAME/draft (NAME in {list(FIXTURES)})"
        )
    spec_of(name)
    return name, role


# ----------------------------------------------------------------------------- HF pair
def build_hf(name: str) -> Path:
    """Build (or find) the HF target/draft directories of a fixture; returns the fixture dir
    (seeded on CPU; renamed into place, so a half-built fixture is never found)."""
    out = fixture_dir(name)
    if (out / FIXTURE_FILE).is_file():
        return out
    import torch

    from spectest.models.derive import noised
    from spectest.models.hf import HFModel, config_of, from_config

    spec = spec_of(name)
    cfg = config_of(spec.config, f"fixture {name!r}")
    target = from_config(cfg, name=f"fixture:{name}/target", seed=spec.seed, dtype="float32")
    with torch.no_grad():
        target.model.lm_head.weight.mul_(spec.logit_scale)  # the law lives in the files
    draft = noised(target, spec.draft_noise, spec.draft_seed)
    assert isinstance(draft, HFModel)
    acceptance = _sampled_acceptance(target, draft)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        files: dict[str, str] = {}
        for role, model in (("target", target), ("draft", draft)):
            model.model.save_pretrained(tmp / role, safe_serialization=True)
            for f in sorted((tmp / role).iterdir()):
                files[f"{role}/{f.name}"] = sha256_file(f)
        meta = {
            "name": name,
            "key": fixture_key(name),
            "spec": asdict(spec),
            "torch": torch.__version__,
            "acceptance_sampled_t1": acceptance,
            "files": files,
        }
        (tmp / FIXTURE_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        try:
            tmp.rename(out)
        except OSError:  # another process won the race: keep theirs
            if not (out / FIXTURE_FILE).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _sampled_acceptance(target: Any, draft: Any) -> float:
    """Mean Σ_x min(p, q) at temperature 1 over the first 32 steps after BOS along the target's
    greedy path: how often a sampled draft is accepted (a readout for fixture.json)."""
    import torch

    ids = torch.tensor([[1]], dtype=torch.int64)
    vals = []
    with torch.no_grad():
        for _ in range(32):
            p = torch.softmax(target.model(ids).logits[0, -1].double(), -1)
            q = torch.softmax(draft.model(ids).logits[0, -1].double(), -1)
            vals.append(float(torch.minimum(p, q).sum()))
            ids = torch.cat([ids, p.argmax().view(1, 1)], dim=1)
    return round(sum(vals) / len(vals), 4)


def hf_dir(name: str, role: str) -> Path:
    """The HF directory of ``role`` (target / draft), built on first use."""
    if role not in ROLES:
        raise ConfigError(f"fixture {name!r}: role must be one of {ROLES}, got {role!r}")
    return build_hf(name) / role


def fixture_manifest(name: str) -> dict[str, Any]:
    """``fixture.json`` (spec, key, sha256 of every file) of a built fixture."""
    return dict(json.loads((build_hf(name) / FIXTURE_FILE).read_text()))


def export_meta(model: str, name: str, role: str, src: Path) -> dict[str, Any]:
    """The provenance of an export of fixture ``name``'s ``role`` (HF directory ``src``): the
    model spec, the fixture key and the sha256 of the role's source files."""
    manifest = fixture_manifest(name)
    files = {k: v for k, v in manifest["files"].items() if k.startswith(f"{role}/")}
    return {
        "model": model,
        "fixture_key": manifest["key"],
        "source": str(src),
        "source_files": files,
    }


def status(name: str) -> str:
    """One line for ``spectest models``: where the fixture lives and what is built."""
    d = fixture_dir(name)
    if not (d / FIXTURE_FILE).is_file():
        return f"not built (first use builds it into {d})"
    ggufs = sorted(p.name for p in d.glob("gguf-*") if (p / "target.gguf").is_file())
    return f"{d}" + (f" (+ {', '.join(ggufs)})" if ggufs else "")


# ----------------------------------------------------------------------------- GGUF
_GGUF_SCRIPT = r"""
import json, subprocess, sys
from pathlib import Path
import sentencepiece as spm
text, tok_dir, vocab, convert = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
spm.SentencePieceTrainer.train(
    input=str(text), model_prefix=str(tok_dir / "tokenizer"), vocab_size=vocab,
    model_type="bpe", character_coverage=1.0, num_threads=1, bos_id=1, eos_id=2, unk_id=0,
    pad_id=-1, byte_fallback=False, shuffle_input_sentence=False, seed_sentencepiece_size=100000,
    input_sentence_size=0, minloglevel=2,
)
"""


def _say(line: str) -> None:
    """A one-off step that may take more than a few seconds says so on stderr."""
    print(line, file=sys.stderr, flush=True)


TOKENIZER_CONFIG = {
    "tokenizer_class": "LlamaTokenizer",
    "add_bos_token": True,
    "add_eos_token": False,
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
}


def _record_hashes(root: Path, files: list[Path]) -> None:
    """Add the sha256 of ``files`` (paths under ``root``) to the fixture's manifest, atomically."""
    meta = json.loads((root / FIXTURE_FILE).read_text())
    for path in files:
        meta.setdefault("files", {})[path.relative_to(root).as_posix()] = sha256_file(path)
    tmp_meta = root / (FIXTURE_FILE + ".tmp")
    tmp_meta.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    tmp_meta.replace(root / FIXTURE_FILE)


def build_gguf(name: str, llamacpp_dir: str | Path) -> dict[str, Path]:
    """GGUF files (float32) of a fixture's target and draft, ``{"target": path, "draft": path}``,
    made by llama.cpp's ``convert_hf_to_gguf.py`` in ``spectest setup llamacpp``'s cache directory
    ``llamacpp_dir``, with a SentencePiece tokenizer trained once per fixture (docs/internals.md).
    """
    base = Path(llamacpp_dir)
    vpy, convert = base / "venv" / "bin" / "python", base / "src" / "convert_hf_to_gguf.py"
    if not vpy.is_file() or not convert.is_file():
        raise ModelError(
            f"{base}: not a llama.cpp build directory (run `spectest setup llamacpp` first)"
        )
    root = build_hf(name)
    out = root / f"gguf-{base.name}"
    paths = {role: out / f"{role}.gguf" for role in ROLES}
    if all(p.is_file() for p in paths.values()):
        return paths
    spec = spec_of(name)
    tok = root / TOKENIZER_FILE
    if not tok.is_file():
        _say(f"fixture {name}: training its tokenizer (once per machine; seconds to a minute)")
        _train_tokenizer(vpy, root, spec.tokenizer_vocab)
    for role in ROLES:
        shutil.copyfile(tok, root / role / TOKENIZER_FILE)
        (root / role / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG) + "\n")
    out.mkdir(exist_ok=True)
    for role, path in paths.items():
        tmp = path.with_suffix(".gguf.tmp")
        _say(f"fixture {name}: converting {role} to GGUF with llama.cpp's converter (once)")
        cmd = [str(vpy), str(convert), str(root / role), "--outfile", str(tmp), "--outtype", "f32"]
        _run(cmd, f"convert_hf_to_gguf.py {root / role}", {**os.environ, "NO_LOCAL_GGUF": "1"})
        tmp.replace(path)
    _record_hashes(root, [tok, *paths.values()])
    return paths


def _train_tokenizer(vpy: Path, root: Path, vocab: int) -> None:
    import pydoc_data.topics as topics

    with tempfile.TemporaryDirectory() as td:
        text = Path(td) / "corpus.txt"
        lines = [
            line.strip()
            for key in sorted(topics.topics)
            for line in topics.topics[key].splitlines()
            if line.strip()
        ]
        text.write_text("\n".join(lines) + "\n")
        _run(
            [str(vpy), "-c", _GGUF_SCRIPT, str(text), td, str(vocab), ""],
            f"SentencePiece training in {vpy}",
        )
        shutil.copyfile(Path(td) / "tokenizer.model", root / TOKENIZER_FILE)


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None) -> None:
    """Run ``cmd``; a ``ModelError`` naming ``what``, the exit code and stderr's last lines."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise ModelError(f"{what}: exit {proc.returncode}: {tail}")


def main(argv: list[str] | None = None) -> None:
    """``python -m spectest.models.fixtures [--gguf LLAMACPP_DIR] [NAME]``: build and print."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("name", nargs="?", default="tiny-llama")
    ap.add_argument("--gguf", help="llama.cpp cache dir from `spectest setup llamacpp`")
    args = ap.parse_args(argv)
    print(build_hf(args.name))
    if args.gguf:
        for role, p in build_gguf(args.name, args.gguf).items():
            print(role, p)
    json.dump(fixture_manifest(args.name), sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
