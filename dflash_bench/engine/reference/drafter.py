"""The DFlash drafter in z-lab's checkpoint format, in plain PyTorch (no trust_remote_code).

config.json is a Qwen3 config plus `block_size` and `dflash_config{mask_token_id, target_layer_ids}`;
model.safetensors holds `fc`, `hidden_norm`, `norm` and `layers.N.*`, loaded strictly. The drafter has no
embedding or head: it uses the target's. Context features (fc over the concatenated target layer outputs,
then hidden_norm) become extra keys/values in every layer; the block `[anchor, mask x (B-1)]` attends to
context and block without a causal mask (sliding-window layers are causal with a window).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from dflash_bench.engine.reference.rope import cos_sin, inv_freq, rope
from dflash_bench.errors import UserError


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"silu": F.silu, "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh")}  # of MLP gates


@dataclass
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    block_size: int
    mask_token_id: int
    target_layer_ids: list[int]
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    attention_bias: bool = False
    vocab_size: int | None = None
    layer_types: list[str] = field(default_factory=list)
    sliding_window: int | None = None
    is_causal: bool | None = None
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    hidden_act: str = "silu"
    raw: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: dict) -> "DrafterConfig":
        dc = d.get("dflash_config") or {}

        def pick(name: str, default: Any = None) -> Any:
            return dc.get(name, d.get(name, default))

        if pick("mask_token_id") is None or pick("target_layer_ids") is None or pick("block_size") is None:
            raise UserError("the drafter config.json is not a DFlash drafter: it needs block_size and dflash_config{mask_token_id, target_layer_ids}")
        rope = d.get("rope_scaling") or d.get("rope_parameters") or {}
        if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
            raise UserError(f"the drafter uses RoPE scaling {rope.get('rope_type', rope.get('type'))!r}, which the builtin engine does not support")
        heads = d["num_attention_heads"]
        act = d.get("hidden_act", d.get("hidden_activation", "silu"))
        if act not in ACTIVATIONS:
            raise UserError(f"the drafter's MLP activation {act!r} is not one the builtin engine runs ({', '.join(ACTIVATIONS)})")
        return cls(
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            block_size=int(pick("block_size")),
            mask_token_id=int(pick("mask_token_id")),
            target_layer_ids=[int(i) for i in pick("target_layer_ids")],
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta", d.get("rope_theta", 1_000_000.0))),
            attention_bias=bool(d.get("attention_bias", False)),
            vocab_size=d.get("vocab_size"),
            layer_types=list(d.get("layer_types") or []),
            # as z-lab's Qwen3Config reads it: the window only with use_sliding_window (sliding layers stay causal)
            sliding_window=d.get("sliding_window") if d.get("use_sliding_window") else None,
            is_causal=pick("is_causal", pick("causal")),
            input_embedding_scale=float(pick("input_embedding_scale", 1.0) or 1.0),
            output_multiplier=float(pick("output_multiplier", 1.0) or 1.0),
            final_logit_softcapping=pick("final_logit_softcapping"),
            hidden_act=act,
            raw=d,
        )

    def layer_mask_kind(self, i: int) -> tuple[bool, int | None]:
        """(causal, window) of draft layer i: full layers are non-causal; sliding ones causal with a window."""
        sliding = i < len(self.layer_types) and self.layer_types[i] == "sliding_attention"
        causal = sliding if self.is_causal is None else bool(self.is_causal)
        return causal, (self.sliding_window if sliding else None)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        hd, b = c.head_dim, c.attention_bias
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * hd, bias=b)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * hd, bias=b)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * hd, bias=b)
        self.o_proj = nn.Linear(c.num_attention_heads * hd, c.hidden_size, bias=b)
        self.q_norm = RMSNorm(hd, c.rms_norm_eps)
        self.k_norm = RMSNorm(hd, c.rms_norm_eps)
        self.hd = hd

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Roped, normed keys and values of x `[bs, n, hidden]` as `[bs, n, kv_heads, hd]`."""
        k = self.k_norm(self.k_proj(x).unflatten(-1, (-1, self.hd)))
        v = self.v_proj(x).unflatten(-1, (-1, self.hd))
        return rope(k, cos, sin), v


