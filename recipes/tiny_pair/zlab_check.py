"""The pair in z-lab's own reference code: does it load, and does it decode what the builtin engine decodes?

    python -m recipes.tiny_pair.zlab_check --zlab DIR --zlab-python PY --data-dir DATA [--json zlab.json]

DIR is a checkout of github.com/z-lab/dflash (its `dflash/model.py`); PY a Python with the transformers it pins
(4.57.1: its cache calls changed meaning in 5.x) and torch, e.g. `python3 -m venv Z && Z/bin/pip install
torch==2.13.0 transformers==4.57.1`. In that Python the drafter is loaded with z-lab's
`DFlashDraftModel.from_pretrained` and the target with transformers, both in float32 on the CPU, and each prompt
(the first turn of the first `--num-prompts` of each suite, seed-0 order: what the demo sends first, held out of
the pair's training) is decoded greedily to `--max-tokens` by z-lab's `dflash_generate`, one prompt at a time as
it decodes; here the builtin reference engine (`engine/reference/decode.py`) decodes the same token ids, also one at a time.
Per suite it prints the prompts whose tokens are equal, and tau both ways: z-lab's mean acceptance length per
step, and the builtin engine's 1 + accepted / drafts (with equal tokens they differ only where z-lab's loop,
which runs until its position passes the prompt plus --max-tokens, takes one step more than the --max-tokens
the builtin engine stops at, and counts it). z-lab's code is run, not copied into this repository.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from recipes.tiny_pair.acceptance import ROOT, SUITES, encode

PAIR = ROOT / "dflash_bench" / "assets" / "default_pair"


def zlab_side(zlab: str, pair: Path, prompts_in: Path, out: Path, max_tokens: int) -> None:
    """Run in z-lab's Python: decode every prompt of `prompts_in` with `dflash_generate`; write tokens and steps."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    import dflash.model as zmodel  # z-lab's reference (its checkout is on PYTHONPATH: see main)

    zmodel._cuda_time = time.perf_counter  # its stats are timed with CUDA syncs; this runs on the CPU
    target = AutoModelForCausalLM.from_pretrained(pair / "target", torch_dtype=torch.float32).eval()
    drafter = zmodel.DFlashDraftModel.from_pretrained(pair / "drafter", torch_dtype=torch.float32).eval()
    got: dict = {"transformers": transformers.__version__, "torch": torch.__version__, "suites": {}}
    for suite, prompts in json.loads(prompts_in.read_text()).items():
        got["suites"][suite] = []
        for p in prompts:
            ids = torch.tensor([p])
            z = zmodel.dflash_generate(drafter, target, ids, max_tokens, None, 0.0, return_stats=True)
            got["suites"][suite].append({"tokens": z.output_ids[0, len(p):len(p) + max_tokens].tolist(),
                               "steps": z.acceptance_lengths})
    out.write_text(json.dumps(got))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zlab", required=True, help="a checkout of github.com/z-lab/dflash")
    ap.add_argument("--zlab-python", default=sys.executable, help="a Python with z-lab's transformers (4.57.1)")
    ap.add_argument("--pair", default=str(PAIR))
    ap.add_argument("--data-dir")
    ap.add_argument("--suites", default=SUITES)
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--zlab-ref", default="", help="which z-lab commit DIR holds (written into --json)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--zlab-side", nargs=2, metavar=("PROMPTS", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    pair = Path(a.pair)
    if a.zlab_side:
        zlab_side(a.zlab, pair, Path(a.zlab_side[0]), Path(a.zlab_side[1]), a.max_tokens)
        return
    if not a.data_dir:
        sys.exit("--data-dir is required")
    from dflash_bench.engine.build import build
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.reference.decode import generate
    from dflash_bench.engine.sampling_params import SamplingParams
    from dflash_bench.suites import load_prompts

    ours = build(EngineConfig(str(pair / "target"), str(pair / "drafter"), mode="dflash", dtype="float32", device="cpu", max_slots=1, max_model_len=2048 + a.max_tokens + 32))
    prompts = {s: [p[-2048:] for p in encode(ours.tok, load_prompts(s, data_dir=Path(a.data_dir),
                                                                    num_prompts=a.num_prompts, seed=0))]
               for s in a.suites.split(",")}
    with tempfile.TemporaryDirectory() as tmp:
        pin, zout = Path(tmp) / "prompts.json", Path(tmp) / "zlab.json"
        pin.write_text(json.dumps(prompts))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([a.zlab, str(ROOT)])}
        subprocess.run([a.zlab_python, "-m", "recipes.tiny_pair.zlab_check", "--zlab", a.zlab, "--pair", str(pair),
                        "--max-tokens", str(a.max_tokens), "--zlab-side", str(pin), str(zout)], check=True, env=env, cwd=ROOT)
        zside = json.loads(zout.read_text())
    theirs = zside["suites"]
    sp = SamplingParams(max_tokens=a.max_tokens, ignore_eos=True)
    rows = []
    for suite, ps in prompts.items():
        before = (ours.stats.drafts, ours.stats.accepted)
        outs = [generate(ours, [p], sp)[0].out for p in ps]  # one at a time, as z-lab decodes
        drafts, accepted = ours.stats.drafts - before[0], ours.stats.accepted - before[1]
        steps = [n for z in theirs[suite] for n in z["steps"]]
        rows.append({"suite": suite, "prompts": len(ps), "max_tokens": a.max_tokens,
                     "equal_tokens": sum(o == z["tokens"] for o, z in zip(outs, theirs[suite])),
                     "tau_zlab": round(sum(steps) / len(steps), 3), "tau_builtin": round(1 + accepted / max(drafts, 1), 3)})
        print(json.dumps(rows[-1]), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"device": "cpu", "zlab": a.zlab_ref, "zlab_transformers": zside["transformers"],
                                            "zlab_torch": zside["torch"], "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
