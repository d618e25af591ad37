"""Incremental detokenization with stop strings (text is emitted only once it can no longer change)."""

from __future__ import annotations

from typing import Any


class Detokenizer:
    """Turns a growing list of token ids into text deltas; finds stop strings and truncates at them."""

    def __init__(self, tokenizer: Any, stop: list[str], prompt_tail: list[int] | None = None) -> None:
        self.tok = tokenizer
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = list(prompt_tail or [])  # a few prompt tokens give byte-level merges context
        self.prefix = 0
        self.read = len(self.ids)
        self.text = ""
        self.sent = 0
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def add(self, tokens: list[int]) -> bool:
        """Append tokens; True when a stop string appeared (the text is then cut before it)."""
        self.ids.extend(tokens)
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            old = len(self.text)
            self.text += after[len(before) :]
            self.prefix, self.read = self.read, len(self.ids)
            return self._find_stop(old)
        return False

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
        if self.stopped:
            return
        rest = self._decode(self.ids[self.prefix :])[len(self._decode(self.ids[self.prefix : self.read])) :]
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
