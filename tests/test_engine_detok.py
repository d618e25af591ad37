"""Incremental detokenization: whole characters only, stop strings cut before they show."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from dflash_bench.engine.detok import Detokenizer  # noqa: E402
from dflash_bench.testing.tiny import make_tokenizer  # noqa: E402

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def stream(tok, text, stop=(), chunk=1, decoder=None):
    ids = tok(text).input_ids
    d = Detokenizer(decoder or tok, list(stop))
    out = []
    for i in range(0, len(ids), chunk):
        if d.add(ids[i : i + chunk]):
            break
        out.append(d.delta(final=False))
    d.flush()
    out.append(d.delta(final=True))
    return out


@pytest.mark.parametrize("chunk", [1, 3])
def test_multibyte_characters_never_split(tok, chunk):
    text = "héllo wörld ✓ 漢字 done"
    pieces = stream(tok, text, chunk=chunk)
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize("chunk", [1, 4])
def test_stop_string_cut_and_never_shown(tok, chunk):
    pieces = stream(tok, "héllo wörld and more", stop=["wör"], chunk=chunk)
    assert "".join(pieces) == "héllo "
    assert all("w" not in p for p in pieces)


class CountingTokenizer:
    """The tiny tokenizer, counting the ids each decode is given (no fast decoder of its own: `decode` is used)."""

    def __init__(self, tok):
        self.tok, self.ids = tok, 0

    def decode(self, ids, skip_special_tokens=False):
        self.ids += len(ids)
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)


def test_ids_that_make_no_text_leave_the_window(tok):
    """A random model's ids mostly lie outside a small tokenizer's vocabulary and decode to nothing; special tokens
    decode to nothing too. Each must leave the window at once: decoding n of them costs O(n) ids, not O(n^2),
    and the text around them comes out whole."""
    counting = CountingTokenizer(tok)
    special = tok.convert_tokens_to_ids("<|im_end|>")
    unknown = [len(tok) + 7 + i for i in range(400)]
    ids = tok("héllo").input_ids + unknown + [special] + tok(" wörld").input_ids
    d = Detokenizer(counting, [])
    out = []
    for t in ids:
        d.add([t])
        out.append(d.delta(final=False))
    d.flush()
    out.append(d.delta(final=True))
    assert "".join(out) == tok.decode(ids, skip_special_tokens=True) == "héllo wörld"
    assert counting.ids < 8 * len(ids)  # every id decoded a few times at most (was ~len(ids)^2 / 2)


def test_the_fast_decoder_gives_the_tokenizers_text(tok):
    text = "héllo wörld ✓ 漢字 done"
    counting = CountingTokenizer(tok)
    assert "".join(stream(tok, text)) == "".join(stream(tok, text, decoder=counting)) == text and counting.ids
