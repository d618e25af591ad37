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


def stream(tok, text, stop=(), chunk=1):
    ids = tok(text).input_ids
    d = Detokenizer(tok, list(stop))
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
