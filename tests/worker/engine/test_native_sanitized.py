"""forward.c built with AddressSanitizer and UndefinedBehaviorSanitizer, run by a C harness (native_harness.c):
every call shape the engine makes computes with no read or write outside its buffers and no undefined
behaviour, and every out-of-range index is refused with nothing written. Both builds: this CPU's (AVX512-VNNI
where it has it) and the plain-C path. No torch in the process, so the sanitizers need no preloading.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from worker.engine.native.build import FLAGS, SOURCE

HARNESS = Path(__file__).with_name("native_harness.c")
SANITIZE = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g", "-O1")
CALLS = 17  # the harness's calls

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


@pytest.mark.parametrize("extra", [(), ("-mno-avx512vnni",)], ids=["this-cpu", "plain-c"])
def test_every_call_shape_is_clean_under_asan_and_ubsan(tmp_path, extra):
    if extra and platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the plain-C build's flag is x86's")
    binary = tmp_path / "harness"
    flags = [f for f in FLAGS if f not in ("-O3", "-shared", "-fPIC", "-lm")]
    built = subprocess.run(["gcc", *flags, *extra, *SANITIZE, f"-I{SOURCE.parent}", str(HARNESS), "-o", str(binary),
                            "-lm"], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-4000:]
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=23",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
    done = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0 and done.stdout.strip() == f"ok {CALLS}", done.stdout + done.stderr[-6000:]
    assert "runtime error" not in done.stderr and "Sanitizer" not in done.stderr, done.stderr[-6000:]
