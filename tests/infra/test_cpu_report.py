"""tests/cpu_report.py: the CPU of a file's tests, its child processes included, lands on that file; a session
fixture's (a session-wide server reaped at the end) is reported apart, not on the file that happened to run last."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.cpu_report import VARIABLE

REPO = Path(__file__).resolve().parents[2]
BURN = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end:\n    pass\n"


def test_a_files_child_processes_count_on_that_file(tmp_path: Path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(
        "import subprocess, sys\n\nimport pytest\n\nfrom tests import cpu_report\n\n\n"
        "def pytest_configure(config):\n    cpu_report.register(config)\n\n\n"
        "@pytest.fixture(scope='session')\ndef server():\n"  # a server burning CPU, reaped at the session's end
        f"    child = subprocess.Popen([sys.executable, '-c', {BURN!r}])\n    yield\n    child.wait()\n")
    (tmp_path / "test_burns.py").write_text(
        "import subprocess, sys\n\n\ndef test_burns():\n"
        f"    subprocess.run([sys.executable, '-c', {BURN!r}], check=True)\n")
    (tmp_path / "test_idle.py").write_text("def test_idle(server):\n    pass\n")  # the last file
    report = tmp_path / "cpu"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")},
                               "PYTHONPATH": str(REPO), VARIABLE: str(report)})  # one process: `cpu.main`
    assert done.returncode == 0, done.stdout + done.stderr
    lines = dict(reversed(line.split(maxsplit=1)) for line in (tmp_path / "cpu.main").read_text().splitlines())
    assert float(lines["test_burns.py"]) >= 1.0 > float(lines["test_idle.py"]), lines
    assert float(lines["(session fixture server)"]) >= 1.0, lines
