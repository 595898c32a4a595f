"""The package builds cleanly: no setuptools deprecation warnings, an SPDX license and its file in the wheel."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_builds_without_deprecation_warnings_and_carries_the_license(tmp_path: Path) -> None:
    # Build from a copy (what the Dockerfile copies), so nothing is written into the repository.
    src = tmp_path / "src-tree"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    result = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(src)],
                            capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "deprecated" not in output.lower(), [line for line in output.splitlines() if "eprecat" in line]
    wheel = next((tmp_path / "dist").glob("kvwatch-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in zf.namelist())
    assert "License-Expression: Apache-2.0" in metadata
    assert "Apache License" in (ROOT / "LICENSE").read_text()
