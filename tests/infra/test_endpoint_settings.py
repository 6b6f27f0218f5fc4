"""`endpoint_settings` with mixed value types (numbers beside a team_id string), rendered by the platform module's
real template through `terraform test` (mock AWS provider), then read by the gateway's real config loader:
every number stays a number. With `map(map(any))` the one string turned every value into text and the loader
refused `idle_seconds = "900"` while plan and apply succeeded."""

from __future__ import annotations

import re
import textwrap

import pytest

from gateway.config import load_settings
from testkit.local_aws import moto_server
from tests.infra.terraform import Terraform

RUN = '''
run "render" {
  command = plan
  variables {
    endpoint_settings = {
      "HuggingFaceTB/SmolLM2-135M-Instruct" = {
        min_replicas = 0, max_replicas = 3, idle_seconds = 900, target_concurrency = 8.5, team_id = "team-abc"
      }
    }
    scaling = { ecs_start_timeout_seconds = 2400 }
  }
}
'''


def rendered_config(terraform: Terraform) -> str:
    platform = terraform.root / "modules" / "platform"
    suite = (platform / "tests" / "platform.tftest.hcl").read_text()
    # the suite's mock provider, its real provider for the ephemeral passwords (served by moto) and variables
    shared = "".join(re.search(pattern, suite, re.DOTALL | re.MULTILINE).group(0)
                     for pattern in (r"^mock_provider.*?^}\n", r'^provider "aws" \{.*?^}\n', r"^variables \{.*?^}\n"))
    probe = platform / "tests" / "render_probe.tftest.hcl"
    probe.write_text(shared + RUN)
    try:
        terraform.init("modules/platform")
        with moto_server() as secrets_manager:
            done = terraform.run("modules/platform", "test", "-verbose", f"-filter=tests/{probe.name}", timeout=900,
                                 env={"AWS_ENDPOINT_URL_SECRETS_MANAGER": secrets_manager})
    finally:
        probe.unlink()
    block = re.search(r"gateway_config_toml\s+= <<-EOT\n(.*?)\n\s*EOT\n", done.stdout, re.DOTALL)
    assert block, done.stdout[-4000:]
    return textwrap.dedent(block.group(1)) + "\n"


@pytest.mark.slow
def test_mixed_endpoint_settings_reach_the_config_loader_with_their_types(terraform: Terraform, monkeypatch):
    config = rendered_config(terraform)
    assert "idle_seconds = 900\n" in config and 'team_id = "team-abc"\n' in config
    monkeypatch.setenv("SLUICE_CONFIG_TOML", config)
    for name in ("SLUICE_DATA_DIR", "SLUICE_PRINT_BOOTSTRAP_KEYS", "SLUICE_TRUSTED_PROXIES"):
        monkeypatch.delenv(name, raising=False)
    # what the task definition injects from Secrets Manager beside the config (modules/data's redis_url)
    monkeypatch.setenv("SLUICE_REDIS_URL", "rediss://sluice-test.abc123.euw1.cache.amazonaws.com:6379/0")
    settings = load_settings()
    (endpoint,) = settings.models
    assert (endpoint.min_replicas, endpoint.max_replicas, endpoint.idle_seconds) == (0, 3, 900.0)
    assert endpoint.target_concurrency == 8.5 and endpoint.team_id == "team-abc"
    assert endpoint.provisioner.service == "sluice-test-worker-huggingfacetb-smollm2-135m-instruct"
    assert endpoint.max_wait_seconds == 600  # an ECS endpoint's default wait
    assert settings.scaling.ecs_start_timeout_seconds == 2400
    assert settings.print_bootstrap_keys is False  # the ECS gateway never prints a key
    assert settings.trusted_proxies == ["10.40.0.0/16"]  # the VPC: the ALB's X-Forwarded-For is believed
    assert settings.request_timeout_s == 840
    # Redis signs in as the data module's IAM user, with tokens for its cache (gateway/redis_iam.py)
    assert (settings.redis_iam.user, settings.redis_iam.cache_name) == ("sluice-test-gateway", "sluice-test")
    assert settings.redis_iam.region == "eu-west-1"
