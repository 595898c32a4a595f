"""kvwatch: a KV-cache watchdog sidecar for vLLM.

``kvwatch.__version__`` is looked up on first use (``importlib.metadata`` costs more to import than the
CLI's dispatcher; ``kvwatch --help`` never needs it)."""

from __future__ import annotations


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvwatch")
    except PackageNotFoundError:  # running from a source tree without an install
        return "0.0.0+unknown"


def __getattr__(name: str) -> str:
    if name == "__version__":
        value = _version()
        globals()["__version__"] = value
        return value
    raise AttributeError(f"module 'kvwatch' has no attribute {name!r}")
