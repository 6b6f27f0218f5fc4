"""`print_bootstrap_keys = false` (the ECS template sets it: CloudWatch keeps the logs a year): the first start
never generates or prints a key. Without SLUICE_ADMIN_KEY the gateway exits 1 with one line before it makes any
key; with it, the admin key works and no team key is created or printed (team keys come from the CLI or the
admin API)."""

from __future__ import annotations

import sqlite3

import httpx

from testkit.sluice import refused_start, start_sluice

ADMIN = "operator-admin-key-from-secrets-manager-0123456789"
# no worker: none is needed here
STATIC = '[[models]]\nname = "m"\nprovisioner = { kind = "static", urls = ["http://127.0.0.1:9"] }\n'


def test_without_an_injected_admin_key_the_gateway_refuses_to_start(tmp_path):
    server = refused_start(tmp_path / "data", config=f"print_bootstrap_keys = false\n{STATIC}",
                           env={"SLUICE_ADMIN_KEY": ""})
    assert "print_bootstrap_keys is false but SLUICE_ADMIN_KEY is unset" in server.output
    assert "shown once" not in server.output
    with sqlite3.connect(tmp_path / "data" / "sluice.db") as db:
        assert db.execute("SELECT count(*) FROM api_keys").fetchone()[0] == 0


def test_the_environment_variable_says_it_too_and_the_admin_key_is_the_only_key(tmp_path):
    server = start_sluice(tmp_path / "data", config=STATIC, wait=False,
                          env={"SLUICE_ADMIN_KEY": ADMIN, "SLUICE_PRINT_BOOTSTRAP_KEYS": "false"})
    try:
        server.wait_alive()
        teams = httpx.get(f"{server.url}/admin/teams", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
        assert teams.status_code == 200
    finally:
        server.stop()
    assert "shown once" not in server.output and "API key for team" not in server.output
    with sqlite3.connect(tmp_path / "data" / "sluice.db") as db:
        assert db.execute("SELECT name FROM api_keys").fetchall() == [("bootstrap-admin",)]


def test_a_value_that_is_not_a_boolean_is_refused(tmp_path):
    server = refused_start(tmp_path / "data", config=STATIC,
                           env={"SLUICE_ADMIN_KEY": ADMIN, "SLUICE_PRINT_BOOTSTRAP_KEYS": "no"})
    assert "SLUICE_PRINT_BOOTSTRAP_KEYS='no': must be true or false" in server.output
