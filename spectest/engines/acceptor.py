"""The ``acceptor`` engine: the user's verification kernel inside spectest's own decode loop.

Owns: loading a kernel (``PATH.py:FUNCTION`` or ``package.module:FUNCTION``), calling it once per
speculative round with spectest's laws, drafts and counter-RNG uniforms, and validating every
return (a violation is one ``EngineError`` line naming the plug-in, exit 2). Everything but the
verification step is spectest's, so a failing verdict points at the kernel. Knows nothing about
statistics, files or protocols. The contract: docs/engines-acceptor.md "The acceptor contract".
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from spectest.contain import contained, err_text, escape_reason
from spectest.engines.base import ArmJob, Models
from spectest.engines.builtin import BuiltinEngine
from spectest.errors import ConfigError, EngineError
from spectest.sampling.mutants import SpecVariant
from spectest.sampling.rejection import (
    AcceptanceTelemetry,
    RoundInputs,
    RoundResult,
    SampleFn,
    round_sampler,
)

PADDING = -1
RANDOMNESS_ATTR = "spectest_randomness"  # "uniforms" (default) or "generator"
PREPARE_ATTR = "spectest_prepare"  # optional: called once when the engine starts


@dataclass(frozen=True)
class KernelSpec:
    """``PATH.py:FUNCTION`` (``path`` absolute) or ``package.module:FUNCTION`` (``module``)."""

    text: str
    function: str
    path: str | None = None
    module: str | None = None


def parse_kernel_spec(text: str, where: str, base_dir: Path | None = None) -> KernelSpec:
    """Check the form; resolve a relative path against ``base_dir`` then the working directory."""
    target, sep, function = text.rpartition(":")
    if not sep or not target or not function.isidentifier():
        raise ConfigError(
            f"{where}: expected PATH.py:FUNCTION or package.module:FUNCTION, got {text!r}"
        )
    if target.endswith(".py"):
        raw = Path(target).expanduser()
        options = [raw] if raw.is_absolute() else [(base_dir or Path.cwd()) / raw, Path.cwd() / raw]
        found = next((p for p in options if p.is_file()), None)
        if found is None:
            raise ConfigError(f"{where}: no such kernel file {target!r}")
        path = str(found.resolve())
        return KernelSpec(f"{path}:{function}", function, path=path)
    if not all(part.isidentifier() for part in target.split(".")):
        raise ConfigError(f"{where}: {target!r} is neither a .py file nor a module name")
    return KernelSpec(text, function, module=target)


def load_kernel(spec: KernelSpec) -> Callable[..., Any]:
    """Import the kernel; any failure — an exception, or a ``sys.exit`` / ``argparse`` /
    ``KeyboardInterrupt`` at import (``spectest.contain``) — is one ``EngineError`` line naming
    it. What the module prints while it is imported is held, and shown with the error."""

    def why(err: BaseException) -> str:
        if isinstance(err, Exception):
            reason = err_text(err, first_line=True) or type(err).__name__
        else:  # SystemExit (sys.exit, argparse), KeyboardInterrupt, GeneratorExit
            reason = escape_reason(err)
        return f"acceptor {spec.text}: cannot import the kernel ({reason})"

    who = f"acceptor {spec.text}"
    module = contained(
        why, _import_kernel_module, spec, hold_output=True, watch=(who, "importing the kernel")
    )
    fn = getattr(module, spec.function, None)
    if not callable(fn):
        raise EngineError(f"acceptor {spec.text}: no function {spec.function!r} in the module")
    mode = getattr(fn, RANDOMNESS_ATTR, "uniforms")
    if mode not in ("uniforms", "generator"):
        raise EngineError(
            f"acceptor {spec.text}: {RANDOMNESS_ATTR} must be 'uniforms' or 'generator', "
            f"got {mode!r}"
        )
    return fn


def _import_kernel_module(spec: KernelSpec) -> Any:
    if spec.path is not None:
        name = "spectest_kernel_" + hashlib.sha256(spec.path.encode()).hexdigest()[:12]
        mspec = importlib.util.spec_from_file_location(name, spec.path)
        assert mspec is not None and mspec.loader is not None
        module = importlib.util.module_from_spec(mspec)
        sys.modules[name] = module
        try:
            mspec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)  # a half-imported module is not kept
            raise
        return module
    assert spec.module is not None
    return importlib.import_module(spec.module)


def kernel_digest(spec: KernelSpec) -> str | None:
    """sha256 of the kernel's source file (provenance), when there is one."""
    path = spec.path
    if path is None and spec.module is not None:
        found = importlib.util.find_spec(spec.module)
        path = None if found is None else found.origin
    if path is None or not Path(path).is_file():
        return None
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def kernel_sampler(kernel: Callable[..., Any], name: str) -> SampleFn:
    """The user's kernel as a round sampler (``rejection.SampleFn``), its return validated.

    Inputs as ``rejection.rejection_sample``'s: float64 laws, int64 drafts, float64 uniforms
    from the counter RNG; ``draft_lens`` must be None (the built-in loop drafts K tokens on
    every row).
    """
    return round_sampler(functools.partial(_kernel_round, kernel, name), RoundInputs)


