"""The repository's scripts (alerts/, benchmarks/, scripts/, tools/) are not in the installed package: tests
load them by their path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative_path: str, name: str) -> ModuleType:
    """The script at ``ROOT / relative_path`` as the module ``name`` (registered in ``sys.modules``, since
    dataclasses resolve their module by name)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
