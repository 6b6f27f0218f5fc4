"""infra/README.md's Deploy section, held to what a fresh AWS account needs: no hard-coded state bucket (the
bootstrap env makes it, dev/prod take it as a partial backend config), the GPU quota by its exact name and code,
weights uploaded before any min_replicas > 0, and the first team made with no gateway running, by the very
command the README gives, run here against a fresh database."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from tests.infra.terraform import REPO, TERRAFORM_SOURCE

README = (REPO / "infra" / "README.md").read_text()
DEPLOY = README[README.index("## Deploy\n"):README.index("### Deploys that keep streams")]


def test_dev_and_prod_take_their_state_bucket_from_the_bootstrap():
    for env in ("dev", "prod"):
        main_tf = (TERRAFORM_SOURCE / "envs" / env / "main.tf").read_text()
        backend = re.search(r'backend "s3" \{(.*?)\n  \}', main_tf, re.S)
        assert backend, env
        settings = dict(re.findall(r"^\s*(\w+)\s*=\s*(.+?)\s*$", backend.group(1), re.M))
        assert "bucket" not in settings and "dynamodb_table" not in settings, (env, settings)  # nothing account-bound
        assert settings == {"key": f'"{env}/terraform.tfstate"', "encrypt": "true", "use_lockfile": "true"}, env
    bootstrap = (TERRAFORM_SOURCE / "modules" / "bootstrap" / "main.tf").read_text()
    assert 'resource "aws_s3_bucket" "state"' in bootstrap and 'resource "aws_ecr_repository" "image"' in bootstrap
    steps = [DEPLOY.index(s) for s in ("envs/bootstrap apply",
                                       "output -raw backend_config > infra/terraform/envs/$ENV/backend.hcl",
                                       "docker push", "init -backend-config=backend.hcl")]
    assert steps == sorted(steps), "bootstrap, backend.hcl, images, then the env's init"


def test_the_gpu_quota_is_named_exactly():
    text = " ".join(DEPLOY.split())  # names wrapped across lines
    for name, code in (("Running On-Demand G and VT instances", "L-DB2E81BA"),
                       ("Running On-Demand P instances", "L-417A185B"),
                       ("All G and VT Spot Instance Requests", "L-3819A6DF")):
        assert f"**\"{name}\"** (quota code `{code}`" in text or f"**\"{name}\"** (`{code}`)" in text, name
    assert "--quota-code L-DB2E81BA" in DEPLOY
    assert DEPLOY.index("GPU quota") < DEPLOY.index("envs/bootstrap apply")


def test_weights_go_up_before_any_endpoint_keeps_a_replica():
    assert DEPLOY.index("min_replicas` stays 0 in this first apply") < DEPLOY.index("aws s3 sync") \
        < DEPLOY.index("Only now raise `min_replicas`")
    example = (TERRAFORM_SOURCE / "terraform.tfvars.example").read_text()
    replicas = re.findall(r"min_replicas\s*=\s*(\d+)", example)
    assert replicas and set(replicas) == {"0"}, "the example a first apply copies starts nothing before its weights"


def test_the_first_team_is_made_without_a_gateway_by_the_readmes_command(tmp_path):
    overrides = json.loads(re.search(r"--overrides '(\{.*?\})'", DEPLOY).group(1))
    (container,) = overrides["containerOverrides"]
    service = (TERRAFORM_SOURCE / "modules" / "gateway" / "service.tf").read_text()
    assert f'name                   = "{container["name"]}"' in service  # the task definition's container
    assert 'family                   = "${var.name}-gateway"' in service
    assert "--task-definition sluice-$ENV-gateway" in DEPLOY
    # what the one-off task has: the gateway's config (an ECS endpoint whose team does not exist yet), the
    # database URL and the pepper from Secrets Manager; no gateway serves
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(PYTHONPATH=str(REPO), SLUICE_DATABASE_URL=f"sqlite:///{tmp_path / 'sluice.db'}",
               SLUICE_KEY_PEPPER="p" * 64, SLUICE_LOG_FORMAT="json", SLUICE_CONFIG_TOML=(
                   '[[models]]\nname = "m"\nteam_id = "not-made-yet"\n[models.provisioner]\nkind = "ecs"\n'
                   'cluster = "sluice-prod"\nservice = "sluice-prod-worker-m"\nregion = "us-east-1"\n'))

    def sluice(*argv: str) -> object:
        done = subprocess.run([sys.executable, "-m", "gateway.cli.main", *argv], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout)

    team = sluice(*container["command"])
    assert team["name"] == "acme" and team["id"]
    assert [t["id"] for t in sluice("teams", "list", "--json")] == [team["id"]]
    local = re.search(r"`SLUICE_DATABASE_URL=… SLUICE_KEY_PEPPER=… sluice (teams create acme --json)`", DEPLOY)
    assert local and local.group(1).split() == container["command"]  # the local form is the same command
