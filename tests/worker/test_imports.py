"""What a worker process imports: triton stays out (worker/__init__.py says why), checked in a fresh interpreter."""

import subprocess
import sys

import pytest

PROBE = """
import sys
import worker
import torch._dynamo  # what transformers imports, and what probes for triton
from torch.utils._triton import has_triton_package
print(has_triton_package(), any("libtriton" in line for line in open("/proc/self/maps")))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_a_worker_process_never_maps_triton():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.split()[-2:] == ["False", "False"]
