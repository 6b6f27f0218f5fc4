"""SLUICE_* environment variables: one per setting, derived from the settings structure, and the few that are not
settings, listed here.

Every field of the settings struct has a variable: SLUICE_ and its name in capitals (`request_timeout_s` is
SLUICE_REQUEST_TIMEOUT_S); the fields of a table join its name with a double underscore (`[http]
keep_alive_timeout_s` is SLUICE_HTTP__KEEP_ALIVE_TIMEOUT_S, `[default_team_limits] rpm` is
SLUICE_DEFAULT_TEAM_LIMITS__RPM). A value is converted to the field's type and checked against its bounds:
numbers, booleans (true, false, 1, 0), strings as given, a list of strings separated by commas
(SLUICE_TRUSTED_PROXIES=10.0.0.0/8,192.168.0.0/16), anything else as JSON (SLUICE_MODELS='[{"name": "m"}]'). An
empty value counts as unset. A field added to the settings has its variable at once: nothing here lists them.

A SLUICE_ variable that is neither a setting nor in NOT_SETTINGS is named in a warning with the nearest setting,
since a misspelt name is otherwise silently ignored.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from typing import Any

import msgspec
import msgspec.inspect as types

from common.protocol import WORKER_SECRET_ENV
from common.worker_launch import PARENT_PID_ENV, SPAWNED_AT_ENV

PREFIX = "SLUICE_"
TABLE_SEPARATOR = "__"
# SLUICE_ variables that are not settings of the gateway: what reads each one. Tests and benchmarks only read
# theirs; `sluice serve` ignores every one of them without a warning.
NOT_SETTINGS = {
    "SLUICE_CONFIG_TOML": "the whole config file in one variable (ECS task definitions): gateway/config.py",
    "SLUICE_CONFIG_S3": "the config file as an S3 object, s3://bucket/key[?versionId=v]: gateway/config_object.py",
    WORKER_SECRET_ENV: "the secret the gateway and its workers share, given to remote workers too: "
                       "gateway/replicas/trust.py, worker/secret.py",
    "SLUICE_MODEL_CACHE": "worker: the model cache (GGUF metadata, q4 packs), shared by data dirs: worker/loading.py",
    "SLUICE_NATIVE_CACHE": "worker: where the q4 forward's compiled C library is cached: worker/engine/native/build.py",
    "SLUICE_NATIVE_COMPILE_TIMEOUT": "worker: seconds the q4 forward's compile may take: worker/engine/native/build.py",
    "SLUICE_NATIVE_FLAGS": "worker: flags added to the q4 forward's C build (`-mno-avx512vnni`: the plain-C path): "
                           "worker/engine/native/build.py",
    "SLUICE_TORCH_THREADS": "worker: torch threads where the model's `threads` is 0: worker/threads.py",
    "SLUICE_S3_ENDPOINT": "worker: an S3-compatible endpoint for s3:// model and adapter sources: worker/loading.py",
    "SLUICE_LISTEN_FD": "internal: the socket a gateway process inherits from the first: gateway/cli/processes.py",
    "SLUICE_FIRST_GATEWAY_PID": "internal: the first gateway process, to its siblings: gateway/cli/processes.py",
    SPAWNED_AT_ENV: "internal: when the gateway started a worker process: common/worker_launch.py",
    PARENT_PID_ENV: "internal: the gateway that started a worker process, which it dies with: common/worker_launch.py",
    "SLUICE_API_KEY": "docs: the key the README's client examples send (a client's, never read by sluice)",
    "SLUICE_ARTIFACTS": "test-only: where the dashboard tests write screenshots",
    "SLUICE_DISCONNECT_REQUESTS": "test-only: requests of tests/faults/test_disconnects.py",
    "SLUICE_BATCH_CRASH_LINES": "test-only: lines of tests/faults/test_batch_crash.py's batch (the issue's 2,000)",
    "SLUICE_SOAK_CLIENTS": "test-only: clients of tests/faults/test_soak.py",
    "SLUICE_SOAK_SECONDS": "test-only: length of tests/faults/test_soak.py",
    "SLUICE_FUZZ_SCALE": "test-only: examples per property test, times this (`make fuzz`)",
    "SLUICE_HYPOTHESIS_PROFILE": "test-only: the Hypothesis profile (tests/conftest.py)",
    "SLUICE_TOOL_PROOF_PROMPTS": "test-only: prompts of tests/compat/test_openai_tools.py and "
                                 "tests/worker/tools/test_proof.py (20: the whole corpus)",
    "SLUICE_TF_PLUGINS": "test-only: the Terraform provider mirror of tests/infra",
    "SLUICE_BENCH_QUICK": "bench-only: the small version of each benchmark (`make bench`)",
    "SLUICE_BENCH_NO_LEDGER": "bench-only: bench/ledger_gateway.py's baseline without a usage ledger: "
                              "gateway/cli/main.py",
}


def settings_variables(struct: type[msgspec.Struct]) -> dict[str, tuple[tuple[str, ...], Any]]:
    """Every setting's variable: name -> (the field's path through the tables, its type)."""
    return {PREFIX + TABLE_SEPARATOR.join(path).upper(): (path, kind) for path, kind in _leaves(struct, ())}


def _leaves(struct: type[msgspec.Struct], path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    for field in msgspec.structs.fields(struct):
        where = (*path, field.encode_name)
        info = types.type_info(field.type)
        if isinstance(info, types.StructType):  # a table: one variable per field
            yield from _leaves(info.cls, where)
        else:
            yield where, field.type


def overrides(struct: type[msgspec.Struct], environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings the environment gives, as a nested dict of the struct's fields (tables as dicts), each value
    converted to its field's type. ValueError names the variable of a value that does not convert."""
    found: dict[str, Any] = {}
    for variable, (path, kind) in settings_variables(struct).items():
        value = environ.get(variable)
        if not value:
            continue
        try:
            converted = _convert(value, kind)
        except msgspec.ValidationError as error:
            raise ValueError(f"{variable}={value[:40]!r}: must be {_expected(kind)} ({error})") from None
        except msgspec.DecodeError as error:
            raise ValueError(f"{variable}={value[:40]!r} is not JSON ({error})") from None
        table = found
        for name in path[:-1]:
            table = table.setdefault(name, {})
        table[path[-1]] = converted
    return found


