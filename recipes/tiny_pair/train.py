"""Train the project's tiny target/drafter pair from a fresh clone, offline.

    python -m recipes.tiny_pair.train --data-dir DATA --device cuda                # the committed pair (H100: ~20 min)
    python -m recipes.tiny_pair.train --data-dir DATA --scale toy --out /tmp/pair  # a few steps on a CPU

1. Text: Python's standard library as chat pairs (docstring -> code, module part -> source, pydoc topic ->
   documentation, and extractive summaries of the documentation), and half of the suites' records that no demo
   sends with their worked answers (`dflash_bench.train.suite_data`: GSM8K and MATH solutions, HumanEval and MBPP
   code; the first 64 prompts of each suite's seed-0 order, and every record whose text overlaps one of them,
   are held out).
2. A byte-level BPE tokenizer trained on that text (the `tokenizers` package).
3. A Qwen3-architecture target of a few million parameters, trained from scratch on it.
4. Self-distillation, as DFlash drafters are trained: the target's own greedy responses to prompts like the
   suites' that it never saw (the other half of the records, the same prompts with new numbers, and
   held-out standard-library prompts, and requests like MT-Bench's, Spec-Bench's and HumanEval's written over
   held-out text by `dflash_bench.train.synthetic_prompts`), as it will not have seen a demo's; then
   one or more drafters trained on those responses (`--drafter NAME:LAYERS:INTERMEDIATE:TARGET_LAYERS`), part
   of the blocks cut short so that an engine may draft fewer positions under load.

Stages: `--stage target` (1-3), `--stage samples` (4's responses, saved in OUT/samples.pt), `--stage drafter`
(4's training, reads OUT/target and OUT/samples.pt), `--stage all`. Writes OUT/target, OUT/drafters/NAME,
OUT/drafter (a copy of the first drafter named; bf16 safetensors) and OUT/recipe.json (sizes, steps, seconds,
device, held-out counts).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import shutil
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCALES = {
    # target: tokenizer size, model shape, steps, seconds; samples: prompts per kind, response length; drafter
    "full": dict(vocab=4096, hidden=256, layers=6, heads=4, kv_heads=2, inter=768, t_steps=3000, t_batch=32,
                 seq_len=1024, t_lr=2e-3, t_time=140, t_epochs=3, suite_repeat=3, varied=4, sample_prompts=40000,
                 max_new=192, d_steps=12300, d_batch=96, anchors=48, d_time=960, d_lr=1.5e-3, regen_batch=512,
                 chat=24000, code=1000),
    "toy": dict(vocab=400, hidden=64, layers=4, heads=4, kv_heads=2, inter=128, t_steps=20, t_batch=8,
                seq_len=128, t_lr=2e-3, t_time=60, t_epochs=None, suite_repeat=1, varied=1, sample_prompts=None, max_new=24,
                d_steps=10, d_batch=4, anchors=8, d_time=60, d_lr=1e-3, regen_batch=32, pairs=400, records=60,
                chat=40, code=10),
}
DRAFTER_SHARE = 0.5  # of the suites' records: prompts for the drafter only (the stdlib: a fifth of that)
CUT_BLOCKS = 0.5  # share of training blocks cut to 2..15 slots (the builtin engine drafts fewer under load)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "dflash_bench" / "assets" / "default_pair"))
    ap.add_argument("--data-dir", required=True, help="the offline prompt sets (../shared/datasets)")
    ap.add_argument("--device", default="cuda" if _cuda() else "cpu")
    ap.add_argument("--scale", choices=sorted(SCALES), default="full")
    ap.add_argument("--stage", choices=["all", "target", "samples", "drafter"], default="all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--drafter", action="append", default=None,
                    help="NAME:LAYERS:INTERMEDIATE:T1,T2,.. (target layers read); repeat for several (default "
                         "d:1:512:1,2,3,4); the first is copied to OUT/drafter")
    ap.add_argument("--target-seconds", type=float, help="time limit of the target's training")
    ap.add_argument("--target-epochs", type=float, help="the target's training length in passes over its text")
    ap.add_argument("--drafter-seconds", type=float, help="time limit of each drafter's training")
    ap.add_argument("--drafter-steps", type=int, help="training steps of each drafter")
    ap.add_argument("--sample-prompts", type=int, help="regenerate responses for at most this many prompts")
    ap.add_argument("--max-new", type=int, help="length of the regenerated responses")
    ap.add_argument("--init-drafter", default=None, help="continue training this drafter (same shape)")
    a = ap.parse_args()
    s = dict(SCALES[a.scale])
    s["t_time"] = a.target_seconds or s["t_time"]
    s["d_time"] = a.drafter_seconds or s["d_time"]
    s["d_steps"] = a.drafter_steps or s["d_steps"]
    s["max_new"] = a.max_new or s["max_new"]
    s["t_epochs"] = a.target_epochs or s["t_epochs"]
    s["sample_prompts"] = a.sample_prompts or s["sample_prompts"]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    record_path = out / "recipe.json"
    from dflash_bench.store import atomic_write_json

    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    record.update(scale=a.scale, seed=a.seed, python=platform.python_version())

    data = training_data(Path(a.data_dir), s, a.seed)
    record["data"] = data["counts"]
    if a.stage in ("all", "target"):
        record["target"] = train_target(data, out / "target", s, a)
        atomic_write_json(record_path, record)
    if a.stage in ("all", "samples"):
        record["samples"] = make_samples(data, out, s, a)
        atomic_write_json(record_path, record)
    if a.stage in ("all", "drafter"):
        specs = [parse_drafter(d) for d in (a.drafter or ["d:1:512:1,2,3,4"])]
        record.setdefault("drafters", {})
        samples = load_samples(out / "samples.pt")
        for spec in specs:
            record["drafters"][spec["name"]] = train_drafter(out, samples, spec, s, a)
            atomic_write_json(record_path, record)
        chosen = out / "drafters" / specs[0]["name"]
        shutil.rmtree(out / "drafter", ignore_errors=True)
        shutil.copytree(chosen, out / "drafter")
        record["drafter"] = {"name": specs[0]["name"], **record["drafters"][specs[0]["name"]]}
    record["sizes_mb"] = {d: round(sum(f.stat().st_size for f in (out / d).glob("*")) / 1e6, 2)
                          for d in ("target", "drafter") if (out / d).is_dir()}
    atomic_write_json(record_path, record)
    log(json.dumps(record, indent=2))


def training_data(data_dir: Path, s: dict, seed: int) -> dict:
    """Everything trained on, the demo's prompts held out: the target's text (stdlib pairs, one half of the
    suites' records with their answers, extractive summaries) and the drafter's prompts (the other half, the
    held part of the stdlib pairs), which the target never saw."""
    from dflash_bench.train import suite_data as sd
    from dflash_bench.train import synthetic_prompts as synthetic
    from dflash_bench.train.data import split_pairs, stdlib_pairs

    pairs = stdlib_pairs()
    if "pairs" in s:
        pairs = random.Random(seed).sample(pairs, min(s["pairs"], len(pairs)))
    stdlib, stdlib_held = split_pairs(pairs, DRAFTER_SHARE / 5, seed)
    held = sd.held_out(data_dir)
    records = sd.train_records(data_dir, held)
    if "records" in s:
        records = random.Random(seed).sample(records, min(s["records"], len(records)))
    mine, theirs = sd.split_records(records, DRAFTER_SHARE, seed)
    answers = sd.answer_pairs(mine, data_dir, held, theirs)
    answers += sd.summary_pairs([a for u, a in stdlib if u.startswith("Explain ")], held)
    prompts = sd.train_prompts(theirs) + [u for u, _ in stdlib_held]
    prompts += [f"Summarize: {' '.join(a.split())}" for u, a in stdlib_held if u.startswith("Explain ")]
    rng = random.Random(seed + 2)  # requests like MT-Bench's, Spec-Bench's and HumanEval's over unseen text
    texts = [a for u, a in stdlib_held if u.startswith("Explain ")] + sd.train_prompts(theirs)
    subjects = synthetic.topics(pairs) + synthetic.phrases(sd.train_prompts(theirs), rng)
    chat = synthetic.chat_prompts(subjects, synthetic.passages(texts, rng), s["chat"], rng)
    code = synthetic.code_prompts(stdlib_held, s["code"], rng)
    prompts += [x for x in chat + code if not held.is_held_out(x)]  # a passage may quote a held-out prompt
    for u in [u for u, _ in answers] + prompts:  # a leak here would be a bug in suite_data: refuse to train on it
        if held.is_held_out(u):
            raise SystemExit(f"held-out prompt in the training data: {u[:80]!r}")
    counts = {"stdlib_pairs": len(stdlib), "target_answer_pairs": len(answers), "drafter_prompts": len(prompts),
              "held_out_prompts": len(held.ids), "held_out_per_suite": sd.HOLD,
              "synthetic_prompts": {"chat": len(chat), "code": len(code)},
              "target_records_by_suite": {k: sum(p.suite == k for p in mine) for k in sd.SUITES},
              "drafter_records_by_suite": {k: sum(p.suite == k for p in theirs) for k in sd.SUITES}}
    log(f"data: {json.dumps(counts)}")
    return {"stdlib": stdlib, "answers": answers, "prompts": prompts, "numeric": sd.train_prompts(theirs),
            "held": held, "counts": counts}


def train_target(data: dict, out: Path, s: dict, a) -> dict:
    from dflash_bench.train.train_target import TargetSpec, train_target as fit
    from dflash_bench.train.train_tokenizer import chat_text, train_tokenizer

    texts = [chat_text(u, r) for u, r in data["stdlib"]] + [chat_text(u, r) for u, r in data["answers"]] * s["suite_repeat"]
    random.Random(a.seed).shuffle(texts)
    t0 = time.time()
    tok = train_tokenizer(texts, s["vocab"])
    tok_s = time.time() - t0
    log(f"tokenizer: {len(tok)} tokens in {tok_s:.0f} s")
    spec = TargetSpec(hidden=s["hidden"], layers=s["layers"], heads=s["heads"], kv_heads=s["kv_heads"],
                      intermediate=s["inter"])
    steps = s["t_steps"]
    if s["t_epochs"]:
        tokens = sum(len(x) for x in tok(texts, add_special_tokens=False).input_ids)
        steps = max(1, int(s["t_epochs"] * tokens / (s["t_batch"] * s["seq_len"])))
    summary = fit(tok, texts, out, spec=spec, steps=steps, batch=s["t_batch"], seq_len=s["seq_len"],
                  lr=s["t_lr"], device=a.device, seed=a.seed, time_limit=s["t_time"], log=log)
    summary["tokenizer_seconds"] = round(tok_s, 1)
    summary["gpu"] = _gpu_name(a.device)
    return summary


def sample_prompts(data: dict, s: dict, seed: int) -> list[list[dict]]:
    """The drafter's prompts (unseen by the target, like a demo's), and the suite ones again with new numbers
    (`varied` times)."""
    from dflash_bench.train.suite_data import vary_numbers

    rng = random.Random(seed + 1)
    texts, seen = list(data["prompts"]), set(data["prompts"])
    for _ in range(s["varied"]):
        for v in (vary_numbers(t, rng) for t in data["numeric"]):
            if v not in seen:
                seen.add(v)
                texts.append(v)
    texts = [t for t in texts if not data["held"].is_held_out(t)]
    if s["sample_prompts"] and len(texts) > s["sample_prompts"]:
        texts = rng.sample(texts, s["sample_prompts"])
    return [[{"role": "user", "content": t}] for t in texts]


def make_samples(data: dict, out: Path, s: dict, a) -> dict:
    import torch

    from dflash_bench.train.train_drafter import DrafterTrainConfig, regenerate_samples

    prompts = sample_prompts(data, s, a.seed)
    cfg = DrafterTrainConfig(max_new_tokens=s["max_new"], max_prompt_tokens=s["seq_len"], device=a.device,
                             regen_batch=s["regen_batch"])
    t0 = time.time()
    samples = regenerate_samples(str(out / "target"), prompts, cfg, log=log)
    flat = [t for p, r in samples for t in p + r]
    torch.save({"ids": torch.tensor(flat, dtype=torch.int16), "prompt_len": torch.tensor([len(p) for p, _ in samples]),
                "response_len": torch.tensor([len(r) for _, r in samples])}, out / "samples.pt")
    return {"prompts": len(prompts), "responses": len(samples), "response_tokens": sum(len(r) for _, r in samples),
            "max_new_tokens": s["max_new"], "seconds": round(time.time() - t0, 1), "gpu": _gpu_name(a.device)}


def parse_drafter(text: str) -> dict:
    try:
        name, layers, inter, taps = text.split(":")
        return {"name": name, "layers": int(layers), "intermediate": int(inter),
                "taps": [int(t) for t in taps.split(",")]}
    except ValueError:
        raise SystemExit(f"--drafter takes NAME:LAYERS:INTERMEDIATE:T1,T2,..., got {text!r}") from None


def load_samples(path: Path) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) as `make_samples` saved them."""
    import torch

    saved = torch.load(path)
    samples, at = [], 0
    for n, m in zip(saved["prompt_len"].tolist(), saved["response_len"].tolist()):
        row = saved["ids"][at:at + n + m].long().tolist()
        samples.append((row[:n], row[n:]))
        at += n + m
    return samples


def train_drafter(out: Path, samples: list, spec: dict, s: dict, a) -> dict:
    from dflash_bench.train.train_drafter import DrafterTrainConfig, train_drafter as fit

    cfg = DrafterTrainConfig(steps=s["d_steps"], block_size=a.block_size, layers=spec["layers"],
                             intermediate=spec["intermediate"], cut_blocks=CUT_BLOCKS, batch=s["d_batch"],
                             anchors=s["anchors"], max_new_tokens=s["max_new"], device=a.device, seed=a.seed,
                             lr=s["d_lr"], time_limit=s["d_time"], target_layer_ids=spec["taps"],
                             max_prompt_tokens=s["seq_len"], init=a.init_drafter)
    summary = fit(str(out / "target"), [], str(out / "drafters" / spec["name"]), cfg, log=log, samples=samples)
    summary["gpu"] = _gpu_name(a.device)
    summary["spec"] = spec
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
