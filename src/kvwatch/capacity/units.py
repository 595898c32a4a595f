"""Byte quantities with units: ``131072``, ``128KiB``, ``0.8MiB``, ``0.0008GiB``, ``1.5 GB`` (pure)."""

from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> float:
    """Bytes in ``text``; binary (KiB, MiB, GiB) and decimal (KB, MB, GB) units, case-insensitive."""
    match = _PATTERN.match(text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r} is not a byte count (examples: 131072, 128KiB, 0.8MiB, 0.0008GiB)")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value <= 0:
        raise ValueError(f"{text!r} must be positive")
    return value


def gib(n_bytes: float) -> float:
    return n_bytes / (1 << 30)
