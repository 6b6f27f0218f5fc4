"""Settings from SLUICE_* environment variables, derived from a declared msgspec struct: the one rule that names
the gateway's variables (gateway/environment.py) and the worker's (worker/settings.py).

Every field of a settings struct has a variable: SLUICE_ and its name in capitals (`request_timeout_s` is
SLUICE_REQUEST_TIMEOUT_S); the fields of a table join its name with a double underscore (`[http]
keep_alive_timeout_s` is SLUICE_HTTP__KEEP_ALIVE_TIMEOUT_S). A value is converted to the field's type and checked
against its bounds: numbers, booleans (true, false, 1, 0), strings as given, a list of strings separated by commas,
anything else as JSON. An empty value counts as unset.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import msgspec
import msgspec.inspect as types

PREFIX = "SLUICE_"
TABLE_SEPARATOR = "__"


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
    if isinstance(info, types.LiteralType):
        return "one of " + ", ".join(str(value) for value in info.values)
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