def _kernel_round(kernel: Callable[..., Any], name: str, r: RoundInputs) -> RoundResult:
    target_probs, draft_probs, draft_tokens, u_accept, u_final = r.tp, r.dp, r.dt, r.ua, r.uf
    assert r.draft_lens is None
    K, V = int(target_probs.shape[1]) - 1, int(target_probs.shape[2])
    if draft_probs is None:  # q = δ(x): one-hot at the draft token
        dp = torch.nn.functional.one_hot(draft_tokens, V).to(torch.float32)  # [B, K, V]
    else:
        dp = draft_probs.to(torch.float32).contiguous()  # [B, K, V]
    uniforms = torch.cat([u_accept, u_final[:, None]], dim=1).contiguous()  # [B, K+1] float64
    tp = target_probs.to(torch.float32).contiguous()  # [B, K+1, V]
    args = (dp, draft_tokens.clone(), uniforms.clone(), tp)
    kwargs: dict[str, Any] = {}
    if getattr(kernel, RANDOMNESS_ATTR, "uniforms") == "generator":
        gen = torch.Generator(device=target_probs.device)
        gen.manual_seed(int(u_final[0].item() * 2.0**53))  # per call, from the first row's key
        kwargs["generator"] = gen
    ret = contained(
        lambda err: f"acceptor {name}: the kernel {escape_reason(err)}",
        kernel,
        *args,
        watch=(f"acceptor {name}", "calling the kernel"),
        **kwargs,
    )
    out, acc, emit = check_return(ret, name, draft_tokens, V, target_probs.device)
    mask = torch.arange(K, device=acc.device)[None, :] < acc[:, None]  # [B, K] (counts only)
    return RoundResult(out, emit + 1, emit, AcceptanceTelemetry(mask, acc))


