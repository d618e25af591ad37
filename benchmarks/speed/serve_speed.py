"""`serve --fast` end to end: the Qwen3-8B-shaped random pair on disk, an AR and a DFlash server (synthetic
acceptance), and `dflash-bench run` against each, as a user would measure it.

    python -m benchmarks.speed.serve_speed --data-dir DIR --out F          # GPU, ~5 min
    python -m benchmarks.speed.serve_speed --shape tiny --device cpu --data-dir ../shared/datasets
    python -m benchmarks.speed.serve_speed --shape pair --device cpu --data-dir ../shared/datasets \
        --concurrency 1,8,32 --tau 4 --new-tokens 256 --step-ahead on --cut-draft both   # CPU, ~15 min

Each server gets GSM8K prompts at each concurrency (closed loop, 512 new tokens, greedy), with the next step
launched before the host reads this one's tokens (`--step-ahead`, the default) and without; the table gives
the cells' output tok/s, median TTFT and TPOT and tau as the load generator measured them over HTTP.
Random weights: the text is noise, only the timing means anything. `--shape pair`: the embedded pair's
target as it is (its weights and tokenizer) and a random drafter of the embedded drafter's config with
`--draft-shape` LxI (layers x intermediate size); its requests ask for `--ignore-eos` (with synthetic
acceptance the text is not the target's, so only the AR server would stop at the target's end of text).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.fixtures.shapes import SHAPES, write_pair

from dflash_bench.engine.reference.drafter import DFlashDrafter, DrafterConfig, save_drafter
from dflash_bench.errors import UserError
from dflash_bench.launch import launch_command

PAIR = Path(__file__).resolve().parents[2] / "dflash_bench" / "assets" / "default_pair"


def write_random_drafter(shape: str, root: Path) -> Path:
    """A drafter of the embedded drafter's config with shape LxI (layers x intermediate size), random weights."""
    layers, inter = (int(x) for x in shape.lower().split("x"))
    raw = json.loads((PAIR / "drafter" / "config.json").read_text())
    raw.update(num_hidden_layers=layers, intermediate_size=inter, dtype="float32")
    d = DFlashDrafter(DrafterConfig.from_dict(raw))
    d.init_random(0)
    save_drafter(d, root / "drafter")
    return root / "drafter"


def server_argv(args, target: Path, draft: Path, mode: str, ahead: bool, port: int, width: str = "auto",
                cut: bool = False) -> list[str]:
    """`dflash-bench serve --fast` of one cell's server (launched by `launch.launch_command`, as a sweep's are)."""
    cmd = [sys.executable, "-m", "dflash_bench", "serve", "--model", str(target), "--port", str(port),
           "--device", args.device, "--max-slots", str(max(args.concurrency)), "--max-model-len", "1536", "--fast",
           "--mode", mode, "--step-ahead" if ahead else "--no-step-ahead", "--served-model-name", f"random-{args.shape}"]
    if mode == "dflash":
        cmd += ["--draft", str(draft), "--synthetic-acceptance", str(args.tau), "--benchmark-only",
                "--verify-width", width] + (["--cut-draft"] if cut else [])
    return cmd


