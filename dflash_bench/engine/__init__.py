"""The builtin DFlash engine: a small PyTorch speculative-decoding server (extra `[engine]`).

By role, each package importing only those listed before it (tests/test_imports.py holds the order):
- here: `config.py` (`EngineConfig`, serve's engine as one value), `sampling_params.py`, `detok.py` and
  `bookkeeping.py` (a request's slot, tokens, stop rules and counters, for both engines), `interface.py`
  (`Engine`: what serving calls);
- `reference/`: the plain PyTorch DFlash step that matches z-lab's code (`decode.ReferenceEngine`: any HF
  model, sampling), and the definitions the fast path builds on (the z-lab drafter, RoPE, the row mask);
- `fast/`: the fast path (`serve --fast`): scheduling, running, models, kernels, parallel, under one
  `EngineCore` (the only caller of its scheduler and runner) and the `FastEngine`;
- `build.py`: the engine `serve` asks for, reference or fast;
- `serving/`: the OpenAI-compatible server, the engine thread and /metrics (response envelopes in
  `dflash_bench/openai_format.py`, shared with the emulator).
"""
