"""The fast path's Triton kernels (engine/fast/kernels/triton_ops.py) against the torch reference, in Triton's interpreter.

And end to end: the fast path with every kernel on (as on a GPU) decodes the same greedy tokens as the
reference engine, AR and DFlash alike, with the same acceptance.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("triton")
pytest.importorskip("transformers")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from dflash_bench.engine.fast.models.decoder import rms_norm  # noqa: E402
from dflash_bench.engine.reference.rope import cos_sin, kernel_tables, rope  # noqa: E402

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def ops():
    from dflash_bench.engine.fast.kernels import triton_ops

    return triton_ops


def test_add_rms_norm_and_silu_mul_match_torch(ops):
    torch.manual_seed(0)
    w = torch.randn(96)  # a width that is not a power of two
    h, a = torch.randn(5, 96), torch.randn(5, 96)
    s, y = ops.add_rms_norm(h, a, w, 1e-6)
    torch.testing.assert_close(s, h + a, rtol=0, atol=0)
    torch.testing.assert_close(y, rms_norm(h + a, w, 1e-6))
    gu = torch.randn(3, 2 * 1500)  # more than one 1024-wide block per row
    g, u = gu.chunk(2, -1)
    torch.testing.assert_close(ops.silu_mul(gu), F.silu(g) * u)


def test_rms_norm_without_residual_matches_torch(ops):
    torch.manual_seed(2)
    x, w = torch.randn(4, 96), torch.randn(96)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6), rms_norm(x, w, 1e-6))


def test_argmax_is_torchs_first_maximum_across_chunks(ops):
    torch.manual_seed(3)
    n = 2 * ops.ARGMAX_CHUNK + 123  # three chunks, the last one partial
    x = torch.randn(2, 3, n)
    x[0, 1, n - 1] = 50.0  # the max in the partial chunk
    x[1, 0, 5] = x[1, 0, ops.ARGMAX_CHUNK + 7] = 60.0  # a tie across chunks: the first wins
    x[1, 2, 100] = x[1, 2, 101] = 70.0  # a tie inside one chunk
    got = ops.argmax(x)
    assert got.dtype == torch.int64 and got.shape == (2, 3)
    assert torch.equal(got, x.argmax(-1))
    assert got[1, 0] == 5 and got[1, 2] == 100
    ties = torch.randint(-2, 2, (5, n)).to(torch.bfloat16)  # many equal maxima, bf16 logits
    assert torch.equal(ops.argmax(ties), ties.argmax(-1))


def test_argmax_writes_into_strided_columns_and_nothing_else(ops):
    torch.manual_seed(4)
    x = torch.randn(3, 5, 700)
    tokens = torch.full((3, 6), -7, dtype=torch.int64)  # the runner's rows: anchor, then five drafts
    ops.argmax(x, tokens[:, 1:])
    assert torch.equal(tokens[:, 1:], x.argmax(-1))
    assert (tokens[:, 0] == -7).all()  # the anchor column is left alone


def test_embed_norm_matches_the_gather_then_norm(ops):
    from dflash_bench.engine.fast.models.decoder import embed_norm

    torch.manual_seed(5)
    emb, w = torch.randn(50, 96), torch.randn(96)  # a width that is not a power of two
    tokens = torch.randint(0, 50, (3, 7))
    ids = tokens[:, 2:]  # strided rows, as the runner's token rows are
    h, x = ops.embed_norm(ids, emb, w, 1e-6)
    assert torch.equal(h, emb[ids.reshape(-1)])
    torch.testing.assert_close(x, rms_norm(emb[ids.reshape(-1)], w, 1e-6))
    for got, want in zip((h, x), embed_norm(None, ids, emb, w, 1e-6)):  # the torch path
        torch.testing.assert_close(got, want)
    # the DFlash block: each row's anchor, then the mask token, scaled (a Gemma drafter)
    h, x = ops.embed_norm(tokens[:, 4], emb, w, 1e-6, scale=3.0, n=4, fill=49)
    block = torch.stack([tokens[:, 4]] + [torch.full((3,), 49)] * 3, 1)
    ref = emb[block.reshape(-1)] * 3.0
    torch.testing.assert_close(h, ref)
    torch.testing.assert_close(x, rms_norm(ref, w, 1e-6))
    for got, want in zip((h, x), embed_norm(None, tokens[:, 4:5], emb, w, 1e-6, scale=3.0, n=4, fill=49)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("norm,group", [(True, 16), (False, 16), (True, 4), (False, 4)])
def test_qk_rope_store_matches_torch_and_writes_only_its_slots(ops, norm, group, monkeypatch):
    # 10 heads: in fours, a program holds query and key heads, and the last one two value heads and padding
    monkeypatch.setattr(ops, "ROPE_HEADS", group)
    torch.manual_seed(1)
    t, H, hkv, hd = 6, 6, 2, 32
    qkv = torch.randn(t, (H + 2 * hkv) * hd)
    wqk = torch.randn(H + hkv, hd) if norm else None
    pos = torch.tensor([3, 4, 5, 9, 0, 17])
    rows = torch.tensor([1, 1, 1, 2, 0, 2])
    inv = 1.0 / (1e4 ** (torch.arange(0, hd, 2).float() / hd))
    kc, vc = torch.zeros(3, 32, hkv, hd), torch.zeros(3, 32, hkv, hd)
    cos, sin = kernel_tables(torch.arange(32), inv, 0.9)  # tables by position
    q = ops.qk_rope_store(qkv, H, hkv, hd, cos, sin, rows, pos, kc, vc, wqk, 1e-6)

    qk = qkv[:, :(H + hkv) * hd].view(t, H + hkv, hd)
    if norm:
        qk = rms_norm(qk, None, 1e-6) * wqk
    qk = rope(qk, *cos_sin(pos, inv, torch.float32, 0.9))
    torch.testing.assert_close(q, qk[:, :H])
    torch.testing.assert_close(kc[rows, pos], qk[:, H:])
    torch.testing.assert_close(vc[rows, pos], qkv[:, (H + hkv) * hd:].view(t, hkv, hd))
    written = torch.zeros(3, 32, dtype=torch.bool)
    written[rows, pos] = True
    assert not kc[~written].any() and not vc[~written].any()

    # the drafter's context: k/v only, read from a column slice of a wider matmul output
    wide = torch.cat([torch.randn(t, 5), qkv[:, H * hd:], torch.randn(t, 3)], 1)
    kc2, vc2 = torch.zeros_like(kc), torch.zeros_like(vc)
    assert ops.qk_rope_store(wide[:, 5:-3], 0, hkv, hd, cos, sin, rows, pos, kc2, vc2,
                             None if wqk is None else wqk[H:], 1e-6) is None
    torch.testing.assert_close(kc2, kc)
    torch.testing.assert_close(vc2, vc)


@pytest.mark.parametrize("mode", ["match", "synthetic", "ar"])
def test_commit_matches_the_torch_commit_exactly(ops, mode):
    """The whole step commit in one launch leaves every buffer as the runner's torch commit does."""
    from dflash_bench.engine.fast.running.accept import commit
    from dflash_bench.synthetic import geometric_rate

    torch.manual_seed(2)
    S, bs, Bk = 8, 6, (1 if mode == "ar" else 5)  # bs < S: the kernel sees row slices of the buffers
    drafts = torch.randint(0, 50, (S, max(Bk - 1, 1)))
    want = torch.tensor([0, 2, Bk - 1, 1, Bk - 1, 0]).clamp(max=Bk - 1)  # drafts each row's target agrees with
    post = torch.randint(50, 100, (bs, Bk))  # never equal to a draft
    for r, n in enumerate(want.tolist()):
        post[r, :n] = drafts[r, :n]
    def column(v):  # the anchor is a column of the runner's token rows: strided
        rows = torch.zeros(S, 3, dtype=v.dtype)
        rows[:, 1] = v
        return rows[:, 1]
    state = dict(drafts=drafts, active=torch.tensor([1, 1, 0, 1, 1, 0, 1, 1]), start=torch.randint(1, 40, (S,)),
                 anchor=column(torch.randint(0, 100, (S,))), out=torch.randint(0, 9, (S, Bk + 1)))
    if mode == "synthetic":
        rate = geometric_rate(3.0, Bk)
        uniforms = torch.rand(7, S, Bk - 1)
        r32 = torch.tensor(rate, dtype=torch.float32)
        uniforms[9 % 7, :bs, 0] = torch.stack([r32, r32.nextafter(torch.tensor(0.0)), r32.nextafter(torch.tensor(1.0)),
                                               torch.tensor(0.0), torch.tensor(0.99), r32])  # rate rounds as in torch
        uniforms[9 % 7, 3] = 0.0  # a row that accepts every draft
        uniforms[8 % 7, 5] = 0.0  # row 5 is a step behind (its own counter): it reads table row 1
        state["step"] = torch.tensor([9, 9, 9, 9, 9, 8, 9, 9])  # the counters cycle past the table's rows
    state0 = {k: v.clone() for k, v in state.items()}
    ref = {k: column(v) if k == "anchor" else v.clone() for k, v in state.items()}
    rows = lambda d: [d[k][:bs] for k in ("drafts", "active", "start", "anchor", "out")]  # noqa: E731
    synth = lambda d: (uniforms, d["step"][:bs], rate) if mode == "synthetic" else None  # noqa: E731
    commit(post, *rows(ref), synth(ref))
    ops.commit(post, *rows(state), synth(state))
    for k in state:
        assert torch.equal(state[k], ref[k]), k
    acc = ref["out"][:bs, 0]
    if mode == "match":
        assert torch.equal(acc, want)
    if mode == "synthetic":
        assert acc[3] == acc[5] == Bk - 1 and acc[1] > 0 and acc[2] == 0 and acc[0] == 0
        assert torch.equal(ref["step"] - state0["step"], (torch.arange(S) < bs).long())  # each row's, once
    moved = ref["start"] - state0["start"]
    assert torch.equal(moved[:bs], (acc + 1) * state0["active"][:bs]) and not moved[bs:].any()


