"""Training for the project's own tiny pair and for users' drafters (extra `[engine]`).

`train_tokenizer.py` (byte-level BPE, offline), `data.py` (standard-library text, prompt files, target-regenerated
responses), `train_target.py` (the tiny Qwen3 target LM), `loss.py` (the DFlash block loss), `train_drafter.py`
(`train_drafter`, what `dflash-bench train-drafter` runs).
"""
