"""Compile forward.c (and logit_stats.c beside it) with the system C compiler into a cache keyed by the sources,
the flags, the compiler and the CPU.

`-march=native` makes the library specific to the CPU it was built on (AVX512-VNNI where present), so
the CPU's model name and flags are part of the key. SLUICE_NATIVE_FLAGS adds flags after the built-in ones
(part of the key too): `-mno-avx512vnni` builds the plain-C path a CPU without AVX512-VNNI runs, on any CPU.
The compiler is keyed by its path and what `--version` prints, so an upgraded compiler at the same path builds
anew. A compile that runs past SLUICE_NATIVE_COMPILE_TIMEOUT seconds (default 300) is killed with its whole
process group (cc1, as, ld) and counts as a failed build.
Built once per key under a lock (build_once.py), then loaded with ctypes: no torch C++ extension, whose
headers alone take a minute to compile. No usable compiler, or a failed build: `NativeUnavailable` with one
line saying so (a configured q4 fails its start with it; `auto` picks w8a8 instead, worker/loading.py).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import signal
import subprocess
from functools import cache
from pathlib import Path

from common.worker_settings import WorkerSettings
from worker.build_once import build_once
from worker.c_compiler import NativeUnavailable, compiler
from worker.settings import SettingsError, environment

SOURCE = Path(__file__).with_name("forward.c")
# compiled into the same library: the token choice's row reductions (logit_stats.c); exp16.h is included by both
SOURCES = (SOURCE, SOURCE.with_name("logit_stats.c"))
HEADERS = (SOURCE.with_name("exp16.h"),)
FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-pthread", "-std=c11", "-lm")
LIBRARY = "libsluice_forward.so"


def _settings() -> WorkerSettings:
    try:
        return environment()
    except SettingsError as error:  # a bad variable is why the build cannot run: one line, as every refusal here
        raise NativeUnavailable(str(error)) from None


def cache_root() -> Path:
    """SLUICE_NATIVE_CACHE (the worker's `native_cache` setting), else ~/.cache/sluice/native."""
    configured = _settings().native_cache
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
    return tuple(shlex.split(_settings().native_flags))


def compile_timeout() -> float:
    """SLUICE_NATIVE_COMPILE_TIMEOUT: seconds a compile (or the compiler's --version) may take."""
    return _settings().native_compile_timeout  # bounded by the declaration: above 0


def _run(command: list[str], timeout: float) -> subprocess.CompletedProcess:
    """`command` in its own process group, the group killed when it runs past `timeout` (a compiler driver's
    children would otherwise keep running and hold its output pipes open)."""
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
    except OSError as error:  # not an executable after all
        raise NativeUnavailable(f"compiling {SOURCE.name} failed: {command[0]}: {error}") from error
    with process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise NativeUnavailable(f"compiling {SOURCE.name} failed: {command[0]} ran past {timeout:g} s "
                                    "(SLUICE_NATIVE_COMPILE_TIMEOUT)") from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def compiler_identity(cc: str) -> str:
    """What `cc --version` prints: the same path may hold another compiler after an upgrade."""
    result = _run([cc, "--version"], compile_timeout())
    if result.returncode != 0:
        raise NativeUnavailable(f"compiling {SOURCE.name} failed: `{cc} --version` exited with {result.returncode}")
    return result.stdout


def load_library() -> ctypes.CDLL:
    """The compiled forward for the current compiler and SLUICE_NATIVE_FLAGS, built on first use."""
    cc = compiler()
    return _load(cc, compiler_identity(cc), extra_flags())


@cache
def _load(cc: str, identity: str, extra: tuple[str, ...]) -> ctypes.CDLL:
    flags = (*FLAGS[:-1], *extra)
    sources = [path.read_bytes() for path in (*SOURCES, *HEADERS)]
    key = hashlib.sha256(b"\0".join([*sources, " ".join((*flags, FLAGS[-1])).encode(), cc.encode(),
                                     identity.encode(), _cpu_identity().encode()])).hexdigest()[:24]

    def build(staging: Path) -> None:
        result = _run([cc, *flags, *map(str, SOURCES), "-o", str(staging / LIBRARY), FLAGS[-1]], compile_timeout())
        if result.returncode != 0:
            detail = " ".join(result.stderr.split())[:500] or f"{cc} exited with {result.returncode}"
            raise NativeUnavailable(f"compiling {SOURCE.name} failed: {detail}")

    target = build_once(cache_root() / key, LIBRARY, build)
    return ctypes.CDLL(str(target / LIBRARY))
