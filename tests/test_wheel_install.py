"""What the image holds, without a Docker engine: the Dockerfile's build-stage RUN steps, run for real.

The build context is recreated in tmp_path the way the Dockerfile's COPY lines and .dockerignore shape it,
the image paths (/src, /wheels, /opt/kvwatch) are mapped into tmp_path, and each RUN line runs with bash.
Nothing is written into the repository. Then the installed `kvwatch` is exercised from outside the source
tree, with its venv made read-only (the container runs with a read-only root filesystem).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from kvwatch import __version__ as KVWATCH_VERSION
from test_dockerfile import DOCKERFILE, ROOT, env_values, parse_dockerfile

PATHS_IN_IMAGE = ("/opt/kvwatch", "/wheels", "/src")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    stages = parse_dockerfile(DOCKERFILE.read_text())
    build = stages[0]
    base = tmp_path_factory.mktemp("image")
    mapped = {"/opt/kvwatch": base / "opt-kvwatch", "/wheels": base / "wheels", "/src": base / "src"}
    workdir = Path(mapped.get(build.all("WORKDIR")[-1].argument, base))
    workdir.mkdir(parents=True, exist_ok=True)

    # COPY lines, relative to WORKDIR, minus what .dockerignore keeps out (caches, egg-info).
    ignored = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for instruction in build.all("COPY"):
        *sources, dest = instruction.argument.split()
        target = workdir / dest
        for source in sources:
            path = ROOT / source
            if path.is_dir():
                shutil.copytree(path, target if dest != "./" else workdir / source, ignore=ignored)
            else:
                shutil.copy2(path, (target if dest.endswith("/") else target.parent) / path.name)

    env = {**os.environ, **env_values(build)}
    env.pop("PIP_NO_CACHE_DIR", None)  # the image layer wants no cache; the test may reuse pip's
    env.pop("PYTHONPATH", None)
    for instruction in build.all("RUN"):
        command = instruction.argument
        for image_path in PATHS_IN_IMAGE:
            command = re.sub(rf"(?<![\w/]){re.escape(image_path)}(?![\w])", str(mapped[image_path]), command)
        # The base image's `python`/`pip` are this interpreter here.
        command = re.sub(r"^pip\b", f"{sys.executable} -m pip", command)
        command = re.sub(r"^python\b", sys.executable, command)
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=workdir, env=env,
                                capture_output=True, text=True, timeout=300, check=False)
        assert result.returncode == 0, f"RUN {instruction.argument}\n{result.stdout[-2000:]}\n{result.stderr}"
    venv = mapped["/opt/kvwatch"]
    # Read-only from here on, like the container's root filesystem.
    for path in [venv, *venv.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    yield {"venv": venv, "wheels": mapped["/wheels"], "base": base}
    for path in [venv, *venv.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | stat.S_IWUSR)


def runtime_env(installed: dict[str, Path]) -> dict[str, str]:
    """The final stage's ENV, with the image's /opt/kvwatch mapped to the test venv."""
    final = parse_dockerfile(DOCKERFILE.read_text())[-1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVWATCH_", "PYTHON"))}
    for key, value in env_values(final).items():
        env[key] = value.replace("/opt/kvwatch", str(installed["venv"])).replace("$PATH", os.environ["PATH"])
    return env


def test_the_wheel_carries_the_package_and_its_data(installed: dict[str, Path]) -> None:
    wheels = list(installed["wheels"].glob("*.whl"))
    assert [w.name.split("-")[0] for w in wheels] == ["kvwatch"]
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    assert "kvwatch/cli.py" in names and "kvwatch/settings.py" in names
    data = [p.relative_to(ROOT / "src").as_posix() for p in (ROOT / "src" / "kvwatch" / "data").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts]
    missing = sorted(set(data) - names)
    assert not missing, f"package data left out of the wheel: {missing}"
    assert not [n for n in names if n.startswith("tests/")]


def test_installed_kvwatch_runs_from_its_own_venv(installed: dict[str, Path], tmp_path: Path) -> None:
    env = runtime_env(installed)
    kvwatch = shutil.which("kvwatch", path=env["PATH"])
    assert kvwatch == str(installed["venv"] / "bin" / "kvwatch"), "ENV PATH puts the venv first"
    result = subprocess.run([kvwatch, "--help"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    for command in ("serve", "check", "plan", "simulate", "demo", "backtest"):
        assert command in result.stdout
    where = subprocess.run([installed["venv"] / "bin" / "python", "-c", "import kvwatch; print(kvwatch.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=True)
    assert where.stdout.strip().startswith(str(installed["venv"])), "imported from the venv, not the source tree"
    version = subprocess.run([kvwatch, "--version"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=60, check=True)
    assert version.stdout == f"kvwatch {KVWATCH_VERSION}\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_image_command_serves_metrics_on_a_read_only_venv(installed: dict[str, Path], tmp_path: Path) -> None:
    """`kvwatch serve` (the image's CMD) with the image's env: it serves, and writes nothing to its venv."""
    env = runtime_env(installed)
    port, dead_target = _free_port(), _free_port()
    env.update({"KVWATCH_LISTEN_ADDRESS": "127.0.0.1", "KVWATCH_PORT": str(port),
                "KVWATCH_TARGET_URL": f"http://127.0.0.1:{dead_target}/metrics",
                "KVWATCH_POLL_INTERVAL_SECONDS": "0.5"})
    before = sorted(p.relative_to(installed["venv"]) for p in installed["venv"].rglob("*"))
    process = subprocess.Popen([installed["venv"] / "bin" / "kvwatch", "serve"], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        body, deadline = "", time.monotonic() + 30
        while time.monotonic() < deadline:
            assert process.poll() is None, f"kvwatch serve exited:\n{process.stdout.read()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as health:
                    assert health.status == 200
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as metrics:
                    body = metrics.read().decode()
                if "kvwatch_up" in body:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert re.search(r"^kvwatch_up(\{[^}]*\})? 0(\.0)?$", body, re.M), body[:2000]
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    after = sorted(p.relative_to(installed["venv"]) for p in installed["venv"].rglob("*"))
    assert after == before, "kvwatch wrote into its installation at run time"
