"""The CPU's instruction sets, and the compute path `quantization = "auto"` picks from them.

The pick is the fastest configuration that keeps output quality, as measured by bench/default_config.py
(README.md, "The default compute path", has the tables and the machine): `q4` (the native C forward over
4-bit groups, worker/engine/native/) where the CPU has AVX512-VNNI, its fast path, and a C compiler can
build it; else `w8a8` (FBGEMM's int8 kernels, which need AVX2); else `bfloat16` where the CPU multiplies it
natively (AVX512-BF16 or AMX); else `float32`. q4 is picked only where w8a8 could run too: that is what a
worker runs instead when the native forward fails to start (worker/engine/engine.py). A path the CPU lacks
is never picked: q4's plain-C path, FBGEMM without AVX2 and bfloat16 without native instructions all run
several times slower. `pick_cpu_default` is a pure function of the features, so every branch is tested on
any machine; `cpu_features` reads the real ones.

The rule (bench/default_config.py prints it): top-1 agreement with float32 >= 0.90 and perplexity <= 1.05x
float32's, then the fastest at 16 streams. On SmolLM2-135M all four keep quality and q4 is the fastest, then
w8a8, bfloat16, float32; README.md ("The default compute path") has the measured tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# the /proc/cpuinfo flags that decide a path (Linux's names)
AVX2, AVX512_VNNI, AVX_VNNI, AVX512_BF16, AMX_BF16, AMX_INT8 = \
    "avx2", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8"
KNOWN = frozenset({AVX2, AVX512_VNNI, AVX_VNNI, AVX512_BF16, AMX_BF16, AMX_INT8})
# torch's own capability query, for CPUs whose flags cannot be read: it names the widest vector unit only
_CAPABILITY_FEATURES = {"AVX2": {AVX2}, "AVX512": {AVX2}, "AVX512_BF16": {AVX2, AVX512_BF16},
                        "AMX": {AVX2, AVX512_BF16, AMX_BF16}}


@dataclass(frozen=True)
class CpuDefault:
    quantization: str  # "q4", "w8a8" or "none"
    dtype: str  # "float32" or "bfloat16"
    reason: str


def parse_cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The known features among the first processor's `flags` line of /proc/cpuinfo (x86 Linux)."""
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return frozenset(value.split()) & KNOWN
    return frozenset()


def cpu_features(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """This CPU's known features: /proc/cpuinfo's flags, else what torch's capability query implies."""
    try:
        flags = parse_cpu_flags(cpuinfo.read_text())
    except OSError:
        flags = frozenset()
    if flags:
        return flags
    import torch

    return frozenset(_CAPABILITY_FEATURES.get(torch.backends.cpu.get_cpu_capability(), set()))


def pick_cpu_default(features: frozenset[str], quantized_engines: frozenset[str],
                     compiler_problem: str | None) -> CpuDefault:
    """The measured winner the CPU can run: q4 > w8a8 > bfloat16 > float32 (bench/default_config.py).
    `quantized_engines`: torch.backends.quantized.supported_engines (w8a8 needs "fbgemm"); `compiler_problem`:
    None when a C compiler can build q4's native forward, else why not (worker/engine/native/build.py)."""
    if AVX2 in features and "fbgemm" in quantized_engines:
        if AVX512_VNNI in features and compiler_problem is None:
            return CpuDefault("q4", "float32", "fastest that keeps quality; the CPU has AVX512-VNNI for the native "
                                               "forward's int8 products and a C compiler builds it")
        if AVX512_VNNI in features:
            return CpuDefault("w8a8", "float32", f"q4 needs its native forward built: {compiler_problem}; w8a8 is "
                                                 "the fastest that keeps quality without it (FBGEMM's int8, AVX2)")
        vnni = " and AVX-VNNI" if AVX_VNNI in features else ""
        return CpuDefault("w8a8", "float32", f"fastest that keeps quality without AVX512-VNNI (q4's fast path); "
                                             f"the CPU has AVX2{vnni} for FBGEMM's int8")
    if features & {AVX512_BF16, AMX_BF16}:
        return CpuDefault("none", "bfloat16", "no AVX2 for FBGEMM's int8; the CPU multiplies bfloat16 natively")
    return CpuDefault("none", "float32", "no AVX2 for FBGEMM's int8 and no native bfloat16")
