"""Training for the project's own tiny pair and for users' drafters (extra `[engine]`).

`tokenizer.py` (byte-level BPE, offline), `data.py` (standard-library text, prompt files, target-regenerated
responses), `target.py` (the tiny Qwen3 target LM), `loss.py` (the DFlash block loss), `drafter.py`
(`train_drafter`, what `dflash-bench train-drafter` runs).
"""
