"""The CPU's instruction sets, and the compute path `quantization = "auto"` picks from them.

The pick is the fastest configuration that keeps output quality, as measured by bench/default_config.py
(README.md has the table and the machine): `w8a8` (FBGEMM's int8 kernels, which need AVX2), else
`bfloat16` where the CPU multiplies it natively (AVX512-BF16 or AMX), else `float32`. A path the CPU
lacks is never picked: FBGEMM without AVX2 and bfloat16 without native instructions both run several
times slower than float32. `pick_cpu_default` is a pure function of the features, so every branch is
tested on any machine; `cpu_features` reads the real ones.
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
    quantization: str  # "w8a8" or "none"
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


def pick_cpu_default(features: frozenset[str], quantized_engines: frozenset[str]) -> CpuDefault:
    """The measured winner the CPU can run: w8a8 > bfloat16 > float32 (bench/default_config.py).
    `quantized_engines`: torch.backends.quantized.supported_engines (w8a8 needs "fbgemm")."""
    if AVX2 in features and "fbgemm" in quantized_engines:
        vnni = " and VNNI" if features & {AVX512_VNNI, AVX_VNNI} else ""
        return CpuDefault("w8a8", "float32", f"fastest that keeps quality; the CPU has AVX2{vnni} for FBGEMM's int8")
    if features & {AVX512_BF16, AMX_BF16}:
        return CpuDefault("none", "bfloat16", "no AVX2 for FBGEMM's int8; the CPU multiplies bfloat16 natively")
    return CpuDefault("none", "float32", "no AVX2 for FBGEMM's int8 and no native bfloat16")
