"""The one place a worker reads its configuration: the environment (SLUICE_* variables derived from
`WorkerSettings`, common/worker_settings.py), then the command line's flags, then, for a standby worker, the
`Assignment` line its gateway writes on stdin. No other module of the worker reads `os.environ`.

A bad value stops the start with one line naming it (`SystemExit`, exit status 1). Modules that read a setting
after the start (the q4 build, the model cache) call `environment()`, which reads the variables as they are now.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping
from typing import IO, Any

import msgspec

from common.settings_env import PREFIX as VARIABLE_PREFIX
from common.settings_env import TABLE_SEPARATOR, overrides, settings_variables
from common.worker_launch import Assignment
from common.worker_settings import WorkerSettings

PREFIX = "sluice worker: invalid configuration"


_FLAGS = {"model": "--model-json", "host": "--host", "port": "--port", "data_dir": "--data-dir",
          "worker_id": "--worker-id"}
_AT = re.compile(r"`\$\.([a-z0-9_.]+)`$")


class SettingsError(ValueError):
    """A value that is not a valid setting; the message is one line naming it."""


def _named(error: msgspec.ValidationError) -> str:
    """msgspec's message with the setting's variable beside its path: "... - at `$.port` (SLUICE_PORT)"."""
    text = str(error)
    found = _AT.search(text)
    if found is None:
        return text
    path = found.group(1)
    named = VARIABLE_PREFIX + path.replace(".", TABLE_SEPARATOR).upper()
    names = [_FLAGS.get(path.split(".")[0]), named if named in settings_variables(WorkerSettings) else None]
    return f"{text} ({' or '.join(name for name in names if name)})"


def environment(environ: Mapping[str, str] | None = None) -> WorkerSettings:
    """The settings the environment gives (defaults elsewhere); `SettingsError` names a bad variable."""
    try:
        return msgspec.convert(overrides(WorkerSettings, os.environ if environ is None else environ), WorkerSettings)
    except msgspec.ValidationError as error:
        raise SettingsError(f"{PREFIX} in the environment: {_named(error)}") from None
    except ValueError as error:  # overrides' names the variable already
        raise SettingsError(f"{PREFIX} in the environment: {error}") from None


def c_compiler() -> str:
    """`CC`, the compiler every build tool reads (not a SLUICE_ setting); "" = gcc or cc on PATH."""
    return os.environ.get("CC", "")


def _parser() -> argparse.ArgumentParser:
    # flags are strings here: msgspec converts and bounds them with the rest, so a bad one is one line too
    parser = argparse.ArgumentParser(prog="python -m worker")
    parser.add_argument("--model-json", help="a ModelConfig as JSON")
    parser.add_argument("--host")
    parser.add_argument("--port")
    parser.add_argument("--data-dir")
    parser.add_argument("--worker-id")
    parser.add_argument("--standby", action="store_true", default=None,
                        help="import, then read an Assignment line from stdin")
    return parser


def load(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> WorkerSettings:
    """The environment, then the flags of `argv` over it; one line and exit 1 on a bad value."""
    args = _parser().parse_args(argv)
    try:
        raw: dict[str, Any] = overrides(WorkerSettings, os.environ if environ is None else environ)
    except ValueError as error:
        raise SystemExit(f"{PREFIX} in the environment: {error}") from None
    flags = {name: value for name, value in vars(args).items() if value is not None and name != "model_json"}
    if args.model_json is not None:
        try:
            flags["model"] = msgspec.json.decode(args.model_json)
        except msgspec.DecodeError as error:
            raise SystemExit(f"{PREFIX}: --model-json is not JSON ({error})") from None
    raw.update(flags)
    try:
        return msgspec.convert(raw, WorkerSettings, strict=False)
    except msgspec.ValidationError as error:
        raise SystemExit(f"{PREFIX}: {_named(error)}") from None


def assigned(settings: WorkerSettings, stdin: IO[bytes] | None = None) -> WorkerSettings | None:
    """What a standby worker becomes: the `Assignment` line its gateway writes on stdin over `settings`; None
    when the gateway let go of it (stdin closed empty). One line and exit 1 on a bad line."""
    line = (sys.stdin.buffer if stdin is None else stdin).readline()
    if not line.strip():
        return None
    try:
        job = msgspec.json.decode(line, type=Assignment)
        return msgspec.convert({**msgspec.to_builtins(settings), "model": msgspec.to_builtins(job.model),
                                "port": job.port, "worker_id": job.worker_id, "data_dir": job.data_dir,
                                "spawned_at": job.assigned_at, "standby": False}, WorkerSettings)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise SystemExit(f"{PREFIX}: the assignment on stdin: {error}") from None