def _expected(kind: Any) -> str:
    """What a value of `kind` is, in words, for the one line a bad variable gets."""
    info = types.type_info(kind)
    if isinstance(info, types.UnionType):  # `int | None`: the value's own type
        info = next((t for t in info.types if not isinstance(t, types.NoneType)), info)
    words = {types.IntType: "an integer", types.FloatType: "a number", types.BoolType: "true or false",
             types.StrType: "text", types.ListType: "a comma-separated list"}
    return next((said for kind_of, said in words.items() if isinstance(info, kind_of)), "a valid value")


def _convert(value: str, kind: Any) -> Any:
    info = types.type_info(kind)
    if isinstance(info, types.ListType) and isinstance(info.item_type, types.StrType):
        return msgspec.convert([item.strip() for item in value.split(",") if item.strip()], kind)
    if isinstance(info, types.CollectionType | types.DictType | types.StructType | types.UnionType) and not (
            isinstance(info, types.UnionType) and all(_scalar(member) for member in info.types)):
        msgspec.json.decode(value, type=kind)  # checked against the type; the settings convert the plain value
        return msgspec.json.decode(value)
    return msgspec.convert(value, kind, strict=False)  # numbers, booleans, strings: from their text


def _scalar(info: types.Type) -> bool:
    return isinstance(info, types.IntType | types.FloatType | types.BoolType | types.StrType | types.NoneType
                      | types.LiteralType)


def unknown(struct: type[msgspec.Struct], environ: Mapping[str, str]) -> list[str]:
    """One warning per SLUICE_ variable that is neither a setting nor in NOT_SETTINGS, naming the nearest setting."""
    known = settings_variables(struct)
    lines = []
    for variable in sorted(name for name in environ if name.startswith(PREFIX)):
        if variable in known or variable in NOT_SETTINGS:
            continue
        nearest = difflib.get_close_matches(variable, known, n=1, cutoff=0.6)
        hint = f"did you mean {nearest[0]}?" if nearest else "the settings are listed under Configuration in README.md"
        lines.append(f"sluice: warning: {variable} is not a setting and is ignored ({hint})")
    return lines
