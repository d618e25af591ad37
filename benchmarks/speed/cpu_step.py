"""DFlash against AR on a CPU: what a step costs on the embedded pair's shape, and tok/s in process.

    python -m benchmarks.speed.cpu_step --out cpu_step.json                  # ~6 min on 2 shared cores
    python -m benchmarks.speed.cpu_step --draft-shapes 1x256,1x512,1x768,2x256,2x512,2x768 --batches 1 \\
        --skip-throughput --out cpu_shapes.json                        # which drafter shapes fit the bound
    python -m benchmarks.speed.cpu_step --real --data-dir ../shared/datasets # the embedded drafter's own acceptance

The fast path as `serve --fast --device cpu` runs it (one torch thread, float32, eager), on the embedded
target (`dflash_bench/assets/default_pair/target`, its real weights) and DFlash drafters of the embedded
drafter's config (hidden size, heads, block 16, tapped layers) with random weights, one per `--draft-shapes`
entry LxI (L layers, intermediate size I; the embedded drafter is 1x512): a step's cost does not depend on
the weights. Prompts are random token ids of `--prompt-len`.

1. Step costs, per batch of `--batches` rows and per verify width w (`--widths`; 1: the anchor alone, no
   draft): the DFlash draft and verify, drafting the whole block ("block") or only the w positions the verify
   checks ("cut", `EngineCore(cut_draft=True)`; `--draft` picks), and the AR step, one AR step and one DFlash step in turn (each runner over
   its own copy of the target, both prefilled with the same prompts), so that both see the same load on a
   shared machine: the median over `--steps` steps (after 2 warm-up steps) of the runners' own per-phase
   timers, then the median over `--rounds` rounds. ratio = (draft + verify) / AR step, the median of the
   rounds' ratios. Steps commit synthetic acceptance `--tau` (the KV grows as it would); "step ratio" uses
   the wall time of `core.step` (host bookkeeping included). "speedup at w": E[tokens | w] / ratio, what
   DFlash would gain over AR if every step verified w tokens, E from the synthetic curve of `--tau`.
2. In-process tok/s (unless `--skip-throughput`): per concurrency of `--concurrency`, AR against DFlash with
   the width chosen by load (`adaptive`, the server's default) and synthetic acceptance `--tau` (a
   per-position curve fitted to tau over the whole block; a narrower step accepts what that curve gives),
   whole-block drafts and cut ones: decode tokens / decode wall time over `--new-tokens` per request
   (prefill not counted), median over rounds, with the widths the chooser took; and the same until the
   first request finished ("full batch": DFlash rows finish at different steps, AR rows all at once). The
   DFlash runners keep their width chooser from a warm-up run, as a server does.
3. `--compare-torch`: the AR step and a DFlash step (`--compare-width`, cut drafts) on plain torch ops against
   the kernels (the C kernels on a CPU), one of each in turn, per batch.
4. `--real`: the embedded pair as it is (or `--drafter DIR`), real acceptance on GSM8K prompts from
   `--data-dir` (chat template), AR against DFlash (adaptive; --cut-draft too with `--real-cut`) at each
   concurrency: tok/s, tau, and whether DFlash's tokens equal AR's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path

import torch

from dflash_bench.engine.reference.drafter import DFlashDrafter, DrafterConfig, load_drafter
from dflash_bench.engine.fast.models.draft import FastDrafter
from dflash_bench.engine.fast.models.dense import DenseTarget
from dflash_bench.synthetic import geometric_rate
from dflash_bench.engine.fast.drive import decode
from dflash_bench.engine.config import StepConfig
from dflash_bench.engine.fast.core import EngineCore
from dflash_bench.engine.fast.running.timer import StepTimer
from dflash_bench.engine.reference.target import load_model

ROOT = Path(__file__).resolve().parents[2]

PAIR = ROOT / "dflash_bench" / "assets" / "default_pair"
KERNELS = {"auto": None, "cpu": "cpu", "torch": False}  # DenseTarget's `kernels`


def parse_shapes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        layers, inter = part.lower().split("x")
        out.append((int(layers), int(inter)))
    return out


def random_drafter(config_dir: Path, layers: int, inter: int, seed: int = 0) -> DFlashDrafter:
    """A drafter of the embedded drafter's config with `layers` layers of intermediate size `inter`, random
    weights (what `save_drafter` would write and `load_drafter` read back, built in memory)."""
    raw = json.loads((config_dir / "config.json").read_text())
    raw.update(num_hidden_layers=layers, intermediate_size=inter)
    d = DFlashDrafter(DrafterConfig.from_dict(raw))
    d.init_random(seed)
    return d.float().eval()


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab - 100) for _ in range(length)] for _ in range(n)]


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def interleaved(ar: EngineCore, df: EngineCore, prompts: list[list[int]], steps: int) -> dict:
    """Prefill `prompts` into slots 0.. of both runners (each over its own target copy), 2 warm-up steps each,
    then `steps` rounds of one AR step and one DFlash step, so both see the same machine: the medians of the
    runners' own timers (AR step; DFlash draft and verify) and of the wall time of `core.step`, in ms."""
    slots = list(range(len(prompts)))
    walls: dict[str, list[float]] = {"ar": [], "df": []}
    timers = {}
    for name, r in (("ar", ar), ("df", df)):
        r.add_many(slots, prompts)
        for _ in range(2):
            r.step(slots)
        timers[name] = StepTimer().attach(r)
    for _ in range(steps):
        for name, r in (("ar", ar), ("df", df)):
            t = time.perf_counter()
            r.step(slots)
            walls[name].append((time.perf_counter() - t) * 1e3)
    out = {}
    for name, r in (("ar", ar), ("df", df)):
        timers[name].detach()
        draft, verify = timers[name].step_times_ms()
        out[name] = dict(draft_ms=draft if r.B > 1 else 0.0, verify_ms=verify, step_ms=med(walls[name]))
        for s in slots:
            r.release(s)
    return out


