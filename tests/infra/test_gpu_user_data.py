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
    done = subprocess.run(["bash", "-c", script + "\necho joined\n"], capture_output=True, text=True, timeout=30,
                          check=False,
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


def rendered_warm_pool_script(tmp_path: Path) -> str:
    """The whole template as Terraform renders it with a warm pool and an ECR image, its host paths moved under
    `tmp_path` (the ECS config, cloud-init's per-boot folder)."""
    values = {"cluster": "sluice-test", "image_cuda": "12.8", "region": "us-east-1",
              "launch_hook": "sluice-test-gpu-launch",
              "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/sluice-worker:1",
              "registry": "123456789012.dkr.ecr.us-east-1.amazonaws.com"}
    text = TEMPLATE.read_text()
    for directive in ("%{ if warm_pool ~}\n", "%{ if ecr_image ~}\n", "%{ endif ~}\n"):
        text = text.replace(directive, "")
    for name, value in values.items():
        text = text.replace("${" + name + "}", value)
    assert "%{" not in text and "${" not in text.replace("$(", "")
    (tmp_path / "per-boot").mkdir()
    return (text.replace("/etc/ecs/ecs.config", str(tmp_path / "ecs.config"))
            .replace("/var/lib/cloud/scripts/per-boot", str(tmp_path / "per-boot")))


@pytest.mark.parametrize("target", ["Warmed:Stopped", "InService"])
def test_the_launch_hook_is_completed_after_the_image_pull(tmp_path, target):
    """Issue #50: with a warm pool and no launch hook, a warmed host was stopped while user data still pulled the
    image. User data now completes the hook, after the pull on a host being warmed, at once on one launched
    straight into service; and the per-boot script it leaves completes it when the host later boots into service."""
    script = rendered_warm_pool_script(tmp_path)
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    tools = {
        "nvidia-smi": SMI.format(cuda="12.8"),
        "curl": f'#!/bin/sh\necho "curl $*" >> {calls}\ncase "$*" in\n  *api/token*) echo token ;;\n'
                f'  *target-lifecycle-state*) echo "{target}" ;;\n  *instance-id*) echo i-0abc ;;\nesac\n',
        "aws": f'#!/bin/sh\necho "aws $*" >> {calls}\ncase "$*" in\n  *describe-auto-scaling-instances*) '
               f'echo sluice-test-gpu-2024 ;;\n  *get-login-password*) echo password ;;\nesac\n',
    }
    for name in ("systemctl", "poweroff", "docker"):
        tools[name] = f'#!/bin/sh\necho "{name} $*" >> {calls}\ncat > /dev/null\n'
    for name, body in tools.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30, check=False, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = calls.read_text().splitlines()
    complete = [i for i, line in enumerate(lines) if "complete-lifecycle-action" in line]
    pulls = [i for i, line in enumerate(lines) if line.startswith("docker pull")]
    assert len(complete) == 1
    assert ("--lifecycle-hook-name sluice-test-gpu-launch --auto-scaling-group-name sluice-test-gpu-2024 "
            "--instance-id i-0abc --lifecycle-action-result CONTINUE") in lines[complete[0]]
    if target == "Warmed:Stopped":
        assert len(pulls) == 1 and pulls[0] < complete[0]  # the pull first, then the host may stop
    else:
        assert pulls == []
    assert "ECS_AWSVPC_BLOCK_IMDS=true" in (tmp_path / "ecs.config").read_text()
    calls.unlink()  # a later boot, into service: cloud-init runs the per-boot script alone
    (per_boot,) = (tmp_path / "per-boot").iterdir()
    again = subprocess.run([str(per_boot)], capture_output=True, text=True, timeout=30, check=False, env=env)
    assert again.returncode == 0 and any("complete-lifecycle-action" in line for line in calls.read_text().splitlines())
