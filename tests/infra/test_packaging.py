"""What the images install is what runs: a wheel of this checkout, installed in a fresh venv.

The gateway installs and imports without torch: `pip install .[gateway]` in a venv built under a tmp dir
(no `--system-site-packages`), so only what `.[gateway]` declares is there. Dependencies come from pip's
cache after the first run. The worker's q4 default compiles forward.c on the host: the wheel carries the
source, and an installed copy (nothing of the checkout on its path) builds the library from its own files.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import httpx
import msgspec
import pytest

from worker.engine.native import build

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
def wheel(tmp_path_factory) -> Path:
    """A wheel of this checkout, built as the Dockerfiles build it (`pip wheel --no-deps`)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"  # a copy, so the build leaves no build/ or egg-info in the checkout
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".bench", ".data", ".sdk-venvs", "tests", "bench", ".terraform", "__pycache__", "infra"))
    wheels = root / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(source)], check=True, capture_output=True, timeout=300)
    return next(wheels.glob("sluice-*.whl"))


@pytest.fixture(scope="module")
def gateway_venv(tmp_path_factory, wheel) -> Path:
    """A fresh venv holding only `sluice[gateway]`, built from a wheel of this checkout."""
    root = tmp_path_factory.mktemp("gateway-venv")
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


def test_the_wheel_ships_the_native_sources(wheel):
    """Without its sources an installed worker could not build q4 (its default on AVX512-VNNI hosts)."""
    with zipfile.ZipFile(wheel) as archive:
        for path in (*build.SOURCES, *build.HEADERS):
            name = path.relative_to(REPO).as_posix()
            assert archive.read(name) == path.read_bytes(), name


BUILD_FROM_INSTALLED = textwrap.dedent("""
    import json, sys
    from worker.engine.native import build
    library = build.load_library()
    print(json.dumps({"module": build.__file__, "source": str(build.SOURCE), "library": library._name,
                      "vnni": library.sluice_native_vnni(), "path": sys.path}))
""")


def _installed(wheel: Path, venv: Path) -> Path:
    """The wheel alone (--no-deps) in a new venv without site packages; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True, timeout=300)
    return python


def _outside_env() -> dict[str, str]:
    """This environment without PYTHONPATH and friends: nothing of the checkout on an import path."""
    return {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "VIRTUAL_ENV"))}


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_an_installed_worker_builds_the_native_forward_from_its_own_files(wheel, tmp_path):
    """The wheel in a venv with no site packages and nothing of the checkout on its path (cwd elsewhere, no
    PYTHONPATH): the build module and the source it compiles are the venv's, and the library loads."""
    venv = tmp_path / "venv"
    python = _installed(wheel, venv)
    # the build reads the worker's settings, declared with msgspec: its one dependency, copied from this
    # interpreter's (self-contained; pip --no-index has no msgspec wheel to install)
    packages = next((venv / "lib").glob("python*/site-packages"))
    shutil.copytree(Path(msgspec.__file__).parent, packages / "msgspec")
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = _outside_env()
    env.update(SLUICE_NATIVE_CACHE=str(tmp_path / "native"), SLUICE_NATIVE_FLAGS="-O0")  # -O0: a short build
    done = subprocess.run([str(python), "-c", BUILD_FROM_INSTALLED], capture_output=True, text=True, cwd=work,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    site = next(Path(p) for p in report["path"] if p.endswith("site-packages"))
    assert site.is_relative_to(venv)
    assert Path(report["module"]).is_relative_to(site) and Path(report["source"]).is_relative_to(site), report
    assert not any(p.startswith(str(REPO)) for p in report["path"]), report["path"]
    assert Path(report["library"]).is_relative_to(tmp_path / "native")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_an_installed_worker_serves_q4(wheel, tmp_path):
    """`python -m worker` from the wheel, configured `quantization = "q4"` (which fails its start where the
    library cannot be built), serves a generation. The venv reaches the third-party packages of this one
    (torch is too heavy to install again) through a .pth line, which comes after its own site-packages: our
    packages are the wheel's (checked), nothing of the checkout is on the path."""
    from common.protocol import Finish, GenerateRequest, SamplingParams, decode_event
    from testkit.servers import free_port
    from testkit.sluice import MODEL_CACHE, wait_for_health
    from testkit.tiny_model import write_tiny_model

    venv = tmp_path / "venv"
    python = _installed(wheel, venv)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    (site / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    model = write_tiny_model(tmp_path / "tiny")
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = _outside_env()
    env.update(SLUICE_MODEL_CACHE=str(MODEL_CACHE), SLUICE_NATIVE_CACHE=str(tmp_path / "native"))
    where = subprocess.run([str(python), "-c", "import common, worker.engine.native.build as b; "
                            "print(b.__file__); print(common.__file__)"],
                           capture_output=True, text=True, cwd=work, env=env, timeout=120)
    assert where.returncode == 0, where.stderr[-3000:]
    assert all(Path(line).is_relative_to(site) for line in where.stdout.split()), where.stdout
    port = free_port()
    process = subprocess.Popen([str(python), "-m", "worker", "--port", str(port), "--data-dir", str(tmp_path / "data"),
                                "--model-json", json.dumps({"source": str(model), "quantization": "q4",
                                                            "dtype": "float32", "max_batch_size": 2,
                                                            "max_context": 128})],
                               cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_for_health(process, url, 300, "the installed worker")
        except BaseException:
            process.kill()
            raise AssertionError(process.communicate(timeout=30)[1][-4000:]) from None
        info = httpx.get(f"{url}/info", timeout=30).json()
        chat = GenerateRequest(request_id="installed-q4", model="test", messages=[{"role": "user", "content": "Hi"}],
                               params=SamplingParams(max_tokens=3, min_tokens=3, temperature=0.0))
        reply = httpx.post(f"{url}/generate", content=msgspec.json.encode(chat), timeout=120)
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert info["quantization"] == "q4", info
    assert reply.status_code == 200, reply.text
    events = [decode_event(line) for line in reply.content.splitlines() if line]
    assert [len(e.token_ids) for e in events if isinstance(e, Finish)] == [3]
    assert list((tmp_path / "native").glob("*/libsluice_forward.so"))  # built here, from the venv's source
