"""forward.c's vectorized attention over many queries and its SiLU's expf keep the bits of the arithmetic they
replace (native_exact.c): a draft token's logits stay bitwise those of a decode step of its own, and those of the
code before. Built with the flags the engine's library is built with, so the compiler keeps the same rounding."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from worker.engine.native.build import FLAGS, SOURCE

CHECK = Path(__file__).with_name("native_exact.c")

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def test_many_queries_at_once_and_sixteen_exponentials_keep_every_bit(tmp_path):
    binary = tmp_path / "exact"
    flags = [f for f in FLAGS if f not in ("-shared", "-fPIC", "-lm")]
    built = subprocess.run(["gcc", *flags, f"-I{SOURCE.parent}", str(CHECK), "-o", str(binary), "-lm"],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-4000:]
    done = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] in ("ok", "skip"), done.stdout[-4000:]
