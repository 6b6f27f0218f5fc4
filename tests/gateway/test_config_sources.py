"""Where settings come from on ECS: the whole config in SLUICE_CONFIG_TOML (a task definition has no
file to mount), and SLUICE_WAL_ROOT; mistakes in either exit with one line."""

from __future__ import annotations

import pytest

from gateway.config import load_settings

CONFIG = '[[models]]\nname = "tiny"\nprovisioner = { kind = "static", urls = ["http://10.0.0.5:8100"] }\n'


def test_the_whole_config_from_one_variable(monkeypatch):
    monkeypatch.setenv("SLUICE_CONFIG_TOML", 'max_body_bytes = 1024\n' + CONFIG)
    monkeypatch.setenv("SLUICE_WAL_ROOT", "/var/lib/sluice/wal")
    settings = load_settings()
    assert [m.name for m in settings.models] == ["tiny"]
    assert settings.models[0].provisioner.urls == ["http://10.0.0.5:8100"]
    assert settings.wal_root == "/var/lib/sluice/wal" and settings.max_body_bytes == 1024


def test_a_config_file_wins_over_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("SLUICE_CONFIG_TOML", CONFIG)
    path = tmp_path / "sluice.toml"
    path.write_text('[[models]]\nname = "from-file"\n')
    assert [m.name for m in load_settings(str(path)).models] == ["from-file"]


@pytest.mark.parametrize(("inline", "words"), [
    ("port = \n", ["cannot read the config in SLUICE_CONFIG_TOML"]),
    ("max_body_byte = 10\n", ["invalid configuration", "max_body_byte"]),
    ("wal_root = 7\n", ["invalid configuration", "wal_root"]),
    ("shutdown_grace_seconds = -1\n", ["invalid configuration", "shutdown_grace_seconds", ">= 0"]),
    ("shutdown_grace_seconds = 86400\n", ["invalid configuration", "shutdown_grace_seconds", "<= 3600"]),
    (CONFIG + 'adapters = { poet = "lora/poet" }\n', ["invalid configuration", "`adapters.poet`", "absolute path"]),
    (CONFIG + 'adapters = { poet = "s3://" }\n', ["invalid configuration", "`adapters.poet`", "s3://<bucket>"]),
    ("[http]\nmax_header_bytes = 100\n", ["invalid configuration", "http.max_header_bytes", ">= 1024"]),
    ("[http]\nheader_timeout_s = 0\n", ["invalid configuration", "http.header_timeout_s", "> 0"]),
    ("[http]\nbody_timeout_s = 7200\n", ["invalid configuration", "http.body_timeout_s", "<= 3600"]),
    ("[http]\nmax_connections_per_client = -1\n", ["invalid configuration", "max_connections_per_client"]),
    ("[http]\nheader_timeout = 5\n", ["invalid configuration", "header_timeout"]),
    (f"metrics_token = \"{'t' * 513}\"\n", ["invalid configuration", "metrics_token", "<= 512"]),
])
def test_a_bad_variable_is_one_line(monkeypatch, inline, words):
    monkeypatch.setenv("SLUICE_CONFIG_TOML", inline)
    with pytest.raises(SystemExit) as failure:
        load_settings()
    message = str(failure.value)
    assert message.startswith("sluice: ") and "\n" not in message and all(w in message for w in words), message


def test_shutdown_grace_from_the_environment(monkeypatch):
    monkeypatch.setenv("SLUICE_SHUTDOWN_GRACE_SECONDS", "95")
    assert load_settings().shutdown_grace_seconds == 95.0
    monkeypatch.setenv("SLUICE_SHUTDOWN_GRACE_SECONDS", "soon")
    with pytest.raises(SystemExit, match="SLUICE_SHUTDOWN_GRACE_SECONDS"):
        load_settings()


def test_the_metrics_token_from_the_environment(monkeypatch):
    monkeypatch.setenv("SLUICE_METRICS_TOKEN", "scrape-secret")  # as ECS passes a secret
    assert load_settings().metrics_token == "scrape-secret"
