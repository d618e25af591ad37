"""Gemma 4's fused Triton kernels (engine/fast/kernels/triton_gemma.py) against the fast path's torch ops, in Triton's
interpreter: the q/k/v norms + RoPE + cache write of sliding layers (a ring shorter than the positions, its spare
row) and full ones (proportional partial rotary, the key as the value), and GeGLU; then GemmaTarget's forward
with them against its torch path.
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")
pytest.importorskip("transformers")

import torch  # noqa: E402

from dflash_bench.engine.fast.models import gemma, cache_layout as layout  # noqa: E402
from dflash_bench.engine.reference.rope import cos_sin  # noqa: E402

pytestmark = pytest.mark.engine
MARGIN, MAX_LEN = 4, 64  # the sliding layers' ring: window 8 + 4 rows, so a step's positions wrap it


def _model():
    from transformers import AutoModelForCausalLM

    from dflash_bench.testing.tiny import _target_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_target_config("gemma4", 3, 64), dtype=torch.float32)
    with torch.no_grad():  # norm weights that are not all one: a dropped or swapped weight shows
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.uniform_(-1.5, -0.5)
        for i, layer in enumerate(model.model.layers):
            layer.layer_scalar.fill_(0.7 + 0.2 * i)
    return model.eval()


@pytest.fixture(scope="module")
def model():
    return _model()


def _target(model, kernels):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(layout, "RING_MARGIN", MARGIN)
        return gemma.GemmaTarget(model, max_slots=4, max_len=MAX_LEN, kernels=kernels)


@pytest.fixture(scope="module")
def target(model):
    t = _target(model, True)
    assert t.fused is not None  # the Triton path runs the fused kernels
    return t


def test_the_tiny_target_has_both_kinds_of_rope_and_a_short_ring(target):
    sliding, full = target.kinds
    assert sliding.ring == 8 + MARGIN and full.ring == 0 and target.layers[2].kind == 1
    assert (sliding.inv_freq > 0).all()  # full rotary
    assert int((full.inv_freq == 0).sum()) == full.hd // 2 * 3 // 4  # proportional, 0.25 of the head rotated


def _place(p: int, end: int, ring: int) -> int:
    """Where key position p goes, written out: its position, or in a ring p % ring if it is one of the ring's
    newest below the row's end, else the spare last row."""
    if not ring:
        return p
    return p % ring if end - ring <= p < end else ring


CASES = [(kind, bs, n) for kind in (0, 1) for bs in (1, 3) for n in (1, 5, 16)]