def kinds(w: int, B: int, draft: str) -> list[bool]:
    """The draft kinds (cut or not) measured at width w: one where they are the same (w = 1: no draft; w = B)."""
    if w in (1, B):
        return [draft == "cut"]
    return {"block": [False], "cut": [True], "both": [False, True]}[draft]


def step_costs(targets: tuple[DenseTarget, DenseTarget], drafters: dict[str, FastDrafter], a) -> list[dict]:
    """Per batch, drafter, width and draft kind, `interleaved` AR and DFlash steps, every round; medians over
    rounds (the ratio: the median of each round's own ratio)."""
    vocab = targets[0].vocab_size
    B = next(iter(drafters.values())).B
    samples: dict[tuple, list[dict]] = {}
    for rnd in range(a.rounds):
        for bs in a.batches:
            prompts = random_prompts(bs, a.prompt_len, vocab, 1000 * rnd + bs)
            for name, fd in drafters.items():
                for w in a.widths:
                    for cut in kinds(w, B, a.draft):
                        df = EngineCore(targets[1], fd, StepConfig(verify_width=w, cut_draft=cut, synthetic_acceptance=a.tau, seed=rnd))
                        samples.setdefault((bs, name, w, cut), []).append(
                            interleaved(EngineCore(targets[0], None, StepConfig(verify_width="full")), df, prompts, a.steps))
            print(f"round {rnd + 1}/{a.rounds}, batch {bs} done", flush=True)
    rows = []
    for bs in a.batches:
        ss = [s["ar"] for key, got in samples.items() if key[0] == bs for s in got]
        row: dict = dict(batch=bs, ar_ms=med([s["verify_ms"] for s in ss]), ar_step_ms=med([s["step_ms"] for s in ss]),
                         dflash=[])
        for name in drafters:
            for w in a.widths:
                for cut in kinds(w, B, a.draft):
                    got = samples[(bs, name, w, cut)]
                    ar, df = [g["ar"] for g in got], [g["df"] for g in got]
                    d, v, st = (med([s[k] for s in df]) for k in ("draft_ms", "verify_ms", "step_ms"))
                    row["dflash"].append(dict(
                        drafter=name, width=w, draft="none" if w == 1 else "cut" if cut else "block", ar_ms=med([s["verify_ms"] for s in ar]),
                        draft_ms=d, verify_ms=v, step_ms=st,
                        ratio=med([(x["draft_ms"] + x["verify_ms"]) / y["verify_ms"] for x, y in zip(df, ar)]),
                        step_ratio=med([x["step_ms"] / y["step_ms"] for x, y in zip(df, ar)])))
                    rate = geometric_rate(a.tau, B)
                    row["dflash"][-1]["speedup_at_w"] = sum(rate ** k for k in range(w)) / row["dflash"][-1]["ratio"]
        rows.append(row)
    return rows


