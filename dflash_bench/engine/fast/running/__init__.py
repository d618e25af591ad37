"""The fast path's execution on the device: the runner, its step bodies, prefills, device state and KV pool."""
