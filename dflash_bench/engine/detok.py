"""Incremental detokenization with stop strings (text is emitted only once it can no longer change)."""

from __future__ import annotations

from typing import Any, Callable


def text_of(tokenizer: Any) -> Callable[[list[int]], str]:
    """How ids become text (special tokens skipped): a fast tokenizer's own decoder when it has one and no clean-up of
    spaces is asked, else the tokenizer's `decode`. The same text; the Python wrapper's conversion of the ids costs
    ~5 us a call and ~0.5 us an id, per row and step on the engine thread, where the decoder itself takes ~1 us."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return lambda ids: backend.decode(ids, skip_special_tokens=True)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


class Detokenizer:
    """Turns a growing list of token ids into text deltas; finds stop strings and truncates at them.

    Each `add` decodes the ids whose text is out last (`context`: byte-level merges and leading spaces depend on what
    comes before) followed by those whose text is not out yet (`pending`), and emits what they add once it is whole
    characters. Ids that add no text at all (special tokens, ids the tokenizer lacks: a random model's) leave the
    window at once, so it holds a few ids, never every id since the last character."""

    def __init__(self, tokenizer: Any, stop: list[str], prompt_tail: list[int] | None = None) -> None:
        self.tok = tokenizer
        self._text_of = text_of(tokenizer)
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.context: list[int] = list(prompt_tail or [])  # a few prompt tokens give byte-level merges context
        self.context_text = self._text_of(self.context)
        self.pending: list[int] = []
        self.text = ""
        self.sent = 0
        self.stopped = False

    def add(self, tokens: list[int]) -> bool:
        """Append tokens; True when a stop string appeared (the text is then cut before it)."""
        self.pending.extend(tokens)
        before = self.context_text
        after = self._text_of(self.context + self.pending)
        if len(after) < len(before) or after.endswith("\ufffd"):  # a character not yet whole: wait for more ids
            return False
        if len(after) == len(before):  # ids that make no text: nothing to wait for
            self.pending = []
            return False
        old = len(self.text)
        self.text += after[len(before) :]
        self.context, self.pending = self.pending, []
        self.context_text = self._text_of(self.context)
        return self._find_stop(old)

    def _find_stop(self, old: int) -> bool:
        for s in self.stop:
            i = self.text.find(s, max(0, old - len(s) + 1))
            if i >= 0:
                self.text = self.text[:i]
                self.stopped = True
                return True
        return False

    def flush(self) -> None:
        """At the end, keep whatever bytes are left even if they are not complete characters."""
        if self.stopped or not self.pending:
            return
        rest = self._text_of(self.context + self.pending)[len(self.context_text) :]
        if rest:
            old = len(self.text)
            self.text += rest
            self._find_stop(old)

    def delta(self, final: bool) -> str:
        """New text since the last call; holds back a possible stop-string prefix unless final."""
        upto = len(self.text) if final or self.stopped else max(self.sent, len(self.text) - self.hold)
        out = self.text[self.sent : upto]
        self.sent = upto
        return out
