"""A `sluice serve` that cannot start exits 1 within seconds, with one line saying what is wrong and how to fix
it, and leaves no process behind: bad configuration, an unusable SLUICE_ADMIN_KEY, an unreachable database,
a port in use. Each through the real command."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from testkit.servers import free_port
from testkit.sluice import SluiceServer, pid_alive, start_sluice

pytestmark = pytest.mark.slow


def failed_start(data_dir: Path, **options) -> tuple[int, str]:
    server: SluiceServer = start_sluice(data_dir, wait=False, **options)
    try:
        code = server.wait_exit(timeout=120)  # seconds in practice; the bound only keeps a hang from stalling CI
    finally:
        server.stop()
    lines = [line for line in server.lines if line.strip()]
    assert len(lines) == 1, server.output
    assert not any(pid_alive(pid) for pid in server.worker_pids())
    assert not _processes_using(data_dir), "a process of the failed start is still running"
    return code, lines[0]


def _processes_using(data_dir: Path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if str(data_dir).encode() in (proc / "cmdline").read_bytes() and pid_alive(int(proc.name)):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def test_unknown_config_field(tmp_path):
    code, line = failed_start(tmp_path, config="max_body_byte = 10\n")
    assert code == 1 and "invalid configuration" in line and "max_body_byte" in line and "README" in line


def test_malformed_config_file(tmp_path):
    code, line = failed_start(tmp_path, config="port = \n")
    assert code == 1 and "cannot read the config file" in line


def test_environment_value_of_the_wrong_type(tmp_path):
    code, line = failed_start(tmp_path, env={"SLUICE_PORT": "eighty"})
    assert code == 1 and "SLUICE_PORT" in line and "integer" in line


@pytest.mark.parametrize(("config", "env", "named"), [
    ('trusted_proxies = ["10.0.0.0/33"]\n', {}, "10.0.0.0/33"),
    ("", {"SLUICE_TRUSTED_PROXIES": "10.0.0.0/8, proxy.example"}, "proxy.example"),
    ("health_generate_interval_s = 0\n", {}, "health_generate_interval_s"),
    ("[default_team_limits]\nrpm = -1\n", {}, "default_team_limits.rpm"),
    ("[default_team_limits]\nrequests = 5\n", {}, "requests"),
])
def test_invalid_tenancy_settings(tmp_path, config, env, named):
    code, line = failed_start(tmp_path, config=config or None, env=env)
    assert code == 1 and "invalid configuration" in line and named in line, line


@pytest.mark.parametrize("key", ["sk-sluice-short", "too short", "sk-sluice-0123456789ab-" + "A" * 32])
def test_unusable_admin_key(tmp_path, key):
    code, line = failed_start(tmp_path, env={"SLUICE_ADMIN_KEY": key})
    assert code == 1 and "SLUICE_ADMIN_KEY" in line
    assert "starting with sk-sluice- must have the generated shape" in line and "unset it" in line


def test_unreachable_database(tmp_path):
    url = f"postgresql://sluice:secret-password@127.0.0.1:{free_port()}/sluice"
    code, line = failed_start(tmp_path, config=f'database_url = "{url}"\n')
    assert code == 1 and "cannot open the database" in line and "database_url" in line
    assert "secret-password" not in line and "127.0.0.1" in line


def test_port_in_use(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, line = failed_start(tmp_path, port=port)
    assert code == 1 and f"127.0.0.1:{port}" in line and "--port" in line


def test_wal_root_that_is_not_a_directory(tmp_path):
    blocker = tmp_path / "not-a-volume"
    blocker.write_text("")
    code, line = failed_start(tmp_path / "data", env={"SLUICE_WAL_ROOT": str(blocker)})
    assert code == 1 and "wal_root" in line and str(blocker) in line and "SLUICE_WAL_ROOT" in line
