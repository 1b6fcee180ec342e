"""The ``plugin`` generator: an acceptor kernel (``candidate=acceptor:kernel.py:accept``) that
raises anything (exceptions, ``BaseException`` subclasses, ``SystemExit``, ``KeyboardInterrupt``,
``GeneratorExit``, an exception whose ``__str__`` raises), returns wrong things (``None``, two
items, wrong shapes, dtypes or devices, out-of-range tokens, emitted counts out of [0, K],
numpy arrays, tuple / list / tensor subclasses whose methods raise), sleeps, prints, writes into
its inputs, or misbehaves at import, in ``spectest_prepare`` or in its attributes; with the exit
codes each behaviour allows. Knows nothing about running a case.
"""

from __future__ import annotations

import random
import textwrap
from typing import Any

import yaml

from fuzzing.common import (
    BAD_INPUT,
    KERNEL_OK,
    MAX_TOKENS,
    PLUGIN_MARK,
    VERDICTS,
    file_entry,
    new_case,
    rng_for,
    toy_prompts,
    toy_protocol,
)

IMPORT_BEHAVIOURS: dict[str, tuple[str, list[int]]] = {
    "none": ("", VERDICTS),
    "raise": ("raise ValueError('at import')", BAD_INPUT),
    "exit0": ("import sys; sys.exit(0)", BAD_INPUT),
    "exit1": ("import sys; sys.exit(1)", BAD_INPUT),
    "exit_str": ("raise SystemExit('bye')", BAD_INPUT),
    "kbint": ("raise KeyboardInterrupt", BAD_INPUT),
    "genexit": ("raise GeneratorExit", BAD_INPUT),
    "argparse": (
        "import argparse\np = argparse.ArgumentParser()\n"
        "p.add_argument('--must', required=True)\np.parse_args()",
        BAD_INPUT,
    ),
    "print": (f"print('{PLUGIN_MARK} hello from import')", VERDICTS),
    "print_err": (f"import sys; print('{PLUGIN_MARK} err', file=sys.stderr)", VERDICTS),
    "missing_module": ("import fuzz_no_such_module", BAD_INPUT),
    "syntax": ("def (:", BAD_INPUT),
    "recursion": ("def f(): return f()\nf()", BAD_INPUT),
    "base_exc": ("class E(BaseException): pass\nraise E('custom base')", BAD_INPUT),
    "memory": ("raise MemoryError('fuzz')", [2, 4]),
    "badstr": (
        "class E(Exception):\n    def __str__(self): raise RuntimeError('no str')\nraise E()",
        BAD_INPUT,
    ),
    "multiline": ("raise ValueError('line one\\nline two\\n\\x1b[31m[/]')", BAD_INPUT),
}
CALL_BEHAVIOURS: dict[str, tuple[str, list[int]]] = {
    "ok": ("", VERDICTS),
    "raise": ("raise ValueError('in call')", BAD_INPUT),
    "raise_type": ("raise TypeError('bad')", BAD_INPUT),
    "exit0": ("import sys; sys.exit(0)", BAD_INPUT),
    "exit1": ("import sys; sys.exit(1)", BAD_INPUT),
    "exit_none": ("import sys; sys.exit()", BAD_INPUT),
    "kbint": ("raise KeyboardInterrupt", BAD_INPUT),
    "genexit": ("raise GeneratorExit", BAD_INPUT),
    "stopiter": ("raise StopIteration", BAD_INPUT),
    "base_exc": ("class E(BaseException): pass\nraise E('custom')", BAD_INPUT),
    "recursion": ("def f(): return f()\nf()", BAD_INPUT),
    "badstr": (
        "class E(Exception):\n    def __str__(self): raise RuntimeError('no str')\nraise E()",
        BAD_INPUT,
    ),
    "ret_none": ("return None", BAD_INPUT),
    "two": ("return out, acc", BAD_INPUT),
    "list": ("return [out, acc, emit]", VERDICTS),
    "dict": ("return {'out': out}", BAD_INPUT),
    "gen": ("return (t for t in (out, acc, emit))", BAD_INPUT),
    "float_out": ("return out.double(), acc, emit", BAD_INPUT),
    "nan_out": ("return out.double() * float('nan'), acc, emit", BAD_INPUT),
    "int32": ("return out.int(), acc, emit", BAD_INPUT),
    "shape": ("return out[:, :-1], acc, emit", BAD_INPUT),
    "shape2": ("return out.T, acc, emit", BAD_INPUT),
    "scalar": ("return out, acc.sum(), emit", BAD_INPUT),
    "oov": ("out = out.clone(); out[0, emit[0]] = 16; return out, acc, emit", BAD_INPUT),
    "neg": ("out = out.clone(); out[0, emit[0]] = -2; return out, acc, emit", BAD_INPUT),
    "huge": ("out = out.clone(); out[0, emit[0]] = 2**40; return out, acc, emit", BAD_INPUT),
    "emit_big": ("return out, acc, emit + 100", BAD_INPUT),
    "emit_neg": ("return out, acc, emit - 100", BAD_INPUT),
    "acc_neg": ("return out, acc - 100, emit", BAD_INPUT),
    "drafts": (
        "out = out.clone(); out[:, 0] = (out[:, 0] + 1) % 16; emit = emit * 0 + 1\n"
        "return out, acc, emit",
        BAD_INPUT,
    ),
    "padding": ("out = out.clone(); out[:, -1] = 3; return out, acc, emit", [0, 1, 2, 3]),
    "numpy": ("return out.numpy(), acc, emit", BAD_INPUT),
    "meta": ("return out.to('meta'), acc, emit", BAD_INPUT),
    "grad": ("return out, acc, emit.float().requires_grad_().long()", VERDICTS),
    "subclass_tuple": (
        "class T(tuple):\n    def __len__(self): raise RuntimeError('len')\n"
        "return T((out, acc, emit))",
        BAD_INPUT,
    ),
    "subclass_list": (
        "class L(list):\n    def __iter__(self): raise RuntimeError('it')\n"
        "return L([out, acc, emit])",
        BAD_INPUT,
    ),
    "tensor_sub": (
        "class S(torch.Tensor):\n    @classmethod\n"
        "    def __torch_function__(cls, f, t, a=(), k=None):\n"
        "        raise RuntimeError('torch function')\n"
        "return out.as_subclass(S), acc, emit",
        BAD_INPUT,
    ),
    "noncontig": (
        "big = torch.full((out.shape[0], 2 * out.shape[1]), -1, dtype=torch.int64)\n"
        "big[:, ::2] = out\nreturn big[:, ::2], acc, emit",
        VERDICTS,
    ),
    "print": (f"print('{PLUGIN_MARK} call')", VERDICTS),
    "print_err": (f"import sys; print('{PLUGIN_MARK} call', file=sys.stderr)", VERDICTS),
    "sleep": ("import time; time.sleep(0.05)", VERDICTS),
    "inplace": ("uniforms.fill_(0.5); target_probs.fill_(float('nan'))", VERDICTS),
    "memory": ("raise MemoryError('fuzz')", [2, 4]),
    "zero_div": ("1 / 0", BAD_INPUT),
    "assert": ("assert False, 'kernel assert'", BAD_INPUT),
    "always_accept": (
        "emit = torch.full_like(emit, draft_token_ids.shape[1]); "
        "out = torch.cat([draft_token_ids, draft_token_ids[:, :1]], 1)\n"
        "return out, emit, emit",
        VERDICTS,
    ),
}
PREPARE_BEHAVIOURS: dict[str, tuple[str, list[int]]] = {
    "raise": ("raise RuntimeError('prepare')", BAD_INPUT),
    "exit0": ("import sys; sys.exit(0)", BAD_INPUT),
    "kbint": ("raise KeyboardInterrupt", BAD_INPUT),
    "print": (f"print('{PLUGIN_MARK} prepare')", VERDICTS),
    "ok": ("return 1", VERDICTS),
}
ATTR_BEHAVIOURS: dict[str, tuple[str, list[int]]] = {
    "random_bad": ("accept.spectest_randomness = 'sometimes'", BAD_INPUT),
    "random_list": ("accept.spectest_randomness = ['x']", BAD_INPUT),
    "random_gen": ("accept.spectest_randomness = 'generator'", [0, 1, 2, 3]),
    "not_callable": ("accept = 3", BAD_INPUT),
    "deleted": ("del accept", BAD_INPUT),
    "prepare_not_callable": ("accept.spectest_prepare = 5", [2, 4]),
}