def measure(args, url: str, mode: str, c: int, out: Path, tag: str) -> dict:
    name = f"serve_speed_{tag}_c{c}"
    cmd = [sys.executable, "-m", "dflash_bench", "run", "--url", url, "--suite", "gsm8k", "-c", str(c),
           "-n", str(args.prompts_per_slot * c), "--max-tokens", str(args.new_tokens), "--label", mode,
           "--engine", "builtin", "--data-dir", str(args.data_dir), "--out", str(out), "--name", name]
    if args.shape == "pair":
        cmd.append("--ignore-eos")
    if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode:
        raise SystemExit(f"dflash-bench run failed against the {tag} server (its error is above)")
    return json.loads(next((out / name).glob("cells/*/summary.json")).read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES) + ["pair"], default="qwen3-8b")
    ap.add_argument("--draft-shape", default="1x512", help="--shape pair: the random drafter's LxI")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    ap.add_argument("--prompts-per-slot", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--tau", type=float, default=6.5)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--step-ahead", choices=["on", "off", "both"], default="both",
                    help="serve with --step-ahead, --no-step-ahead, or each in turn")
    ap.add_argument("--verify-width", choices=["auto", "full", "both"], default="auto",
                    help="DFlash servers verify a width chosen by load (auto, the default), the whole block, or each")
    ap.add_argument("--cut-draft", choices=["off", "on", "both"], default="off",
                    help="DFlash servers draft only the positions a step verifies (--cut-draft), the whole block, or each")
    ap.add_argument("--out", help="also write the results as JSON here")
    args = ap.parse_args()
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    res: dict = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "shape": args.shape,
                 "tau": args.tau, "new_tokens": args.new_tokens, "rows": {}}
    if args.shape == "pair":
        res["draft_shape"] = args.draft_shape
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t = time.monotonic()
        if args.shape == "pair":
            target, draft = PAIR / "target", write_random_drafter(args.draft_shape, root)
        else:
            target, draft = write_pair(SHAPES[args.shape], dev, dtype, root)
        print(f"pair written in {time.monotonic() - t:.0f} s", flush=True)
        aheads = {"on": [True], "off": [False], "both": [True, False]}[args.step_ahead]
        widths = {"auto": ["auto"], "full": ["full"], "both": ["auto", "full"]}[args.verify_width]
        cuts = {"off": [False], "on": [True], "both": [False, True]}[args.cut_draft]
        for ahead in aheads:
            for mode, width, cut in [("ar", "auto", False)] + [("dflash", w, c) for w in widths for c in cuts]:
                tag = f"{mode}{'_full' if width == 'full' and args.verify_width == 'both' else ''}" \
                      f"{'_cut' if cut and args.cut_draft == 'both' else ''}{'' if ahead else '_no_step_ahead'}"
                argv = server_argv(args, target, draft, mode, ahead, args.port, width, cut)
                try:
                    with launch_command(argv, port=args.port, log_path=root / f"{tag}.log", ready_timeout=900,
                                        name=tag) as server:
                        res[f"{tag}_ready_s"] = server.info.ready_s
                        for c in args.concurrency:
                            s = measure(args, server.url, mode, c, root / "sweeps", tag)
                            res["rows"].setdefault(str(c), {})[tag] = s
                            print(f"{tag} c={c}: {json.dumps(brief(s))}", flush=True)
                except UserError as err:  # the server died or never answered: the sentence carries its log tail
                    raise SystemExit(str(err)) from None
    print_table(res)
    if args.out:
        tmp = Path(args.out + ".tmp")
        tmp.write_text(json.dumps(res, indent=1, default=str))
        tmp.replace(args.out)


def brief(s: dict) -> dict:
    """The few numbers of a cell summary the table shows."""
    return {"tok_s": s["output_throughput"], "tpot_ms_p50": (s["tpot_ms"] or {}).get("p50"),
            "tau": s["acceptance_length"], "width": s.get("verify_width"), "ok": s["num_ok"], "failed": s["num_failed"]}


def print_table(res: dict) -> None:
    print(f"\n{res['device']} | {res['shape']} | serve --fast over HTTP, GSM8K prompts, {res['new_tokens']} new tokens, "
          f"DFlash synthetic tau {res['tau']}")
    print(f"{'conc':>4} | {'step ahead':>14} | {'AR tok/s':>9} | {'AR TTFT':>7} | {'AR TPOT':>7} | {'DFlash tok/s':>12} | "
          f"{'DF TTFT':>7} | {'DF TPOT':>7} | {'tau':>5} | {'width':>5} | {'speedup':>7}")
    for c, row in res["rows"].items():
        for suffix, label, df in (("", "on", "dflash"), ("", "on, full", "dflash_full"), ("", "on, cut", "dflash_cut"),
                                  ("_no_step_ahead", "off", "dflash"), ("_no_step_ahead", "off, full", "dflash_full"),
                                  ("_no_step_ahead", "off, cut", "dflash_cut")):
            if "ar" + suffix not in row or df + suffix not in row:
                continue
            a, d = row["ar" + suffix], row[df + suffix]
            ttft = lambda s: (s["ttft_ms"] or {}).get("p50") or 0.0  # noqa: E731
            tpot = lambda s: (s["tpot_ms"] or {}).get("p50") or 0.0  # noqa: E731
            print(f"{c:>4} | {label:>14} | {a['output_throughput']:>9.1f} | {ttft(a):>7.1f} | {tpot(a):>7.2f} | "
                  f"{d['output_throughput']:>12.1f} | {ttft(d):>7.1f} | {tpot(d):>7.2f} | {d['acceptance_length'] or 0:>5.2f} | "
                  f"{d.get('verify_width') or 0:>5.1f} | "
                  f"{d['output_throughput'] / a['output_throughput']:>6.2f}x")
    print("tok/s: output tokens / the cell's wall time; TTFT and TPOT: medians in ms. DFlash verifies a width chosen "
          "by load (--verify-width auto), or with 'full' the whole block every step; 'cut': --cut-draft (drafts only "
          "the positions a step verifies); width: tokens verified per row and step, mean.")


if __name__ == "__main__":
    main()
