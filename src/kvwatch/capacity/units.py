"""Byte quantities with units (pure): ``131072``, ``128KiB``, ``0.8MiB`` (838,861 B), ``0.0008GiB`` (858,993 B);
and ratios as the percentages kvwatch prints (:func:`percent`).

KiB/MiB/GiB/TiB are binary (2^10 ...), the units of vLLM's logs and of every budget kvwatch prints; kB/MB/
GB/TB are decimal (10^3 ...). A decimal unit next to a GiB budget is usually a slip (a tutorial's "GB" that
means GiB), so :func:`decimal_unit_note` says what it was read as.
"""

from __future__ import annotations

import re

GIB = 1 << 30
_BINARY = {"kib": 1 << 10, "mib": 1 << 20, "gib": GIB, "tib": 1 << 40}
_DECIMAL = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS = {"": 1, "b": 1, **_BINARY, **_DECIMAL}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")
MAX_BYTES = float(1 << 50)  # 1 PiB: no GPU budget or per-token size comes near it
EXAMPLES = "131072, 128KiB, 0.8MiB (= 838,861 B), 0.0008GiB (= 858,993 B)"

# Bytes per element of the dtypes kvwatch sizes (KV cache, Mamba state): fp8 and its variants are stored as uint8
# (vllm/utils/torch_utils.py STR_DTYPE_TO_TORCH_DTYPE).
DTYPE_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "fp8_ds_mla": 1, "bfloat16": 2, "bf16": 2,
               "float16": 2, "fp16": 2, "half": 2, "float32": 4, "fp32": 4, "float": 4}


def _split(text: str) -> tuple[float, str]:
    match = _PATTERN.match(text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r} is not a byte count (examples: {EXAMPLES})")
    return float(match.group(1)), match.group(2).lower()


def parse_bytes(text: str) -> float:
    """Bytes in ``text``; binary (KiB, MiB, GiB) and decimal (kB, MB, GB) units, case-insensitive."""
    number, unit = _split(text)
    value = number * _UNITS[unit]
    if value <= 0:
        raise ValueError(f"{text!r} must be positive")
    if not value <= MAX_BYTES:  # (also inf: 1e400 overflowed later, a traceback)
        raise ValueError(f"{text!r} is more than 1 PiB")
    return value


def decimal_unit_note(text: str) -> str | None:
    """A note when ``text`` uses a decimal unit: what it was read as and what the binary unit would give."""
    number, unit = _split(text)
    if unit not in _DECIMAL:
        return None
    binary = unit[0] + "i" + unit[1:]
    pretty = {"kib": "KiB", "mib": "MiB", "gib": "GiB", "tib": "TiB"}[binary]
    return (f"{text.strip()} is a decimal unit: {number * _DECIMAL[unit]:,.0f} B; kvwatch's budgets are in binary "
            f"units (GiB, like vLLM's logs), where {number:g}{pretty} would be {number * _BINARY[binary]:,.0f} B")


def percent(ratio: float) -> str:
    """``ratio`` as a percentage with one decimal, or as many more (up to six) as keep a value off a multiple of 5 %
    it is not: kvwatch's rules sit there (5 %, 10 %, 90 %, 95 %), and 0.8999 printed "90.0 %" in a finding that
    said it was under 90 % while 0.90 was critical."""
    for digits in range(1, 7):
        shown = round(ratio * 100, digits)
        if abs(shown - ratio * 100) < 1e-9 or round(shown, 9) % 5 != 0:  # (0.55 x 100 is 55.00000000000001)
            break
    return f"{ratio:.{digits}%}"
