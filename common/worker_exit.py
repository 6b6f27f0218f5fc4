"""How a worker process tells whoever started it that its model cannot load (a process-level contract).

It writes one plain line, prefixed `MODEL_LOAD_FAILED`, to stderr and exits with `MODEL_LOAD_FAILED_EXIT`.
Starting it again cannot help, so a supervisor marks the endpoint failed instead of restarting it.
"""

MODEL_LOAD_FAILED_EXIT = 3
MODEL_LOAD_FAILED = "sluice worker: cannot load model"
