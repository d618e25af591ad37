"""dflash-bench: measure DFlash speculative decoding against autoregressive decoding on your own GPUs."""

__version__ = "0.1.0"