class MLP(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        self.act = ACTIVATIONS[c.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DrafterLayer(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)


def rope_cos_sin(pos: torch.Tensor, hd: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """z-lab's tables: angles in float32, or float64 for a float64 drafter."""
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    return cos_sin(pos, inv_freq(hd, theta, pos.device, wide), dtype)


class DFlashDrafter(nn.Module):
    """The drafter's weights; key names match z-lab's model.safetensors exactly."""

    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.config = c
        self.layers = nn.ModuleList(DrafterLayer(c) for _ in range(c.num_hidden_layers))
        self.fc = nn.Linear(len(c.target_layer_ids) * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def init_random(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if not name.endswith("norm.weight"):
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)

    def context(self, feats: torch.Tensor) -> torch.Tensor:
        """Target layer outputs `[bs, n, K*hidden]` -> context `[bs, n, hidden]`."""
        return self.hidden_norm(self.fc(feats))


def save_drafter(model: DFlashDrafter, out_dir: str | Path) -> None:
    """Write a drafter in z-lab's format (config.json + model.safetensors with unprefixed keys)."""
    from safetensors.torch import save_file

    from dflash_bench.store import atomic_write_json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    tmp = out / ".model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(out / "model.safetensors")
    c = model.config
    # what z-lab's configs carry and other readers take from the file (vLLM finds the model class by
    # model_type and architectures); a config read from a real drafter keeps every key it had
    known = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "num_key_value_heads": c.num_key_value_heads,
             "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
             "attention_bias": c.attention_bias, "block_size": c.block_size}
    if "dtype" not in c.raw and "torch_dtype" not in c.raw:  # the weights' own: a reader that finds none assumes
        # float32 and casts to float16 (SGLang 0.5.16's DFLASH did, then multiplied them with a bf16 target's features)
        known["dtype"] = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    atomic_write_json(out / "config.json", {**known, **c.raw})


def load_drafter(path: str | Path, *, target_hidden: int, target_layers: int, target_vocab: int, dtype: torch.dtype,
                 device: torch.device | str, dummy: bool = False) -> DFlashDrafter:
    """Load a z-lab drafter strictly and check that it fits the target; mismatches are one clear error.
    `dummy`: random weights of its config's shape, created on the device (the folder needs only config.json)."""
    from safetensors.torch import load_file

    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise UserError(f"no drafter at {str(path)!r}: expected a folder with config.json and model.safetensors")
    c = DrafterConfig.from_dict(json.loads((folder / "config.json").read_text()))
    if c.hidden_size != target_hidden:
        raise UserError(f"the drafter's hidden size {c.hidden_size} does not match the target's {target_hidden}: it was made for another model")
    bad = [i for i in c.target_layer_ids if not 0 <= i < target_layers]
    if bad:
        raise UserError(f"the drafter reads target layers {c.target_layer_ids}, but the target has {target_layers} layers (0..{target_layers - 1})")
    if c.vocab_size is not None and c.vocab_size != target_vocab:
        raise UserError(f"the drafter was made for a vocabulary of {c.vocab_size} tokens, but the target has {target_vocab}")
    if not 0 <= c.mask_token_id < target_vocab:
        raise UserError(f"the drafter's mask_token_id {c.mask_token_id} is outside the target's vocabulary of {target_vocab}")
    if c.block_size < 2:
        raise UserError(f"the drafter's block_size must be at least 2, got {c.block_size}")
    if dummy:  # made and filled on the host, then moved: a float32 copy of it never sits beside the target
        model = DFlashDrafter(c)
        model.init_random(0)
        return model.to(device=device, dtype=dtype).eval()
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise UserError(f"no model.safetensors in the drafter folder {str(path)!r}")
    state = {}
    for f in files:
        state.update(load_file(str(f)))
    model = DFlashDrafter(c)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        first = str(err).splitlines()[1:2] or [str(err)]
        raise UserError(f"the drafter weights do not match its config.json: {first[0].strip()}") from err
    return model.to(device=device, dtype=dtype).eval()
