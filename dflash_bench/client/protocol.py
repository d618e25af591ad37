"""Request bodies and stream parsing for the three protocols the client speaks.

- `chat`: OpenAI `/v1/chat/completions` (vLLM, SGLang, builtin engine)
- `completions`: OpenAI `/v1/completions`
- `generate`: SGLang native `/generate` (cumulative events, `meta_info` with spec fields)

`Stream` is the per-request accumulator on the hot path: it is fed the bytes of each network read with the read's
arrival time (`feed_bytes`), parses every SSE `data:` line as it completes, and keeps only what the metrics need.
Every transport holds a server to the same limits (dflash_bench/http_limits.py): a line longer than MAX_LINE_BYTES
fails the request here, in `Stream.feed_bytes`, and a 200 answer that is not an event stream in one sentence
(`event_stream_refusal`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, TypedDict

import orjson

from dflash_bench.http_limits import MAX_LINE_BYTES

APIS = ("chat", "completions", "generate")
EVENT_STREAM = "text/event-stream"
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "generate": "/generate"}


class SavedIds(TypedDict):
    """A request's token ids and top-2 logprobs per position, as the record keeps them (RequestRecord)."""

    token_ids: list[int] | None
    top_logprobs: list[list[tuple[int, float]]] | None


@dataclass(frozen=True)
class RequestSettings:
    """What every request of a cell asks for (the body build_body sends)."""

    api: str = "chat"
    model: str = ""  # empty for `measure`: the first model the server lists at /v1/models
    max_tokens: int = 2048
    temperature: float = 0.0
    save_token_ids: bool = False
    enable_thinking: bool | None = None  # sent as chat_template_kwargs.enable_thinking when set
    seed: int | None = None
    ignore_eos: bool = False  # every request runs to max_tokens (engines compared on equal output lengths)
    # /generate and /v1/completions: the Hugging Face id or folder whose chat template renders prompts
    tokenizer: str | None = None
    render: Callable[[list[dict[str, str]]], str] | None = None  # /generate and /v1/completions: messages -> text


