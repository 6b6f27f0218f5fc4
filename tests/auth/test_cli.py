"""`sluice users|teams|keys …` against the configured database, as an operator runs them."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json

import pytest
import structlog

from auth import AuthService, cli
from tests.auth.helpers import PEPPER


@pytest.fixture
def sluice(store_url, capsys):
    """Runs one CLI command line; returns (exit code, stdout)."""
    parser = argparse.ArgumentParser(prog="sluice")
    parser.add_argument("--database-url", default=store_url)
    parser.set_defaults(pepper=PEPPER)
    cli.register(parser.add_subparsers(dest="command", required=True))

    def run(*argv: str) -> tuple[int, str]:
        # as in a fresh `sluice` process: a test before this one in the same process (structlog's capture_logs)
        # leaves structlog "configured" with stdout output, and the CLI would then not move its lines to stderr
        structlog.reset_defaults()
        capsys.readouterr()
        args = parser.parse_args(argv)
        code = args.func(args)
        captured = capsys.readouterr()
        run.last_err = captured.err
        return code, captured.out

    return run


def test_cli_full_flow(sluice):
    code, out = sluice("users", "create", "alice", "--json")
    assert code == 0, sluice.last_err
    user_id = json.loads(out)["id"]
    code, out = sluice("teams", "create", "lab", "--rpm", "60", "--json")
    team = json.loads(out)
    assert code == 0 and team["limits"] == {"rpm": 60}
    assert sluice("teams", "add-member", team["id"], user_id, "--role", "owner")[0] == 0, sluice.last_err
    members = json.loads(sluice("teams", "members", team["id"], "--json")[1])
    assert [(m["user_id"], m["role"]) for m in members] == [(user_id, "owner")]
    code, out = sluice("keys", "create", "--name", "alice-key", "--user-id", user_id, "--model", "m1",
                       "--tpm", "1000", "--json")
    key = json.loads(out)
    assert code == 0 and key["key"].startswith("sk-sluice-") and key["team_id"] == team["id"]
    assert key["models"] == ["m1"] and key["limits"] == {"tpm": 1000}
    listed = json.loads(sluice("keys", "list", "--team-id", team["id"], "--json")[1])
    assert [k["id"] for k in listed] == [key["id"]] and "key" not in listed[0]
    rotated = json.loads(sluice("keys", "rotate", key["id"], "--grace-seconds", "30", "--json")[1])
    assert rotated["replaces"] == key["id"]
    assert json.loads(sluice("keys", "revoke", rotated["id"], "--json")[1])["revoked_at"]
    team = json.loads(sluice("teams", "update", team["id"], "--name", "lab2", "--clear-limits", "--json")[1])
    assert team["name"] == "lab2" and team["limits"] is None
    assert sluice("teams", "remove-member", team["id"], user_id)[0] == 0


def test_cli_tables_and_one_time_key(sluice):
    code, out = sluice("teams", "create", "ops")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["ID", "NAME", "LIMITS", "CREATED_AT"] and "ops" in lines[1]
    team_id = lines[1].split()[0]
    code, out = sluice("keys", "create", "--name", "svc", "--team-id", team_id, "--admin")
    assert code == 0 and "shown once" in out
    clear = out.rsplit(" ", 1)[1].strip()
    assert clear.startswith("sk-sluice-")
    code, out = sluice("keys", "list")
    assert code == 0 and "svc" in out and clear.rsplit("-", 1)[1] not in out
    assert sluice("users", "list")[1].strip() == "(none)"


@pytest.mark.parametrize("argv", [
    ("users", "create", ""),
    ("teams", "update", "team_nope", "--name", "x"),
    ("teams", "add-member", "team_nope", "usr_nope"),
    ("keys", "create", "--name", "k"),
    ("keys", "create", "--name", "k", "--team-id", "team_nope"),
    ("keys", "create", "--name", "k", "--team-id", "t", "--expires-at", "yesterday"),
    ("keys", "revoke", "nope"),
    ("teams", "create", "t", "--rpm", "-1"),
])
def test_cli_errors_exit_nonzero_with_a_message(sluice, argv):
    code, _ = sluice(*argv)
    assert code == 1 and sluice.last_err.startswith("error: ")


def test_cli_audits_as_the_operator(sluice, store_url):
    sluice("users", "create", "bob")

    async def read():
        service = await AuthService.open(store_url, PEPPER)
        try:
            return await service.admin.audit()
        finally:
            await service.close()

    entries = asyncio.run(read())
    assert entries[0].action == "users.create"
    assert entries[0].actor == f"cli:{getpass.getuser()}" and entries[0].source == "cli"