def plugin_kernel(call: str, on_call: int, imp: str, prepare: str | None, attr: str | None) -> str:
    """The kernel file: the correct kernel, with the behaviour run from its ``on_call``-th call
    (a behaviour without a ``return`` falls through to the correct return)."""
    body = KERNEL_OK.replace(
        "    return out, ok.long().sum(1), emitted\n", "    acc, emit = ok.long().sum(1), emitted\n"
    )
    code = CALL_BEHAVIOURS[call][0]
    tail = "    _CALLS[0] += 1\n"
    if code:
        tail += f"    if _CALLS[0] >= {on_call}:\n" + textwrap.indent(code, " " * 8) + "\n"
    tail += "    return out, acc, emit\n"
    text = "_CALLS = [0]\n" + IMPORT_BEHAVIOURS[imp][0] + "\n" + body + tail
    if prepare is not None:
        text += "\n\ndef _prepare():\n" + textwrap.indent(PREPARE_BEHAVIOURS[prepare][0], "    ")
        text += "\n\n\naccept.spectest_prepare = _prepare\n"
    if attr is not None:
        text += "\n" + ATTR_BEHAVIOURS[attr][0] + "\n"
    return text


def plugin_case(seed: int, index: int) -> dict[str, Any]:
    r = rng_for(seed, "plugin", index)
    case = new_case("plugin", index, seed)
    notes = case["notes"]
    proto = toy_protocol(r)
    proto["teeth"] = {"null_arm": False, "epsilons": [], "mutants": []}
    proto["seeds"] = {"per_arm": r.choice([4, 20])}
    roll = r.random()
    imp, call, prepare, attr = "none", "ok", None, None
    if roll < 0.2:
        imp = r.choice(sorted(IMPORT_BEHAVIOURS))
    elif roll < 0.85:
        call = r.choice(sorted(CALL_BEHAVIOURS))
    elif roll < 0.93:
        prepare = r.choice(sorted(PREPARE_BEHAVIOURS))
    else:
        attr = r.choice(sorted(ATTR_BEHAVIOURS))
    on_call = r.choice([1, 1, 2, 3])
    expect = set(VERDICTS)  # the correct kernel, unless one behaviour is not the default
    for table, key in (
        (IMPORT_BEHAVIOURS, imp),
        (CALL_BEHAVIOURS, call),
        (PREPARE_BEHAVIOURS, prepare),
        (ATTR_BEHAVIOURS, attr),
    ):
        if key not in (None, "none", "ok"):
            expect = set(table[key][1])
    if on_call > 1 and call != "ok":
        expect |= set(VERDICTS)  # the run may end before the kernel's n-th call
    notes.append(f"kernel import={imp} call={call}@{on_call} prepare={prepare} attr={attr}")
    case["files"]["kernel.py"] = file_entry(plugin_kernel(call, on_call, imp, prepare, attr))
    case["files"]["prompts.jsonl"] = file_entry(toy_prompts(r))
    case["files"]["proto.yaml"] = file_entry(yaml.safe_dump(proto, sort_keys=False))
    spec = r.choice(["kernel.py:accept", "./kernel.py:accept", "{dir}/kernel.py:accept"])
    case["argv"] = [
        "run",
        "--config",
        "proto.yaml",
        "--out",
        "run",
        "--no-progress",
        "--set",
        f"candidate=acceptor:{spec}",
        "--set",
        f"limits.max_tokens={MAX_TOKENS}",
    ]
    case["expect"] = sorted(expect)
    return case


