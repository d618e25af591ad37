"""Load a target (and optionally a drafter) into a ready `Engine`; the one entry point for server and tests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from dflash_bench.errors import UserError

if TYPE_CHECKING:
    from dflash_bench.engine.reference.decode import ReferenceEngine

def load_tokenizer(path: str) -> Any:
    from dflash_bench.tokenizer import load_tokenizer as load

    return load(path, "for the engine")


def build_engine(model: str, draft: str | None = None, *, mode: str = "dflash", dtype: str = "auto",
                 device: str = "cpu", max_slots: int = 32, max_len: int = 4096, tokenizer: Any = None,
                 threads: int | None = None, dummy: bool = False) -> ReferenceEngine:
    """Load the target (and the drafter in dflash mode) and return a `ReferenceEngine`.

    `dummy`: random weights of the configs' shapes (`target.load_model`, `drafter.load_drafter`).
    On CPU, torch uses `threads` threads (default 1): small models run many tiny ops, where extra threads
    only add synchronisation, and 10-25x slower steps were measured with 2 threads on a busy 2-core machine.
    """
    from dflash_bench.engine.reference.decode import ReferenceEngine
    from dflash_bench.engine.reference.drafter import load_drafter
    from dflash_bench.engine.reference.propose import DFlashProposer
    from dflash_bench.engine.bookkeeping import eos_ids
    from dflash_bench.engine.reference.target import ReferenceTarget, resolve_dtype

    if mode not in ("ar", "dflash"):
        raise UserError(f"unknown mode {mode!r}; use 'ar' or 'dflash'")
    if mode == "dflash" and not draft:
        raise UserError("mode dflash needs a drafter: pass --draft <drafter folder>")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device {device!r} was asked for but no CUDA GPU is available; use --device cpu")
    if device == "cpu":
        torch.set_num_threads(threads or 1)
    else:  # cuDNN attention plans a kernel per new shape; the KV length changes every step
        torch.backends.cuda.enable_cudnn_sdp(False)
    dt = resolve_dtype(dtype, device)
    tok = tokenizer or load_tokenizer(model)
    target = ReferenceTarget(model, dtype=dt, device=device, max_slots=max_slots, max_len=max_len, dummy=dummy)
    proposer = None
    if mode == "dflash":
        assert draft is not None  # checked above
        drafter = load_drafter(draft, target_hidden=target.hidden_size, target_layers=target.n_layers,
                               target_vocab=target.vocab_size, dtype=dt, device=device, dummy=dummy)
        proposer = DFlashProposer(drafter, target.embed_weight(), target.lm_head(), max_slots=max_slots, max_len=max_len)
    return ReferenceEngine(target, tok, proposer, eos_ids=eos_ids(target.model, tok))
