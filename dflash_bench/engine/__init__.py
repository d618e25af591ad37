"""The builtin DFlash engine: a small PyTorch speculative-decoding server (extra `[engine]`).

Files, one job each: `tiny.py` (tiny random test pairs), `cache.py` (slot KV cache and row masks),
`target.py` (any HF causal LM with slot attention and hidden-state taps), `drafter.py` (z-lab drafter
weights, strict loading), `propose.py` (what drafts a block), `sampling.py` (sampling and rejection
sampling), `decode.py` (prefill, draft, verify, accept), `detok.py` (incremental text), `build.py` (load an
`Engine`), `loop.py` (the batching thread), `api.py` / `server.py` / `metrics.py` (the HTTP server).
"""
