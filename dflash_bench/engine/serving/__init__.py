"""The builtin engine's OpenAI-compatible server: the HTTP server, the engine thread, /metrics."""
