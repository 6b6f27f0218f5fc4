"""SLUICE_* environment variables (gateway/environment.py): one per setting, derived from the settings structs, typed;
a bad value is one line naming the variable; an unknown SLUICE_ variable is a warning naming the nearest setting;
every SLUICE_ name the repository uses is a setting or listed as not one. Through `sluice serve` where about
start-up."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from common.settings_env import overrides, settings_variables
from common.worker_settings import worker_variables
from gateway.config import Settings, load_settings
from gateway.environment import NOT_SETTINGS
from testkit.sluice import refused_start, start_sluice

REPO = Path(__file__).resolve().parents[2]
ADMIN = "operator-admin-key-from-secrets-manager-0123456789"
STATIC = '[[models]]\nname = "m"\nprovisioner = { kind = "static", urls = ["http://127.0.0.1:9"] }\n'


class Inner(msgspec.Struct, kw_only=True):
    depth: int = 1
    names: list[str] = []


class Outer(msgspec.Struct, kw_only=True):
    ratio: float = 0.5
    on: bool = False
    limit: int | None = None
    inner: Inner = msgspec.field(default_factory=Inner)
    entries: list[Inner] = []


def test_the_variables_are_derived_from_the_struct_tables_included():
    """A field gets its variable by being in the struct: tables join with a double underscore."""
    assert set(settings_variables(Outer)) == {"SLUICE_RATIO", "SLUICE_ON", "SLUICE_LIMIT", "SLUICE_INNER__DEPTH",
                                              "SLUICE_INNER__NAMES", "SLUICE_ENTRIES"}
    environ = {"SLUICE_RATIO": "2", "SLUICE_ON": "true", "SLUICE_LIMIT": "7", "SLUICE_INNER__DEPTH": "3",
               "SLUICE_INNER__NAMES": "a, b,", "SLUICE_ENTRIES": '[{"depth": 9}]', "SLUICE_IGNORED": "x"}
    assert overrides(Outer, environ) == {"ratio": 2.0, "on": True, "limit": 7,
                                         "inner": {"depth": 3, "names": ["a", "b"]}, "entries": [{"depth": 9}]}
    assert overrides(Outer, {"SLUICE_RATIO": ""}) == {}  # empty: unset


def test_every_setting_and_every_table_field_has_a_variable():
    variables = settings_variables(Settings)
    for name in ("SLUICE_REQUEST_TIMEOUT_S", "SLUICE_HTTP__KEEP_ALIVE_TIMEOUT_S", "SLUICE_SCALING__LEASE_SECONDS",
                 "SLUICE_DEFAULT_TEAM_LIMITS__RPM", "SLUICE_CLOUDWATCH__NAMESPACE", "SLUICE_MODELS",
                 "SLUICE_ADMIN_KEY", "SLUICE_KEY_PEPPER", "SLUICE_LEDGER_MIN_FREE_BYTES"):
        assert name in variables, name
    tables = {"http", "scaling", "cloudwatch", "default_team_limits"}
    top = {path[0] for path, _ in variables.values()}
    assert top == set(Settings.__struct_fields__)  # every field, tables through their own fields
    assert all(len(path) == 2 for path, _ in variables.values() if path[0] in tables)


def test_values_are_typed_and_merge_with_the_files_tables(monkeypatch, tmp_path):
    config = tmp_path / "sluice.toml"
    config.write_text("request_timeout_s = 30\n[http]\nheader_timeout_s = 3\n" + STATIC)
    for name, value in {"SLUICE_REQUEST_TIMEOUT_S": "12.5", "SLUICE_HTTP__KEEP_ALIVE_TIMEOUT_S": "70",
                        "SLUICE_SCALING__STANDBY_WORKER": "false",
                        "SLUICE_TRUSTED_PROXIES": "10.0.0.0/8, 192.168.0.0/16",
                        "SLUICE_DEFAULT_TEAM_LIMITS__RPM": "5", "SLUICE_KEY_PEPPER": "s3cr3t-value",
                        "SLUICE_MODELS": '[{"name": "a", "provisioner": {"kind": "static", "urls": ["http://w:1"]}}]',
                        }.items():
        monkeypatch.setenv(name, value)
    settings = load_settings(str(config))
    assert settings.request_timeout_s == 12.5 and settings.concurrency_lease_s == 72.5  # the environment wins
    assert (settings.http.header_timeout_s, settings.http.keep_alive_timeout_s) == (3.0, 70.0)  # one table, merged
    assert settings.scaling.standby_worker is False and settings.default_team_limits.rpm == 5
    assert settings.trusted_proxies == ["10.0.0.0/8", "192.168.0.0/16"] and settings.key_pepper == "s3cr3t-value"
    assert [model.name for model in settings.models] == ["a"]
    assert "s3cr3t" not in repr(settings)  # a secret setting never reaches a log line


@pytest.mark.parametrize(("variable", "value", "words"), [
    ("SLUICE_PORT", "eighty", ["Expected `int`"]),
    ("SLUICE_REQUEST_TIMEOUT_S", "0", ["> 0"]),
    ("SLUICE_HTTP__MAX_HEADER_BYTES", "10", [">= 1024"]),
    ("SLUICE_SCALING__STANDBY_WORKER", "maybe", ["Expected `bool`"]),
    ("SLUICE_DEFAULT_TEAM_LIMITS__RPM", "-1", [">= 0"]),
    ("SLUICE_MODELS", "[{", ["not JSON"]),
    ("SLUICE_MODELS", '[{"name": "a", "replica": 2}]', ["replica"]),
])
def test_a_bad_value_is_one_line_naming_its_variable(monkeypatch, variable, value, words):
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as failure:
        load_settings()
    message = str(failure.value)
    assert message.startswith(f"sluice: invalid configuration in the environment: {variable}=") and "\n" not in message
    assert all(word in message for word in words), message


def test_an_unknown_variable_is_a_warning_naming_the_nearest_setting(monkeypatch, capsys):
    monkeypatch.setenv("SLUICE_REQUEST_TIMEOUT", "5")  # the `_s` forgotten
    monkeypatch.setenv("SLUICE_HTTP__KEEPALIVE_TIMEOUT_S", "5")
    monkeypatch.setenv("SLUICE_BENCH_QUICK", "1")  # a bench's own: no warning
    settings = load_settings()
    assert settings.request_timeout_s == 840.0 and settings.http.keep_alive_timeout_s == 5.0  # both ignored
    warnings = capsys.readouterr().err.splitlines()
    assert warnings == [
        "sluice: warning: SLUICE_HTTP__KEEPALIVE_TIMEOUT_S is not a setting and is ignored "
        "(did you mean SLUICE_HTTP__KEEP_ALIVE_TIMEOUT_S?)",
        "sluice: warning: SLUICE_REQUEST_TIMEOUT is not a setting and is ignored "
        "(did you mean SLUICE_REQUEST_TIMEOUT_S?)",
    ]


def test_every_sluice_variable_the_repository_names_is_a_setting_or_listed_as_not_one():
    """NOT_SETTINGS is the one list of the others (internal, test- and bench-only; a worker's are its settings): a
    variable used anywhere without being in it or in the settings would be warned about at every start."""
    known = set(settings_variables(Settings)) | worker_variables() | set(NOT_SETTINGS)
    this_file = Path(__file__).resolve()
    used: dict[str, str] = {}
    for path in REPO.rglob("*"):
        if (path.suffix not in {".py", ".md", ".tf", ".tftpl", ".toml", ".sh", ".json", ".yml", ".yaml"}
                and path.name not in {"Makefile", "Dockerfile"} and not path.name.endswith(".Dockerfile")):
            continue
        if path == this_file or any(part.startswith(".") for part in path.relative_to(REPO).parts):
            continue
        for name in re.findall(r"\bSLUICE_[A-Z0-9]+(?:_[A-Z0-9]+)*\b", path.read_text(errors="replace")):
            used.setdefault(name, str(path.relative_to(REPO)))
    assert {name: where for name, where in used.items() if name not in known} == {}


def test_sluice_serve_refuses_a_bad_variable_with_one_line(tmp_path):
    server = refused_start(tmp_path / "data", config=STATIC,
                           env={"SLUICE_ADMIN_KEY": ADMIN, "SLUICE_REQUEST_TIMEOUT_S": "forever"})
    assert server.lines == ["sluice: invalid configuration in the environment: SLUICE_REQUEST_TIMEOUT_S='forever': "
                            "must be a number (Expected `float`, got `str`)"]


def test_sluice_serve_warns_of_an_unknown_variable_and_starts(tmp_path):
    server = start_sluice(tmp_path / "data", config=STATIC, wait=False,
                          env={"SLUICE_ADMIN_KEY": ADMIN, "SLUICE_SHUTDOWN_GRACE_S": "5"})
    try:
        server.wait_alive()
    finally:
        server.stop()
    assert server.lines[0] == ("sluice: warning: SLUICE_SHUTDOWN_GRACE_S is not a setting and is ignored "
                               "(did you mean SLUICE_SHUTDOWN_GRACE_SECONDS?)")


def test_sluice_serve_refuses_an_earlier_spelling_naming_the_new_one(tmp_path):
    server = refused_start(tmp_path / "data", config='[[models]]\nname = "m"\nreplicas = 2\n',
                           env={"SLUICE_ADMIN_KEY": ADMIN})
    [line] = server.lines
    assert line.startswith("sluice: invalid configuration in ") and "`replicas` is no longer a setting" in line
    assert "`min_replicas` and `max_replicas`" in line and line.endswith("at `$.models[0]`")
