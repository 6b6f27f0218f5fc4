"""`sluice serve` with the embedded single-model setup whose model cannot load: it exits non-zero
within seconds with one line saying what and how to fix it, and leaves no worker behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testkit.sluice import pid_alive, start_sluice

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("broken", ["missing", "not-a-model", "unknown-architecture"])
def test_a_model_that_cannot_load_stops_sluice_serve_with_one_line(tmp_path, broken):
    source = tmp_path / broken
    if broken == "not-a-model":
        source.mkdir()
        (source / "config.json").write_text("{ this is not json")
    if broken == "unknown-architecture":  # worker/model_config_check.py names it
        source.mkdir()
        (source / "config.json").write_text('{"model_type": "frobnicator", "architectures": ["FrobForCausalLM"]}')
    config = f'[[models]]\nname = "org/broken"\nsource = "{source}"\n'
    server = start_sluice(tmp_path / "data", config=config, wait=False)
    try:
        code = server.process.wait(timeout=120)
    finally:
        server.stop()
    assert code == 1
    lines = [line for line in server.lines if line.startswith("sluice serve: ")]
    assert len(lines) == 1, server.output[-3000:]
    assert "cannot load model 'org/broken'" in lines[0] and str(source) in lines[0]
    assert "set its `source` to" in lines[0]
    if broken == "unknown-architecture":
        assert "unknown architecture: model_type 'frobnicator' (FrobForCausalLM)" in lines[0]
    pids = server.worker_pids()
    assert pids and not any(pid_alive(pid) for pid in pids)



def test_a_failure_outside_sluice_serve_is_recorded_without_signalling_the_host():
    """An app run in-process (by a test, under another server) has no `serve` loop to stop: the failure is
    recorded and said, and the host process lives on. A child interpreter hosts it, so a regression fails
    this test instead of killing pytest."""
    script = ("from gateway.edge import startup_failure as shutdown\n"
              "shutdown.fail('the endpoint failed')\n"
              "import time; time.sleep(0.5)\n"
              "print('HOST-ALIVE', shutdown.exit_status(), flush=True)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "HOST-ALIVE 1" in done.stdout, done.stdout + done.stderr
    assert "sluice serve: the endpoint failed" in done.stderr
