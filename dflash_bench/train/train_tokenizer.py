"""A byte-level BPE tokenizer trained offline (the `tokenizers` package), with Qwen3's chat special tokens.

The chat template is Qwen3's shape without a thinking block (`chat_template_kwargs` such as
`enable_thinking` are accepted and ignored): the tiny target is a non-thinking model.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS, PAD = "<|im_end|>", "<|endoftext|>"

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE of `vocab_size` tokens (specials included) and wrap it for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, chat_template=CHAT_TEMPLATE)
    if out_dir is not None:
        fast.save_pretrained(str(out_dir))
    return fast


def chat_text(user: str, assistant: str) -> str:
    """One training sample rendered exactly as the template renders it, answer and end token included."""
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{assistant}<|im_end|>\n"