@pytest.mark.parametrize("kind,bs,n", CASES, ids=[f"{'full' if k else 'sliding'}-bs{b}-n{n}" for k, b, n in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_qkv_norm_rope_store_matches_the_torch_path(target, kind, bs, n, dtype):
    """q equals the torch path's (norm, RoPE with the kind's table), and the cache holds exactly the step's keys
    (normed, rotated) and values (normed, not rotated) where `attend` puts them; every other row is untouched."""
    from dflash_bench.engine.fast.kernels import triton_gemma

    g, ly = target.kinds[kind], next(ly for ly in target.layers if ly.kind == kind)
    H, hkv, hd = target.H, g.hkv, g.hd
    gen = torch.Generator().manual_seed(100 * kind + 10 * bs + n)
    qkv = torch.randn(bs * n, (H + 2 * hkv) * hd, generator=gen).to(dtype)
    if kind == 1:  # attention_k_eq_v: the value columns are the raw key (the key's weights twice)
        qkv[:, (H + hkv) * hd:] = qkv[:, H * hd:(H + hkv) * hd]
    starts = torch.tensor([7, 30, 41][:bs])  # past the ring: its rows wrap
    pos = starts[:, None] + torch.arange(n)
    pad = torch.tensor([0, min(3, n - 1), n - 1][:bs])  # a prefill's padding past a row's end (kept out of the ring)
    ends = starts + n - pad
    slots = torch.tensor([2, 0, 3][:bs])
    rows = slots[:, None].expand(bs, n)
    places = g.ring + 1 if g.ring else MAX_LEN
    kc, vc = (torch.randn(4, places, hkv, hd, generator=gen).to(dtype) for _ in range(2))
    want_k, want_v = kc.clone(), vc.clone()

    at = gemma.ring_at(pos, ends, g.ring) if g.ring else pos
    cos, sin = target.tables[kind]
    q = triton_gemma.qkv_norm_rope_store(qkv, H, hkv, hd, ly.qn.to(dtype), ly.kn.to(dtype), cos, sin,
                                         rows.reshape(-1), pos.reshape(-1), at.reshape(-1), kc, vc, target.eps)

    rc, rs = cos_sin(pos.reshape(-1), g.inv_freq, dtype, g.rope_scale)
    wq, wk, wv = gemma.qkv_torch(qkv, H, hkv, hd, ly.qn.to(dtype), ly.kn.to(dtype), target.eps, rc, rs)
    tol = dict(rtol=0.02, atol=0.02) if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(q, wq, **tol)
    for b in range(bs):
        for j in range(n):
            p = int(pos[b, j])
            place = _place(p, int(ends[b]), g.ring)
            if place != g.ring or not g.ring:  # the spare row takes any of its keys: not compared
                want_k[slots[b], place] = wk[b * n + j]
                want_v[slots[b], place] = wv[b * n + j]
    if g.ring:
        kc[:, g.ring], vc[:, g.ring] = want_k[:, g.ring], want_v[:, g.ring]
    torch.testing.assert_close(kc, want_k, **tol)
    torch.testing.assert_close(vc, want_v, **tol)


def test_gelu_mul_matches_the_torch_path():
    from dflash_bench.engine.fast.kernels import triton_gemma

    gu = torch.randn(3, 2 * 1500, generator=torch.Generator().manual_seed(1)) * 3  # more than one 1024 block a row
    torch.testing.assert_close(triton_gemma.gelu_mul(gu), gemma.gelu_mul(gu))
    half = gu.to(torch.bfloat16)
    torch.testing.assert_close(triton_gemma.gelu_mul(half), gemma.gelu_mul(half), rtol=0.02, atol=0.02)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("scalar", [1.0, 0.85])
def test_norm_add_norm_is_the_norms_and_add_it_replaces(dtype, scalar):
    """Bit for bit what the Triton path ran before: rms_norm, then add_rms_norm (or torch's `(h + m) * scalar`
    and rms_norm), on a width that is not a power of two."""
    from dflash_bench.engine.fast.kernels import triton_gemma, triton_ops

    gen = torch.Generator().manual_seed(3)
    h, a = (torch.randn(3, 96, generator=gen).to(dtype) for _ in range(2))
    wa, wn = (torch.rand(96, generator=gen).to(dtype) + 0.5 for _ in range(2))
    m = triton_ops.rms_norm(a, wa, 1e-6)
    if scalar == 1.0:
        want = triton_ops.add_rms_norm(h, m, wn, 1e-6)
    else:
        s = (h + m) * scalar
        want = (s, triton_ops.rms_norm(s, wn, 1e-6))
    got = triton_gemma.norm_add_norm(h, a, wa, wn, 1e-6, scalar)
    # the interpreter rounds to bfloat16 otherwise than torch: each torch op in the reference may differ by a rounding
    tol = dict(rtol=2 ** -6, atol=2 ** -6) if dtype == torch.bfloat16 and scalar != 1.0 else dict(rtol=0, atol=0)
    torch.testing.assert_close(got, want, **tol)


def test_target_forward_with_the_fused_kernels_equals_its_torch_path(model, target):
    """A batched prefill of prompts longer than the ring (one padded), then decode steps of 1 and 3 tokens: the
    logits and every layer's cache equal GemmaTarget's torch path."""
    ref = _target(model, False)
    assert ref.fused is None
    for t in (target, ref):
        for g in t.kinds:
            for c in g.k + g.v:
                c.zero_()
    lens = [20, 14, 17]
    n = max(lens)
    ids = torch.randint(0, 256, (3, n), generator=torch.Generator().manual_seed(2))
    slot, starts, last = torch.tensor([0, 1, 2]), torch.zeros(3, dtype=torch.long), torch.tensor(lens) - 1
    last = last + torch.arange(3) * n  # each row's last prompt token in the flattened rows
    out = [t.forward(ids, starts, 0, n, slot=slot, last=last, last_only=True)[0] for t in (target, ref)]
    torch.testing.assert_close(out[0], out[1])
    steps = [(torch.tensor([[5], [6], [7]]), torch.tensor(lens)),
             (torch.tensor([[8, 9, 10], [11, 12, 13], [14, 15, 16]]), torch.tensor(lens) + 1)]
    for step, at in steps:
        out = [t.forward(step, at, 0, int(at.max()) + step.shape[1])[0] for t in (target, ref)]
        torch.testing.assert_close(out[0], out[1])
    for g, r in zip(target.kinds, ref.kinds, strict=True):
        for c, rc in zip(g.k + g.v, r.k + r.v, strict=True):
            keep = c[:, :-1] if g.ring else c  # the ring's spare row holds whichever padding key came last
            torch.testing.assert_close(keep, rc[:, :-1] if g.ring else rc)


@pytest.mark.parametrize("kernels", [False, True], ids=["torch", "fused"])
def test_a_packed_prefill_equals_the_padded_one(model, kernels, monkeypatch):
    """An eager prefill whose matmuls leave the padding out (`packed`: the real tokens of prompts padded to the
    longest, one past the ring) gives the padded forward's logits and tapped layers at every real token, and the
    decode steps after it read the same caches."""
    plain, packed = _target(model, kernels), _target(model, kernels)
    assert packed.packs
    lens = [20, 9, 14]
    n = max(lens)
    ids = torch.randint(0, 256, (3, n), generator=torch.Generator().manual_seed(4))
    slot, starts = torch.tensor([0, 1, 2]), torch.zeros(3, dtype=torch.long)
    last = torch.tensor(lens) - 1 + torch.arange(3) * n
    real = torch.tensor([i * n + j for i, m in enumerate(lens) for j in range(m)])
    rows_set_back = []  # the packed forward's layers ran over the real tokens alone
    monkeypatch.setattr(gemma, "padded", lambda t, p, total, put=gemma.padded: rows_set_back.append(t.shape[0])
                        or put(t, p, total))
    got = [t.forward(ids, starts, 0, n, slot=slot, last=last, last_only=True, taps=(0, 2), packed=p)
           for t, p in ((plain, None), (packed, real))]
    assert rows_set_back and set(rows_set_back) == {sum(lens)}
    torch.testing.assert_close(got[1][0], got[0][0])
    feats = [f.reshape(3 * n, -1).index_select(0, real) for _, f in got]
    torch.testing.assert_close(feats[1], feats[0])
    at = torch.tensor(lens)
    for step in (torch.tensor([[5], [6], [7]]), torch.tensor([[8, 9, 10], [11, 12, 13], [14, 15, 16]])):
        out = [t.forward(step, at, 0, int(at.max()) + step.shape[1])[0] for t in (plain, packed)]
        torch.testing.assert_close(out[1], out[0])
        at = at + step.shape[1]
