"""Measure the bundled pair and write its model cards (README.md + spectest_card.json per model).

Owns: the card's numbers — validation bits/byte of target and draft, the unigram baseline, the
check slice the CI test re-computes, per-token entropies at t = 0.8 / 1.0 on the english-8
prompts, and the pair's per-position acceptance probabilities — and the card files. Knows
nothing about training (``train_pair`` writes the weights) or about spectest's sampler: the
acceptance numbers are analytic (teacher forcing along sampled continuations), not the engine.

Usage (CPU, after copying trained dirs into ``spectest/zoo/bundled/{target,draft}``)::

    python tools/pair/pair_card.py --dir spectest/zoo/bundled --corpus .corpus
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import corpus
import numpy as np
import torch
from train_pair import stream_nll, unigram_nll

from spectest.errors import InputError, ModelError
from spectest.models import bytetok

CARD_FILE = "spectest_card.json"
CHECK_SLICE_IDS = 4096  # first ids of the validation stream re-evaluated by the CI test
CHECK_CTX = 256
PROMPTS_FILE = Path("protocols/prompts/english-8.jsonl")
CARD_TEMPERATURES = (0.8, 1.0)
CARD_POSITIONS = 32  # first generated positions measured
CARD_SAMPLES = 16  # continuations per prompt and temperature
CARD_SEED = 1234


def load_model(directory: Path) -> Any:
    """A bundled HF directory as a float32 ``LlamaForCausalLM`` in eval mode (local files only).

    NOTE: the weights are stored in float16 to keep the pair small; every measurement here (and
    the CI test) runs them in float32, so fp16 matmul rounding on CPU never enters a number.
    """
    from transformers import AutoModelForCausalLM

    if not (directory / "config.json").is_file():
        raise ModelError(f"pair_card: no config.json in model directory {str(directory)!r}")
    model = AutoModelForCausalLM.from_pretrained(
        directory, local_files_only=True, trust_remote_code=False, dtype=torch.float32
    )
    model.eval()
    return model


def check_slice(documents: list[str]) -> tuple[np.ndarray, str]:
    """The first ``CHECK_SLICE_IDS`` ids of the validation stream of ``documents`` and their sha256.

    ``documents`` may be only the corpus' first validation documents (see
    ``corpus.validation_prefix_documents``): the slice is the same as for the whole corpus.
    The hash is over the ids as little-endian uint16.
    """
    val = [d for i, d in enumerate(documents) if corpus.split_of(i) == "val"]
    return _slice_of_val_docs(val)


def _slice_of_val_docs(val_docs: list[str]) -> tuple[np.ndarray, str]:
    ids = np.concatenate([np.array(bytetok.encode(d, eos=True), dtype=np.int64) for d in val_docs])
    if ids.shape[0] < CHECK_SLICE_IDS:
        raise InputError(f"pair_card: validation stream has {ids.shape[0]} ids < {CHECK_SLICE_IDS}")
    ids = ids[:CHECK_SLICE_IDS]  # [CHECK_SLICE_IDS]
    return ids, hashlib.sha256(ids.astype("<u2").tobytes()).hexdigest()


def rebuild_check_slice() -> tuple[np.ndarray, str]:
    """The check slice rebuilt from this Python's standard library (fast: pydoc topics only)."""
    docs, _ = corpus.validation_prefix_documents(min_bytes=CHECK_SLICE_IDS)
    return _slice_of_val_docs(docs)


def bits_per_byte(nll: float, n: int) -> float:
    return nll / n / math.log(2)


def load_prompts(path: Path) -> list[tuple[str, str]]:
    """``(id, text)`` pairs of a prompt JSONL file (``{"id": ..., "text": ...}`` per line)."""
    if not path.is_file():
        raise InputError(f"pair_card: prompt file not found: {str(path)!r}")
    out = []
    for k, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        obj = json.loads(line)
        if not isinstance(obj, dict) or set(obj) != {"id", "text"}:
            raise InputError(
                f"pair_card: {str(path)!r} line {k + 1} must be {{id, text}}, got {obj!r}"
            )
        out.append((str(obj["id"]), str(obj["text"])))
    return out


