"""The fast path's CPU kernels (cpu_kernels.c, cpu_attention.c), built with the machine's C compiler, run by ctypes.

The same calls as the Triton modules (`triton_gemm.linear` and `linear_argmax`, `triton_ops`' norms, RoPE +
cache write, silu * up, embedding, argmax and commit, `triton_attn.decode_attention`), so `selector.Kernels`
takes this module in all three places on a CPU. Why: an eager torch decode step on a CPU is ~40 ops a layer
of ~5 us dispatch each, and MKL's sgemm costs about twice a one-row gemv from 2 to 8 rows, so a verify of a
few tokens cost 1.7x an AR step's matmuls; here a layer is 9 calls, and the matmul (`linear`, over weights
packed once by `pack`) reads each weight once for up to 6 rows (benchmarks/speed/cpu_step.py measures both).

float32 and float64 (the tests' dtype). Built once per source and flags into the cache folder
(DFLASH_BENCH_CACHE, else ~/.cache/dflash-bench) with `cc -O3 -march=native`, about 1.5 s; `load` returns
None where no compiler builds it (the torch path then runs; `DenseTarget(kernels=False)`, or
`serve --fast --no-kernels`, runs it by choice). Each call releases the GIL while it runs (ctypes).
"""

from __future__ import annotations

from typing import Any

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from dflash_bench.errors import UserError
from dflash_bench.llamacpp import cache_root

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = [HERE / "cpu_kernels.c", HERE / "cpu_attention.c"]  # and the header both include, cpu_kernels.h
FLAGS = ["-O3", "-march=native", "-ffp-contract=fast", "-std=gnu11", "-shared", "-fPIC"]
SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
PANEL = {torch.float32: 16, torch.float64: 8}  # output columns per packed panel (two 32-byte vectors)
_P, _L, _D, _I = ctypes.c_void_p, ctypes.c_long, ctypes.c_double, ctypes.c_int
_SIGNATURES = {
    "linear": [_P, _L, _L, _L, _P, _L, _P, _P, _L],
    "rms_norm": [_P, _P, _P, _P, _P, _L, _L, _D],
    "silu_mul": [_P, _L, _P, _L, _L],
    "argmax": [_P, _L, _L, _L, _P],
    "embed_norm": [_P, _L, _L, _L, _L, _L, _P, _L, _D, _P, _D, _P, _P],
    "qk_rope_store": [_P, _L, _L, _L, _L, _L, _P, _P, _P, _P, _P, _P, _L, _L, _L, _P, _D, _P],
    "attention": [_P, _P, _P, _L, _L, _L, _P, _L, _L, _L, _L, _L, _L, _D, _I, _L, _L, _P],
}
_lib: list = []  # [the loaded library, or None when it could not be built]


def load(required: bool = False) -> ctypes.CDLL | None:
    """The kernels' library, built on first use; None (or with `required` a UserError) where it cannot be."""
    if not _lib:
        _lib.append(_build())
    if _lib[0] is None and required:
        raise UserError("the CPU kernels need a C compiler (cc, gcc or clang on PATH, or CC)")
    return _lib[0]


def _build() -> ctypes.CDLL | None:
    cc = os.environ.get("CC") or next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if cc is None:
        log.warning("no C compiler found: the fast path runs plain torch ops on the CPU")
        return None
    src = b"".join(f.read_bytes() for f in SOURCES + [HERE / "cpu_kernels.h"])
    key = hashlib.sha256(src + " ".join([cc] + FLAGS).encode() + _cpu_id()).hexdigest()[:16]
    lib = cache_root() / "cpu_kernels" / f"{key}.so"
    if not lib.exists():
        lib.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
            out = Path(tmp) / lib.name
            done = subprocess.run([cc, *FLAGS, "-o", str(out), *map(str, SOURCES), "-lm"], capture_output=True,
                                  text=True)
            if done.returncode:
                log.warning("the CPU kernels did not build (%s): the fast path runs plain torch ops\n%s", cc,
                            done.stderr[-2000:])
                return None
            out.replace(lib)  # atomic: a concurrent build leaves one complete file
    dll = ctypes.CDLL(str(lib))
    for name, args in _SIGNATURES.items():
        for suffix in SUFFIX.values():
            fn = getattr(dll, f"{name}_{suffix}")
            fn.argtypes, fn.restype = args, _I if name == "attention" else None
    dll.commit.argtypes = [_P, _L, _P, _L, _P, _P, _P, _L, _P, _L, _L, _L, _P, _L, _L, _L, _P, _D]
    dll.commit.restype = None
    return dll


