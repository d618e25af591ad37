"""The Triton split-K decode attention (engine/fast/kernels/triton_attn) equals decoder.attention + step_mask.

Runs in Triton's interpreter on the CPU (conftest sets TRITON_INTERPRET=1). The cache is random beyond
every row's valid keys and beyond L, so a kernel that reads or keeps one key too many (or too few) fails.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from dflash_bench.engine.fast.models.decoder import attention, step_mask  # noqa: E402

pytestmark = pytest.mark.engine


def _kernel():
    from dflash_bench.engine.fast.kernels import triton_attn

    return triton_attn


def _case(bs, n, H, hkv, hd, starts, row0, L, *, slots=None, max_len=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    slots = slots or row0 + bs + 1
    max_len = max_len or L + 24
    q = torch.randn(bs, n, H, hd, generator=g).to(dtype)
    kc = torch.randn(slots, max_len, hkv, hd, generator=g).to(dtype)
    vc = torch.randn(slots, max_len, hkv, hd, generator=g).to(dtype)
    return q, kc, vc, torch.tensor(starts, dtype=torch.int64)


def _reference(q, kc, vc, starts, row0, L, scale, *, causal, window=None):
    bs, n, H, _ = q.shape
    mask = step_mask(starts, n, L, H // kc.shape[2], q.dtype, causal=causal, window=window)
    return attention(q, kc[row0:row0 + bs, :L], vc[row0:row0 + bs, :L], mask, scale)


def _check(bs, n, H, hkv, hd, starts, row0, L, *, causal, window=None, dtype=torch.float32, tol=1e-5, splits=None):
    ta = _kernel()
    q, kc, vc, st = _case(bs, n, H, hkv, hd, starts, row0, L, dtype=dtype)
    scale = hd ** -0.5
    with pytest.MonkeyPatch.context() as mp:
        if splits is not None:  # the case is meant to exercise this many splits
            mp.setattr(ta, "num_splits", lambda *a, **k: splits)
        out = ta.decode_attention(q, kc, vc, st, row0, L, scale, causal=causal, window=window)
    ref = _reference(q.float(), kc.float(), vc.float(), st, row0, L, scale, causal=causal, window=window)
    assert out.shape == (bs * n, H * hd) and out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)
    counters = ta._COUNTERS.get(q.device)  # every merging program left its counter at 0 for the next call
    assert counters is None or not counters.any()


def test_ar_one_token_gqa4_ragged_over_splits():
    # 4 splits of L = 256; row 0 fills only the first split (the others are empty partials), row 2 ends on
    # a tile boundary (its last key is 191, the start of tile 3 is not read), row 1 is one key into tile 3.
    _check(3, 1, 8, 2, 64, [5, 192, 190], 1, 256, causal=True, splits=4)


@pytest.mark.parametrize("causal", [True, False])
def test_block_ragged_starts(causal):
    # n = 8, rep 4 (M = 32), hd 32; start + n lands on 8, 45, 108, 128 (a tile edge) and 129 (one past)
    _check(5, 8, 8, 2, 32, [0, 37, 100, 120, 121], 2, 192, causal=causal, splits=3)


@pytest.mark.parametrize("causal", [True, False])
def test_dflash_block_rep1_hd64(causal):
    _check(2, 16, 2, 2, 64, [64 - 16, 150], 0, 256, causal=causal)


@pytest.mark.parametrize("causal", [True, False])
def test_sliding_window(causal):
    # window 50: row 1 and 2 lose the keys more than 49 positions back (a split range starting past 0)
    _check(3, 8, 4, 1, 32, [0, 70, 230], 1, 320, causal=causal, window=50)


def test_last_split_resets_its_counter_for_the_next_call():
    # The split program that arrives last merges and zeroes its (b, kv_head, row block) counter; one left
    # non-zero would make the next call (or graph replay) merge nothing, leaving its output unwritten.
    ta = _kernel()
    bs, n, H, hkv, hd, row0, L = 2, 4, 8, 2, 32, 1, 384
    assert ta.num_splits(L, bs * hkv) == 3  # 4 heads x 4 tokens: one row block of 16 rows
    for seed, starts in [(1, [30, 200]), (2, [250 - n, 64])]:
        q, kc, vc, st = _case(bs, n, H, hkv, hd, starts, row0, L, seed=seed)
        out = ta.decode_attention(q, kc, vc, st, row0, L, 0.2, causal=True)
        torch.testing.assert_close(out, _reference(q, kc, vc, st, row0, L, 0.2, causal=True), rtol=1e-5, atol=1e-5)
    assert not ta._COUNTERS[q.device].any()


@pytest.mark.parametrize("bs,n,counters", [(2, 1, 3), (1, 16, 7)])
def test_more_programs_than_counters_are_refused(monkeypatch, bs, n, counters):
    # bs x 2 KV heads x row blocks (n = 16 at rep 4: 64 rows per KV head, 4 blocks) counters are needed
    ta = _kernel()
    monkeypatch.setattr(ta, "_MAX_COUNTERS", counters)
    q, kc, vc, st = _case(bs, n, 8, 2, 16, [100] * bs, 0, 384)  # split: counters are used
    with pytest.raises(ValueError, match="counters"):
        ta.decode_attention(q, kc, vc, st, 0, 384, 0.25, causal=True)
    monkeypatch.setattr(ta, "_MAX_COUNTERS", counters + 1)  # exactly enough
    monkeypatch.setattr(ta, "_COUNTERS", {})  # allocated at that size for this test only
    ta.decode_attention(q, kc, vc, st, 0, 384, 0.25, causal=True)


def test_single_split_writes_the_output_directly():
    _check(3, 8, 4, 1, 16, [0, 20, 56], 0, 64, causal=True, splits=1)
    _check(3, 8, 4, 1, 16, [0, 20, 56], 0, 64, causal=False, window=7, splits=1)


@pytest.mark.parametrize("splits", [1, 2])
@pytest.mark.parametrize("causal,window", [(True, None), (False, None), (True, 100)])
def test_several_tiles_per_split(monkeypatch, splits, causal, window):
    # A large batch gets few splits of a long L; forced here so one program loops over up to 4 tiles
    # (the running max and sum are rescaled as later tiles raise the max).
    ta = _kernel()
    monkeypatch.setattr(ta, "num_splits", lambda *a, **k: splits)
    _check(3, 4, 4, 2, 32, [0, 95, 250], 1, 256, causal=causal, window=window)


@pytest.mark.parametrize("splits", [1, 3])  # 3: bfloat16 keeps its partial sums in bfloat16, float16 in float32
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision(dtype, splits):
    _check(2, 4, 8, 2, 32, [3, 130], 1, 192, causal=True, dtype=dtype, tol=2e-2, splits=splits)


def test_a_gpu_without_the_shared_memory_for_128_key_tiles_gets_64(monkeypatch):
    ta = _kernel()
    real, tiles = ta._split_kernel, []

    class Refusing:  # what Triton raises at the first launch when the tiles do not fit
        def __getitem__(self, grid):
            def launch(*args, **kw):
                tiles.append(kw["BLOCK_N"])
                if kw["BLOCK_N"] > 64:
                    raise ta.triton.runtime.errors.OutOfResources(300000, 232448, "shared memory")
                return real[grid](*args, **kw)
            return launch
    monkeypatch.setattr(ta, "_split_kernel", Refusing())
    monkeypatch.setattr(ta, "_SMALL_TILES", set())
    for _ in range(2):
        _check(2, 4, 8, 2, 32, [3, 130], 1, 192, causal=True)
    assert tiles == [128, 64, 64]  # refused once, then 64-key tiles straight away


def test_strided_q_as_qk_rope_returns_it():
    # qk_rope hands attention q = qk[:, :H] of [t, H + Hkv, hd]: not contiguous, last axis unit-stride
    ta = _kernel()
    bs, n, H, hkv, hd, L = 2, 4, 4, 2, 32, 128
    q, kc, vc, st = _case(bs, n, H, hkv, hd, [10, 90], 0, L)
    qk = torch.cat([q.view(bs * n, H, hd), torch.randn(bs * n, hkv, hd)], 1)
    q_view = qk[:, :H].view(bs, n, H, hd)
    assert not q_view.is_contiguous()
    out = ta.decode_attention(q_view, kc, vc, st, 0, L, 0.3, causal=True)
    torch.testing.assert_close(out, _reference(q, kc, vc, st, 0, L, 0.3, causal=True), rtol=1e-5, atol=1e-5)


def test_grids_past_one_wave_take_64_key_tiles(monkeypatch):
    ta = _kernel()
    real, tiles = ta._split_kernel, []

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                tiles.append(kw["BLOCK_N"])
                return real[grid](*args, **kw)
            return launch
    monkeypatch.setattr(ta, "_split_kernel", Spy())
    _check(2, 4, 8, 2, 32, [3, 130], 1, 192, causal=True)  # 4 programs on a 132-SM GPU: one wave
    monkeypatch.setattr(ta, "sm_count", lambda device: 3)  # the same 4 programs on a 3-SM GPU: two waves
    _check(2, 4, 8, 2, 32, [3, 130], 1, 192, causal=True)
    assert tiles == [128, 64]


def test_num_splits_aims_at_one_program_per_sm():
    ta = _kernel()
    assert ta.num_splits(640, 8) == 5  # bs 1, Hkv 8, one token: 128 keys a split
    assert ta.num_splits(256, 8) == ta.num_splits(256, 32) == 1  # two tiles in one program beat a merge
    assert ta.num_splits(4096, 8) == ta.MAX_SPLITS  # the serial merge caps it
    assert ta.num_splits(4096, 8 * 4) == 4  # a 16-token block: 4 row blocks per KV head, 132 SMs
    assert ta.num_splits(4096, 8 * 8) == 2  # batch 8, one token
    assert ta.num_splits(768, 8 * 8 * 4) == 1  # batch 8 of 16-token blocks fills the GPU unsplit
    assert ta.num_splits(100, 8) == 1  # fewer than 128 keys
    assert ta.num_splits(4096, 8, sms=16) == 2  # a smaller GPU
    assert ta.num_splits(32, 1) == 1


def test_a_dflash_block_runs_as_row_blocks_of_16(monkeypatch):
    # Qwen3-8B heads (rep 4) at 16 tokens: 64 rows per KV head -> 4 programs of 16 rows per KV head and split
    ta = _kernel()
    seen = []
    monkeypatch.setattr(ta, "num_splits", lambda *a: seen.append(a) or 3)
    _check(1, 16, 32, 8, 16, [200], 0, 256, causal=True)
    assert seen == [(256, 8 * 4, 132)]


ROW_BLOCK_SHAPES = pytest.mark.parametrize("n,H,hkv", [(16, 8, 2), (12, 4, 2), (8, 6, 2)])


@ROW_BLOCK_SHAPES
@pytest.mark.parametrize("causal,window", [(True, None), (False, None), (True, 40), (False, 9)])
def test_several_row_blocks_over_splits(n, H, hkv, causal, window):
    # rep * n = 64 (4 full row blocks) or 24 (16 + 8: the second block ends half-padded; with n = 12 the
    # first block stops 4 tokens into head 1 and the second takes the rest of it). The interpreter runs one
    # program at a time, all splits of a row block in a row, so only a GPU would show row blocks sharing a
    # counter; test_more_programs_than_counters_are_refused checks that each gets its own.
    _check(3, n, H, hkv, 32, [0, 61, 170], 1, 256, causal=causal, window=window, splits=3)


@ROW_BLOCK_SHAPES
@pytest.mark.parametrize("causal,window", [(True, None), (False, 9)])
def test_several_row_blocks_direct(n, H, hkv, causal, window):
    _check(3, n, H, hkv, 32, [0, 61, 170], 1, 256, causal=causal, window=window, splits=1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_several_row_blocks_half_precision(dtype):
    _check(2, 16, 8, 2, 32, [5, 140], 0, 192, causal=False, dtype=dtype, tol=2e-2, splits=2)


def test_float64_and_bad_shapes_are_refused():
    ta = _kernel()
    q, kc, vc, st = _case(1, 1, 4, 2, 16, [0], 0, 64)
    with pytest.raises(ValueError, match="float32"):
        ta.decode_attention(q.double(), kc.double(), vc.double(), st, 0, 64, 0.25, causal=True)
    with pytest.raises(ValueError, match="power-of-two"):
        ta.decode_attention(q[..., :12], kc[..., :12], vc[..., :12], st, 0, 64, 0.25, causal=True)


def _ring(cache, starts, n, row0, ring, fill=float("nan")):
    """A sliding layer's ring of `ring` rows: key k of slot row0 + b at row k % ring for the newest `ring` keys of
    each row (up to starts[b] + n), NaN elsewhere (never read)."""
    out = torch.full((cache.shape[0], ring, *cache.shape[2:]), fill, dtype=cache.dtype)
    for b, s in enumerate(starts.tolist()):
        for k in range(max(0, s + n - ring), s + n):
            out[row0 + b, k % ring] = cache[row0 + b, k]
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("hd", [32, 512])
def test_a_ring_cache_of_a_sliding_window_reads_what_the_full_cache_holds(causal, hd):
    """Gemma 4's sliding layers keep only their window (ring of window + block rows, key k at k % ring); 512: the
    head size of its full layers. Rows start before, at and past one ring, their windows wrap around it."""
    ta = _kernel()
    bs, n, H, hkv, row0, L, window = 3, 6, 4, 2, 1, 192, 20
    ring = window + n + 2
    q, kc, vc, st = _case(bs, n, H, hkv, hd, [3, 22, 150], row0, L)
    scale = hd ** -0.5
    ref = _reference(q, kc, vc, st, row0, L, scale, causal=causal, window=window)
    out = ta.decode_attention(q, _ring(kc, st, n, row0, ring), _ring(vc, st, n, row0, ring), st, row0, L, scale,
                              causal=causal, window=window, ring=ring)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_head_dim_512_takes_narrower_tiles(monkeypatch):
    """Gemma 4's full layers (head size 512, 4 KV heads, 8 query heads each): 32-key tiles in two stages."""
    ta = _kernel()
    real, seen = ta._split_kernel, []

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen.append((kw["BLOCK_N"], kw["num_stages"]))
                return real[grid](*args, **kw)
            return launch
    monkeypatch.setattr(ta, "_split_kernel", Spy())
    _check(2, 2, 8, 1, 512, [40, 300], 0, 384, causal=True, splits=2)
    assert seen == [(32, 2)]