@torch.no_grad()
def sample_continuations(
    model: Any, prompt: list[int], n: int, length: int, temperature: float, gen: torch.Generator
) -> torch.Tensor:
    """``n`` continuations of ``length`` ids sampled from ``model`` at ``temperature``: [n, length].

    Plain ancestral sampling with the HF KV cache, float64 probabilities, ``torch.multinomial``
    on the passed generator (card statistics only, not spectest's sampler).
    """
    # NOTE: transformers 5.2x renamed ``past_key_values`` to ``cache`` (argument and output);
    # older versions (the GPU machine's 5.17, CI's >= 4.45) only know the old name.
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    ids = torch.tensor([prompt] * n, dtype=torch.int64)  # [n, P]
    out = model(input_ids=ids, use_cache=True)
    past, logits = getattr(out, key), out.logits[:, -1]  # [n, V]
    tokens = []
    for _ in range(length):
        probs = torch.softmax(logits.double() / temperature, dim=-1)  # [n, V]
        nxt = torch.multinomial(probs, 1, generator=gen)  # [n, 1]
        tokens.append(nxt)
        out = model(input_ids=nxt, use_cache=True, **{key: past})
        past, logits = getattr(out, key), out.logits[:, -1]
    return torch.cat(tokens, dim=1)  # [n, length]


@torch.no_grad()
def position_stats(
    target: Any, draft: Any, prompt: list[int], cont: torch.Tensor, temperature: float
) -> dict[str, torch.Tensor]:
    """Per generated position (teacher forcing ``prompt + cont``), each ``[n, L]`` float64.

    ``entropy_p`` / ``entropy_q``: entropy (bits) of the tempered target / draft law;
    ``accept_onehot``: p(argmax q), the acceptance probability of a greedy (one-hot) drafter;
    ``accept_sampled``: sum_v min(p(v), q(v)), that of a drafter sampling from q
    (Leviathan et al. 2023, arXiv 2211.17192, Theorem 3.5).
    """
    n, length = cont.shape
    full = torch.cat([torch.tensor([prompt] * n, dtype=torch.int64), cont], dim=1)  # [n, P+L]
    sl = slice(len(prompt) - 1, len(prompt) - 1 + length)
    lp = torch.log_softmax(
        target(input_ids=full).logits[:, sl].double() / temperature, -1
    )  # [n,L,V]
    lq = torch.log_softmax(
        draft(input_ids=full).logits[:, sl].double() / temperature, -1
    )  # [n,L,V]
    p, q = lp.exp(), lq.exp()
    return {
        "entropy_p": -(p * lp).sum(-1) / math.log(2),
        "entropy_q": -(q * lq).sum(-1) / math.log(2),
        "accept_onehot": p.gather(-1, q.argmax(-1, keepdim=True)).squeeze(-1),
        "accept_sampled": torch.minimum(p, q).sum(-1),
    }


@dataclass(frozen=True)
class PairMeasures:
    """What the cards report; bits are per token (= per byte, BOS/EOS counted as tokens)."""

    target_val_bpb: float
    draft_val_bpb: float
    unigram_val_bpb: float
    val_tokens: int
    target_check_nll: float
    draft_check_nll: float
    check_tokens: int
    check_sha256: str
    entropy_target_bits: dict[str, float]  # temperature -> mean over prompts, samples, positions
    entropy_draft_bits: dict[str, float]
    accept_onehot: dict[str, float]  # temperature -> mean p(argmax q)
    accept_sampled: dict[str, float]  # temperature -> mean sum min(p, q)
    samples: dict[str, str]  # prompt id -> one decoded continuation at t = 0.8
    seconds: float


def measure_pair(
    target: Any,
    draft: Any,
    documents: list[str],
    prompts: list[tuple[str, str]],
    seed: int = CARD_SEED,
) -> PairMeasures:
    """All card numbers for ``target`` / ``draft`` on the corpus ``documents`` and ``prompts``."""
    t0 = time.perf_counter()
    torch.manual_seed(seed)  # NOTE: HF models hold no randomness in eval mode; belt and braces
    train, val = corpus.split_stream(documents, "train"), corpus.split_stream(documents, "val")
    tn, n = stream_nll(target, val, CHECK_CTX)
    dn, _ = stream_nll(draft, val, CHECK_CTX)
    un, _ = unigram_nll(train, val)
    ids, sha = check_slice(documents)
    tc, nc = stream_nll(target, ids, CHECK_CTX)
    dc, _ = stream_nll(draft, ids, CHECK_CTX)
    gen = torch.Generator().manual_seed(seed)
    ent_p, ent_q, acc1, accs = {}, {}, {}, {}
    samples = {}
    for t in CARD_TEMPERATURES:
        rows: dict[str, list[torch.Tensor]] = {}
        for pid, text in prompts:
            prompt = bytetok.encode(text)
            cont = sample_continuations(target, prompt, CARD_SAMPLES, CARD_POSITIONS, t, gen)
            for k, v in position_stats(target, draft, prompt, cont, t).items():
                rows.setdefault(k, []).append(v)
            if t == 0.8:
                samples[pid] = text + bytetok.decode(cont[0].tolist())
        key = f"{t:g}"
        ent_p[key] = float(torch.cat(rows["entropy_p"]).mean())
        ent_q[key] = float(torch.cat(rows["entropy_q"]).mean())
        acc1[key] = float(torch.cat(rows["accept_onehot"]).mean())
        accs[key] = float(torch.cat(rows["accept_sampled"]).mean())
    return PairMeasures(
        target_val_bpb=bits_per_byte(tn, n),
        draft_val_bpb=bits_per_byte(dn, n),
        unigram_val_bpb=bits_per_byte(un, n),
        val_tokens=n,
        target_check_nll=tc,
        draft_check_nll=dc,
        check_tokens=nc,
        check_sha256=sha,
        entropy_target_bits=ent_p,
        entropy_draft_bits=ent_q,
        accept_onehot=acc1,
        accept_sampled=accs,
        samples=samples,
        seconds=time.perf_counter() - t0,
    )


