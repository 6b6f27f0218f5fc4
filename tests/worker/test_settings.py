"""The worker's one configuration (common/worker_settings.py, read in worker/settings.py): every setting's
variable derived as the gateway's are, each bound refused with one line naming the variable (and the process
exits non-zero), flags over the environment, the standby's assignment through the same declaration, the gateway's
launch read back as what it decided, and no other module of the worker reading the environment."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from common.protocol import WORKER_SECRET_ENV, ModelConfig
from common.settings_env import settings_variables
from common.worker_launch import SPAWNED_AT_ENV, Assignment
from common.worker_settings import INHERITED, WorkerSettings, variable, worker_variables
from gateway.config import Settings
from gateway.endpoints.provisioners.worker_process import worker_command, worker_env
from gateway.replicas.trust import worker_environment, worker_secret
from testkit.sluice import REPO
from worker.settings import SettingsError, assigned, environment, load

WORKER = REPO / "worker"

# every bounded setting: a value past its bound (through the environment)
BAD = {
    "SLUICE_PORT": ["0", "65536", "http"],
    "SLUICE_HOST": [""],  # an empty variable counts as unset: the default stands (checked below)
    "SLUICE_WORKER_ID": ["w" * 201],
    "SLUICE_SPAWNED_AT": ["-1", "yesterday"],
    "SLUICE_LOG_FORMAT": ["text"],
    "SLUICE_TORCH_THREADS": ["-1", "4097", "two"],
    "SLUICE_NATIVE_COMPILE_TIMEOUT": ["0", "-5", "86401", "soon"],
    "SLUICE_NATIVE_FLAGS": ["-O" * 2049],
    "SLUICE_S3_ENDPOINT": ["h" * 513],
    "SLUICE_MODEL_CACHE": ["/" * 4097],
    "SLUICE_NATIVE_CACHE": ["/" * 4097],
    "SLUICE_WORKER_SECRET": ["s" * 4097],
    "SLUICE_DATA_DIR": ["d" * 4097],
    "SLUICE_STANDBY": ["maybe"],
    "SLUICE_MODEL__MAX_LOADED_ADAPTERS": ["0"],
    "SLUICE_MODEL__QUANTIZATION": ["q3"],
}


def test_each_field_has_the_variable_the_gateways_rule_derives():
    names = settings_variables(WorkerSettings)
    assert variable("model_cache") == "SLUICE_MODEL_CACHE" and variable("native_flags") == "SLUICE_NATIVE_FLAGS"
    assert names["SLUICE_MODEL__SOURCE"][0] == ("model", "source")  # a table's field: double underscore
    assert SPAWNED_AT_ENV == variable("spawned_at") and WORKER_SECRET_ENV == variable("worker_secret")
    # the variable both read means the same in both: the gateway's setting and its workers'
    assert "SLUICE_LOG_FORMAT" in settings_variables(Settings) and "SLUICE_LOG_FORMAT" in worker_variables()
    assert worker_variables() == set(names)
    with pytest.raises(KeyError):
        variable("no_such_setting")


def test_every_bounded_setting_has_a_row_here():
    top = {f"SLUICE_{name.upper()}" for name in WorkerSettings.__struct_fields__ if name != "model"}
    assert top <= set(BAD)


@pytest.mark.parametrize(("name", "value"), [(n, v) for n, vs in BAD.items() for v in vs if v])
def test_a_bad_value_is_one_line_naming_its_variable(name, value):
    with pytest.raises(SystemExit) as stopped:
        load([], {name: value})
    line = str(stopped.value)
    assert "\n" not in line and line.startswith("sluice worker: invalid configuration") and name in line
    with pytest.raises(SettingsError, match=name):
        environment({name: value})


def test_an_empty_variable_is_unset():
    assert load([], {"SLUICE_HOST": "", "SLUICE_PORT": ""}) == WorkerSettings()


def test_values_convert_and_flags_win_over_the_environment():
    env = {"SLUICE_PORT": "9000", "SLUICE_TORCH_THREADS": "3", "SLUICE_NATIVE_COMPILE_TIMEOUT": "2.5",
           "SLUICE_MODEL__MAX_BATCH_SIZE": "4", "SLUICE_STANDBY": "true"}
    settings = load(["--port", "9001", "--model-json", '{"max_batch_size": 6}'], env)
    assert settings.port == 9001 and settings.torch_threads == 3 and settings.native_compile_timeout == 2.5
    assert settings.model.max_batch_size == 6 and settings.standby
    assert load([], env).model.max_batch_size == 4


@pytest.mark.parametrize(("argv", "named"), [
    (["--port", "70000"], "--port or SLUICE_PORT"),
    (["--port", "eighty"], "--port or SLUICE_PORT"),
    (["--model-json", "{"], "--model-json"),
    (["--model-json", '{"bogus": 1}'], "(--model-json)"),
    (["--model-json", '{"max_queue": "many"}'], "--model-json or SLUICE_MODEL__MAX_QUEUE"),
    (["--worker-id", "w" * 201], "--worker-id")])
def test_a_bad_flag_is_one_line_naming_it(argv, named):
    with pytest.raises(SystemExit) as stopped:
        load(argv, {})
    assert "\n" not in str(stopped.value) and named in str(stopped.value)


def test_the_gateways_launch_reads_back_as_what_it_decided(tmp_path):
    """The flags and variables the gateway starts a local worker with (worker_process.py) are the declaration's:
    the worker reads back the model, port, data dir, id, secret and spawn time it was given."""
    model = ModelConfig(name="m", max_batch_size=3, quantization="w8a8")
    command = worker_command(model, 8123, tmp_path, "worker-7")
    assert command[1:3] == ["-m", "worker"]
    settings = load(command[3:], worker_env())
    assert settings.model == model and settings.port == 8123 and settings.data_dir == str(tmp_path)
    assert settings.worker_id == "worker-7" and settings.host == "127.0.0.1"
    assert settings.worker_secret == worker_secret() and settings.spawned_at > 0


def test_a_local_worker_inherits_the_hosts_settings_only(monkeypatch):
    for name in INHERITED:
        monkeypatch.setenv(variable(name), "1")
    monkeypatch.setenv("SLUICE_HOST", "0.0.0.0")  # the gateway's own address: never a local worker's
    monkeypatch.setenv("SLUICE_PORT", "8000")
    passed = worker_environment("s" * 32)
    assert {variable(name) for name in INHERITED} <= passed.keys()
    assert not {"SLUICE_HOST", "SLUICE_PORT"} & passed.keys()


def test_a_standby_becomes_its_assignment():
    base = load(["--standby"], {"SLUICE_TORCH_THREADS": "2", "SLUICE_WORKER_SECRET": "s" * 32})
    job = Assignment(model=ModelConfig(name="late"), port=8200, worker_id="w-1", data_dir="/d", assigned_at=12.5)
    settings = assigned(base, io.BytesIO(msgspec.json.encode(job) + b"\n"))
    assert settings is not None and settings.model.name == "late" and settings.port == 8200
    assert (settings.worker_id, settings.data_dir, settings.spawned_at) == ("w-1", "/d", 12.5)
    assert settings.torch_threads == 2 and settings.worker_secret == "s" * 32 and not settings.standby
    assert assigned(base, io.BytesIO(b"")) is None  # the gateway let go of it
    for line in (b"{not json\n", b'{"model": {}, "port": 0, "worker_id": "", "data_dir": "/d", "assigned_at": 1}\n'):
        with pytest.raises(SystemExit) as stopped:
            assigned(base, io.BytesIO(line))
        assert "\n" not in str(stopped.value) and "assignment" in str(stopped.value)


def test_no_module_of_the_worker_reads_the_environment_but_its_settings():
    readers = re.compile(r"os\.environ|getenv|environ\.get|sys\.stdin")
    found = [f"{path.relative_to(REPO)}:{number}" for path in sorted(WORKER.rglob("*.py"))
             if path.name != "settings.py" or path.parent != WORKER
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if readers.search(line.split("#")[0])]
    assert found == []


def test_a_worker_with_a_bad_setting_exits_non_zero_with_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "worker", "--port", "1", "--data-dir", str(tmp_path)],
                          cwd=REPO, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
                                         "SLUICE_TORCH_THREADS": "-1"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "sluice worker: invalid configuration in the environment: SLUICE_TORCH_THREADS='-1': must be an integer "
        "(Expected `int` >= 0)"]
    assert Path(tmp_path).exists()


def test_the_gateway_refuses_a_log_format_its_workers_would(monkeypatch):
    """SLUICE_LOG_FORMAT is the gateway's setting and, passed on, its workers': both take the same two values."""
    from gateway.config import load_settings

    monkeypatch.setenv("SLUICE_LOG_FORMAT", "text")
    with pytest.raises(SystemExit, match="SLUICE_LOG_FORMAT='text': must be one of console, json"):
        load_settings()
