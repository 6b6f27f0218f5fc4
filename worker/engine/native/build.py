"""Compile forward.c with the system C compiler into a cache keyed by the source, the flags and the CPU.

`-march=native` makes the library specific to the CPU it was built on (AVX512-VNNI where present), so
the CPU's model name and flags are part of the key. Built once per key under a lock (build_once.py), then
loaded with ctypes: no torch C++ extension, whose headers alone take a minute to compile. No compiler:
`NativeUnavailable` with one line saying so (the engine reports it at start-up and exits).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

from worker.build_once import build_once

SOURCE = Path(__file__).with_name("forward.c")
FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-pthread", "-std=c11", "-lm")
LIBRARY = "libsluice_forward.so"


class NativeUnavailable(RuntimeError):
    pass


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


def compiler() -> str:
    found = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not found:
        raise NativeUnavailable("quantization q4 needs a C compiler (gcc: apt-get install build-essential)")
    return found


@cache
def load_library() -> ctypes.CDLL:
    """The compiled forward, built on first use."""
    cc = compiler()
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, " ".join(FLAGS).encode(), cc.encode(),
                                     _cpu_identity().encode()])).hexdigest()[:24]

    def build(staging: Path) -> None:
        result = subprocess.run([cc, *FLAGS[:-1], str(SOURCE), "-o", str(staging / LIBRARY), FLAGS[-1]],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise NativeUnavailable(f"compiling {SOURCE.name} failed: {result.stderr.strip()[:500]}")

    target = build_once(cache_root() / key, LIBRARY, build)
    return ctypes.CDLL(str(target / LIBRARY))
