"""Compile forward.c with the system C compiler into a cache keyed by the source, the flags and the CPU.

`-march=native` makes the library specific to the CPU it was built on (AVX512-VNNI where present), so
the CPU's model name and flags are part of the key. SLUICE_NATIVE_FLAGS adds flags after the built-in ones
(part of the key too): `-mno-avx512vnni` builds the plain-C path a CPU without AVX512-VNNI runs, on any CPU.
Built once per key under a lock (build_once.py), then loaded with ctypes: no torch C++ extension, whose
headers alone take a minute to compile. No usable compiler, or a failed build: `NativeUnavailable` with one
line saying so (a configured q4 fails its start with it; `auto` picks w8a8 instead, worker/loading.py).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import subprocess
from functools import cache
from pathlib import Path

from worker.build_once import build_once
from worker.c_compiler import NativeUnavailable, compiler

SOURCE = Path(__file__).with_name("forward.c")
FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-pthread", "-std=c11", "-lm")
LIBRARY = "libsluice_forward.so"


def cache_root() -> Path:
    """SLUICE_NATIVE_CACHE, else ~/.cache/sluice/native."""
    configured = os.environ.get("SLUICE_NATIVE_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "sluice" / "native"


def _cpu_identity() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown"
    wanted = [line for line in lines if line.split(":")[0].strip() in ("model name", "flags")]
    return "\n".join(wanted[:2])


def extra_flags() -> tuple[str, ...]:
    """SLUICE_NATIVE_FLAGS, split as a shell would: flags the compiler gets after FLAGS."""
    return tuple(shlex.split(os.environ.get("SLUICE_NATIVE_FLAGS", "")))


def load_library() -> ctypes.CDLL:
    """The compiled forward for the current compiler and SLUICE_NATIVE_FLAGS, built on first use."""
    return _load(compiler(), extra_flags())


@cache
def _load(cc: str, extra: tuple[str, ...]) -> ctypes.CDLL:
    flags = (*FLAGS[:-1], *extra)
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, " ".join((*flags, FLAGS[-1])).encode(), cc.encode(),
                                     _cpu_identity().encode()])).hexdigest()[:24]

    def build(staging: Path) -> None:
        try:
            result = subprocess.run([cc, *flags, str(SOURCE), "-o", str(staging / LIBRARY), FLAGS[-1]],
                                    capture_output=True, text=True)
        except OSError as error:  # not an executable after all
            raise NativeUnavailable(f"compiling {SOURCE.name} failed: {cc}: {error}") from error
        if result.returncode != 0:
            detail = " ".join(result.stderr.split())[:500] or f"{cc} exited with {result.returncode}"
            raise NativeUnavailable(f"compiling {SOURCE.name} failed: {detail}")

    target = build_once(cache_root() / key, LIBRARY, build)
    return ctypes.CDLL(str(target / LIBRARY))
