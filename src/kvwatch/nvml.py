"""GPU framebuffer memory through NVML (``nvidia-ml-py``, the optional extra ``kvwatch[nvml]``), for a sidecar
that sees the engine's GPUs itself (on the GPU node, with the devices visible to its container).

The import is guarded: without the package, or without a driver, :func:`read_nvml` raises
:class:`NvmlUnavailable` with the reason, and ``serve`` reports the source down instead of failing.
NVML gives memory (total/free/used bytes) but no "last Xid" value (Xids arrive as events), so ``xid_last``
is unknown here; dcgm-exporter is the source for Xids.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Collection
from typing import Any

from kvwatch.gpu_memory import GpuMemory


class NvmlUnavailable(RuntimeError):
    """NVML cannot be read (package missing, no driver, a device call failed); ``str()`` says why."""


def _module() -> Any:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise NvmlUnavailable("the pynvml module is missing: install kvwatch[nvml] (nvidia-ml-py)") from None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_nvml(uuids: Collection[str] = ()) -> list[GpuMemory]:
    """The visible GPUs' memory (only ``uuids`` when given), sorted by UUID."""
    nvml = _module()
    try:
        nvml.nvmlInit()
    except Exception as exc:  # pynvml raises NVMLError subclasses; a missing driver is one of them
        raise NvmlUnavailable(f"nvmlInit failed: {exc}") from None
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            if uuids and uuid not in uuids:
                continue
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            used, free, total = float(info.used), float(info.free), float(info.total)
            # What neither used nor free counts (driver/firmware reservations), so that totals match dcgm's.
            reserved = max(total - used - free, 0.0)
            gpus.append(GpuMemory(uuid, "", used, free, reserved, None))
        return sorted(gpus, key=lambda g: g.uuid)
    except NvmlUnavailable:
        raise
    except Exception as exc:
        raise NvmlUnavailable(f"NVML query failed: {exc}") from None
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
