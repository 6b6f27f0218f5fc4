"""Terraform hygiene, read from the sources: every variable is used outside its own declaration (a variable only
its validation reads is a knob that changes nothing) and carries a description or a validation where it takes
free-form input, and each module's inputs with a finite domain are validated."""

from __future__ import annotations

import re

from tests.infra.terraform import TERRAFORM_SOURCE

DIRECTORIES = sorted(p for kind in ("modules", "envs") for p in (TERRAFORM_SOURCE / kind).iterdir() if p.is_dir())
DECLARATION = re.compile(r'^variable "(\w+)" \{\n(.*?)^\}\n', re.S | re.M)


def declarations(directory) -> dict[str, str]:
    return {name: body for path in directory.glob("*.tf") for name, body in DECLARATION.findall(path.read_text())}


def test_no_variable_is_unused():
    unused = []
    for directory in DIRECTORIES:
        code = "\n".join(DECLARATION.sub("", path.read_text()) for path in directory.glob("*.tf"))
        unused += [f"{directory.name}: {name}" for name in declarations(directory)
                   if not re.search(rf"\bvar\.{name}\b", code)]
    assert unused == []


def test_the_inputs_this_issue_added_are_validated():
    worker_pool = declarations(TERRAFORM_SOURCE / "modules" / "worker_pool")
    assert worker_pool["instance_types"].count("validation {") == 2 and worker_pool["spot"].count("validation {") == 3
    gateway = declarations(TERRAFORM_SOURCE / "modules" / "gateway")
    for name in ("export_task_role_arn", "export_exec_role_arn", "metrics_collector_image", "metrics_namespace"):
        assert "validation {" in gateway[name], name
    iam = declarations(TERRAFORM_SOURCE / "modules" / "iam")
    for name in ("export_secret_arn", "config_object_arn", "metrics_log_group_arn"):
        assert "validation {" in iam[name], name
    bootstrap = declarations(TERRAFORM_SOURCE / "modules" / "bootstrap")
    assert all("validation {" in body for body in bootstrap.values())
