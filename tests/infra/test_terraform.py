"""Terraform, checked offline: formatting, `init` + `validate` of every module and env, and each
module's `terraform test` suite (mock AWS provider, assertions on the plan)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from testkit.local_aws import moto_server
from tests.infra.terraform import TERRAFORM_SOURCE, Terraform

MODULES = sorted(p.name for p in (TERRAFORM_SOURCE / "modules").iterdir() if p.is_dir())
ENVS = sorted(p.name for p in (TERRAFORM_SOURCE / "envs").iterdir() if p.is_dir())
TESTED = [m for m in MODULES if any((TERRAFORM_SOURCE / "modules" / m / "tests").glob("*.tftest.hcl"))]


def test_every_module_has_a_terraform_test_suite():
    assert set(TESTED) == set(MODULES)


def test_formatting(terraform: Terraform):
    done = terraform.run(".", "fmt", "-check", "-recursive", "-diff", check=False)
    assert done.returncode == 0, f"run `terraform fmt -recursive infra/terraform`:\n{done.stdout}{done.stderr}"


def test_every_module_is_validated_through_an_env():
    """`validate` of a root module checks the modules it calls: the envs' runs below cover every module (each
    module's own `terraform test` validates it again), so no module is initialised and validated twice."""
    called = {m for env in ENVS for path in (TERRAFORM_SOURCE / "envs" / env).glob("*.tf")
              for m in re.findall(r'source\s*=\s*"\.\./\.\./modules/(\w+)"', path.read_text())}
    assert called == set(MODULES)


@pytest.mark.parametrize("directory", [f"envs/{e}" for e in ENVS])
def test_init_and_validate(terraform: Terraform, directory: str):
    terraform.init(directory)
    done = terraform.run(directory, "validate", "-json", check=False)
    assert '"valid": true' in done.stdout, done.stdout


@pytest.fixture(scope="module")
def secrets_manager() -> Iterator[dict[str, str]]:
    """A moto server for the suites' one real provider: modules/data's ephemeral passwords (`aws.secrets`),
    which terraform test's mock provider cannot serve."""
    with moto_server() as url:
        yield {"AWS_ENDPOINT_URL_SECRETS_MANAGER": url}


@pytest.mark.slow
@pytest.mark.parametrize("module", TESTED)
def test_module_suite(terraform: Terraform, module: str, secrets_manager: dict[str, str]):
    terraform.init(f"modules/{module}")
    done = terraform.run(f"modules/{module}", "test", check=False, timeout=900, env=secrets_manager)
    summary = re.search(r"(Success|Failure)! (\d+) passed, (\d+) failed", done.stdout)
    assert done.returncode == 0 and summary and summary.group(1) == "Success", done.stdout[-8000:] + done.stderr
    assert int(summary.group(2)) >= 2


def test_local_keeps_no_remote_state():
    """dev and prod: tests/infra/test_deploy_readme.py (a partial backend, filled by envs/bootstrap)."""
    assert "backend" not in (TERRAFORM_SOURCE / "envs" / "local" / "main.tf").read_text()


def test_no_ingress_rule_anywhere_opens_a_cidr_to_the_world_except_the_alb():
    """A static sweep over every .tf file, on top of the plan assertions of modules/network."""
    offenders = []
    for path in TERRAFORM_SOURCE.rglob("*.tf"):
        text = path.read_text()
        for match in re.finditer(r'resource "(aws_vpc_security_group_ingress_rule|aws_security_group_rule|'
                                 r'aws_security_group)" "(\w+)" \{(.*?)\n\}', text, re.S):
            kind, name, body = match.groups()
            world = re.search(r'cidr_(ipv4|blocks)\s*=\s*\[?"0\.0\.0\.0/0"', body) or "::/0" in body
            ingress = kind != "aws_security_group" or "ingress {" in body
            if world and ingress and name not in {"alb_https", "alb_http"}:
                offenders.append(f"{path.relative_to(TERRAFORM_SOURCE)}: {kind}.{name}")
    assert offenders == []


def test_no_redis_auth_token_anywhere():
    """Redis signs the gateway in with IAM tokens (modules/data): no AUTH token, hence none in plan or state.
    The data suite asserts it on the plan and the applied state; this sweep keeps it out of every module."""
    offenders = [f"{path.relative_to(TERRAFORM_SOURCE)}:{number}"
                 for path in TERRAFORM_SOURCE.rglob("*.tf")
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if re.match(r"\s*auth_token(_update_strategy)?\s*=", line)]
    assert offenders == []
