"""The images, read as files (no container engine here to build them): pinned bases, a non-root
user, no secrets, `sluice` as the entrypoint, and each image installing only its own extra."""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "infra" / "docker"
SECRET_NAME = re.compile(r"KEY|SECRET|PASSWORD|PASSWD|TOKEN|PEPPER|CREDENTIAL|DATABASE_URL", re.I)
PINNED = re.compile(r"^[\w.\-/]+(:\d+(\.\d+){1,2}[\w.\-]*)?(@sha256:[0-9a-f]{64})?$")


@dataclass
class Dockerfile:
    instructions: list[tuple[str, str]]
    args: dict[str, str] = field(default_factory=dict)  # ARG defaults

    def all(self, name: str) -> list[str]:
        return [value for keyword, value in self.instructions if keyword == name]

    def final_stage(self) -> Dockerfile:
        start = max(i for i, (keyword, _) in enumerate(self.instructions) if keyword == "FROM")
        return Dockerfile(self.instructions[start:], self.args)

    def expand(self, text: str) -> str:
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: self.args.get(m.group(1) or m.group(2), m.group(0)), text)


def parse(path: Path) -> Dockerfile:
    """Instructions with continuation lines joined and comments dropped; ARG defaults collected."""
    instructions, pending = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        pending += " " + stripped.removesuffix("\\").strip() if pending else stripped.removesuffix("\\").strip()
        if not stripped.endswith("\\"):
            keyword, _, value = pending.partition(" ")
            instructions.append((keyword.upper(), value.strip()))
            pending = ""
    assert not pending, f"{path.name}: a continuation line runs off the end"
    parsed = Dockerfile(instructions)
    for value in parsed.all("ARG"):
        name, _, default = value.partition("=")
        if default:
            parsed.args[name] = default
    return parsed


def env_pairs(value: str) -> dict[str, str]:
    words = shlex.split(value)
    if len(words) == 2 and "=" not in words[0]:  # legacy `ENV NAME value`
        return {words[0]: words[1]}
    return dict(word.split("=", 1) for word in words)


def exec_form(value: str) -> list[str]:
    return json.loads(value)  # a JSON array, so signals reach the process (no shell in between)


@pytest.fixture(params=["gateway", "worker"])
def image(request) -> tuple[str, Dockerfile]:
    return request.param, parse(DOCKER / f"{request.param}.Dockerfile")


def test_every_base_is_pinned_to_a_version(image):
    name, dockerfile = image
    for value in dockerfile.all("FROM"):
        base = dockerfile.expand(value.split()[0])
        if base in {v.split()[-1] for v in dockerfile.all("FROM") if " AS " in v.upper()}:
            continue  # an earlier stage
        assert PINNED.match(base) and (":" in base or "@sha256:" in base), f"{name}: unpinned base {base}"
        assert not base.endswith(":latest"), base


def test_the_final_stage_runs_as_a_non_root_user(image):
    name, dockerfile = image
    users = dockerfile.final_stage().all("USER")
    assert users, f"{name}: no USER in the final stage"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}, f"{name}: runs as {user}"


def test_no_secret_is_baked_in(image):
    name, dockerfile = image
    for keyword in ("ENV", "ARG"):
        for value in dockerfile.all(keyword):
            names = env_pairs(value) if keyword == "ENV" else {value.partition("=")[0]: value.partition("=")[2]}
            for key in names:
                assert not SECRET_NAME.search(key), f"{name}: {keyword} {key} looks like a secret"
    text = (DOCKER / f"{name}.Dockerfile").read_text()
    assert not re.search(r"(AKIA[0-9A-Z]{16}|sk-[A-Za-z0-9]{20,}|BEGIN [A-Z ]*PRIVATE KEY)", text)
    copied = " ".join(dockerfile.all("COPY"))
    assert ".env" not in copied and "key_pepper" not in copied and ".data" not in copied


def test_the_entrypoint_is_sluice_in_exec_form(image):
    name, dockerfile = image
    final = dockerfile.final_stage()
    assert exec_form(final.all("ENTRYPOINT")[-1]) == ["sluice"]
    command = exec_form(final.all("CMD")[-1])
    assert command[0] == {"gateway": "serve", "worker": "worker"}[name]
    assert "0.0.0.0" in command  # reachable from the load balancer / the gateway