# the card's fixed text: after the title, and after the table
CARD_INTRO = [
    "",
    "Trained from scratch by `tools/pair/train_pair.py` on English text that ships with",
    "CPython (`pydoc_data.topics` + standard-library docstrings, built by",
    "`tools/pair/corpus.py`); nothing downloaded. Tokenizer: `spectest.models.bytetok`",
    "(ids 0-255 = UTF-8 bytes, 256 BOS, 257 EOS, 258 PAD; vocab 259 = lm_head rows).",
    "Use through spectest (`bundled:target` / `bundled:draft`) or",
    "`AutoModelForCausalLM.from_pretrained(dir, local_files_only=True)`; weights are float16,",
    "measurements below ran them in float32 on CPU.",
    "",
]
CARD_NOTES = [
    "",
    "Bits/byte: mean next-id cross-entropy over the validation stream (one id per byte plus a",
    "BOS/EOS pair per document), windows of 256 ids, each from an empty context.",
    "Acceptance: per-position probability that a draft token is accepted (p(argmax q) for the",
    "one-hot drafter, sum_v min(p, q) for the sampled one, both at the same temperature),",
    "averaged over the same target-sampled continuations; it does not depend on K. Draft",
    "widths 96/128/192 were trained alongside (validation 1.873 / 1.862 / 1.872 bits/byte,",
    "one-hot acceptance 0.71 / 0.70 / 0.69 on a quick 8-sample check): 128 is the default",
    "spec and its training was run twice on the GPU with bit-identical weights.",
    "",
    "Samples from the target at t = 0.8 (prompt + 32 generated bytes):",
    "",
]


def _card_table(
    log: dict[str, Any], m: PairMeasures, cfg: dict[str, Any], val: float, ent: dict[str, float]
) -> list[str]:
    """The card's table of facts: architecture, training, software, corpus, measurements."""
    spec, env = log["spec"], log["env"]
    return [
        "| | |",
        "|---|---|",
        f"| architecture | Llama, hidden {cfg['hidden_size']}, {cfg['num_hidden_layers']} layers, "
        f"{cfg['num_attention_heads']} heads, MLP {cfg['intermediate_size']}, tied embeddings, "
        f"context {cfg['max_position_embeddings']} |",
        f"| parameters | {log['parameters']:,} |",
        f"| training | {log['steps_run']} steps of {spec['batch']} x {spec['ctx']} ids "
        f"({log['tokens_seen'] / 1e6:.0f} M ids, "
        f"{log['tokens_seen'] / log['corpus']['train_bytes']:.0f} epochs); best dev checkpoint "
        f"at step "
        f"{log['best_step']}; AdamW lr {spec['lr']:g}, warmup {spec['warmup']}, cosine to "
        f"{spec['min_lr_ratio']:g} x lr over {spec['steps']} steps, wd {spec['weight_decay']:g}, "
        f"residual dropout {spec['dropout']:g} |",
        f"| seed / device / time | {log['seed']} / {log['device']} ({env['gpu']}) / "
        f"{log['train_seconds']:.0f} s (3 targets and 4 drafts trained at once on one GPU) |",
        f"| software | torch {env['torch']}, transformers {env['transformers']}, "
        f"Python {env['python']} |",
        f"| command | `{env['command']}` (the same run: `python tools/pair/train_pair.py "
        f"--corpus .corpus --out DIR --seed {log['seed']} --device cuda`, whose defaults are "
        "this spec) |",
        f"| corpus | sha256 `{log['corpus']['sha256'][:16]}…`, {log['corpus']['num_documents']} "
        f"documents, {log['corpus']['num_bytes']:,} bytes (train {log['corpus']['train_bytes']:,}"
        f" / dev {log['corpus']['dev_bytes']:,} / val {log['corpus']['val_bytes']:,}), "
        f"Python {log['corpus']['python_version']} |",
        f"| **validation bits/byte** | **{val:.4f}** ({m.val_tokens:,} ids; target "
        f"{m.target_val_bpb:.4f}, draft {m.draft_val_bpb:.4f}) |",
        f"| unigram baseline bits/byte | {m.unigram_val_bpb:.4f} "
        "(add-one byte frequencies of train) |",
        f"| mean entropy per token, t = 0.8 / 1.0 | {ent['0.8']:.3f} / {ent['1']:.3f} bits "
        f"(english-8 prompts, first {CARD_POSITIONS} positions, {CARD_SAMPLES} target samples "
        f"per prompt) |",
        f"| pair acceptance, t = 0.8, K = 4 | one-hot drafter {m.accept_onehot['0.8']:.3f}, "
        f"sampled drafter {m.accept_sampled['0.8']:.3f} (t = 1.0: {m.accept_onehot['1']:.3f} / "
        f"{m.accept_sampled['1']:.3f}) |",
    ]


