"""The drafter against an independent, cache-free reference of z-lab's forward, through ragged batched steps."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

from dflash_bench.engine.reference.drafter import load_drafter  # noqa: E402
from dflash_bench.engine.reference.propose import DFlashProposer  # noqa: E402
from dflash_bench.engine.reference.target import ReferenceTarget  # noqa: E402
from dflash_bench.testing.tiny import make_tiny_pair  # noqa: E402

pytestmark = pytest.mark.engine
B = 5


def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rot(x, pos, hd, theta):  # x [n, heads, hd], rotate-half RoPE
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    f = pos.double()[:, None] * inv
    cos, sin = torch.cat([f, f], -1).cos()[:, None], torch.cat([f, f], -1).sin()[:, None]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def reference_draft_logits(hf, drafter, tokens: list[int], start: int) -> torch.Tensor:
    """z-lab's draft step written out plainly: context = all committed positions, block at start.."""
    c = drafter.config
    sd = {k: v.double() for k, v in drafter.state_dict().items()}
    with torch.no_grad():
        out = hf(torch.tensor([tokens[:start]]), output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i + 1][0] for i in c.target_layer_ids], -1).double()
        ctx = _rms(feats @ sd["fc.weight"].T, sd["hidden_norm.weight"], c.rms_norm_eps)
        block = torch.tensor([tokens[start]] + [c.mask_token_id] * (B - 1))
        h = F.embedding(block, hf.get_input_embeddings().weight.double())
        hd, pos = c.head_dim, torch.arange(start + B)
        for i in range(c.num_hidden_layers):
            p = lambda n: sd[f"layers.{i}.{n}.weight"]  # noqa: E731
            x = _rms(h, p("input_layernorm"), c.rms_norm_eps)
            q = _rms((x @ p("self_attn.q_proj").T).view(B, -1, hd), p("self_attn.q_norm"), c.rms_norm_eps)
            both = torch.cat([ctx, x])
            k = _rms((both @ p("self_attn.k_proj").T).view(start + B, -1, hd), p("self_attn.k_norm"), c.rms_norm_eps)
            v = (both @ p("self_attn.v_proj").T).view(start + B, -1, hd)
            q, k = _rot(q, pos[start:], hd, c.rope_theta), _rot(k, pos, hd, c.rope_theta)
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            att = torch.einsum("qhd,khd->hqk", q, k) * hd**-0.5  # no mask: non-causal over context + block
            o = torch.einsum("hqk,khd->qhd", att.softmax(-1), v).reshape(B, -1)
            h = h + o @ p("self_attn.o_proj").T
            y = _rms(h, p("post_attention_layernorm"), c.rms_norm_eps)
            h = h + (F.silu(y @ p("mlp.gate_proj").T) * (y @ p("mlp.up_proj").T)) @ p("mlp.down_proj").T
        h = _rms(h, sd["norm.weight"], c.rms_norm_eps)
        return h[1:] @ hf.get_output_embeddings().weight.double().T


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_batched_cached_drafter_matches_reference(tmp_path, arch):
    from transformers import AutoModelForCausalLM

    target_dir, drafter_dir = make_tiny_pair(tmp_path, arch=arch, seed=2, block_size=B, layers=5)
    tgt = ReferenceTarget(str(target_dir), dtype=torch.float64, device="cpu", max_slots=4, max_len=128)
    drafter = load_drafter(drafter_dir, target_hidden=tgt.hidden_size, target_layers=tgt.n_layers,
                           target_vocab=tgt.vocab_size, dtype=torch.float64, device="cpu")
    tgt.tap(drafter.config.target_layer_ids)
    prop = DFlashProposer(drafter, tgt.embed_weight(), tgt.lm_head(), max_slots=4, max_len=128)
    hf = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float64, attn_implementation="sdpa").eval()

    rng = random.Random(0)
    streams = [[rng.randrange(256) for _ in range(80)] for _ in range(3)]
    seqs = []
    for slot, (stream, plen) in enumerate(zip(streams, [3, 11, 7])):
        s = SimpleNamespace(slot=slot, start=plen, out=[stream[plen]], stream=stream)
        _, feats = tgt.forward(torch.tensor([stream[:plen]]), torch.tensor([0]), torch.tensor([slot]))
        prop.prefill(slot, feats[0])
        seqs.append(s)
    for step in range(6):
        live = seqs if step % 3 else seqs[:2]  # a row can sit out a step and join the next one
        _, logits = prop.propose(live)
        for row, s in enumerate(live):
            ref = reference_draft_logits(hf, drafter, s.stream, s.start)
            torch.testing.assert_close(logits[row], ref, rtol=1e-7, atol=1e-7)
        block = torch.tensor([s.stream[s.start : s.start + B] for s in live])
        starts = torch.tensor([s.start for s in live])
        _, feats = tgt.forward(block, starts, torch.tensor([s.slot for s in live]))
        prop.commit(live, feats, starts)
        for s in live:  # ragged acceptance: each row keeps 1..B of its block
            s.start += rng.randint(0, B - 1) + 1
            s.out = [s.stream[s.start]]