def _cpu_id() -> bytes:
    """What -march=native builds for: the processor's model and feature flags (a cache folder shared by machines
    of other processors must not hand them this one's build)."""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:  # not Linux: the platform's own description
        return f"{platform.machine()} {platform.processor()}".encode()
    return "\n".join(sorted({ln for ln in info if ln.startswith(("model name", "flags", "Features"))})).encode()


def _fn(name: str, dtype: torch.dtype | None = None) -> Any:
    lib = _lib[0] if _lib else load(required=True)
    return getattr(lib, name if dtype is None else f"{name}_{SUFFIX[dtype]}")


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def pack(w: torch.Tensor) -> torch.Tensor:
    """A weight `[n, k]` as `linear` reads it, `[n / P, k, P]` (panels of P output columns, each streamed
    contiguously); a weight whose n is not a multiple of P is kept as it is (`linear` then calls F.linear)."""
    n, k = w.shape
    p = PANEL.get(w.dtype, 0)
    if not p or n % p:
        return w
    return w.detach().reshape(n // p, p, k).transpose(1, 2).contiguous()


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, lane: int = 0) -> torch.Tensor:
    """`F.linear(x, w, bias)` for a weight packed by `pack` (3-D), else F.linear. `lane` is the Triton
    kernel's (a second CUDA stream's workspace): unused here."""
    if w.dim() != 3:
        return F.linear(x, w, bias)
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    m, k = x2.shape
    n = w.shape[0] * w.shape[2]
    assert w.shape[1] == k and x.dtype == w.dtype and (bias is None or bias.is_contiguous()), (x.shape, w.shape)
    y = torch.empty(m, n, dtype=x.dtype)
    _fn("linear", x.dtype)(x2.data_ptr(), x2.stride(0), m, k, w.data_ptr(), n, _ptr(bias), y.data_ptr(), n)
    return y.view(*x.shape[:-1], n)