def _card_markdown(role: str, log: dict[str, Any], m: PairMeasures, cfg: dict[str, Any]) -> str:
    val = m.target_val_bpb if role == "target" else m.draft_val_bpb
    ent = m.entropy_target_bits if role == "target" else m.entropy_draft_bits
    title = (
        f"# spectest bundled {role}: byte-level Llama, {log['parameters'] / 1e6:.2f} M parameters"
    )
    lines = [title, *CARD_INTRO, *_card_table(log, m, cfg, val, ent), *CARD_NOTES]
    lines += [f"- `{pid}`: {json.dumps(text)}" for pid, text in m.samples.items()]
    return "\n".join(lines) + "\n"


def write_cards(bundle: Path, m: PairMeasures) -> None:
    """Write ``README.md`` and ``spectest_card.json`` into ``bundle/{target,draft}``."""
    for role in ("target", "draft"):
        d = bundle / role
        log = json.loads((d / "train_log.json").read_text(encoding="utf-8"))
        cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
        card = {
            "role": role,
            "tokenizer": "spectest.models.bytetok",
            "vocab_size": bytetok.VOCAB_SIZE,
            "parameters": log["parameters"],
            "weights_sha256": hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest(),
            "val_bpb": m.target_val_bpb if role == "target" else m.draft_val_bpb,
            "check_slice": {
                "ids": m.check_tokens + 1,
                "ctx": CHECK_CTX,
                "sha256": m.check_sha256,
                "nll_nats": m.target_check_nll if role == "target" else m.draft_check_nll,
                "targets": m.check_tokens,
            },
            "measures": asdict(m),
        }
        (d / CARD_FILE).write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
        (d / "README.md").write_text(_card_markdown(role, log, m, cfg), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Measure the bundled pair and write its cards.")
    parser.add_argument("--dir", type=Path, default=Path("spectest/zoo/bundled"))
    parser.add_argument("--target", type=Path, default=None, help="default DIR/target")
    parser.add_argument("--draft", type=Path, default=None, help="default DIR/draft")
    parser.add_argument(
        "--corpus", type=Path, default=None, help="saved corpus dir (default: build)"
    )
    parser.add_argument("--prompts", type=Path, default=PROMPTS_FILE)
    parser.add_argument("--no-write", action="store_true", help="print the measures only")
    parser.add_argument(
        "--rewrite", action="store_true", help="re-render the cards from their recorded measures"
    )
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.rewrite:
        rec = json.loads((args.dir / "target" / CARD_FILE).read_text(encoding="utf-8"))
        write_cards(args.dir, PairMeasures(**rec["measures"]))
        return
    documents = corpus.load(args.corpus)[0] if args.corpus else corpus.build_documents()
    target = load_model(args.target or args.dir / "target")
    draft = load_model(args.draft or args.dir / "draft")
    m = measure_pair(target, draft, documents, load_prompts(args.prompts))
    print(json.dumps(asdict(m), indent=2))
    if not args.no_write:
        write_cards(args.dir, m)


if __name__ == "__main__":
    main()
