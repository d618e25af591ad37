"""Folders of a large known pair's shape, without weights: vLLM and SGLang load them with `--load-format dummy`.

    python -m benchmarks.peers.big_shape --pair gemma-4-31B-it --out WORK

writes WORK/<pair>/ (the target: config.json from `dflash_bench.model_shapes`, generation_config.json, a
tokenizer with a chat template), WORK/<pair>-DFlash/ (the drafter's config.json in z-lab's format) and, for a
pair with an EAGLE-3 head recorded (`model_shapes.eagle3_shape_of`), WORK/<pair>-EAGLE3/ (its config.json, for
vLLM's `LlamaForCausalLMEagle3`), and prints the chat template's rendering of one conversation. No weights are written: the engines create random
weights of the real shape where they run, so a 62 GB file never exists. Timing, memory and launch flags are
real; acceptance is not (a random drafter: tau near 1). The tokenizer and the folders:
benchmarks/fixtures/shape_folders.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.fixtures.shape_folders import write_shape


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="gemma-4-31B-it")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--naming", choices=["hf", "sglang"], default="hf",
                    help="sglang: the target config in SGLang's naming (Gemma 4's renamed), in WORK/sglang/<pair>")
    ap.add_argument("--data-dir", type=Path, help="the offline suites: train the tokenizer on their text "
                                                 "(default: one token per byte)")
    args = ap.parse_args()
    print(json.dumps(write_shape(args.pair, args.out, args.data_dir, args.naming), indent=1))


if __name__ == "__main__":
    main()
