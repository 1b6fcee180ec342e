"""mistral.rs: its pinned environments (``SPECS``), the fixtures exported for its text API
(``export``), ``setup`` and the launcher (``python -m spectest.setup.mistralrs run ...``).
Knows nothing about the line protocol or sampling.

The why and the details: docs/internals.md "spectest/setup/mistralrs.py".
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from spectest.errors import ConfigError
from spectest.setup.venv import (
    EXPORT_FILE,
    EnvSpec,
    Log,
    cache_root,
    export_once,
    module_main,
    setup_report,
    stderr_log,
)

VERSION = "0.5.0"  # the release the shipped protocols run: the last with target/draft speculation
KNOWN = ("0.5.0", "0.6.0")
PROGRAM = "mistralrs_engine.py"
CHECK = (
    "import json, importlib.metadata as m, mistralrs; "
    "print(json.dumps({'mistralrs': m.version('mistralrs')}))"
)
SPECS = {
    v: EnvSpec(
        engine="mistralrs",
        version=v,
        requirements=(f"mistralrs=={v}",),
        check=CHECK,
        setup_args="" if v == VERSION else f"--version {v}",
    )
    for v in KNOWN
}


def spec_for(version: str) -> EnvSpec:
    if version not in SPECS:
        raise ConfigError(
            f"mistralrs: version {version!r} is not set up by spectest (known: "
            f"{', '.join(KNOWN)}; 0.9.x has no target/draft speculative decoding)"
        )
    return SPECS[version]


def export(model: str, log: Log = stderr_log) -> Path:
    """The directory mistral.rs loads for ``fixture:NAME/ROLE`` (made once, cached), or
    ``model`` itself when it is a directory holding a ``tokenizer.json``."""
    p = Path(model)
    if (p / "tokenizer.json").is_file() and (p / "config.json").is_file():
        return p
    from spectest.models.fixtures import export_meta, fixture_key, hf_dir, parse_fixture_spec

    if not model.startswith("fixture:"):
        raise ConfigError(
            f"mistralrs: model {model!r}: expected fixture:NAME/target or fixture:NAME/draft"
        )
    name, role = parse_fixture_spec(model[len("fixture:") :])
    out = cache_root() / "mistralrs" / "models" / f"{name}-{fixture_key(name)[:12]}" / role
    if (out / EXPORT_FILE).is_file():
        return out
    src = hf_dir(name, role)

    def make(tmp: Path) -> tuple[dict[str, Any], str]:
        tmp.mkdir()
        write_export(src, tmp, int(json.loads((src / "config.json").read_text())["vocab_size"]))
        word_level = "word-level: id i <-> word t<i>; eos = vocab_size (never emitted)"
        meta = {**export_meta(model, name, role, src), "tokenizer": word_level}
        return meta, f"mistralrs: exported {model} -> {out}"

    lock = out.parent.parent / "export.lock"
    return export_once(out, lock, f"mistralrs export {model}", log, make)


def tokenizer_json(vocab: int) -> dict[str, Any]:
    """A ``tokenizers`` file whose token ``i`` is the word ``t<i>`` (``▁t<i>`` inside), plus an
    end-of-sequence token ``<eos>`` = ``vocab`` that the model can never emit."""
    words = {f"\u2581t{i}": i for i in range(vocab)}
    words["<eos>"] = vocab
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": vocab,
                "content": "<eos>",
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Metaspace",
            "replacement": "\u2581",
            "prepend_scheme": "first",
            "split": True,
        },
        "post_processor": None,
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ],
        },
        "model": {"type": "WordLevel", "vocab": words, "unk_token": "<eos>"},
    }


def write_export(src: Path, dst: Path, vocab: int) -> None:
    """The files of one exported model: weights copied, config patched, tokenizer written."""
    for f in sorted(src.glob("*.safetensors")):
        shutil.copyfile(f, dst / f.name)
    for name in ("config.json", "generation_config.json"):
        if not (src / name).is_file():
            continue
        c = json.loads((src / name).read_text())
        c["eos_token_id"] = vocab  # never emitted: no early stop (the API has no ignore_eos)
        if name == "config.json" and "rope_theta" not in c:
            c["rope_theta"] = float((c.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        (dst / name).write_text(json.dumps(c, indent=1, sort_keys=True) + "\n")
    (dst / "tokenizer.json").write_text(json.dumps(tokenizer_json(vocab), ensure_ascii=False))
    bos = "\u2581t1"
    (dst / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": bos,
                "eos_token": "<eos>",
                "unk_token": "<eos>",
                "add_bos_token": False,
                "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
            }
        )
    )


def setup(
    version: str = VERSION,
    fixtures: tuple[str, ...] = ("tiny-llama",),
    log: Log = stderr_log,
    force: bool = False,
) -> dict[str, object]:
    """``spectest setup mistralrs``: the environment of ``version`` and each fixture's export."""
    return setup_report(spec_for(version), log, force, lambda m: export(m, log), fixtures)


if __name__ == "__main__":
    sys.exit(
        module_main(
            "spectest.setup.mistralrs", sys.argv[1:], setup, PROGRAM, spec_for, export, VERSION
        )
    )
