"""The gateway installs and imports without torch: `pip install .[gateway]` in a fresh venv.

The venv is built under a tmp dir from a wheel of this checkout (no `--system-site-packages`), so
only what `.[gateway]` declares is there. Dependencies come from pip's cache after the first run.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GATEWAY_SIDE = ("gateway", "auth", "billing", "common", "storage")
HEAVY = ("torch", "transformers", "bitsandbytes", "xgrammar", "accelerate", "gguf", "worker")

# every module of the gateway side imported, then nothing heavy may be in sys.modules
IMPORT_ALL = textwrap.dedent("""
    import importlib, json, pkgutil, sys
    import gateway.edge.app, gateway.cli.main
    names = []
    for top in {tops!r}:
        package = importlib.import_module(top)
        for info in pkgutil.walk_packages(package.__path__, top + "."):
            importlib.import_module(info.name)
            names.append(info.name)
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})
    print(json.dumps({{"modules": len(names), "heavy": heavy, "file": gateway.edge.app.__file__}}))
""").format(tops=GATEWAY_SIDE, heavy=HEAVY)


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_gateway_side_never_imports_the_worker_or_torch():
    """Static: no module of the gateway side names torch or the worker, at any depth, except the
    `sluice worker` subcommand, which the gateway image answers with a clear error."""
    offenders = []
    for top in GATEWAY_SIDE:
        for path in sorted((REPO / top).rglob("*.py")):
            heavy = _imports(path) & set(HEAVY)
            if path.relative_to(REPO).as_posix() == "gateway/cli/main.py":
                heavy -= {"worker"}
            if heavy:
                offenders.append(f"{path.relative_to(REPO)}: {sorted(heavy)}")
    assert not offenders, offenders


@pytest.fixture(scope="module")
def gateway_venv(tmp_path_factory) -> Path:
    """A fresh venv holding only `sluice[gateway]`, built from a wheel of this checkout."""
    root = tmp_path_factory.mktemp("gateway-venv")
    source = root / "src"  # a copy, so the build leaves no build/ or egg-info in the checkout
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".bench", ".data", ".sdk-venvs", "tests", "bench", ".terraform", "__pycache__", "infra"))
    wheels = root / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(source)], check=True, capture_output=True, timeout=300)
    wheel = next(wheels.glob("sluice-*.whl"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    python = venv / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", f"{wheel}[gateway]"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return python


@pytest.mark.slow
def test_gateway_extra_installs_and_imports_without_torch(gateway_venv, tmp_path):
    # cwd outside the checkout: the installed wheel is what gets imported
    done = subprocess.run([str(gateway_venv), "-c", IMPORT_ALL], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    report = __import__("json").loads(done.stdout.strip().splitlines()[-1])
    assert str(gateway_venv.parents[1]) in report["file"], report  # the venv's copy, not the checkout
    assert report["modules"] > 30
    assert report["heavy"] == []
    probe = subprocess.run([str(gateway_venv), "-c", "import torch"], capture_output=True, text=True, cwd=tmp_path)
    assert probe.returncode != 0 and "No module named 'torch'" in probe.stderr


@pytest.mark.slow
def test_gateway_image_refuses_the_worker_subcommand_clearly(gateway_venv, tmp_path):
    sluice = gateway_venv.parent / "sluice"
    done = subprocess.run([str(sluice), "worker", "--port", "1"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert done.returncode != 0
    assert "sluice[worker]" in done.stderr and "Traceback" not in done.stderr, done.stderr
