"""The target: any Hugging Face causal LM, run with slot-cache attention and hidden-state taps.

The HF model does the math (embedding, RoPE, layers, norm, lm_head, softcapping); we only replace its
attention function with one that writes K/V into our `SlotCache` and attends with per-row masks, so
sequences of different lengths share a batch and rejected drafts roll back for free. Forward hooks on
the decoder layers capture the outputs the drafter reads (HF `hidden_states[id + 1]`).
"""

from __future__ import annotations

from typing import Any, Callable

import threading
from dataclasses import dataclass

import torch
from torch import nn

from dflash_bench.engine.reference.slot_cache import SlotCache, attend, row_mask
from dflash_bench.engine.reference.layers import check_servable, kv_shapes
from dflash_bench.errors import UserError

ATTN_NAME = "slot_cache"  # must not contain "flash": transformers treats such names as kernels


@dataclass
class _Step:
    """What the attention function needs for the current forward (per thread: engines on two threads are fine)."""

    cache: SlotCache
    slots: torch.Tensor
    pos: torch.Tensor
    starts: torch.Tensor
    kv_len: int
    masks: dict


_LOCAL = threading.local()  # .step: the _Step of this thread's forward
DTYPES = {"auto": None, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """`--dtype`: a name of DTYPES; auto is bfloat16 on a GPU, float32 on a CPU."""
    if name not in DTYPES:
        raise UserError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}")
    dt = DTYPES[name]
    if dt is not None:
        return dt
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def _slot_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: object,
                    scaling: float | None = None, dropout: float = 0.0, **kwargs: Any) -> tuple[torch.Tensor, None]:
    step = _LOCAL.step
    layer = module.layer_idx
    step.cache.write(layer, step.slots, step.pos, key.transpose(1, 2), value.transpose(1, 2))
    k, v = step.cache.read(layer, step.slots, step.kv_len)
    window = kwargs.get("sliding_window")
    if window not in step.masks:
        step.masks[window] = row_mask(step.starts, query.shape[2], step.kv_len, causal=True, window=window)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return attend(query, k, v, step.masks[window], scale, kwargs.get("softcap")), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, _slot_attention)


def _device_map(device: str) -> dict:
    """Load straight onto the GPU when accelerate is there (an 8B model then never sits in host memory)."""
    import importlib.util

    if device == "cpu" or importlib.util.find_spec("accelerate") is None:
        return {}
    return {"device_map": {"": device}}


def decoder_layers(model: nn.Module, n_layers: int) -> nn.ModuleList:
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and name.endswith("layers") and len(mod) == n_layers:
            return mod
    raise UserError("could not find the decoder layers of the target model; this architecture is not supported")


def load_model(path: str, *, dtype: torch.dtype, device: str, dummy: bool = False) -> Any:  # a transformers LM
    """The Hugging Face causal LM at `path`, on `device`, with its attention routed to the slot cache.

    Both engines start here: `ReferenceTarget` runs it as it is, the fast path copies out its weights. `dummy`
    (`serve --load-format dummy`): random weights of the config's shape, created on the device (no weight file
    is read), as vLLM's dummy format, for measuring a large model's speed without its weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    _register()
    try:
        cfg = AutoConfig.from_pretrained(path)
        check_servable(cfg.get_text_config())
        if dummy:  # seeded: the ranks of a tensor-parallel engine make the same weights, each keeping its shard
            torch.manual_seed(0)
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=ATTN_NAME)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=ATTN_NAME,
                                                         **_device_map(device))
    except (OSError, ValueError, KeyError) as err:
        raise UserError(f"the builtin engine could not load the target model from {path!r}: "
                        f"{str(err).strip().splitlines()[0]}") from err
    return model.to(device).eval()


class ReferenceTarget:
    """A loaded target model with a slot KV cache of `max_slots` sequences of `max_len` tokens."""

    def __init__(self, path: str, *, dtype: torch.dtype, device: str, max_slots: int, max_len: int,
                 dummy: bool = False):
        self.model = load_model(path, dtype=dtype, device=device, dummy=dummy)
        self.config = self.model.config.get_text_config()
        self.device = torch.device(device)
        self.dtype = dtype
        cfg = self.config
        self.n_layers = cfg.num_hidden_layers
        self.hidden_size = cfg.hidden_size
        self.vocab_size = self.model.get_output_embeddings().weight.shape[0]
        self.max_len = max_len
        self.cache = SlotCache(kv_shapes(cfg), max_slots, max_len, dtype, self.device)
        self.layers = decoder_layers(self.model, self.n_layers)
        self._taps: list[int] = []
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []

    def tap(self, layer_ids: list[int]) -> None:
        """Capture the outputs of these decoder layers on every forward (HF `hidden_states[id + 1]`)."""
        bad = [i for i in layer_ids if not 0 <= i < self.n_layers]
        if bad:
            raise UserError(
                f"drafter reads target layers {layer_ids} but the target has only {self.n_layers} layers (0..{self.n_layers - 1})"
            )
        self._taps = list(layer_ids)
        for i in sorted(set(layer_ids)):
            self._hooks.append(self.layers[i].register_forward_hook(self._hook(i)))

    def _hook(self, i: int) -> Callable[[nn.Module, object, Any], None]:
        def save(_mod: nn.Module, _inp: object, out: Any) -> None:
            self._captured[i] = out[0] if isinstance(out, tuple) else out

        return save

    def embed_weight(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight

    def lm_head(self) -> nn.Module:
        return self.model.get_output_embeddings()

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, starts: torch.Tensor, slots: torch.Tensor, keep: int = 0
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run `ids` `[bs, q]` at positions `starts[b] + j`, appending to each row's slot.

        Returns logits of the last `keep` positions (all when 0) `[bs, k, V]` and the tapped features
        `[bs, q, K * hidden]` (None without taps).
        """
        q = ids.shape[1]
        pos = starts[:, None] + torch.arange(q, device=ids.device)
        kv_len = int(starts.max()) + q
        _LOCAL.step = _Step(self.cache, slots, pos, starts, kv_len, {})
        try:
            out = self.model(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=keep)
        finally:
            _LOCAL.step = None
        feats = None
        if self._taps:
            feats = torch.cat([self._captured[i] for i in self._taps], dim=-1)
            self._captured.clear()
        return out.logits, feats