# ----------------------------------------------------------------------------- death and hangs
# What a plug-in does that raises nothing (issue 33 item 1): the run must be exit 2 naming the
# plug-in (4 where it happens outside any plug-in call), never a verdict code, never a hang.
# These cases run only as real processes (``process_only``): in the fuzzer's worker they would
# end or hang the worker itself.
DEATHS: dict[str, str] = {
    "os_exit0": "os._exit(0)",
    "os_exit1": "os._exit(1)",
    "os_exit3": "os._exit(3)",
    "os_exit4": "os._exit(4)",
    "os_exit130": "os._exit(130)",
    "sigkill": "os.kill(os.getpid(), signal.SIGKILL)",
    "sigterm": "os.kill(os.getpid(), signal.SIGTERM)",
    "sigsegv": "import ctypes; ctypes.string_at(0)",
    "abort": "os.abort()",
    "killpg": "os.killpg(0, signal.SIGKILL)",
}
HANGS: dict[str, str] = {
    "sleep": "time.sleep(3600)",
    "busy": "while True:\n    pass",
    "event": "import threading; threading.Event().wait()",
    "select": "import select; select.select([], [], [])",
    "ignore_term": "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)",
}
SITES = ("import", "prepare", "call", "return")  # where in the kernel the behaviour runs
HEADER = "import os, signal, sys, time\n_CALLS = [0]\n"


def _kernel_with(code: str, site: str, on_call: int) -> str:
    """The correct kernel (``KERNEL_OK``) with ``code`` run at ``site``: at import, in
    ``spectest_prepare``, from the ``on_call``-th call, or while its return value is read (a
    tuple subclass whose ``__iter__`` runs it)."""
    body = KERNEL_OK.replace(
        "    return out, ok.long().sum(1), emitted\n", "    acc, emit = ok.long().sum(1), emitted\n"
    )
    text = HEADER + (code + "\n" if site == "import" else "") + body
    text += "    _CALLS[0] += 1\n"
    if site == "call":
        text += f"    if _CALLS[0] >= {on_call}:\n" + textwrap.indent(code, " " * 8) + "\n"
    if site == "return":
        text += (
            "    class T(tuple):\n        def __iter__(self):\n"
            + f"            if _CALLS[0] >= {on_call}:\n"
            + textwrap.indent(code, " " * 16)
            + "\n            return super().__iter__()\n"
            "    return T((out, acc, emit))\n"
        )
    else:
        text += "    return out, acc, emit\n"
    if site == "prepare":
        text += "\n\ndef _prepare():\n" + textwrap.indent(code, "    ") + "\n\n\n"
        text += "accept.spectest_prepare = _prepare\n"
    return text


