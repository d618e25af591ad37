"""The fast path's CPU kernels (engine/fast/kernels/cpu_kernels.c) against the torch reference, float32 and float64.

And end to end: the fast path on the CPU kernels decodes the greedy tokens of the torch path and the reference
engine (tests/test_engine_fast.py runs both paths through its main equality test).
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from dflash_bench.engine.fast.kernels import cpu_kernels as ck  # noqa: E402
from dflash_bench.engine.fast.models.decoder import attention, embed_norm, qk_rope, rms_norm, silu_mul, step_mask  # noqa: E402
from dflash_bench.engine.reference.rope import cos_sin, kernel_tables  # noqa: E402

pytestmark = [pytest.mark.engine,
              pytest.mark.skipif(ck.load() is None, reason="no C compiler builds the CPU kernels")]
DTYPES = [torch.float32, torch.float64]


def close(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 2, 5, 6, 7, 13, 97, 200])
def test_linear_over_packed_weights_matches_torch(dtype, m):
    """Every row count a step or a prefill gives (tiles of 6 rows, blocks of 96), strided rows, a bias."""
    torch.manual_seed(m)
    w, b = torch.randn(48, 40, dtype=dtype), torch.randn(48, dtype=dtype)
    x = torch.randn(m, 50, dtype=dtype)[:, 3:43]  # rows 50 apart
    packed = ck.pack(w)
    assert packed.shape == (48 // ck.PANEL[dtype], 40, ck.PANEL[dtype])
    torch.testing.assert_close(ck.linear(x, packed, b), F.linear(x, w, b), **close(dtype))
    torch.testing.assert_close(ck.linear(x, packed), F.linear(x, w), **close(dtype))
    odd = torch.randn(41, 40, dtype=dtype)  # rows that fill no whole panel: kept as they are, F.linear
    assert ck.pack(odd) is odd
    torch.testing.assert_close(ck.linear(x, odd), F.linear(x, odd))
    ids = torch.full((m, 3), -1)
    ck.linear_argmax(x, packed, ids[:, 1])  # a strided column, as the runner's drafts
    assert torch.equal(ids[:, 1], F.linear(x, w).argmax(-1)) and (ids[:, [0, 2]] == -1).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax_is_torchs_first_maximum(dtype):
    torch.manual_seed(3)
    x = torch.randn(2, 3, 4163, dtype=dtype)  # a tail past the vector width
    x[0, 1, 4162] = 50.0  # the max in the tail
    x[1, 0, 5] = x[1, 0, 3000] = 60.0  # a tie: the first wins
    assert torch.equal(ck.argmax(x), x.argmax(-1)) and ck.argmax(x)[1, 0] == 5
    tokens = torch.full((2, 4), -7)
    ck.argmax(x[:, :, :100], tokens[:, 1:])  # strided columns, as the runner's drafts
    assert torch.equal(tokens[:, 1:], x[:, :, :100].argmax(-1)) and (tokens[:, 0] == -7).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_norms_silu_and_embedding_match_torch(dtype):
    torch.manual_seed(0)
    w = torch.randn(100, dtype=dtype)  # not a multiple of the vector width
    h, a = torch.randn(5, 100, dtype=dtype), torch.randn(5, 100, dtype=dtype)
    s, y = ck.add_rms_norm(h, a, w, 1e-6)
    assert torch.equal(s, h + a)
    torch.testing.assert_close(y, rms_norm(h + a, w, 1e-6), **close(dtype))
    torch.testing.assert_close(ck.rms_norm(h, None, 1e-6), rms_norm(h, None, 1e-6), **close(dtype))
    gu = torch.randn(3, 2 * 70, dtype=dtype) * 4
    torch.testing.assert_close(ck.silu_mul(gu), silu_mul(gu), **close(dtype))
    emb = torch.randn(50, 100, dtype=dtype)
    tokens = torch.randint(0, 50, (3, 7))
    for args in ((tokens[:, 2:],), (tokens[:, 4], dict(scale=3.0, n=4, fill=49))):  # strided rows; the DFlash block
        ids, kw = args[0], (args[1] if len(args) > 1 else {})
        got = ck.embed_norm(ids, emb, w, 1e-6, **kw)
        want = embed_norm(None, ids if ids.dim() == 2 else ids[:, None], emb, w, 1e-6, **kw)
        for g, r in zip(got, want):
            torch.testing.assert_close(g, r, **close(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [True, False])
def test_qk_rope_store_matches_torch_and_writes_only_its_slots(dtype, norm):
    torch.manual_seed(1)
    t, H, hkv, hd = 6, 6, 2, 32
    qkv = torch.randn(t, (H + 2 * hkv) * hd, dtype=dtype)
    wqk = torch.randn(H + hkv, hd, dtype=dtype) if norm else None
    pos, rows = torch.tensor([3, 4, 5, 9, 0, 17]), torch.tensor([1, 1, 1, 2, 0, 2])
    inv = 1.0 / (1e4 ** (torch.arange(0, hd, 2).float() / hd))
    kc, vc = torch.zeros(3, 32, hkv, hd, dtype=dtype), torch.zeros(3, 32, hkv, hd, dtype=dtype)
    cos, sin = kernel_tables(torch.arange(32), inv, 0.9)
    q = ck.qk_rope_store(qkv, H, hkv, hd, cos, sin, rows, pos, kc, vc, wqk, 1e-6)

    class Ly:
        pass
    ly = Ly()
    ly.wqk = wqk
    rq, rk, rv = qk_rope(qkv, ly, H, hkv, hd, *cos_sin(pos, inv, dtype, 0.9), 1e-6)
    torch.testing.assert_close(q, rq, **close(dtype))
    torch.testing.assert_close(kc[rows, pos], rk, **close(dtype))
    assert torch.equal(vc[rows, pos], rv)
    written = torch.zeros(3, 32, dtype=torch.bool)
    written[rows, pos] = True
    assert not kc[~written].any() and not vc[~written].any()
    # the drafter's context: k/v only, read from a column slice of a wider matmul output
    wide = torch.cat([torch.randn(t, 5, dtype=dtype), qkv[:, H * hd:], torch.randn(t, 3, dtype=dtype)], 1)
    kc2, vc2 = torch.zeros_like(kc), torch.zeros_like(vc)
    assert ck.qk_rope_store(wide[:, 5:-3], 0, hkv, hd, cos, sin, rows, pos, kc2, vc2,
                            None if wqk is None else wqk[H:], 1e-6) is None
    torch.testing.assert_close(kc2, kc, **close(dtype))
    assert torch.equal(vc2, vc)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bs,n,causal,window", [(1, 1, True, None), (3, 1, True, None), (2, 5, True, None),
                                                 (3, 16, False, None), (2, 3, True, 7), (2, 6, False, 4),
                                                 (1, 16, True, None)])
def test_attention_matches_sdpa_over_the_masked_cache(dtype, bs, n, causal, window):
    """Each row reads only its keys (keys past them hold garbage: never read); tiles of 64 keys, odd counts of
    query rows (3 query heads per KV head), rows from a slot offset."""
    torch.manual_seed(bs * n)
    S, L, hkv, H, hd = 5, 160, 2, 6, 16
    kc, vc = torch.randn(S, L, hkv, hd, dtype=dtype), torch.randn(S, L, hkv, hd, dtype=dtype)
    starts = torch.tensor([130, 3, 70])[:bs]
    q = torch.randn(bs, n, H, hd, dtype=dtype)
    mask = step_mask(starts, n, L, H // hkv, dtype, causal=causal, window=window)
    want = attention(q, kc[1:1 + bs], vc[1:1 + bs], mask, 0.3)
    kc[1:1 + bs][torch.arange(L)[None, :] >= (starts + n)[:, None]] = float("nan")  # never read
    got = ck.decode_attention(q, kc, vc, starts, 1, L, 0.3, causal=causal, window=window)
    torch.testing.assert_close(got, want, **close(dtype))


@pytest.mark.parametrize("synthetic", [False, True])
def test_commit_matches_the_torch_commit(synthetic):
    from dflash_bench.engine.fast.running.accept import commit

    torch.manual_seed(2)
    S, bs, Bk = 8, 6, 5
    tokens = torch.randint(0, 50, (S, Bk + 1))  # anchor, then drafts: strided columns
    post = torch.randint(50, 100, (bs, Bk))
    for r, n in enumerate([0, 2, 4, 1, 4, 0]):
        post[r, :n] = tokens[r, 1:1 + n]
    state = dict(tokens=tokens, active=torch.tensor([1, 1, 0, 1, 1, 0, 1, 1]), start=torch.randint(1, 40, (S,)),
                 out=torch.zeros(S, Bk + 2, dtype=torch.long), step=torch.tensor([9, 9, 9, 9, 9, 8, 9, 9]))
    uniforms = torch.rand(7, S, Bk - 1)
    ref = {k: v.clone() for k, v in state.items()}

    def run(fn, d):
        synth = (uniforms, d["step"][:bs], 0.6) if synthetic else None
        fn(post, d["tokens"][:bs, 1:], d["active"][:bs], d["start"][:bs], d["tokens"][:bs, 0], d["out"][:bs, :Bk + 1],
           synth)
    run(commit, ref)
    run(ck.commit, state)
    for k in state:
        assert torch.equal(state[k], ref[k]), k
    assert (ref["out"][:bs, 0] > 0).any()


def test_load_kernels_picks_the_c_kernels_on_a_cpu(monkeypatch):
    from dflash_bench.engine.fast.kernels.selector import load_kernels
    from dflash_bench.errors import UserError

    cpu = torch.device("cpu")
    assert load_kernels(cpu, None, torch.float32).gemm is ck
    assert load_kernels(cpu, False, torch.float32) is None
    assert load_kernels(cpu, None, torch.bfloat16) is None  # the torch path
    with pytest.raises(UserError):
        load_kernels(cpu, "cpu", torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,causal", [(1, True), (6, True), (6, False)])
def test_attention_over_a_ring_cache(dtype, n, causal):
    """A sliding layer that keeps only its window: key k at row k % ring; a tile that wraps is read in two parts."""
    torch.manual_seed(n)
    S, L, hkv, H, hd, window = 4, 160, 2, 4, 16, 20
    ring = window + n + 3
    kc, vc = torch.randn(S, L, hkv, hd, dtype=dtype), torch.randn(S, L, hkv, hd, dtype=dtype)
    starts = torch.tensor([2, 40, 131])
    q = torch.randn(3, n, H, hd, dtype=dtype)
    mask = step_mask(starts, n, L, H // hkv, dtype, causal=causal, window=window)
    want = attention(q, kc[1:4], vc[1:4], mask, 0.3)
    rk, rv = (torch.full((S, ring, hkv, hd), float("nan"), dtype=dtype) for _ in range(2))
    for b, s in enumerate(starts.tolist()):
        for k in range(max(0, s + n - ring), s + n):
            rk[1 + b, k % ring], rv[1 + b, k % ring] = kc[1 + b, k], vc[1 + b, k]
    got = ck.decode_attention(q, rk, rv, starts, 1, L, 0.3, causal=causal, window=window, ring=ring)
    torch.testing.assert_close(got, want, **close(dtype))