def build_body(s: RequestSettings, messages: list[dict[str, str]], max_tokens: int | None = None) -> bytes:
    """The JSON body of one streaming request. Temperature is always sent explicitly."""
    mt = max_tokens or s.max_tokens
    if s.api == "generate":
        sp: dict[str, Any] = {"max_new_tokens": mt, "temperature": s.temperature}
        if s.seed is not None:
            sp["sampling_seed"] = s.seed
        if s.ignore_eos:
            sp["ignore_eos"] = True
        text = s.render(messages) if s.render is not None else _flatten(messages)
        body: dict[str, Any] = {"text": text, "sampling_params": sp, "stream": True}
        if s.save_token_ids:
            body.update(return_logprob=True, top_logprobs_num=2)
        return orjson.dumps(body)
    body = {"model": s.model, "max_tokens": mt, "temperature": s.temperature, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    if s.seed is not None:
        body["seed"] = s.seed
    if s.ignore_eos:
        body["ignore_eos"] = True  # vLLM, SGLang, llama.cpp and the builtin engine all take it
    if s.api == "chat":
        body["messages"] = messages
        if s.enable_thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": s.enable_thinking}
        if s.save_token_ids:
            body.update(logprobs=True, top_logprobs=2, return_tokens_as_token_ids=True)
    else:
        body["prompt"] = s.render(messages) if s.render is not None else _flatten(messages)
        if s.save_token_ids:
            body.update(logprobs=2, return_tokens_as_token_ids=True)
    return orjson.dumps(body)


def _flatten(messages: list[dict[str, str]]) -> str:
    """Raw-text protocols without a renderer get the last user turn (the server applies no template)."""
    return messages[-1]["content"]


def chat_renderer(tokenizer: str, enable_thinking: bool | None) -> Callable[[list[dict[str, str]]], str]:
    """The model's own chat template (transformers, tokenizer files only: no torch), for SGLang /generate,
    which takes text the client has already templated. Raises ValueError with a sentence when it cannot."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ValueError("rendering the chat template for --api generate needs transformers "
                         "(pip install transformers), or use --api chat") from None
    try:
        tok = AutoTokenizer.from_pretrained(tokenizer)
    except (OSError, ValueError) as err:
        from dflash_bench.tokenizer import tokenizer_error

        raise ValueError(tokenizer_error(tokenizer, err, "to render the chat template")) from None
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"the tokenizer {tokenizer!r} has no chat template")
    kwargs: dict[str, Any] = {} if enable_thinking is None else {"enable_thinking": enable_thinking}

    def render(messages: list[dict[str, str]]) -> str:
        return str(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs))

    return render


def _tok_id(token: str) -> int:
    """vLLM's `token_id:123` (return_tokens_as_token_ids) -> 123."""
    return int(token.rpartition(":")[2])


def _entry_id(e: dict) -> int:
    """A chat logprobs entry's token id: llama.cpp gives it as `id` (its `token` is the text piece)."""
    return int(e["id"]) if "id" in e else _tok_id(e["token"])


class Stream:
    """What one streamed response said, fed event by event."""

    __slots__ = ("api", "want_ids", "times", "tokens", "t_first_byte", "t_first_token", "t_end", "pieces",
                 "text", "prompt_tokens", "output_tokens", "finish", "error", "done", "ids", "tops",
                 "spec_steps", "spec_accepted", "spec_drafted", "cached_tokens", "chars", "tokens_from", "t_write", "connect_s", "connect_wait_s", "connection",
                 "_abort_reason", "_tail", "_held")

    def __init__(self, api: str, want_ids: bool):
        self.api = api
        self.want_ids = want_ids
        self.times: list[float] = []
        self.tokens: list[int] = []  # cumulative output tokens after each token-carrying chunk
        self.t_first_byte: float | None = None
        self.t_first_token: float | None = None
        self.t_end: float | None = None
        self.pieces: list[str] = []
        self.text: str | None = None  # /generate: the cumulative text
        self.prompt_tokens: int | None = None
        self.output_tokens: int | None = None
        self.finish: str | None = None
        self.error: str | None = None
        self.done = False
        self.ids: list[int] = []  # filled only when want_ids
        self.tops: list[list[tuple[int, float]]] = []
        self.spec_steps: int | None = None
        self.spec_accepted: int | None = None
        self.spec_drafted: int | None = None  # llama.cpp timings.draft_n
        self.cached_tokens: int | None = None  # prompt tokens the server read from its prefix cache, where it says
        self.chars: list[int] = []  # cumulative characters after each content chunk that carried no usage
        self.tokens_from: str | None = None  # where `tokens` came from: "usage" or "text" (see finish_tokens)
        self.t_write: float | None = None  # when the transport wrote the request (after connecting)
        # A new connection's TCP handshake (SYN to SYN-ACK, the kernel's timing; None where not measured) and the
        # rest of the wait for it: the client's event loop handing the connected socket over (and name lookup).
        # `connection` says "new" or "reused" (None: the request never got a connection).
        self.connect_s: float | None = None
        self.connect_wait_s: float | None = None
        self.connection: str | None = None
        self._abort_reason: str | None = None  # what the server said when it aborted the request
        self._tail: list[bytes] = []  # the bytes of the line not yet ended, as read (joined once, at its end)
        self._held = 0  # their length

    def output_text(self) -> str:
        return self.text if self.text is not None else "".join(self.pieces)

    def saved_ids(self) -> SavedIds:
        """token_ids and top_logprobs for the record; both None when they were not asked for, or when the server
        reported ids for fewer tokens than it generated (llama.cpp sends logprobs for none of the accepted draft
        tokens): a partial list would read as a divergence at its end. One missing id is allowed: a final stop
        token some servers count but do not report."""
        ids = self.ids
        if not self.want_ids or (self.output_tokens is not None and len(ids) < self.output_tokens - 1):
            return {"token_ids": None, "top_logprobs": None}
        return {"token_ids": ids, "top_logprobs": self.tops}

    def feed_bytes(self, t: float, data: bytes) -> None:
        """Feed the bytes of one network read (at `t`): each line that ends here is parsed, the unended rest is held
        for the next read. Linear time (a byte is joined at most twice, whatever the line's length); a line longer
        than MAX_LINE_BYTES fails the request, so a server cannot grow the client's memory without end."""
        if self._tail or b"\n" not in data:
            if b"\n" not in data:
                if data:
                    self._tail.append(data)
                    self._held += len(data)
                    self._check_held()
                return
            self._tail.append(data)
            data = b"".join(self._tail)
            self._tail, self._held = [], 0
        rest = self.feed_lines(t, data)
        if rest:  # the common case, a read of whole events, holds nothing
            self._tail, self._held = [rest], len(rest)
            self._check_held()

    def _check_held(self) -> None:
        if self._held > MAX_LINE_BYTES and self.error is None:
            self.error = (f"stream line too long: the server sent more than {MAX_LINE_BYTES >> 20} MiB without a line "
                          "end, past the client's limit (MAX_LINE_BYTES)")
            self._tail, self._held = [], 0

    def feed_lines(self, t: float, buf: bytes) -> bytes:
        """Feed the SSE `data:` lines of `buf` that are complete (read at `t`); return the incomplete rest."""
        *lines, rest = buf.split(b"\n")
        if len(buf) > MAX_LINE_BYTES and any(len(line) > MAX_LINE_BYTES for line in lines):
            self._held = MAX_LINE_BYTES + 1  # one read that held a whole line past the limit
            self._check_held()
            return b""
        for line in lines:
            if line[:5] == b"data:":
                self.feed(t, line[5:].strip())
                if self.error:
                    break
        return rest

    def feed(self, t: float, payload: bytes) -> None:
        if payload == b"[DONE]":
            self.done = True
            self.t_end = t
            return
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self.error = f"malformed SSE event: {payload[:80].decode('utf-8', 'replace')!r}"
            return
        if not isinstance(obj, dict):
            self.error = f"malformed SSE event: {payload[:80].decode('utf-8', 'replace')!r}"
            return
        if obj.get("error"):
            err = obj["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            self.error = f"server error in stream: {str(msg)[:200]}"
            return
        try:  # an event of the wrong shape fails this request, never the cell (free when nothing raises)
            if self.api == "generate":
                self._feed_generate(t, obj)
            else:
                self._feed_openai(t, obj)
        except (AttributeError, KeyError, TypeError, ValueError, IndexError) as err:
            self.error = f"malformed SSE event: {type(err).__name__} {err} in {payload[:80].decode('utf-8', 'replace')!r}"
            return
        if self.finish == "abort" and self.error is None:  # a refusal inside a 200 stream (vLLM, SGLang)
            self.error = f"server aborted the request: {self._abort_reason or 'finish_reason abort'}"

    def _token_chunk(self, t: float, cum: int) -> None:
        if not self.tokens or cum > self.tokens[-1]:
            if self.t_first_token is None:
                self.t_first_token = t
            self.times.append(t)
            self.tokens.append(cum)

    def _feed_openai(self, t: float, obj: dict) -> None:
        usage = obj.get("usage")
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
            ct = usage.get("completion_tokens")
            if ct is not None:
                self.output_tokens = ct
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            if cached is not None:
                self.cached_tokens = int(cached)
        choices = obj.get("choices")
        if choices:
            c = choices[0]
            if self.api == "chat":
                d = c.get("delta") or {}
                piece = d.get("content")
                thought = d.get("reasoning") or d.get("reasoning_content")
            else:
                piece, thought = c.get("text"), None
            if piece:
                self.pieces.append(piece)
            if c.get("finish_reason"):
                self.finish = c["finish_reason"]
            lp = c.get("logprobs")
            if self.want_ids and lp:
                self._openai_ids(lp)
            if usage and usage.get("completion_tokens"):
                self._token_chunk(t, usage["completion_tokens"])
            elif not usage and (piece or thought):  # no per-chunk usage: keep the text's size (finish_tokens)
                if self.t_first_token is None:
                    self.t_first_token = t
                self.times.append(t)
                self.chars.append((self.chars[-1] if self.chars else 0) + len(piece or "") + len(thought or ""))
        elif usage:  # the trailing usage chunk
            spec = (obj.get("metrics") or {}).get("speculative_decoding")
            if spec:
                self.spec_steps = spec.get("num_spec_steps")
                self.spec_accepted = spec.get("num_accepted_draft_tokens")
            timings = obj.get("timings")  # llama.cpp: this response's drafts (draft_n, only where it drafted)
            if isinstance(timings, dict) and timings.get("draft_n") is not None:
                self.spec_drafted = int(timings["draft_n"])
                self.spec_accepted = int(timings.get("draft_n_accepted") or 0)

    def finish_tokens(self) -> None:
        """Cumulative tokens per chunk once the stream ended. Without per-chunk usage, the final usage
        total is spread over the chunks by the characters each carried (one token per chunk when the
        counts match), as vLLM's bench serve and guidellm derive per-token latency from text."""
        if self.tokens:
            self.tokens_from = "usage"
            return
        n, chars = self.output_tokens, self.chars
        if not n or not chars or len(chars) != len(self.times):
            return
        if len(chars) == n:
            self.tokens = list(range(1, n + 1))
        else:
            total = chars[-1] or 1
            cum: list[int] = []
            prev = 0
            for c in chars:
                prev = max(prev, min(n, round(n * c / total)), 1 if not cum else 0)
                cum.append(prev)
            cum[-1] = n
            self.tokens = cum
        self.tokens_from = "text"

    def _openai_ids(self, lp: dict) -> None:
        if self.api == "chat":
            for e in lp.get("content") or ():
                self.ids.append(_entry_id(e))
                self.tops.append([(_entry_id(x), x["logprob"]) for x in (e.get("top_logprobs") or ())][:2])
        else:
            for tok, top in zip(lp.get("tokens") or (), lp.get("top_logprobs") or ()):
                self.ids.append(_tok_id(tok))
                self.tops.append([(_tok_id(k), v) for k, v in (top or {}).items()][:2])

    def _feed_generate(self, t: float, obj: dict) -> None:
        meta = obj.get("meta_info") or {}
        ct = meta.get("completion_tokens")
        self.prompt_tokens = meta.get("prompt_tokens", self.prompt_tokens)
        ids = obj.get("output_ids")
        # each event is cumulative (SGLang's default) or incremental (--incremental-streaming-output):
        # cumulative when it carries as many ids as completion_tokens says were made so far
        cumulative = ids is not None and ct is not None and len(ids) == ct
        if ct is not None:
            self.output_tokens = ct
            text = obj.get("text") or ""
            self.text = text if cumulative or ids is None else (self.text or "") + text
            if ct:
                self._token_chunk(t, ct)
        if self.want_ids and ids is not None:
            if cumulative:
                self.ids[:] = ids
            else:
                self.ids.extend(ids)
            tops = meta.get("output_top_logprobs")
            if tops:
                rows = [[(int(x[1]), float(x[0])) for x in pos[:2]] for pos in tops]
                if len(rows) == len(self.ids):
                    self.tops[:] = rows
                else:
                    self.tops.extend(rows)
        fr = meta.get("finish_reason")
        if fr:
            self.finish = fr.get("type") if isinstance(fr, dict) else str(fr)
            if isinstance(fr, dict) and fr.get("message"):  # SGLang says why it aborted (e.g. DFLASH + logprobs)
                self._abort_reason = str(fr["message"])[:200]
        if meta.get("cached_tokens") is not None:
            self.cached_tokens = int(meta["cached_tokens"])
        if meta.get("spec_verify_ct") is not None:
            self.spec_steps = meta["spec_verify_ct"]
            self.spec_accepted = meta.get("spec_accept_token_num", meta.get("spec_accepted_drafts"))


def event_stream_refusal(content_type: str | None) -> str | None:
    """Why a 200 answer to a streamed request is not one (an HTML page, a JSON body), named by its Content-Type;
    None for an event stream, or an answer that names no type (then its lines are read, and judged as they come)."""
    if content_type is None or content_type.strip().lower().startswith(EVENT_STREAM):
        return None
    return (f"not an event stream: the server answered 200 with Content-Type {content_type.strip()[:80]!r}, where a "
            f"streamed request needs {EVENT_STREAM}")


def error_message(status: int, body: bytes) -> str:
    """One line for an HTTP error response: the server's own message where its JSON body has one."""
    msg = body[:300].decode("utf-8", "replace")
    try:
        obj = orjson.loads(body)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        msg = (err.get("message") if isinstance(err, dict) else None) or msg
    except (orjson.JSONDecodeError, AttributeError):
        pass
    return f"HTTP {status}: {str(msg)[:200]}"