def installs(dockerfile: Dockerfile) -> str:
    return dockerfile.expand(" ".join(dockerfile.final_stage().all("RUN")))


def test_the_gateway_image_installs_only_the_gateway_extra():
    dockerfile = parse(DOCKER / "gateway.Dockerfile")
    run = installs(dockerfile)
    assert "[gateway]" in run
    for heavy in ("[worker]", "[all]", "[dev]", "torch", "bitsandbytes", "nvidia"):
        assert heavy not in run, heavy
    base = dockerfile.expand(dockerfile.final_stage().all("FROM")[0])
    assert base.startswith("python:3.11") and "slim" in base


def test_the_worker_image_installs_cuda_torch_bitsandbytes_and_the_worker_extra():
    """A plain Python base (torch's CUDA wheels ship the CUDA libraries: a nvidia/cuda base would be a second
    copy), pinned CUDA torch first, then the worker extra's other dependencies, then the code alone."""
    dockerfile = parse(DOCKER / "worker.Dockerfile")
    final = dockerfile.final_stage()
    run = installs(dockerfile)
    base = dockerfile.expand(final.all("FROM")[0])
    assert base.startswith("python:3.11") and "slim" in base and "cuda" not in base
    torch = re.search(r"--index-url\s+(\S+)\s+torch==([\d.]+)", run)
    assert torch, "torch must come from a CUDA wheel index"
    assert re.search(r"/whl/cu\d+", torch.group(1).strip('"'))
    assert torch.group(2) == "2.13.0"  # the project's pin
    # the dependency list is the worker extra of pyproject.toml, read in the build stage
    build = Dockerfile(dockerfile.instructions[:dockerfile.instructions.index(final.instructions[0])])
    listing = " ".join(build.all("RUN"))
    assert "['optional-dependencies']['worker']" in listing and "p['dependencies']" in listing
    for other in ("[gateway]", "[all]", "[dev]", "nvidia"):
        assert other not in run, other


def test_the_worker_code_layer_is_apart_from_its_dependency_layers():
    final = parse(DOCKER / "worker.Dockerfile").final_stage()
    steps = [(keyword, value) for keyword, value in final.instructions if keyword in ("RUN", "COPY")]
    torch_step = next(i for i, (k, v) in enumerate(steps) if k == "RUN" and "torch==" in v)
    deps_step = next(i for i, (k, v) in enumerate(steps) if k == "RUN" and "-r /tmp/requirements.txt" in v)
    code_copy = next(i for i, (k, v) in enumerate(steps) if k == "COPY" and "/wheels" in v)
    code_step = next(i for i, (k, v) in enumerate(steps) if k == "RUN" and "sluice-*.whl" in v)
    assert torch_step < deps_step < code_copy < code_step
    assert "--no-deps" in steps[code_step][1]  # the code layer installs nothing else
    assert not any(k == "COPY" and "/wheels" in v for k, v in steps[:deps_step])  # no code under the deps


def test_dockerignore_keeps_environments_data_and_secrets_out():
    """The build context is the repository root, so its `.dockerignore` is the one docker reads."""
    lines = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[0] == "*", "deny everything, then allow the packages"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed <= {"pyproject.toml", "requirements.lock", "README.md", "gateway", "auth", "billing", "common",
                       "storage", "worker"}
    for dockerfile in ("gateway", "worker"):
        for value in parse(DOCKER / f"{dockerfile}.Dockerfile").all("COPY"):
            if value.startswith("--from"):
                continue
            for source in value.split()[:-1]:
                assert source.rstrip("/") in allowed, f"{dockerfile}: COPY {source} is excluded by .dockerignore"
    for secret in ("**/.env", "**/key_pepper"):
        assert secret in lines


def test_both_images_run_the_python_minor_the_tests_run():
    """What ships is what is tested: CI's venv comes from the machine's python3 (`make install`), and a minor
    version apart from it (3.12 in the worker image once) runs code no test ran."""
    tested = f"{sys.version_info.major}.{sys.version_info.minor}"
    for image in ("gateway", "worker"):
        dockerfile = parse(DOCKER / f"{image}.Dockerfile")
        for base in (dockerfile.expand(value.split()[0]) for value in dockerfile.all("FROM")):
            minor = re.match(r"python:(\d+\.\d+)", base)
            assert minor and minor.group(1) == tested, f"{image}.Dockerfile: {base}, the tests run {tested}"
