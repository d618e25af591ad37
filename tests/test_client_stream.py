"""The load generator's wire format without a server: the request body, and the stream parsers fed bytes and
events directly (split anywhere, cumulative or incremental, of the wrong shape)."""

from __future__ import annotations

import orjson
import pytest

from dflash_bench.client.protocol import RequestSettings, build_body


def test_request_body_sends_temperature_thinking_and_logprobs():
    s = RequestSettings(api="chat", model="m", max_tokens=7, temperature=0.0, save_token_ids=True, enable_thinking=False)
    body = orjson.loads(build_body(s, [{"role": "user", "content": "hi"}]))
    assert body["temperature"] == 0.0 and body["max_tokens"] == 7 and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["logprobs"] is True and body["top_logprobs"] == 2 and body["return_tokens_as_token_ids"] is True
    assert "ignore_eos" not in body
    gen = orjson.loads(build_body(RequestSettings(api="generate", max_tokens=5), [{"role": "user", "content": "x"}]))
    assert gen["sampling_params"] == {"max_new_tokens": 5, "temperature": 0.0} and gen["text"] == "x"
    plain = orjson.loads(build_body(RequestSettings(api="chat", model="m"), [{"role": "user", "content": "x"}]))
    assert "chat_template_kwargs" not in plain and "logprobs" not in plain


def test_raw_parser_is_indifferent_to_how_bytes_are_split():
    import asyncio
    import random

    from dflash_bench.client.protocol import Stream
    from dflash_bench.client.rawhttp import _Response

    events = [b'data: {"choices":[{"delta":{"role":"assistant","content":""}}],"usage":{"completion_tokens":0}}\n\n']
    events += [b'data: {"choices":[{"delta":{"content":" t%d"},"finish_reason":%s}],"usage":{"prompt_tokens":2,'
               b'"completion_tokens":%d}}\n\n' % (i, b'"stop"' if i == 5 else b"null", i) for i in range(1, 6)]
    events += [b'data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":5}}\n\n', b"data: [DONE]\n\n"]
    wire = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    wire += b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    loop = asyncio.new_event_loop()
    try:
        rng = random.Random(0)
        for sizes in ([len(wire)], [1] * len(wire), [rng.randint(1, 40) for _ in range(len(wire))]):
            st, r, pos = Stream("chat", False), _Response(None, loop.create_future(), "http://127.0.0.1/"), 0
            r.st = st
            for i, n in enumerate(sizes):  # the connection stops feeding a response once it is done
                r.feed(float(i), wire[pos:pos + n])
                pos += n
                if r.done or pos >= len(wire):
                    break
            assert wire[pos:] in (b"", b"\r\n", b"\n")  # at most the terminator's last CRLF is left
            assert r.done and r.status == 200 and st.done and st.error is None
            assert st.tokens == [1, 2, 3, 4, 5] and st.output_text() == " t1 t2 t3 t4 t5" and st.finish == "stop"
    finally:
        loop.close()


@pytest.mark.parametrize("incremental", [False, True])
def test_generate_events_cumulative_or_incremental(incremental: bool):
    from dflash_bench.client.protocol import Stream

    ids = [11, 12, 13, 14, 15]
    cuts = [1, 3, 5]
    st, prev = Stream("generate", True), 0
    for i, c in enumerate(cuts):
        part = ids[prev:c] if incremental else ids[:c]
        text = "".join(f" w{x}" for x in part)
        tops = [[[-0.1, x, None], [-2.0, x + 1, None]] for x in part]
        meta = {"completion_tokens": c, "prompt_tokens": 4, "output_top_logprobs": tops,
                "finish_reason": {"type": "length", "length": 5} if c == 5 else None}
        if c == 5:
            meta.update(spec_verify_ct=2, spec_accept_token_num=3)
        st.feed(float(i), orjson.dumps({"text": text, "output_ids": part, "meta_info": meta}))
        prev = c
    st.feed(9.0, b"[DONE]")
    assert st.ids == ids and [t[0][0] for t in st.tops] == ids and len(st.tops) == 5
    assert st.output_text() == "".join(f" w{x}" for x in ids)
    assert st.tokens == cuts and st.finish == "length" and (st.spec_steps, st.spec_accepted) == (2, 3)


@pytest.mark.parametrize("api,event", [
    ("chat", b'{"choices":[{"delta":{"content":"a"}}],"usage":[1]}'),  # usage not an object
    ("chat", b'{"choices":[{"delta":{"content":"a"},"logprobs":{"content":[{"logprob":-1}]}}]}'),  # no token
    ("generate", b'{"text":"a","output_ids":[1],"meta_info":{"completion_tokens":1,"output_top_logprobs":[[[1]]]}}'),
])
def test_an_event_of_the_wrong_shape_fails_the_request_not_the_cell(api: str, event: bytes):
    from dflash_bench.client.protocol import Stream

    st = Stream(api, True)
    st.feed(0.0, event)  # must not raise: a raise escapes the transport and aborts the whole cell
    assert st.error is not None and st.error.startswith("malformed SSE event")


def test_tokens_are_spread_by_characters_when_chunks_and_tokens_differ():
    from dflash_bench.client.protocol import Stream

    st = Stream("chat", False)
    for t, text in ((1.0, "ab"), (2.0, "abcdef"), (3.0, "ab")):  # 2 + 6 + 2 characters
        st.feed(t, orjson.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}))
    st.feed(4.0, orjson.dumps({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 10}}))
    st.finish_tokens()
    assert st.tokens == [2, 8, 10] and st.tokens_from == "text" and st.times == [1.0, 2.0, 3.0]
