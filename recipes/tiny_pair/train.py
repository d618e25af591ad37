"""Train the project's tiny target/drafter pair from a fresh clone, offline.

    python recipes/tiny_pair/train.py --device cuda                 # the committed pair (GPU, ~10 minutes)
    python recipes/tiny_pair/train.py --scale toy --out /tmp/pair   # a few steps on a CPU, to check the recipe

1. Text: Python's own standard library (source without its tests, and pydoc topics), as chat pairs
   (docstring -> code, module part -> source, topic -> documentation). No benchmark data.
2. A byte-level BPE tokenizer trained on that text (the `tokenizers` package).
3. A Qwen3-architecture target of a few million parameters, trained from scratch.
4. Its DFlash drafter, trained on the target's own greedy responses to held-in prompts (`train_drafter`).

Stages: `--stage target` (steps 1-3), `--stage drafter` (step 4, reads OUT/target), `--stage all`.
Writes OUT/target, OUT/drafter (bf16 safetensors) and OUT/recipe.json (sizes, steps, seconds, device).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SCALES = {
    # target: tokenizer size, model shape, steps; drafter: prompts, response length, steps
    "full": dict(vocab=4096, hidden=256, layers=6, heads=4, kv_heads=2, inter=768, t_steps=6000, t_batch=64,
                 seq_len=512, t_lr=2e-3, t_time=240, prompts=8000, max_new=256, d_layers=2, d_steps=4000,
                 d_batch=32, anchors=32, d_time=180, d_lr=1e-3, regen_batch=512, layer_ids=[1, 2, 3]),
    "toy": dict(vocab=400, hidden=64, layers=4, heads=4, kv_heads=2, inter=128, t_steps=20, t_batch=8,
                seq_len=128, t_lr=2e-3, t_time=60, prompts=24, max_new=24, d_layers=1, d_steps=10,
                d_batch=4, anchors=8, d_time=60, regen_batch=32, pairs=400),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "dflash_bench" / "assets" / "default_pair"))
    ap.add_argument("--device", default="cuda" if _cuda() else "cpu")
    ap.add_argument("--scale", choices=sorted(SCALES), default="full")
    ap.add_argument("--stage", choices=["all", "target", "drafter"], default="all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--init-drafter", default=None, help="continue training this drafter (same shape) instead of a fresh one")
    a = ap.parse_args()
    s = SCALES[a.scale]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    record_path = out / "recipe.json"
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    record.update(scale=a.scale, seed=a.seed, python=platform.python_version())

    from dflash_bench.train.data import split_pairs, stdlib_pairs

    t0 = time.time()
    pairs = stdlib_pairs()
    if "pairs" in s:
        pairs = random.Random(a.seed).sample(pairs, min(s["pairs"], len(pairs)))
    train, held = split_pairs(pairs, 0.02, a.seed)
    log(f"{len(train)} training pairs, {len(held)} held out ({time.time() - t0:.0f} s)")
    if a.stage in ("all", "target"):
        record["target"] = train_target(train, out / "target", s, a)
    if a.stage in ("all", "drafter"):
        record["drafter"] = train_drafter(train, out, s, a)
    record["sizes_mb"] = {d: round(sum(f.stat().st_size for f in (out / d).glob("*")) / 1e6, 2)
                          for d in ("target", "drafter") if (out / d).is_dir()}
    tmp = record_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    os.replace(tmp, record_path)
    log(json.dumps(record, indent=2))


def train_target(train, out: Path, s: dict, a) -> dict:
    from dflash_bench.train.target import TargetSpec, train_target as fit
    from dflash_bench.train.tokenizer import chat_text, train_tokenizer

    texts = [chat_text(u, r) for u, r in train]
    t0 = time.time()
    tok = train_tokenizer(texts, s["vocab"])
    tok_s = time.time() - t0
    log(f"tokenizer: {len(tok)} tokens in {tok_s:.0f} s")
    spec = TargetSpec(hidden=s["hidden"], layers=s["layers"], heads=s["heads"], kv_heads=s["kv_heads"],
                      intermediate=s["inter"])
    summary = fit(tok, texts, out, spec=spec, steps=s["t_steps"], batch=s["t_batch"], seq_len=s["seq_len"],
                  lr=s["t_lr"], device=a.device, seed=a.seed, time_limit=s["t_time"], log=log)
    summary["tokenizer_seconds"] = round(tok_s, 1)
    summary["gpu"] = _gpu_name(a.device)
    return summary


def train_drafter(train, out: Path, s: dict, a) -> dict:
    from dflash_bench.train.drafter import DrafterTrainConfig, train_drafter as fit

    rng = random.Random(a.seed + 1)
    users = [u for u, _ in rng.sample(train, min(s["prompts"], len(train)))]
    prompts = [[{"role": "user", "content": u}] for u in users]
    cfg = DrafterTrainConfig(steps=s["d_steps"], block_size=a.block_size, layers=s["d_layers"], batch=s["d_batch"],
                             anchors=s["anchors"], max_new_tokens=s["max_new"], device=a.device, seed=a.seed,
                             lr=s.get("d_lr", 6e-4), time_limit=s["d_time"], regen_batch=s["regen_batch"], target_layer_ids=s.get("layer_ids"),
                             init=a.init_drafter)
    summary = fit(str(out / "target"), prompts, str(out / "drafter"), cfg, log=log)
    summary["gpu"] = _gpu_name(a.device)
    summary["prompts"] = len(prompts)
    if a.init_drafter:  # the committed pair's drafter was trained in two runs: say so
        summary["continued_from"] = (json.loads(Path(a.init_drafter, "dflash_train.json").read_text())
                                     if Path(a.init_drafter, "dflash_train.json").is_file() else a.init_drafter)
    return summary


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _gpu_name(device: str) -> str | None:
    import torch

    return torch.cuda.get_device_name() if device.startswith("cuda") else None


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


if __name__ == "__main__":
    main()