def check_return(
    ret: Any, name: str, draft_tokens: torch.Tensor, V: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The contract's checks on a kernel's return; ``EngineError`` naming ``name`` otherwise."""
    B, K = (int(s) for s in draft_tokens.shape)

    def fail(msg: str) -> EngineError:
        return EngineError(f"acceptor {name}: {msg}")

    expected = "expected a tuple (output_token_ids, accepted_num, emitted_num)"
    if not isinstance(ret, (tuple, list)):
        raise fail(f"{expected}, got {type(ret).__name__}")
    # a tuple or list subclass runs the plug-in's own __iter__ / __len__: read it contained
    # (a RuntimeError there was exit 4, "a bug in spectest"; found by tools/fuzz.py)
    items = contained(
        lambda err: f"acceptor {name}: its return value cannot be read: {escape_reason(err)}",
        tuple,
        ret,
        watch=(f"acceptor {name}", "reading the kernel's return value"),
    )
    if len(items) != 3:
        raise fail(f"{expected}, got a {type(ret).__name__} of {len(items)} items")
    want = {"output_token_ids": (B, K + 1), "accepted_num": (B,), "emitted_num": (B,)}
    for (field, shape), t in zip(want.items(), items, strict=True):
        if not isinstance(t, torch.Tensor):
            raise fail(f"{field} must be a torch.Tensor, got {type(t).__name__}")
        if type(t) is not torch.Tensor:  # a subclass's __torch_function__ is plug-in code
            raise fail(f"{field} must be a plain torch.Tensor, got the subclass {type(t).__name__}")
        if t.dtype != torch.int64:
            raise fail(f"{field} must be int64, got {t.dtype}")
        if tuple(t.shape) != shape:
            raise fail(f"{field} must have shape {list(shape)}, got {list(t.shape)}")
        if t.device != device:
            raise fail(f"{field} is on {t.device}, the inputs on {device}")
    out, acc, emit = items
    pos = torch.arange(K + 1, device=device)[None, :]  # [1, K+1]
    n = emit[:, None]  # [B, 1]
    drafts = torch.cat([draft_tokens, draft_tokens[:, :1]], dim=1)  # [B, K+1] (last col unused)
    final = out.gather(1, emit.clamp(0, K)[:, None])[:, 0]  # [B]
    checks = [
        ("emitted_num must be in [0, K]", (emit < 0) | (emit > K)),
        ("accepted_num must be in [0, K]", (acc < 0) | (acc > K)),
        ("the emitted drafts differ from the proposed ones", ((pos < n) & (out != drafts)).any(1)),
        ("the recovered/bonus token is not an id in [0, V)", (final < 0) | (final >= V)),
        ("entries after the last emitted token must be -1", ((pos > n) & (out != PADDING)).any(1)),
    ]
    for msg, bad in checks:
        if bool(bad.any()):
            row = int(torch.nonzero(bad)[0, 0])
            raise fail(
                f"{msg} (row {row}: emitted_num {int(emit[row])}, accepted_num {int(acc[row])}, "
                f"output {out[row].tolist()}, drafts {draft_tokens[row].tolist()}, K={K}, V={V})"
            )
    return out, acc, emit


def _prepare_why(err: BaseException) -> str:
    if isinstance(err, Exception):
        return err_text(err) or type(err).__name__
    return escape_reason(err)


class AcceptorEngine(BuiltinEngine):
    """spectest's speculative loop with the user's verification kernel
    (docs/engines-acceptor.md)."""

    name = "acceptor"
    needs = "draft"
    whitebox = "generation"  # spectest's own loop records the columns (builtin.BuiltinEngine)
    rounds = "tested"
    uses_variant = False
    fast_variant: ClassVar[str | None] = "fast-acceptor"  # --fast: engines/fast.py, same kernel

    @dataclass(frozen=True)
    class Options:
        """``kernel``: ``PATH.py:FUNCTION`` (absolute after parsing) or
        ``package.module:FUNCTION``, e.g. ``spectest.acceptors.sglang:chain``."""

        kernel: str = ""

    @classmethod
    def parse_options(cls, raw: Mapping[str, Any], where: str, base_dir: Path | None = None) -> Any:
        opts = super().parse_options(raw, where, base_dir)
        if not opts.kernel:
            raise ConfigError(f"{where}.kernel: required field is missing")
        spec = parse_kernel_spec(opts.kernel, f"{where}.kernel", base_dir)
        return dataclasses.replace(opts, kernel=spec.text)

    @classmethod
    def needs_draft(cls, variant: str | None) -> bool:
        return True

    def __init__(self, options: Any, models: Models) -> None:
        super().__init__(options, models)
        self.spec = parse_kernel_spec(options.kernel, "acceptor kernel")
        self.kernel = load_kernel(self.spec)
        prepare = getattr(self.kernel, PREPARE_ATTR, None)
        if prepare is not None:
            text = self.spec.text
            contained(
                lambda err: f"acceptor {text}: preparing failed: {_prepare_why(err)}",
                prepare,
                hold_output=True,
                watch=(f"acceptor {text}", "preparing the kernel"),
            )

    def speculative(self, job: ArmJob) -> bool:
        return True

    def variant(self, job: ArmJob) -> SpecVariant:
        from spectest.sampling.mutants import get_variant

        exact = get_variant("exact")  # spectest's own pipeline and drafts; only the sampler swaps
        kernel, name = self.kernel, self.spec.text
        sample = kernel_sampler(kernel, name)
        # the user's kernel sees the dense laws it was written for: no round on a shortlist
        return dataclasses.replace(
            exact,
            name="acceptor",
            description=f"acceptor {name}",
            exact=False,
            sample_fn=sample,
            round_on_shortlist=False,
        )

    def provenance(self) -> dict[str, Any]:
        return {
            **super().provenance(),
            "kernel_sha256": kernel_digest(self.spec),
            "randomness": getattr(self.kernel, RANDOMNESS_ATTR, "uniforms"),
        }
