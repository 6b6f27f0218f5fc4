"""The GPU host's boot check (modules/worker_pool/user_data.sh.tftpl), run for real by bash with stand-in
`nvidia-smi`, `systemctl` and `poweroff` on PATH: a driver that serves less CUDA than the worker image needs (or
none at all) powers the host off before it joins the cluster; one that serves as much or more lets it join."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

TEMPLATE = Path(__file__).resolve().parents[2] / "infra/terraform/modules/worker_pool/user_data.sh.tftpl"
SMI = """#!/bin/sh
cat <<'OUT'
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 570.133.20             Driver Version: 570.133.20     CUDA Version: {cuda}     |
OUT
"""


def boot_check(tmp_path: Path, image_cuda: str, driver_cuda: str | None) -> tuple[int, str, list[str]]:
    """The template's check (everything before the ECS config is written), rendered for `image_cuda`."""
    script = TEMPLATE.read_text().split("cat >> /etc/ecs/ecs.config", 1)[0].replace("${image_cuda}", image_cuda)
    assert "%{" not in script and "${" not in script.replace("$(", "")  # nothing left unrendered
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for name in ("systemctl", "poweroff"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n')
    if driver_cuda is not None:
        (bin_dir / "nvidia-smi").write_text(SMI.format(cuda=driver_cuda))
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    done = subprocess.run(["bash", "-c", script + "\necho joined\n"], capture_output=True, text=True, timeout=30, check=False,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    return done.returncode, done.stdout + done.stderr, calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.parametrize("driver", ["12.8", "12.9", "13.0"])
def test_a_driver_that_serves_the_images_cuda_joins(tmp_path, driver):
    code, output, calls = boot_check(tmp_path, "12.8", driver)
    assert code == 0 and "joined" in output and calls == []


@pytest.mark.parametrize("driver", ["12.4", "11.8", None])
def test_an_older_or_missing_driver_powers_the_host_off_before_joining(tmp_path, driver):
    code, output, calls = boot_check(tmp_path, "12.8", driver)
    assert code == 1 and "joined" not in output
    assert "the worker image needs 12.8; not joining" in output
    assert calls == ["systemctl stop ecs", "poweroff "]