def argmax(logits: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """`logits.argmax(-1)` (the first column of each row's maximum), into `out` (any strides) when given."""
    x = logits.reshape(-1, logits.shape[-1])
    if x.stride(1) != 1:
        x = x.contiguous()
    ids = torch.empty(logits.shape[:-1], dtype=torch.int64)
    _fn("argmax", x.dtype)(x.data_ptr(), x.stride(0), x.shape[0], x.shape[1], ids.data_ptr())
    return ids if out is None else out.copy_(ids.view(out.shape))


def linear_argmax(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """`argmax(x @ w.T, -1)`, into `out` (any `[bs, n]` view with bs * n rows) when given."""
    return argmax(linear(x, w), out)


def _rms(h: torch.Tensor, a: torch.Tensor | None, w: torch.Tensor | None, eps: float
         ) -> tuple[torch.Tensor | None, torch.Tensor]:
    h, a = h.contiguous(), None if a is None else a.contiguous()  # kept alive through the call
    n = h.shape[-1]
    out = torch.empty_like(h)
    s = None if a is None else torch.empty_like(h)
    _fn("rms_norm", h.dtype)(h.data_ptr(), _ptr(a), _ptr(s), _ptr(w), out.data_ptr(), h.numel() // n, n, eps)
    return s, out


def rms_norm(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    return _rms(x, None, w, eps)[1]


def add_rms_norm(h: torch.Tensor, a: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`(h + a, rms_norm(h + a) * w)`: the sum is rounded to the dtype before its norm, as torch's."""
    s, out = _rms(h, a, w, eps)
    assert s is not None  # `a` given: the sum was written
    return s, out


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up over the fused `[t, 2 n]` projection (rows may be strided)."""
    t, n = gu.shape[0], gu.shape[1] // 2
    assert gu.stride(1) == 1
    out = torch.empty(t, n, dtype=gu.dtype)
    _fn("silu_mul", gu.dtype)(gu.data_ptr(), gu.stride(0), out.data_ptr(), t, n)
    return out


def embed_norm(ids: torch.Tensor, embed: torch.Tensor, w: torch.Tensor, eps: float, scale: float = 1.0,
               n: int | None = None, fill: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`(h, rms_norm(h) * w)`, h `[bs * n, hidden]` = `embed[tokens] * scale`: tokens = ids `[bs, n]` (any
    strides), or with `fill` `[ids[b, 0], fill x (n - 1)]` per row (the DFlash block; ids may be `[bs]`)."""
    ids = ids[:, None] if ids.dim() == 1 else ids
    bs, n = ids.shape[0], ids.shape[1] if n is None else n
    hidden = embed.shape[1]
    assert embed.is_contiguous() and ids.dtype == torch.int64
    h = torch.empty(bs * n, hidden, dtype=embed.dtype)
    out = torch.empty_like(h)
    _fn("embed_norm", embed.dtype)(ids.data_ptr(), ids.stride(0), ids.stride(1), bs, n, -1 if fill is None else fill,
                                   embed.data_ptr(), hidden, scale, w.data_ptr(), eps, h.data_ptr(), out.data_ptr())
    return h, out


def qk_rope_store(qkv: torch.Tensor, nq: int, hkv: int, hd: int, cos: torch.Tensor, sin: torch.Tensor,
                  rows: torch.Tensor, pos: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
                  wqk: torch.Tensor | None, eps: float) -> torch.Tensor | None:
    """From `qkv` `[t, (nq + 2 hkv) hd]` (rows may be strided): q `[t, nq, hd]` (None if nq == 0), and k, v
    written to the cache `[slots, max_len, hkv, hd]` at (rows, pos) `[t]`; cos, sin: float32 tables
    `[max_len, hd / 2]`; wqk `[nq + hkv, hd]`: the q/k norm weights per head, or None."""
    t = qkv.shape[0]
    assert qkv.stride(1) == 1 and kc.stride() == vc.stride() and kc.stride(3) == 1 and cos.dtype == torch.float32
    rows, pos, cos, sin = rows.contiguous(), pos.contiguous(), cos.contiguous(), sin.contiguous()
    wqk = None if wqk is None else wqk.contiguous()  # contiguous copies kept alive through the call
    q = torch.empty((t, nq, hd), dtype=kc.dtype) if nq else None
    _fn("qk_rope_store", kc.dtype)(qkv.data_ptr(), qkv.stride(0), t, nq, hkv, hd, cos.data_ptr(), sin.data_ptr(),
                                   rows.data_ptr(), pos.data_ptr(), kc.data_ptr(), vc.data_ptr(), kc.stride(0),
                                   kc.stride(1), kc.stride(2), _ptr(wqk), eps,
                                   _ptr(q))
    return q


HEAD_DIMS = "C kernels take head dims of a multiple of 8 (float32) or 4 (float64)"  # `fits`, said by the load's refusal


def fits(hd: int, dtype: torch.dtype = torch.float32) -> bool:
    """Whether the C attention takes head dim `hd`: whole vectors of 32 bytes."""
    return hd % (32 // torch.empty((), dtype=dtype).element_size()) == 0


def decode_attention(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, starts: torch.Tensor, row0: int,
                     L: int, scale: float, *, causal: bool, window: int | None = None, ring: int = 0) -> torch.Tensor:
    """q `[bs, n, H, hd]` over cache slots `row0..row0+bs-1` of kc/vc `[S, max_len, Hkv, hd]` -> `[bs * n, H * hd]`,
    each row reading only the keys its queries see (`triton_attn.decode_attention`'s rule; L is unused; `ring`:
    key k at row k % ring)."""
    bs, n, H, hd = q.shape
    q, starts = q.contiguous(), starts.contiguous()
    assert kc.stride() == vc.stride() and kc[0].is_contiguous() and starts.dtype == torch.int64
    assert fits(hd, q.dtype), f"head dim {hd} is not a multiple of the vector width"
    out = torch.empty(bs * n, H * hd, dtype=q.dtype)
    if _fn("attention", q.dtype)(q.data_ptr(), kc.data_ptr(), vc.data_ptr(), kc.stride(0), kc.stride(1),
                                 kc.stride(2), starts.data_ptr(), row0, bs, n, H, kc.shape[2], hd, scale, int(causal),
                                 window or 0, ring, out.data_ptr()):
        raise MemoryError("attention: no memory for its scratch")
    return out


def commit(post: torch.Tensor, drafts: torch.Tensor, active: torch.Tensor, start: torch.Tensor, anchor: torch.Tensor,
           out: torch.Tensor, synth: tuple | None = None) -> None:
    """A step's commit, as `triton_ops.commit` (same arguments; `accept.commit` is the torch reference)."""
    bs, B = post.shape
    assert post.stride(1) == drafts.stride(1) == out.stride(1) == 1 and active.is_contiguous() and start.is_contiguous()
    u, step, rate = synth if synth is not None else (None, None, 0.0)
    if synth is not None:
        assert u.dtype == torch.float32 and u.stride(2) == 1 and step.is_contiguous()
    _fn("commit")(post.data_ptr(), post.stride(0), drafts.data_ptr(), drafts.stride(0), active.data_ptr(),
                   start.data_ptr(), anchor.data_ptr(), anchor.stride(0), out.data_ptr(), out.stride(0), bs, B,
                   _ptr(u), u.shape[0] if u is not None else 0, u.stride(0) if u is not None else 0,
                   u.stride(1) if u is not None else 0, _ptr(step), rate)
