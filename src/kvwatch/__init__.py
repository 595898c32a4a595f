"""kvwatch: a KV-cache watchdog sidecar for vLLM.

``__version__`` is the release's one version: the package metadata takes it from here (pyproject.toml's
``dynamic`` version). Written here rather than looked up through ``importlib.metadata``, whose imports
(email, zipfile, csv...) cost the sidecar ~1 MB of RSS (docs/performance.md)."""

from __future__ import annotations

__version__ = "0.1.0"
