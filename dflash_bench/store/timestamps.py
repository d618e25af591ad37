"""Timestamps written into sweep files: UTC, ISO 8601, whole seconds."""

from __future__ import annotations

from datetime import datetime, timezone


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
