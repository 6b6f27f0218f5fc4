"""The model worker. Its start timings count from this package's first import (python -m worker),
which comes before every heavy import.

Triton is kept out of the worker's processes: torch._dynamo (which transformers imports) probes for it by
importing it, and that import maps ~65 MB of libtriton into the process's RSS. The worker compiles no
kernels (TorchScript and our own C, never torch.compile), so a `None` entry makes the probe answer "no
triton" (`import triton` raises ImportError, `importlib.util.find_spec` returns None). Where triton was
imported already, it stays.
"""

import sys
import time

IMPORTED_AT = time.time()
sys.modules.setdefault("triton", None)
