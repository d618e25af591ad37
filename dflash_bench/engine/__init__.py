"""The builtin DFlash engine: a small PyTorch speculative-decoding server (extra `[engine]`).

Files, one job each: `tiny.py` (tiny random test models), `cache.py` (slot KV cache and masks),
`target.py` (HF causal LM with slot attention and hidden-state taps), `drafter.py` (z-lab DFlash drafter),
`sampling.py` (sampling and rejection sampling), `decode.py` (prefill, draft, verify, accept),
`loop.py` (batching thread), `api.py` / `server.py` (OpenAI-compatible HTTP server), `metrics.py`.
"""
