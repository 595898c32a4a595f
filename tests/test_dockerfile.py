"""The Dockerfile's rules, checked by parsing it (there is no Docker engine on CI machines).

The parser handles what the Dockerfile uses: comments, line continuations, JSON (exec) and shell forms.
tests/test_wheel_install.py runs the build stage's RUN steps for real.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    argument: str
    line: int

    def exec_form(self) -> list[str]:
        value = json.loads(self.argument)
        assert isinstance(value, list), f"line {self.line}: {self.keyword} is not in exec (JSON) form"
        return value


@dataclass(frozen=True)
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction]

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse_dockerfile(text: str) -> list[Stage]:
    instructions: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continuation are dropped by Docker too
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        keyword, _, argument = (pending + stripped).partition(" ")
        instructions.append(Instruction(keyword.upper(), argument.strip(), start))
        pending = ""
    assert not pending, "the Dockerfile ends inside a line continuation"
    stages: list[Stage] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            match = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", instruction.argument, re.I)
            assert match, f"line {instruction.line}: cannot read FROM {instruction.argument}"
            stages.append(Stage(match.group(1), match.group(2), []))
        else:
            assert stages or instruction.keyword == "ARG", f"line {instruction.line}: instruction before FROM"
            if stages:
                stages[-1].instructions.append(instruction)
    return stages


def env_values(stage: Stage) -> dict[str, str]:
    values: dict[str, str] = {}
    for instruction in stage.all("ENV"):
        for key, value in re.findall(r'(\w+)=("[^"]*"|\S+)', instruction.argument):
            values[key] = value.strip('"')
    return values


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())


def test_the_parser_reads_continuations_and_forms() -> None:
    parsed = parse_dockerfile('FROM a:1 AS x\nRUN echo 1 \\\n  # note\n  && echo 2\nFROM b:2\nCMD ["c"]\n')
    assert [(s.base, s.name) for s in parsed] == [("a:1", "x"), ("b:2", None)]
    assert parsed[0].instructions[0].argument == "echo 1 && echo 2"
    assert parsed[1].all("CMD")[0].exec_form() == ["c"]


def test_multi_stage_on_a_pinned_slim_base(stages: list[Stage]) -> None:
    assert len(stages) >= 2, "a build stage and a runtime stage"
    for stage in stages:
        image, _, tag = stage.base.partition(":")
        assert tag and tag != "latest", f"{stage.base}: pin the base image by version"
        assert re.fullmatch(r"\d+\.\d+\.\d+-slim(-\w+)?", tag), f"{stage.base}: a slim base with a full version"
        assert image == "python"
    assert stages[0].name, "the build stage is named so the runtime stage can copy from it"
    assert stages[-1].base == stages[0].base, "same base: the venv's interpreter symlink stays valid"


def test_final_stage_only_copies_the_built_venv(stages: list[Stage]) -> None:
    final = stages[-1]
    copies = final.all("COPY")
    assert copies and all(f"--from={stages[0].name}" in c.argument for c in copies), "nothing from the context"
    assert not final.all("RUN"), "no package installs or compilers in the final stage"
    assert not final.all("ADD")


def test_runs_as_a_fixed_non_root_numeric_user(stages: list[Stage]) -> None:
    users = stages[-1].all("USER")
    assert users, "the final stage sets USER"
    user, _, group = users[-1].argument.partition(":")
    assert user.isdigit() and int(user) != 0, "numeric, so Kubernetes runAsNonRoot can verify it"
    assert not group or (group.isdigit() and int(group) != 0)
    # The chart's securityContext expects the same UID.
    values = (ROOT / "deploy" / "helm" / "kvwatch" / "values.yaml").read_text()
    assert f"runAsUser: {user}" in values


def test_entrypoint_command_port_and_environment(stages: list[Stage]) -> None:
    final = stages[-1]
    assert final.all("ENTRYPOINT")[-1].exec_form() == ["kvwatch"]
    assert final.all("CMD")[-1].exec_form() == ["serve"]
    assert [e.argument for e in final.all("EXPOSE")] == ["9747"]
    env = env_values(final)
    assert env["KVWATCH_LISTEN_ADDRESS"] == "0.0.0.0"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1", "nothing written at run time: read-only root filesystem"
    assert env["PATH"].startswith("/opt/kvwatch/bin:")


def test_no_secrets_in_the_image(stages: list[Stage]) -> None:
    secret = re.compile(r"(password|passwd|secret|token|api[_-]?key|credential)", re.I)
    for stage in stages:
        for instruction in stage.all("ENV") + stage.all("ARG"):
            assert not secret.search(instruction.argument), f"line {instruction.line}: secret-like build value"
    text = DOCKERFILE.read_text()
    assert not re.search(r"https?://[^/\s]*:[^@\s]*@", text), "credentials in a URL"


def test_build_stage_builds_a_wheel_and_installs_it_into_a_venv(stages: list[Stage]) -> None:
    runs = " ".join(r.argument for r in stages[0].all("RUN"))
    assert "wheel" in runs and "python -m venv /opt/kvwatch" in runs
    assert "/opt/kvwatch/bin/pip install" in runs


@pytest.mark.parametrize(("extras", "installed"), [("", "kvwatch-0.1.0-py3-none-any.whl"),
                                                   ("nvml", "kvwatch-0.1.0-py3-none-any.whl[nvml]")])
def test_the_build_argument_names_the_extras_pip_installs(stages: list[Stage], tmp_path: Path, extras: str,
                                                          installed: str) -> None:
    # config.nvml needs the nvml extra in the image: `docker build --build-arg KVWATCH_EXTRAS=nvml` (docs/deploy.md)
    assert "KVWATCH_EXTRAS" in [a.argument.split("=")[0] for a in stages[0].all("ARG")]
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "kvwatch-0.1.0-py3-none-any.whl").touch()
    step = next(r.argument for r in stages[0].all("RUN") if r.argument.startswith("/opt/kvwatch/bin/pip install"))
    # (the step as Docker's /bin/sh runs it, with pip printing what it was asked to install)
    command = step.replace("/opt/kvwatch/bin/pip install", "printf %s").replace("/wheels", str(tmp_path / "wheels"))
    result = subprocess.run(["sh", "-euc", command], env={"KVWATCH_EXTRAS": extras, "PATH": "/usr/bin:/bin"},
                            capture_output=True, text=True, check=True)
    assert result.stdout == str(tmp_path / "wheels" / installed)


def test_dockerignore_keeps_the_context_to_what_the_build_copies(stages: list[Stage]) -> None:
    rules = [line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip()
             and not line.startswith("#")]
    assert rules[0] == "*", "ignore everything, then allow what the build needs"
    allowed = {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")}
    copied = set()
    for instruction in stages[0].all("COPY"):
        copied.update(part.rstrip("/") for part in instruction.argument.split()[:-1] if not part.startswith("--"))
    assert copied == allowed