# ---- end to end: every kernel on, on real tiny models -------------------------------------------------
B, N, SLOTS, MAX_LEN = 6, 12, 2, 64


def test_fast_path_with_kernels_is_lossless(tmp_path):
    """Qwen3 (q/k norm); Llama's only difference, no q/k norm, is covered by the kernel test above."""
    pytest.importorskip("dflash_bench.engine.fast.kernels.triton_attn")
    from dflash_bench.engine.build import build
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.reference.decode import generate as ref_generate
    from dflash_bench.engine.fast.models.draft import FastDrafter
    from dflash_bench.engine.fast.models.dense import DenseTarget
    from dflash_bench.engine.fast.drive import generate
    from dflash_bench.engine.config import StepConfig
    from dflash_bench.engine.fast.core import EngineCore
    from dflash_bench.engine.fast.running.timer import StepTimer
    from dflash_bench.engine.sampling_params import SamplingParams
    from dflash_bench.testing.tiny import make_tiny_pair

    target, drafter = make_tiny_pair(tmp_path, arch="qwen3", seed=1, block_size=B, layers=2)
    ar = build(EngineConfig(str(target), mode="ar", max_slots=SLOTS, max_model_len=MAX_LEN, dtype="float32", device="cpu"))
    df = build(EngineConfig(str(target), str(drafter), mode="dflash", max_slots=SLOTS, max_model_len=MAX_LEN, dtype="float32", device="cpu"))
    rng = random.Random(0)
    words = "the cat sat on a mat while seven dogs ran past quickly".split()
    prompts = [ar.tok(" ".join(rng.choice(words) for _ in range(rng.randint(1, 8)))).input_ids for _ in range(2)]
    ref = [s.out for s in ref_generate(ar, prompts, SamplingParams(max_tokens=N, ignore_eos=True))]

    def runner(with_drafter: bool, kernels: bool) -> EngineCore:
        t = DenseTarget(df.target.model, max_slots=SLOTS, max_len=MAX_LEN, kernels=kernels)
        d = FastDrafter(df.proposer.drafter, t.embed, t.head, max_slots=SLOTS, max_len=MAX_LEN,
                        kernels=kernels) if with_drafter else None
        assert (t.kernels is not None) == kernels
        r = EngineCore(t, d, StepConfig(verify_width="full", kv_block=16))
        StepTimer().attach(r)
        return r

    assert generate(runner(False, True), prompts, N) == ref
    fast_df, plain_df = runner(True, True), runner(True, False)
    assert generate(fast_df, prompts, N) == ref
    generate(plain_df, prompts, N)
    assert fast_df.timer.tau == pytest.approx(plain_df.timer.tau)  # the kernels draft what the torch path drafts
