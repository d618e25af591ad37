"""The builtin DFlash engine: a small PyTorch speculative-decoding server (extra `[engine]`).

Files, one job each: `protocol.py` (`Engine`: what the loop and the server call), `bookkeeping.py` (a
request's slot, tokens, stop rules and the counters, for both engines), `tiny.py` (tiny random test pairs),
`cache.py` (slot KV cache and row masks), `rope.py` (RoPE), `target.py` (load any HF causal LM; run it with
slot attention and hidden-state taps), `drafter.py` (z-lab drafter weights, strict loading), `propose.py`
(what drafts a block), `sampling_params.py` (a request's decoding), `sampling.py` (sampling and rejection sampling), `decode.py` (`ReferenceEngine`:
prefill, draft, verify, accept), `detok.py` (incremental text), `build.py` (load a `ReferenceEngine`),
`loop.py` (the batching thread), `api.py` / `server.py` / `metrics.py` (the HTTP server; response envelopes
in `dflash_bench/openai_format.py`, shared with the emulator). `fast/`: the `FastEngine` for one GPU.
"""
