"""The operator commands (`sluice keys ...`) hash keys with the server's pepper: with `key_pepper` set
(SLUICE_KEY_PEPPER), a key `sluice keys create` or `keys rotate` makes in the database a real `sluice serve` shares
is the server's key, and back. The operator runs from another data dir, whose own `key_pepper` file (made by an
earlier start without the setting) must not be what the command hashes with."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx

from testkit.protocol_worker import MODEL, protocol_worker
from testkit.sluice import REPO, running_sluice

ADMIN_KEY = "operator-pepper-tests-admin-key-0123456789"
PEPPER = "operator-pepper-tests-pepper-0123456789"


def operator(data_dir, env: dict[str, str], *argv: str) -> dict | list:
    """`sluice --data-dir DATA_DIR ARGV --json`, as an operator runs it; its JSON output."""
    done = subprocess.run([sys.executable, "-m", "gateway.cli.main", "--data-dir", str(data_dir), *argv, "--json"],
                          cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_keys_the_operator_makes_are_the_servers_with_a_pepper_set(tmp_path):
    shared = {"SLUICE_KEY_PEPPER": PEPPER, "SLUICE_DATABASE_URL": f"sqlite:///{tmp_path / 'shared.db'}"}
    desk = tmp_path / "operator"
    desk.mkdir()
    (desk / "key_pepper").write_bytes(os.urandom(32))  # another pepper: the data dir's, from before the setting
    with protocol_worker() as worker:
        config = f'[[models]]\nname = "{MODEL}"\nprovisioner = {{ kind = "static", urls = ["{worker.url}"] }}\n'
        with running_sluice(tmp_path / "server", config=config,
                            env={**shared, "SLUICE_ADMIN_KEY": ADMIN_KEY}) as server:
            team = next(t for t in operator(desk, shared, "teams", "list") if t["name"] == "default")
            made = operator(desk, shared, "keys", "create", "--name", "ops", "--team-id", team["id"])
            with httpx.Client(base_url=server.url, timeout=30) as client:
                assert _models(client, made["key"]) == 200
                rotated = operator(desk, shared, "keys", "rotate", made["id"], "--grace-seconds", "0")
                assert _models(client, rotated["key"]) == 200
                assert _models(client, made["key"]) == 401  # found, and expired by the rotation
                # and back: the key the server makes has the id the operator's commands compute
                served = client.post("/admin/keys", headers={"authorization": f"Bearer {ADMIN_KEY}"},
                                     json={"name": "served", "team_id": team["id"]})
                assert served.status_code in (200, 201), served.text
            listed = operator(desk, shared, "keys", "list", "--team-id", team["id"])
            assert served.json()["id"] in [k["id"] for k in listed]
            revoked = operator(desk, shared, "keys", "revoke", served.json()["id"])
            assert revoked["revoked_at"]


def _models(client: httpx.Client, key: str) -> int:
    reply = client.get("/v1/models", headers={"authorization": f"Bearer {key}"})
    assert reply.status_code != 200 or [m["id"] for m in reply.json()["data"]] == [MODEL], reply.text
    assert reply.status_code != 401 or reply.json()["error"]["code"] == "expired_api_key", reply.text
    return reply.status_code
