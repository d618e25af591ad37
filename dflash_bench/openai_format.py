"""OpenAI response bodies and stream chunks as vLLM writes them, for the builtin engine's server and the emulator.

One `Reply` per request: its id, creation time and served model name, and the four shapes a server sends
(the chat stream's role chunk, a content chunk, the usage chunk that ends a stream, a whole response). What
goes in them (text, logprobs, usage, vLLM's per-request `metrics`) is the caller's. No third-party imports:
the emulator starts in a fraction of a second.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

Kind = Literal["chat", "completions"]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict:
    """OpenAI's usage; `cached_tokens`: the prompt tokens read from a prefix cache (`prompt_tokens_details`, as
    vLLM writes it with --enable-prompt-tokens-details and llama.cpp always does), left out when None."""
    out: dict = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


class Reply:
    """The envelopes of one request's response (`kind` chat: /v1/chat/completions; else /v1/completions)."""

    def __init__(self, kind: Kind, model: str, rid: str | None = None):
        self.kind, self.model = kind, model
        self.id = rid or new_id("chatcmpl" if kind == "chat" else "cmpl")
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list, extra: dict) -> dict:
        out = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}
        out.update({k: v for k, v in extra.items() if v is not None})
        return out

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.kind == "chat" else "text_completion"

    def role_chunk(self, usage: dict | None = None) -> dict:
        """A chat stream's first chunk: the assistant's role, no content."""
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return self._envelope(self._chunk_object, [choice], {"usage": usage})

    def chunk(self, text: str, finish: str | None, logprobs: dict | None = None, usage: dict | None = None) -> dict:
        """One stream chunk (`usage` with vLLM's continuous usage stats)."""
        if self.kind == "chat":
            choice = {"index": 0, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return self._envelope(self._chunk_object, [choice], {"usage": usage})

    def usage_chunk(self, usage: dict, metrics: dict | None = None) -> dict:
        """The chunk that ends a stream with `include_usage`; `metrics`: vLLM's per-request spec-decode stats."""
        return self._envelope(self._chunk_object, [], {"usage": usage, "metrics": metrics})

    def full(self, text: str, finish: str | None, usage: dict, logprobs: dict | None = None,
             metrics: dict | None = None) -> dict:
        """A whole (non-streamed) response."""
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                      "finish_reason": finish}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
            obj = "text_completion"
        return self._envelope(obj, [choice], {"usage": usage, "metrics": metrics})
