"""How a gateway starts a local worker process, and how the process answers (a process-level contract).

- `python -m worker --model-json ... --port ...` loads the model at once.
- `python -m worker --standby` imports everything a worker needs, then waits for one `Assignment`
  (a JSON line on stdin) and goes on as if started with it: a model scaled to zero then skips the
  seconds of imports when it wakes.
- A worker whose model cannot load writes one plain line, prefixed `MODEL_LOAD_FAILED`, to stderr and
  exits with `MODEL_LOAD_FAILED_EXIT`. Starting it again cannot help, so the endpoint controller marks the
  endpoint failed instead of restarting it.
- Every other setting of a worker is a field of `WorkerSettings` (common/worker_settings.py).
- `SPAWNED_AT_ENV` carries the unix time the gateway spawned (or assigned) the process, so the worker
  can report how long its start took from the gateway's point of view.
"""

from __future__ import annotations

import msgspec

from common.protocol import ModelConfig
from common.worker_settings import variable

MODEL_LOAD_FAILED_EXIT = 3
MODEL_LOAD_FAILED = "sluice worker: cannot load model"
SPAWNED_AT_ENV = variable("spawned_at")  # SLUICE_SPAWNED_AT
STANDBY_READY = "worker_standby_ready"  # the log event a standby worker writes once it has imported everything


class Assignment(msgspec.Struct, forbid_unknown_fields=True):
    """What a standby worker becomes."""

    model: ModelConfig
    port: int
    worker_id: str
    data_dir: str
    assigned_at: float  # unix time