def _process_case(kind: str, seed: int, index: int) -> tuple[dict[str, Any], random.Random]:
    r = rng_for(seed, kind, index)
    case = new_case(kind, index, seed)
    case["process_only"] = True
    proto = toy_protocol(r)
    proto["teeth"] = {"null_arm": False, "epsilons": [], "mutants": []}
    proto["seeds"] = {"per_arm": r.choice([4, 20])}
    case["files"]["prompts.jsonl"] = file_entry(toy_prompts(r))
    case["files"]["proto.yaml"] = file_entry(yaml.safe_dump(proto, sort_keys=False))
    return case, r


def _argv(spec: str, *extra: str) -> list[str]:
    return ["run", "--config", "proto.yaml", "--out", "run", "--no-progress", "--set",
            f"candidate=acceptor:{spec}", "--set", f"limits.max_tokens={MAX_TOKENS}",
            *extra]  # fmt: skip


def plugin_death_case(seed: int, index: int) -> dict[str, Any]:
    """A kernel that ends the process without raising (``os._exit(N)``, a signal to itself or
    its group, a segfault, ``abort``) at import, in prepare, in a call or while its return is
    read — or from an ``atexit`` hook or a thread, where spectest's own end may come first."""
    case, r = _process_case("plugin_death", seed, index)
    death = r.choice(sorted(DEATHS))
    roll = r.random()
    on_call = r.choice([1, 1, 2, 3])
    if roll < 0.8:
        site = r.choice(SITES)
        text = _kernel_with(DEATHS[death], site, on_call)
        expect = {2} | (set(VERDICTS) if site in ("call", "return") and on_call > 1 else set())
        case["expect_error"] = "ended spectest's process"
    elif roll < 0.9:  # atexit: after spectest announced its end, which stands
        site = "atexit"
        hook = "import atexit\ndef _hook():\n" + textwrap.indent(DEATHS[death], "    ")
        hook += "\natexit.register(_hook)"
        text = _kernel_with(hook, "import", on_call)
        expect = set(VERDICTS)
    else:  # a thread: inside a call (2), outside any (4), or after the end (the verdict)
        site = "thread"
        delay = r.choice([0.0, 0.5, 2.0])
        code = textwrap.indent(DEATHS[death], "    ")
        thread = f"import threading\ndef _bye():\n    time.sleep({delay})\n{code}\n"
        text = _kernel_with(thread + "threading.Thread(target=_bye, daemon=True).start()",
                            "import", on_call)  # fmt: skip
        expect = {2, 4} | set(VERDICTS)
    case["notes"].append(f"kernel death={death} site={site} on_call={on_call}")
    case["files"]["kernel.py"] = file_entry(text)
    case["argv"] = _argv("{dir}/kernel.py:accept")
    case["expect"] = sorted(expect)
    return case


def plugin_hang_case(seed: int, index: int) -> dict[str, Any]:
    """A kernel that never answers (sleep, a busy loop, a wait on nothing, SIGTERM ignored) at
    one site, under a short ``--plugin-timeout``: exit 2 naming it within the limit; or a slow
    kernel that finishes each call under it: a verdict."""
    case, r = _process_case("plugin_hang", seed, index)
    timeout = r.choice([1, 2, 3])
    on_call = r.choice([1, 1, 2, 3])
    if r.random() < 0.8:
        hang, site = r.choice(sorted(HANGS)), r.choice(SITES)
        text = _kernel_with(HANGS[hang], site, on_call)
        expect = {2} | (set(VERDICTS) if site in ("call", "return") and on_call > 1 else set())
        case["expect_error"] = f"gave no answer within {timeout} s"
    else:
        hang, site = "slow", "call"
        text = _kernel_with(f"time.sleep({r.choice([0.05, 0.2, timeout / 4])})", site, 1)
        expect = set(VERDICTS)
    case["notes"].append(f"kernel hang={hang} site={site} on_call={on_call} timeout={timeout}")
    case["files"]["kernel.py"] = file_entry(text)
    case["argv"] = _argv("{dir}/kernel.py:accept", "--plugin-timeout", str(timeout))
    case["expect"] = sorted(expect)
    return case
