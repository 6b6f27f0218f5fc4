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
- `PARENT_PID_ENV` carries the gateway's pid: the worker asks at its start to die with it (`die_with_parent`),
  so even a gateway killed with SIGKILL leaves no orphan. Asked by the child after exec, never in a
  `preexec_fn` between fork and exec, which is unsafe in the threaded gateway.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

import msgspec

from common.protocol import ModelConfig
from common.worker_settings import variable

MODEL_LOAD_FAILED_EXIT = 3
MODEL_LOAD_FAILED = "sluice worker: cannot load model"
SPAWNED_AT_ENV = variable("spawned_at")  # SLUICE_SPAWNED_AT
PARENT_PID_ENV = "SLUICE_PARENT_PID"  # not a worker setting: read (and removed) before the settings are
PR_SET_PDEATHSIG = 1
STANDBY_READY = "worker_standby_ready"  # the log event a standby worker writes once it has imported everything


class Assignment(msgspec.Struct, forbid_unknown_fields=True):
    """What a standby worker becomes."""

    model: ModelConfig
    port: int
    worker_id: str
    data_dir: str
    assigned_at: float  # unix time


def die_with_parent(parent_env: str = PARENT_PID_ENV) -> None:
    """When `parent_env` names this process's parent: SIGTERM to this process once the parent ends, however it
    ends (Linux PR_SET_PDEATHSIG; elsewhere nothing). Exits at once if the parent ended before this ran. The
    variable is taken out of the environment: a process this one starts is not the parent's child."""
    parent = os.environ.pop(parent_env, "")
    if not parent or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(parent):
        raise SystemExit("sluice: the process that started this one is gone")
