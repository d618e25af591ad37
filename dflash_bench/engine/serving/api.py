"""OpenAI-compatible request schemas (vLLM's extensions included) and what goes in the engine's responses."""

from __future__ import annotations

from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field

from dflash_bench import openai_format
from dflash_bench.engine.bookkeeping import Delta
from dflash_bench.engine.sampling_params import SamplingParams


class BadRequest(Exception):
    """A request the server refuses with HTTP 400 and this message."""


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)
    min_tokens: int = Field(0, ge=0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1)
    seed: int | None = None
    return_tokens_as_token_ids: bool = False

    def sampling(self, max_tokens: int, logprobs: int | None) -> SamplingParams:
        if self.n != 1:
            raise BadRequest("only n=1 is supported")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, top_k=max(self.top_k, 0), max_tokens=max_tokens,
            min_tokens=self.min_tokens, ignore_eos=self.ignore_eos, stop=stop,
            stop_token_ids=list(self.stop_token_ids or []), logprobs=logprobs, seed=self.seed,
        )


class ChatRequest(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True

    def wanted_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def wanted_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False

    def wanted_max_tokens(self) -> int | None:
        return self.max_tokens or 16  # OpenAI's default for completions

    def wanted_logprobs(self) -> int | None:
        return self.logprobs


def chat_prompt(tokenizer: Any, req: ChatRequest) -> list[int]:
    msgs = [{**m, "content": _text_content(m.get("content"))} for m in req.messages]
    try:
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=req.add_generation_prompt,
                                             **(req.chat_template_kwargs or {}))
    except Exception as err:  # jinja errors, missing template, bad roles
        raise BadRequest(f"could not apply the chat template: {err}") from err
    return tokenizer(text, add_special_tokens=False).input_ids


def _text_content(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise BadRequest("message content must be a string or a list of text parts")


def completion_prompt(tokenizer: Any, req: CompletionRequest) -> list[int]:
    if req.echo:
        raise BadRequest("echo is not supported")
    p = req.prompt
    if isinstance(p, list) and p and isinstance(p[0], (str, list)):
        if len(p) != 1:
            raise BadRequest("only one prompt per request is supported")
        p = p[0]
    if isinstance(p, str):
        return tokenizer(p).input_ids
    return list(cast("list[int]", p))  # the schema's union: token ids by now


def usage(d: Delta) -> dict:
    """OpenAI's usage as of `d`; `prompt_tokens_details.cached_tokens`: the prompt tokens the engine read from its
    prefix cache (0 where it keeps none), as vLLM with --enable-prompt-tokens-details and llama.cpp write it."""
    return openai_format.usage(d.prompt_tokens, d.completion_tokens, d.cached_tokens)


def spec_metrics(d: Delta, block_size: int) -> dict | None:
    """Per-request speculative stats, in vLLM's experimental per-request format."""
    if block_size <= 1 or d.steps == 0:
        return None
    return {"speculative_decoding": {"num_spec_steps": d.steps, "num_accepted_draft_tokens": d.accepted,
                                     "num_draft_tokens": d.drafted,
                                     "mean_acceptance_length": 1 + d.accepted / d.steps}}


class Formatter:
    """One request's response bodies and stream chunks from its deltas (envelopes: `openai_format.Reply`)."""

    def __init__(self, kind: Literal["chat", "completions"], model: str, tokenizer: Any, as_ids: bool) -> None:
        self.kind, self.tok, self.as_ids = kind, tokenizer, as_ids
        self.reply = openai_format.Reply(kind, model)
        self.offset = 0  # completions text_offset

    def _tok_str(self, t: int) -> str:
        return f"token_id:{t}" if self.as_ids else self.tok.decode([t])

    def logprobs(self, d: Delta) -> dict | None:
        if d.logprobs is None:
            return None
        if self.kind == "chat":
            return {"content": [{"token": self._tok_str(t), "logprob": lp, "bytes": list(self._tok_str(t).encode()),
                                 "top_logprobs": [{"token": self._tok_str(i), "logprob": v} for i, v in top]}
                                for t, lp, top in d.logprobs]}
        tokens = [self._tok_str(t) for t, _, _ in d.logprobs]
        offsets = []
        for s in tokens:
            offsets.append(self.offset)
            self.offset += len(s)
        return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in d.logprobs],
                "top_logprobs": [{self._tok_str(i): v for i, v in top} for _, _, top in d.logprobs],
                "text_offset": offsets}

    def role_chunk(self) -> dict:
        return self.reply.role_chunk()

    def chunk(self, d: Delta, *, with_usage: bool) -> dict:
        return self.reply.chunk(d.text, d.finish, self.logprobs(d), usage(d) if with_usage else None)

    def usage_chunk(self, d: Delta, block_size: int) -> dict:
        return self.reply.usage_chunk(usage(d), spec_metrics(d, block_size))

    def full(self, deltas: list[Delta], block_size: int) -> dict:
        last = deltas[-1]
        lps = None
        if last.logprobs is not None:
            merged = Delta(last.req_id, [], "", 0, 0, logprobs=[e for d in deltas for e in (d.logprobs or [])])
            lps = self.logprobs(merged)
        return self.reply.full("".join(d.text for d in deltas), last.finish, usage(last), lps,
                               spec_metrics(last, block_size))
