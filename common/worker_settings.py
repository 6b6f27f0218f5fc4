"""`WorkerSettings`: everything a worker process is configured by, declared once. The gateway that starts a
worker writes these (flags, environment, a standby's `Assignment`: common/worker_launch.py); the worker reads
them in one place (worker/settings.py). Each field's environment variable is derived as the gateway's are
(common/settings_env.py): `model_cache` is SLUICE_MODEL_CACHE, `[model] source` is SLUICE_MODEL__SOURCE.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from common.protocol import ModelConfig
from common.settings_env import PREFIX, settings_variables


class WorkerSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # what to serve and where: flags (`--model-json`, `--port`...) or a standby's Assignment, over the environment
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    host: Annotated[str, msgspec.Meta(min_length=1, max_length=253)] = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 8100
    data_dir: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)] = ".data"
    worker_id: Annotated[str, msgspec.Meta(max_length=200)] = ""  # "" = a random one
    standby: bool = False  # import everything, then read an Assignment line from stdin
    # what the gateway decides for each process it starts (a remote worker's operator sets the secret)
    worker_secret: Annotated[str, msgspec.Meta(max_length=4096)] = ""  # worker/secret.py
    spawned_at: Annotated[float, msgspec.Meta(ge=0)] = 0.0  # unix time the gateway asked; 0 = the worker's import
    # the host's: a local worker inherits these from its gateway's environment (INHERITED)
    log_format: Literal["json", "console"] = "json"
    model_cache: Annotated[str, msgspec.Meta(max_length=4096)] = ""  # "" = <data_dir>/models (worker/loading.py)
    s3_endpoint: Annotated[str, msgspec.Meta(max_length=512)] = ""  # "" = AWS; s3:// model and adapter sources
    torch_threads: Annotated[int, msgspec.Meta(ge=0, le=4096)] = 0  # where the model's `threads` is 0; 0 = half
    native_cache: Annotated[str, msgspec.Meta(max_length=4096)] = ""  # "" = ~/.cache/sluice/native
    native_flags: Annotated[str, msgspec.Meta(max_length=4096)] = ""  # added to q4's C build, split as a shell would
    native_compile_timeout: Annotated[float, msgspec.Meta(gt=0, le=86_400)] = 300.0  # seconds a q4 compile may take


# the settings a gateway passes from its own environment to the local workers it starts (gateway/replicas/trust.py)
INHERITED = ("log_format", "model_cache", "s3_endpoint", "torch_threads", "native_cache", "native_flags",
             "native_compile_timeout")


def variable(field: str) -> str:
    """The environment variable of a top-level field: `spawned_at` -> SLUICE_SPAWNED_AT."""
    if field not in WorkerSettings.__struct_fields__:
        raise KeyError(field)
    return PREFIX + field.upper()


def worker_variables() -> frozenset[str]:
    """Every variable a worker reads as a setting."""
    return frozenset(settings_variables(WorkerSettings))


def arguments(settings: WorkerSettings) -> list[str]:
    """The flags of `python -m worker` that start a worker with `settings`' model, address and identity (the
    process's own; the environment carries the rest: `environment`)."""
    return ["--model-json", msgspec.json.encode(settings.model).decode(), "--host", settings.host,
            "--port", str(settings.port), "--data-dir", settings.data_dir, "--worker-id", settings.worker_id]


def environment(settings: WorkerSettings) -> dict[str, str]:
    """The variables that give a worker what its gateway decided for it: its secret and when it was asked for."""
    return {variable("worker_secret"): settings.worker_secret, variable("spawned_at"): repr(settings.spawned_at)}
