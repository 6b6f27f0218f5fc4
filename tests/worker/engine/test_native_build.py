"""How the native forward is built (worker/engine/native/build.py): the compiler's identity is part of the cache
key, and a compile that hangs is killed, with its children, at SLUICE_NATIVE_COMPILE_TIMEOUT.

The compilers here are real gcc behind a small shell script that answers `--version` as told (a compiler
upgraded in place), or sleeps before compiling (a compile that hangs). `-O0` after the built-in flags keeps
each build short.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from worker.c_compiler import NativeUnavailable
from worker.engine.native.build import load_library

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def _compiler(directory: Path, body: str) -> Path:
    script = directory / "cc"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


@pytest.fixture
def quick(tmp_path, monkeypatch):
    monkeypatch.setenv("SLUICE_NATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SLUICE_NATIVE_FLAGS", "-O0")
    return tmp_path


def test_another_compiler_at_the_same_path_builds_its_own_library(quick, monkeypatch):
    """Keyed by the path alone, an upgraded gcc kept loading what the old one built."""
    cc = _compiler(quick, 'if [ "$1" = "--version" ]; then echo "$FAKE_CC_VERSION"; exit 0; fi\nexec gcc "$@"')
    monkeypatch.setenv("CC", str(cc))
    built = {}
    for version in ("gcc (Test) 12.2.0", "gcc (Test) 13.1.0"):
        monkeypatch.setenv("FAKE_CC_VERSION", version)
        library = load_library()
        assert library.sluice_native_forward  # a whole library, not a stub
        built[version] = Path(library._name).parent
    assert len(set(built.values())) == 2, built
    monkeypatch.setenv("FAKE_CC_VERSION", "gcc (Test) 12.2.0")
    assert Path(load_library()._name).parent == built["gcc (Test) 12.2.0"]  # the same compiler: the cache


def test_a_compile_past_the_timeout_is_killed_with_its_children_and_fails_in_one_line(quick, monkeypatch):
    pid_file = quick / "compiler.pid"
    cc = _compiler(quick, f'if [ "$1" = "--version" ]; then echo slow; exit 0; fi\n'
                          f'echo $$ > {pid_file}\nsleep 120\nexec gcc "$@"')  # sleep: a child, as cc1 is
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("SLUICE_NATIVE_COMPILE_TIMEOUT", "2")
    with pytest.raises(NativeUnavailable, match="ran past 2 s") as raised:
        load_library()
    assert "\n" not in str(raised.value)
    group = int(pid_file.read_text())
    for _ in range(300):  # the killed sleep is reaped by init: wait for it, generously
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the compiler's children outlived the timeout")
    assert not list((quick / "cache").glob("*/libsluice_forward.so"))  # nothing half-built is kept


@pytest.mark.parametrize("value", ["soon", "0", "-5"])
def test_a_timeout_that_is_not_a_positive_number_is_refused(quick, monkeypatch, value):
    monkeypatch.setenv("SLUICE_NATIVE_COMPILE_TIMEOUT", value)
    with pytest.raises(NativeUnavailable, match="SLUICE_NATIVE_COMPILE_TIMEOUT"):
        load_library()