def compare_torch(hf, target: DenseTarget, drafter_cfg: Path, shape: tuple[int, int], max_len: int, a) -> list[dict]:
    """The same steps on the torch path (plain torch ops, MKL's sgemm, SDPA) and on `target`'s kernels, one step
    of each in turn (`interleaved`): AR, and DFlash at `--compare-width` with cut drafts, per batch."""
    S = max(a.batches)
    plain = DenseTarget(hf, max_slots=S, max_len=max_len, kernels=False)
    d = random_drafter(drafter_cfg, *shape)
    fd = FastDrafter(d, target.embed, target.head, max_slots=S, max_len=max_len, kernels=None)
    fd_plain = FastDrafter(d, plain.embed, plain.head, max_slots=S, max_len=max_len, kernels=False)
    w, rows = a.compare_width, []
    for bs in a.batches:
        got: dict[str, list[dict]] = {"ar": [], "dflash": []}
        for rnd in range(a.rounds):
            prompts = random_prompts(bs, a.prompt_len, target.vocab_size, 5000 + 1000 * rnd + bs)
            got["ar"].append(interleaved(EngineCore(target, None, StepConfig(verify_width="full")), EngineCore(plain, None, StepConfig(verify_width="full")), prompts, a.steps))
            got["dflash"].append(interleaved(
                EngineCore(target, fd, StepConfig(verify_width=w, cut_draft=True, synthetic_acceptance=a.tau, seed=rnd)),
                EngineCore(plain, fd_plain, StepConfig(verify_width=w, cut_draft=True, synthetic_acceptance=a.tau, seed=rnd)), prompts, a.steps))
        row: dict = dict(batch=bs, width=w)
        for kind, gs in got.items():
            ms = lambda x: x["draft_ms"] + x["verify_ms"]  # noqa: E731
            row[kind] = dict(kernels_ms=med([ms(g["ar"]) for g in gs]), torch_ms=med([ms(g["df"]) for g in gs]),
                             torch_over_kernels=med([ms(g["df"]) / ms(g["ar"]) for g in gs]))
        rows.append(row)
        print(f"batch {bs}: AR step {row['ar']['torch_ms']:.2f} ms on torch ops, {row['ar']['kernels_ms']:.2f} on the "
              f"kernels ({row['ar']['torch_over_kernels']:.2f}x); DFlash w={w} cut {row['dflash']['torch_ms']:.2f} vs "
              f"{row['dflash']['kernels_ms']:.2f} ({row['dflash']['torch_over_kernels']:.2f}x)", flush=True)
    return rows


def decode_rate(runner: EngineCore, prompts: list[list[int]], new: int) -> dict:
    """Prefill (not timed), then decode every prompt to `new` tokens: tok/s, tau, widths chosen meanwhile, and
    tok/s until the first request finished (every row still running: DFlash rows finish at different steps,
    AR rows at once, and a closed batch's tail is no serving workload)."""
    before = runner.widths_chosen()
    timer = StepTimer().attach(runner)  # the decode's steps and acceptance (prefill steps nothing)
    firsts = runner.add_many(list(range(len(prompts))), prompts)
    outs = [[f] for f in firsts]
    first: dict = {}

    def done(slot: int) -> None:
        if not first:
            first.update(t=time.perf_counter(), tokens=sum(min(len(o), new) - 1 for o in outs))
    t = time.perf_counter()
    try:
        decode(runner, outs, new, on_done=done)
    finally:
        timer.detach()
    dt = time.perf_counter() - t
    out = dict(tok_s=sum(min(len(o), new) - 1 for o in outs) / dt, steps=timer.steps, outs=[o[:new] for o in outs],
               full_batch_tok_s=first["tokens"] / (first["t"] - t))
    if runner.B > 1:
        out.update(tau=timer.tau, width=timer.verify_width)
        if runner.config.adaptive:
            out["widths"] = {w: n - before.get(w, 0) for w, n in sorted(runner.widths_chosen().items())
                             if n > before.get(w, 0)}
    return out


