"""The layers of docs/architecture.md hold: the pure core imports no I/O library and nothing from the service wing
or the shell, and importing the core packages loads none of those libraries; every Python file opens with a
docstring that says what it is for.

Reads every core module's source (AST, so an import inside a function counts too), not its documentation: a new file
under a core package is checked the day it is added, and a new top-level module must be named a core or an upper one
here before the suite passes.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "kvwatch"

# The pure core (docs/architecture.md): top-level modules and whole packages.
CORE_MODULES = ("exposition.py", "model.py", "payload.py", "counters.py", "history.py", "advisor.py", "derived.py",
                "plausible.py", "latency.py", "gpu_memory.py")
CORE_PACKAGES = ("engines", "capacity", "forecast")
# Libraries the core must not import: network, settings/validation, Prometheus client, scheduler.
IO_LIBRARIES = ("httpx", "pydantic", "pydantic_settings", "prometheus_client", "apscheduler")
# Layers above the core: the service wing, the shell, the simulator and the backtest.
UPPER_LAYERS = ("kvwatch.serve", "kvwatch.fetch", "kvwatch.settings", "kvwatch.cli", "kvwatch.check",
                "kvwatch.plan", "kvwatch.demo", "kvwatch.sim", "kvwatch.backtest", "kvwatch.__main__",
                "kvwatch.nvml", "kvwatch.stop_signals")


def core_files() -> list[Path]:
    files = [SRC / name for name in CORE_MODULES]
    for package in CORE_PACKAGES:
        files.extend(sorted((SRC / package).rglob("*.py")))
    return files


def imported_modules(path: Path, src: Path = SRC) -> set[str]:
    """Every module a file imports, absolute (relative imports resolved against its package under `src`)."""
    package = ".".join(path.relative_to(src.parent).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def violations(path: Path, src: Path = SRC) -> list[str]:
    bad = []
    for module in sorted(imported_modules(path, src)):
        if any(module == lib or module.startswith(lib + ".") for lib in IO_LIBRARIES + UPPER_LAYERS):
            bad.append(module)
    return bad


def test_every_core_module_exists() -> None:
    missing = [str(p.relative_to(SRC)) for p in core_files() if not p.is_file()]
    assert not missing, f"docs/architecture.md names core modules that are not there: {missing}"


def test_every_top_level_module_is_placed_in_a_layer() -> None:
    # nvml and stop_signals (I/O: NVML, signal handlers) were in neither list, so a core module could import them.
    placed = {name.removesuffix(".py") for name in CORE_MODULES} | set(CORE_PACKAGES)
    placed |= {layer.removeprefix("kvwatch.") for layer in UPPER_LAYERS}
    found = {p.stem for p in SRC.glob("*.py")} | {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()}
    assert found - placed - {"__init__"} == set()


@pytest.mark.parametrize("path", core_files(), ids=lambda p: str(p.relative_to(SRC)))
def test_core_module_imports_only_the_core(path: Path) -> None:
    if not path.is_file():
        pytest.fail(f"{path.relative_to(SRC)} is missing")
    assert violations(path) == [], (
        f"{path.relative_to(SRC)} is in the pure core (docs/architecture.md) but imports {violations(path)}")


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    """The walk is not limited to the top of a file: a deferred import counts."""
    package = tmp_path / "kvwatch" / "forecast"
    package.mkdir(parents=True)
    module = package / "sneaky.py"
    module.write_text("def f():\n    from ..serve import app\n    import httpx\n")
    assert violations(module, tmp_path / "kvwatch") == ["httpx", "kvwatch.serve", "kvwatch.serve.app"]


def test_importing_the_core_loads_no_io_library() -> None:
    code = (
        "import json, sys\n"
        "import kvwatch.capacity, kvwatch.forecast, kvwatch.exposition, kvwatch.engines, kvwatch.model, "
        "kvwatch.history, kvwatch.advisor, kvwatch.payload, kvwatch.counters\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    bad = [m for m in loaded if m.split(".")[0] in IO_LIBRARIES
           or any(m == layer or m.startswith(layer + ".") for layer in UPPER_LAYERS)]
    assert bad == [], f"importing the pure core loaded {bad}"


ROOT = SRC.parents[1]


@pytest.mark.parametrize("folder", ["src", "benchmarks", "tools", "scripts", "alerts", "tests"])
def test_every_file_says_first_what_it_is_for(folder: str) -> None:
    """Every file's first lines say what it is for: a module docstring, in every Python file."""
    silent = [str(p.relative_to(ROOT)) for p in sorted((ROOT / folder).rglob("*.py"))
              if not ast.get_docstring(ast.parse(p.read_text(), filename=str(p)))]
    assert silent == []
