"""Serving against peers: the builtin engine beside vLLM and SGLang, measured by two clients, on shapes of large pairs."""
