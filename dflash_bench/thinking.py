"""Was thinking on or off? Read from the prompt the model actually saw, not from the flag we sent.

A `--thinking` flag can be lost on the way (a server that ignores chat_template_kwargs, a template with
another switch name, a server-side default), and a drafter trained with thinking off loses most of its
acceptance when thinking is on (z-lab#133: 25% -> 60% acceptance once thinking was turned off). So each
cell records what the rendered prompt says. The markers, per template family:

- Qwen3 / Qwen3.5 / Qwen3.6 / DeepSeek-style `<think>`: off is a closed empty block at the start of the
  assistant turn (`<think>\\n\\n</think>\\n\\n`); on is an open `<think>` (Qwen3.5) or, in a template that
  knows `<think>` but adds nothing (Qwen3), no block at all: the model opens one itself.
- Gemma 4: on puts `<|think|>` in a system turn; off is no `<|think|>`, and the 26B/31B templates also
  pre-fill a closed empty thought channel (`<|channel>thought\\n<channel|>`) after `<|turn>model\\n`.
- gpt-oss (harmony): always reasons; the system message states `Reasoning: low|medium|high`.
- A template with no thinking markers at all (the embedded pair's): off, the model has no such mode.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Sequence

from pydantic import BaseModel

Mode = Literal["on", "off", "unknown"]


class ThinkingState(BaseModel):
    mode: Mode
    family: str  # qwen-think | gemma4 | harmony | none | unknown
    evidence: str  # the marker that decided it, for the report
    effort: str | None = None  # harmony's reasoning effort


_EMPTY_THINK = re.compile(r"<think>\s*</think>\s*$")
_OPEN_THINK = re.compile(r"<think>\s*$")
_GEMMA_EMPTY = re.compile(r"<\|channel>thought\s*<channel\|>\s*$")
_HARMONY_EFFORT = re.compile(r"Reasoning:\s*(low|medium|high)\b", re.IGNORECASE)
_QWEN_ASSISTANT = re.compile(r"<\|im_start\|>assistant\n$")


def _gemma_system_turn(prompt: str) -> str:
    """The system turn's body: Gemma's `<|think|>` switch lives there, and a user may quote the marker."""
    start = prompt.find("<|turn>system")
    return prompt[start:].split("<turn|>", 1)[0] if start >= 0 else ""


def detect(prompt: str, template: str | None = None) -> ThinkingState:
    """Thinking on or off for the next assistant turn of `prompt` (rendered with add_generation_prompt).

    `template` (the chat template's source) settles the one case the prompt alone cannot: a prompt that
    ends at the assistant header with no block, which is "on" for a template that knows `<think>` and
    "off" for one that has no thinking mode.
    """
    tail = prompt.rstrip(" ")
    if "<|turn>" in prompt:  # Gemma 4
        if _GEMMA_EMPTY.search(tail):
            return ThinkingState(mode="off", family="gemma4", evidence="empty thought channel after <|turn>model")
        if "<|think|>" in _gemma_system_turn(prompt):
            return ThinkingState(mode="on", family="gemma4", evidence="<|think|> in the system turn")
        return ThinkingState(mode="off", family="gemma4", evidence="no <|think|> in the prompt")
    if "<|start|>" in prompt and "<|message|>" in prompt:  # harmony (gpt-oss)
        head = prompt.split("<|start|>system<|message|>", 1)
        system = head[1].split("<|end|>", 1)[0] if len(head) == 2 else ""
        m = _HARMONY_EFFORT.search(system)
        effort = m.group(1).lower() if m else None
        return ThinkingState(mode="on", family="harmony", effort=effort,
                             evidence=f"harmony always reasons (Reasoning: {effort or 'not stated'})")
    if _EMPTY_THINK.search(tail):
        return ThinkingState(mode="off", family="qwen-think", evidence="empty <think></think> block")
    if _OPEN_THINK.search(tail):
        return ThinkingState(mode="on", family="qwen-think", evidence="open <think> block")
    if template is None:
        return ThinkingState(mode="unknown", family="unknown",
                             evidence="no thinking marker in the prompt, and no template to tell why")
    if "<think>" in template:
        if _QWEN_ASSISTANT.search(prompt):
            return ThinkingState(mode="on", family="qwen-think",
                                 evidence="the template knows <think> but closed no block: the model opens one")
        return ThinkingState(mode="unknown", family="qwen-think", evidence="prompt does not end at the assistant turn")
    if "think" not in template.lower() and "reasoning" not in template.lower():
        return ThinkingState(mode="off", family="none", evidence="the chat template has no thinking mode")
    return ThinkingState(mode="unknown", family="unknown", evidence="the template mentions thinking in an unknown form")


def detect_ids(token_ids: Sequence[int], tokenizer: Any, template: str | None = None) -> ThinkingState:
    """`detect` on token ids, decoded with the special tokens kept (they are the markers)."""
    text = tokenizer.decode(list(token_ids), skip_special_tokens=False)
    if template is None:
        template = getattr(tokenizer, "chat_template", None)
    return detect(text, template if isinstance(template, str) else None)


def template_hash(template: str) -> str:
    """"sha256:<first 16 hex>" of a chat template's source: the sweep records it per cell so a card's
    template (once a card states one) and a run's can be compared without storing the template."""
    import hashlib

    return "sha256:" + hashlib.sha256(template.encode("utf-8")).hexdigest()[:16]


class ThinkingRecord(BaseModel):
    """What one cell records: thinking as its rendered prompt shows it, and the template's hash."""

    mode: Mode
    evidence: str
    template_hash: str | None = None


_TOKENIZERS: dict[str, Any] = {}


def record(target: str, messages: list[dict[str, str]], enable_thinking: bool | None) -> ThinkingRecord:
    """Render `messages` as the server does (the target's chat template, the same enable_thinking) and read
    thinking off the result. "unknown", with why, when the target's tokenizer is not on this machine (a hub id
    never downloaded here) or has no chat template: the flag sent is never taken for what the model saw."""
    tok = _TOKENIZERS.get(target)
    if tok is None:
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(target, local_files_only=True)
        except Exception as err:  # noqa: BLE001 - any loader failure means "cannot tell", said plainly
            why = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
            return ThinkingRecord(mode="unknown", evidence=f"the target's tokenizer is not on this machine ({why})")
        _TOKENIZERS[target] = tok
    template = getattr(tok, "chat_template", None)
    if not isinstance(template, str):
        return ThinkingRecord(mode="unknown", evidence="the target's tokenizer has no chat template")
    kwargs: dict[str, Any] = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    try:
        rendered = str(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs))
    except Exception as err:  # noqa: BLE001 - a template that cannot render these messages
        return ThinkingRecord(mode="unknown", evidence=f"the chat template did not render: {str(err)[:120]}",
                              template_hash=template_hash(template))
    state = detect(rendered, template)
    return ThinkingRecord(mode=state.mode, evidence=state.evidence, template_hash=template_hash(template))
