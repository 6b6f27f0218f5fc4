"""Run a small client script inside a dedicated SDK virtualenv and return the JSON it prints.

Each real SDK lives in its own virtualenv under the git-ignored `.sdk-venvs/<name>`, because their
pins clash (text-generation needs huggingface-hub<1.0, friendli-client pins httpx 0.24, ...). A venv
is created on first use and reused afterwards; a marker file records the exact requirements it was
built with, so changing the pins rebuilds it.

    result = run_in_venv("openai", ["openai==3.52.0"], script, {"BASE_URL": server.url})

`script` is Python source; it must print one JSON value on its LAST stdout line. Anything printed
before is ignored (clients may log). A non-zero exit raises `ClientScriptFailed` with the output.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENVS = REPO / ".sdk-venvs"
MARKER = "sluice-requirements.json"


class ClientScriptFailed(AssertionError):
    """The client script exited non-zero or did not print JSON last."""


def venv_python(name: str, requirements: list[str]) -> Path:
    """The interpreter of `.sdk-venvs/<name>`, created (or rebuilt when the pins changed) under a lock."""
    VENVS.mkdir(exist_ok=True)
    target = VENVS / name
    python = target / "bin" / "python"
    wanted = sorted(requirements)
    with open(VENVS / f".{name}.lock", "w") as lock:  # several pytest workers may race on first use
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = target / MARKER
        if python.exists() and marker.exists() and json.loads(marker.read_text()) == wanted:
            return python
        if target.exists():
            shutil.rmtree(target)
        subprocess.run([sys.executable, "-m", "venv", str(target)], check=True, capture_output=True)
        if requirements:
            done = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                                   *requirements], check=False, capture_output=True, text=True, timeout=1200)
            if done.returncode != 0:
                shutil.rmtree(target, ignore_errors=True)
                raise RuntimeError(f"pip install {requirements} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        marker.write_text(json.dumps(wanted))
    return python


def run_in_venv(name: str, requirements: list[str], script: str, env: dict[str, str] | None = None,
                timeout: float = 300.0):
    """Run `script` with the venv's Python and return the parsed JSON of its last stdout line."""
    python = venv_python(name, requirements)
    with tempfile.TemporaryDirectory(prefix=f"sdk-{name}-") as home:
        path = Path(home) / "client.py"
        path.write_text(textwrap.dedent(script))
        # HOME points at an empty dir: friendli-client reads ~/.friendli/{access_token,team}
        environment = {"PATH": os.environ.get("PATH", ""), "HOME": home, "PYTHONUNBUFFERED": "1",
                       "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", **(env or {})}
        done = subprocess.run([str(python), str(path)], check=False, capture_output=True, text=True, env=environment,
                              timeout=timeout, cwd=home)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not lines:
        raise ClientScriptFailed(f"{name} client exited {done.returncode}\n--- stdout\n{done.stdout[-4000:]}"
                                 f"\n--- stderr\n{done.stderr[-4000:]}")
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise ClientScriptFailed(f"{name} client did not print JSON last: {lines[-1][:500]!r}\n"
                                 f"--- stderr\n{done.stderr[-4000:]}") from exc
