"""The CPU's features and the compute path `auto` picks from them: every branch as a function of a feature
set, and this machine's own detection."""

from __future__ import annotations

import pytest
import torch

from worker.cpu_features import (
    AMX_BF16,
    AVX2,
    AVX512_BF16,
    AVX512_VNNI,
    AVX_VNNI,
    cpu_features,
    parse_cpu_flags,
    pick_cpu_default,
)

FBGEMM = frozenset({"fbgemm", "qnnpack", "none"})
NO_CC = "quantization q4 needs a C compiler: CC='/nowhere/cc' is not an executable"


@pytest.mark.parametrize(("features", "engines", "compiler", "quantization", "dtype"), [
    ({AVX2, AVX512_VNNI}, FBGEMM, None, "q4", "float32"),
    ({AVX2, AVX512_VNNI, AVX512_BF16, AMX_BF16}, FBGEMM, None, "q4", "float32"),
    ({AVX2, AVX512_VNNI}, FBGEMM, NO_CC, "w8a8", "float32"),  # q4 cannot be built: the next winner
    ({AVX2, AVX_VNNI}, FBGEMM, None, "w8a8", "float32"),  # AVX-VNNI (256-bit) is not q4's fast path
    ({AVX2}, FBGEMM, None, "w8a8", "float32"),
    ({AVX2, AVX512_VNNI, AVX512_BF16}, frozenset({"qnnpack"}), None, "none", "bfloat16"),  # no FBGEMM: no fallback
    ({AMX_BF16}, frozenset(), None, "none", "bfloat16"),
    ({AVX2}, frozenset({"qnnpack"}), None, "none", "float32"),
    (set(), FBGEMM, None, "none", "float32"),  # e.g. an ARM CPU: no x86 flags at all
])
def test_auto_picks_the_measured_winner_the_cpu_can_run(features, engines, compiler, quantization, dtype):
    picked = pick_cpu_default(frozenset(features), engines, compiler)
    assert (picked.quantization, picked.dtype) == (quantization, dtype)
    assert picked.reason and "\n" not in picked.reason
    if compiler is not None and AVX512_VNNI in features:
        assert compiler in picked.reason  # why q4 was passed over, in the compute_picked line


def test_the_flags_line_is_parsed_and_unknown_flags_dropped():
    cpuinfo = ("processor\t: 0\nmodel name\t: Some CPU\n"
               "flags\t\t: fpu sse2 avx avx2 avx512f avx512_vnni avx512_bf16 amx_tile amx_bf16 amx_int8\n"
               "processor\t: 1\nflags\t\t: fpu\n")
    assert parse_cpu_flags(cpuinfo) == {"avx2", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"}
    assert parse_cpu_flags("Features\t: fp asimd\n") == frozenset()  # ARM's cpuinfo names no x86 flags


def test_this_machines_features_agree_with_torchs_own_capability_query(tmp_path):
    capability = torch.backends.cpu.get_cpu_capability()
    features = cpu_features()
    assert (AVX2 in features) == (capability in ("AVX2", "AVX512", "AVX512_BF16", "AMX"))
    unreadable = tmp_path / "cpuinfo"
    unreadable.write_text("processor\t: 0\n")  # no flags line: torch's query answers instead
    fallback = cpu_features(unreadable)
    assert fallback <= features and (AVX2 in fallback) == (AVX2 in features)
