"""kvwatch: a KV-cache watchdog sidecar for vLLM."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvwatch")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"
