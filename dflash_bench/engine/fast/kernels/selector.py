"""Which kernels a fast-path step runs: Triton's on a GPU, the C kernels (`cpu_kernels`) on a CPU, or none
(decoder.py's torch ops), and the weights as those kernels read them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType

import torch

from dflash_bench.errors import UserError


@dataclass(frozen=True)
class Kernels:
    """The kernel modules of a decode step (Triton's, or `cpu_kernels` in every place); a family may add its own
    beside them (`gemma.gemma_kernels`)."""

    name: str  # "triton" or "cpu"
    ops: ModuleType  # triton_ops: norms, q/k norm + RoPE + cache write, silu * up, embedding, argmax, commit
    attn: ModuleType  # triton_attn: split-K attention over each row's valid keys
    gemm: ModuleType  # triton_gemm: skinny matmuls, and the lm_head's matmul fused with its argmax


def load_kernels(device: torch.device, want: bool | str | None, dtype: torch.dtype | None = None) -> Kernels | None:
    """The kernels of a decode step, or None for the torch path.

    want None: on CUDA the Triton kernels when Triton imports; on a CPU the C kernels (`cpu_kernels`, float32
    and float64) when the machine's C compiler builds them. True: the Triton kernels anywhere (the CPU tests
    run them in Triton's interpreter). "cpu": the C kernels (an error where they cannot be built). False: the
    torch path.
    """
    if want is False:
        return None
    if device.type == "cpu" and want in (None, "cpu"):
        from dflash_bench.engine.fast.kernels import cpu_kernels

        if dtype not in cpu_kernels.SUFFIX:
            if want == "cpu":
                raise UserError(f"the CPU kernels run float32 and float64 models, not {dtype}")
            return None
        if cpu_kernels.load(required=want == "cpu") is None:
            return None
        return Kernels("cpu", ops=cpu_kernels, attn=cpu_kernels, gemm=cpu_kernels)
    if want is None and device.type != "cuda":
        return None
    try:
        from dflash_bench.engine.fast.kernels import triton_attn, triton_gemm, triton_ops
    except ImportError:
        if want:
            raise UserError("the fast path's kernels need Triton: pip install triton") from None
        return None
    return Kernels("triton", ops=triton_ops, attn=triton_attn, gemm=triton_gemm)


def check_head_dims(kernels: Kernels | None, head_dims: Iterable[int], what: str, dtype: torch.dtype) -> None:
    """Refuse at load, in one sentence, a model whose head dims the chosen kernels cannot run (not at its
    first decode step, after the server is up)."""
    if kernels is None:
        return
    bad = sorted({hd for hd in head_dims if not kernels.attn.fits(hd, dtype)})
    if bad:
        raise UserError(f"the fast path's {kernels.attn.HEAD_DIMS}, and the {what} has head dim "
                        f"{', '.join(map(str, bad))}: serve it with --no-kernels (torch ops) or without --fast")


def prepared(kernels: Kernels | None, w: torch.Tensor) -> torch.Tensor:
    """A weight as the kernels' matmul reads it: the CPU kernels' packed panels; otherwise as it is."""
    pack = getattr(kernels.gemm, "pack", None) if kernels else None
    return pack(w) if pack else w