def throughput(target: DenseTarget, fd: FastDrafter, prompts_for, a, tau: float | None, cuts: list[bool]) -> list[dict]:
    """AR vs DFlash (adaptive width, whole-block and/or cut drafts) per concurrency, median tok/s over rounds."""
    rows = []
    for c in a.concurrency:
        runners = {"ar": EngineCore(target, None, StepConfig(verify_width="full"))}
        for cut in cuts:
            runners["cut" if cut else "block"] = EngineCore(target, fd, StepConfig(verify_width="auto", synthetic_acceptance=tau, cut_draft=cut))
        warm = prompts_for(c, -1)
        for r in runners.values():  # the chooser learns step times and acceptance, as in a running server
            decode_rate(r, warm, min(a.new_tokens, 64))
        got: dict[str, list[dict]] = {k: [] for k in runners}
        for rnd in range(a.rounds):
            ps = prompts_for(c, rnd)
            for k, r in runners.items():
                got[k].append(decode_rate(r, ps, a.new_tokens))
        row: dict = dict(concurrency=c, ar_tok_s=med([g["tok_s"] for g in got["ar"]]),
                         ar_full_batch_tok_s=med([g["full_batch_tok_s"] for g in got["ar"]]))
        for k in runners:
            if k == "ar":
                continue
            gs = got[k]
            widths: dict = {}
            for g in gs:
                for w, n in g.get("widths", {}).items():
                    widths[w] = widths.get(w, 0) + n
            row[k] = dict(tok_s=med([g["tok_s"] for g in gs]), tau=med([g["tau"] for g in gs]),
                          width=med([g["width"] for g in gs]), widths=widths,
                          speedup=med([g["tok_s"] for g in gs]) / row["ar_tok_s"],
                          full_batch_tok_s=med([g["full_batch_tok_s"] for g in gs]))
            row[k]["full_batch_speedup"] = row[k]["full_batch_tok_s"] / row["ar_full_batch_tok_s"]
            if tau is None:  # real acceptance: greedy DFlash must say what AR says
                row[k]["same_tokens_as_ar"] = all(g["outs"] == h["outs"] for g, h in zip(gs, got["ar"]))
        rows.append(row)
        print(f"c={c}: " + json.dumps({k: (v if not isinstance(v, dict) else {x: y for x, y in v.items()
                                                                               if x != "widths"})
                                       for k, v in row.items()}), flush=True)
    return rows


def real_prompts(data_dir: str, tok, n: int, seed: int, max_len: int) -> list[list[int]]:
    from dflash_bench.suites import load_prompts

    ps = load_prompts("gsm8k", data_dir=Path(data_dir), num_prompts=n, seed=seed)
    return [tok(tok.apply_chat_template([{"role": "user", "content": p.turns[0]}], tokenize=False,
                                        add_generation_prompt=True), add_special_tokens=False).input_ids[-max_len:]
            for p in ps]


