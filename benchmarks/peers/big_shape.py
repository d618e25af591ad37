"""Folders of a large known pair's shape, without weights: vLLM and SGLang load them with `--load-format dummy`.

    python -m benchmarks.peers.big_shape --pair gemma-4-31B-it --out WORK

writes WORK/<pair>/ (the target: config.json from `dflash_bench.model_shapes`, generation_config.json, a
tokenizer with a chat template), WORK/<pair>-DFlash/ (the drafter's config.json in z-lab's format) and, for a
pair with an EAGLE-3 head recorded (`model_shapes.eagle3_shape_of`), WORK/<pair>-EAGLE3/ (its config.json, for
vLLM's `LlamaForCausalLMEagle3`), and prints the chat template's rendering of one conversation. No weights are written: the engines create random
weights of the real shape where they run, so a 62 GB file never exists. Timing, memory and launch flags are
real; acceptance is not (a random drafter: tau near 1).

The tokenizer is built here, since none can be downloaded: byte-level BPE with the family's special tokens and
turn template (Gemma's at Gemma's ids: pad 0, eos 1, bos 2, unk 3, mask 4; Qwen's ChatML), its merges trained on
the offline suites' text (`--data-dir`; 32,000 tokens), so that a prompt is about as many tokens as a real
tokenizer makes of it and the plan's context limit and KV cache are of the real size; without a data folder,
one token per byte (3-4 times as many tokens).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any



@dataclass(frozen=True)
class Family:
    """A tokenizer's special tokens (ids 0, 1, ... in this order), its turn template, and the token that ends a turn."""

    specials: tuple[str, ...]
    template: str
    end_of_turn: str
    bos: str | None
    pad: str


GEMMA = Family(
    specials=("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"),
    template=(
        "{{- bos_token }}"
        "{%- for message in messages %}"
        "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
        "{{- '<start_of_turn>' + role + '\\n' + message['content'] + '<end_of_turn>\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
    ),
    end_of_turn="<end_of_turn>", bos="<bos>", pad="<pad>",
)
CHATML = Family(
    specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    template=(
        "{%- for message in messages %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    ),
    end_of_turn="<|im_end|>", bos=None, pad="<|endoftext|>",
)
FAMILIES = {"gemma4_text": GEMMA, "qwen3": CHATML}
SPECIALS = list(GEMMA.specials)  # Gemma's, at Gemma's ids
CHAT_TEMPLATE = GEMMA.template
EXAMPLE = [{"role": "user", "content": "What is 7 * 6?"}]
VOCAB = 32000


def training_text(data_dir: Path) -> list[str]:
    """Every string of the offline suites' records (their .jsonl files), in a fixed order."""
    out: list[str] = []

    def walk(value) -> None:
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
    for path in sorted(Path(data_dir).rglob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                walk(json.loads(line))
    return out


def make_tokenizer(data_dir: Path | None, vocab_size: int = VOCAB, family: Family = GEMMA):
    """Byte-level BPE with the family's special tokens first (Gemma's: ids 0-6): trained on the suites' text when a
    data folder is given (about as many characters a token as Gemma's own tokenizer makes of English), else
    one token per byte."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if data_dir is not None:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(family.specials), show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(training_text(data_dir), trainer=trainer)
    else:
        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
        vocab = {t: i for i, t in enumerate(family.specials)}
        vocab.update({ch: len(family.specials) + i for i, ch in enumerate(alphabet)})
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.add_special_tokens(list(family.specials))
    tok.decoder = decoders.ByteLevel()
    extra = {"unk_token": "<unk>", "mask_token": "<mask>"} if family is GEMMA else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=family.pad, eos_token=family.end_of_turn,
                                   bos_token=family.bos, chat_template=family.template, **extra)


def write_shape(pair: str, out: Path, data_dir: Path | None = None, naming: str = "hf") -> dict[str, Any]:
    """Write the target and drafter folders of `pair`; what was written and what the template renders.
    naming "sglang": the target's config in SGLang's naming (model_shapes.sglang_naming), for SGLang 0.5.16."""
    from dflash_bench.model_shapes import SHAPES, eagle3_shape_of, sglang_naming, shape_of

    shape = shape_of(pair)
    if shape is None:
        raise SystemExit(f"no recorded shape for {pair!r}: pairs with one are {', '.join(SHAPES)} "
                         "(dflash_bench/model_shapes.py)")
    target_cfg, drafter_cfg = shape
    family = FAMILIES.get(target_cfg["model_type"])
    if family is None:
        raise SystemExit(f"no tokenizer family for the model type {target_cfg['model_type']!r} of {pair!r}")
    if naming == "sglang" and family is GEMMA:
        target_cfg = sglang_naming(target_cfg)
    # SGLang's copy in a folder of its own under the same name: a local folder's pair is named after its folder,
    # so every engine's sweep names (and is set against the card of) the same model
    target, drafter = (out / pair if naming == "hf" else out / naming / pair), out / f"{pair}-DFlash"
    target.mkdir(parents=True, exist_ok=True)
    drafter.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(data_dir, family=family)
    tok.save_pretrained(target)
    # the template's end-of-turn token stops generation, as Gemma's <end_of_turn> (id 6 here) does
    eos = [target_cfg["eos_token_id"], tok.convert_tokens_to_ids(family.end_of_turn)]
    pad = target_cfg.get("pad_token_id", tok.pad_token_id)
    (target / "config.json").write_text(json.dumps({**target_cfg, "eos_token_id": eos}, indent=1))
    (target / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": target_cfg.get("bos_token_id"), "eos_token_id": eos, "pad_token_id": pad}))
    (drafter / "config.json").write_text(json.dumps(drafter_cfg, indent=1))
    written = {"target": str(target), "drafter": str(drafter)}
    eagle3 = eagle3_shape_of(pair)
    if eagle3 is not None:
        head = out / f"{pair}-EAGLE3"
        head.mkdir(parents=True, exist_ok=True)
        (head / "config.json").write_text(json.dumps(eagle3, indent=1))
        written["eagle3"] = str(head)
    rendered = tok.apply_chat_template(EXAMPLE, tokenize=False, add_generation_prompt=True)
    kind = f"byte-level BPE of {len(tok)} tokens trained on the suites' text" if data_dir else "byte-level, a token a byte"
    specials = "Gemma's special tokens" if family is GEMMA else "ChatML's special tokens"
    return {**written, "tokenizer": f"{kind}, {specials}",
            "renders": {"messages": EXAMPLE, "text": rendered,
                        "token_ids": tok(rendered, add_special_tokens=False)["input_ids"]}}


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