def print_steps(rows: list[dict], a) -> None:
    print(f"\nStep costs, ms (medians; {a.rounds} rounds x {a.steps} steps; prompts {a.prompt_len} tokens; "
          f"synthetic tau {a.tau} commits)")
    print(f"{'batch':>5} | {'AR ms':>6} | {'drafter':>7} | {'w':>2} | {'draft':>5} | {'draft ms':>8} | "
          f"{'verify ms':>9} | {'DFlash ms':>9} | {'ratio':>5} | {'step ratio':>10} | {'speedup at w':>12}")
    for row in rows:
        for d in row["dflash"]:
            print(f"{row['batch']:>5} | {d['ar_ms']:>6.2f} | {d['drafter']:>7} | {d['width']:>2} | {d['draft']:>5} | "
                  f"{d['draft_ms']:>8.2f} | {d['verify_ms']:>9.2f} | {d['draft_ms'] + d['verify_ms']:>9.2f} | "
                  f"{d['ratio']:>5.2f} | {d['step_ratio']:>10.2f} | {d['speedup_at_w']:>11.2f}x")
    print("AR ms: the AR steps interleaved with that row's DFlash steps. ratio: (draft + verify) / AR step, the "
          "runners' timers, the median of the rounds' ratios; step ratio: the same with each step's wall time (host "
          "bookkeeping included). speedup at w: E[tokens | w] / ratio with the synthetic curve of tau.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=str(PAIR / "target"))
    ap.add_argument("--drafter", default=str(PAIR / "drafter"), help="config of the random drafters; --real: the drafter")
    ap.add_argument("--draft-shapes", type=parse_shapes, default=parse_shapes("1x512"),
                    help="random drafters LxI (layers x intermediate size), comma-separated")
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    ap.add_argument("--widths", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3, 4, 6, 8, 16])
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    ap.add_argument("--draft", choices=["block", "cut", "both"], default="both",
                    help="step costs: draft the whole block, only the positions verified, or each")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=12, help="timed steps per configuration and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tau", type=float, default=4.0, help="synthetic acceptance (mean tokens per whole-block step)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--skip-steps", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--real", action="store_true", help="also the real pair's acceptance on GSM8K (needs --data-dir)")
    ap.add_argument("--real-cut", action="store_true", help="with --real: also DFlash with --cut-draft")
    ap.add_argument("--data-dir")
    ap.add_argument("--compare-torch", action="store_true",
                    help="also: AR and DFlash (--compare-width, cut) steps on torch ops against the kernels, in turn")
    ap.add_argument("--compare-width", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (serve --device cpu uses 1)")
    ap.add_argument("--kernels", choices=sorted(KERNELS), default="auto",
                    help="the step's ops: auto (as serve --fast picks them), cpu (the C kernels), torch (plain torch ops)")
    ap.add_argument("--out", help="also write the results as JSON here")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    hf = load_model(a.target, dtype=torch.float32, device="cpu")
    max_len = a.prompt_len + max(a.new_tokens, a.steps + 2) * 16 + 64
    max_len = min(-(-max_len // 256) * 256, hf.config.max_position_embeddings)
    S = max(a.batches + a.concurrency)
    kernels = KERNELS[a.kernels]
    target = DenseTarget(hf, max_slots=S, max_len=max_len, kernels=kernels)
    df_target = DenseTarget(hf, max_slots=S, max_len=max_len, kernels=kernels)  # its own cache, for interleaving
    res: dict = dict(machine=platform.processor() or platform.machine(), cpus=os.cpu_count(), torch=torch.__version__,
                     threads=torch.get_num_threads(),
                     kernels=target.kernels.gemm.__name__.rpartition(".")[2] if target.kernels else "torch ops",
                     args=portable(vars(a)))
    print(f"{res['machine']}, {res['cpus']} CPUs, torch {res['torch']}, {res['threads']} thread(s), "
          f"{res['kernels']}", flush=True)
    drafters = {f"{L}x{inter}": FastDrafter(random_drafter(Path(a.drafter), L, inter), df_target.embed, df_target.head,
                                            max_slots=S, max_len=max_len, kernels=kernels)
                for L, inter in a.draft_shapes}
    t0 = time.perf_counter()
    if not a.skip_steps:
        res["steps"] = step_costs((target, df_target), drafters, a)
        print_steps(res["steps"], a)
        save(res, a.out)
    if a.compare_torch:
        print("\nTorch ops against the kernels, one step of each in turn (medians):")
        res["torch_vs_kernels"] = compare_torch(hf, target, Path(a.drafter), a.draft_shapes[0], max_len, a)
        save(res, a.out)
    if not a.skip_throughput:
        fd = next(iter(drafters.values()))
        print(f"\nIn process, synthetic tau {a.tau}, drafter {next(iter(drafters))}, {a.new_tokens} new tokens:")
        res["throughput"] = throughput(
            target, fd, lambda c, rnd: random_prompts(c, a.prompt_len, target.vocab_size, 7000 + 100 * c + rnd),
            a, a.tau, [False, True])
        save(res, a.out)
    if a.real:
        if not a.data_dir:
            raise SystemExit("--real needs --data-dir")
        from dflash_bench.engine.build import load_tokenizer

        tok = load_tokenizer(a.target)
        real = load_drafter(a.drafter, target_hidden=hf.config.hidden_size, target_layers=hf.config.num_hidden_layers,
                            target_vocab=target.vocab_size, dtype=torch.float32, device="cpu")
        fd = FastDrafter(real, target.embed, target.head, max_slots=S, max_len=max_len, kernels=kernels)
        plen = max_len - a.new_tokens - 64
        print(f"\nIn process, the real drafter {a.drafter}, GSM8K prompts, {a.new_tokens} new tokens:")
        res["real"] = throughput(target, fd, lambda c, rnd: real_prompts(a.data_dir, tok, c, rnd + 1, plen), a, None,
                                 [False, True] if a.real_cut else [False])
        save(res, a.out)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    save(res, a.out)


def portable(args: dict) -> dict:
    """The options as they can be kept in the repository: no path of the machine they ran on."""
    out = dict(args)
    for k in ("target", "drafter"):
        p = Path(out[k]).resolve()
        out[k] = str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else p.name
    out["data_dir"] = "DATA_DIR" if out.get("data_dir") else None
    out["out"] = Path(out["out"]).name if out.get("out") else None
    return out


def save(res: dict, path: str | None) -> None:
    if not path:
        return
    tmp = path + ".tmp"
    Path(tmp).write_text(json.dumps(res, indent=1, default=str))
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
