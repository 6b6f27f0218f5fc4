"""Each task role grants what its job's code calls, and nothing else: the boto3 calls are read from the source
(every file that uses boto3, its client methods resolved against botocore's own service models) and compared with
the actions of the role's policy in modules/iam. A new call without its grant would be AccessDenied only on AWS;
a grant no code calls is a privilege an attacker inside the task gets for free."""

from __future__ import annotations

import re
from pathlib import Path

import botocore.session
from botocore import xform_name

from tests.infra.terraform import REPO, TERRAFORM_SOURCE

EXPORT_FILES = {"billing/cli.py", "billing/exports/s3.py"}  # `sluice usage export`, its own one-off task
JOBS = {  # the role's policy local in modules/iam -> which source files run under it
    "gateway_task_policy": lambda path: path.parts[0] in {"gateway", "auth", "billing", "storage", "common"}
    and path.as_posix() not in EXPORT_FILES,
    "export_task_policy": lambda path: path.as_posix() in EXPORT_FILES,
    "worker_task_policy": lambda path: path.parts[0] == "worker",
}
# what a role needs that no boto3 call in the code shows, each with its reason
IMPLICIT = {
    "gateway_task_policy": {
        "elasticfilesystem:ClientMount": "ECS mounts the usage log's EFS access point with the task role (IAM auth)",
        "elasticfilesystem:ClientWrite": "the usage log is written there",
        "kms:Decrypt": "the config object and the batch bodies are SSE-KMS: S3 decrypts them for GetObject",
        "kms:GenerateDataKey": "S3 encrypts each new batch body (object or part) with a data key",
        "elasticache:Connect": "gateway/redis_iam.py presigns the Redis sign-in token (no client call)",
        "logs:CreateLogStream": "the task's metrics collector (ADOT, modules/gateway) opens its EMF stream",
        "logs:PutLogEvents": "and writes the scraped /metrics into it",
    },
    "export_task_policy": {
        "kms:Decrypt": "head_object / multipart upload of SSE-KMS objects",
        "kms:GenerateDataKey": "S3 encrypts each new export object with a data key",
        "s3:AbortMultipartUpload": "upload_fileobj aborts a failed multipart upload",
    },
    "worker_task_policy": {"kms:Decrypt": "the weights are SSE-KMS: S3 decrypts them for GetObject"},
}
# IAM actions whose name is not the operation's (S3's), and boto3's transfer helpers
S3_ACTIONS = {"HeadObject": "GetObject", "ListObjectsV2": "ListBucket", "ListObjects": "ListBucket",
              "CreateMultipartUpload": "PutObject", "UploadPart": "PutObject", "CompleteMultipartUpload": "PutObject",
              "ListMultipartUploads": "ListBucketMultipartUploads"}
TRANSFER = {"upload_fileobj": "PutObject", "upload_file": "PutObject", "download_file": "GetObject",
            "download_fileobj": "GetObject"}
# a method called or handed to a thread (asyncio.to_thread(self.client.update_service, ...)), named to the ECS
# provisioner's one caller (self._call("update_service", ...)), or paginated
CALL = re.compile(r"\b(?:self\.client|client|s3)\.(\w+)\b|\bself\._call\(\"(\w+)\"")
PAGINATED = re.compile(r"get_paginator\(\"(\w+)\"\)")
SERVICE = re.compile(r"boto3\.client\(\s*\"([\w-]+)\"")


def code_actions(policy: str) -> dict[str, set[str]]:
    """Action -> the files that call it, for the files of one job."""
    session = botocore.session.get_session()
    files = [p for p in REPO.glob("*/**/*.py") if p.relative_to(REPO).parts[0] in
             {"gateway", "auth", "billing", "storage", "common", "worker"}]
    used = [p for p in files if JOBS[policy](p.relative_to(REPO)) and "boto3" in p.read_text()]
    services = {name for p in used for name in SERVICE.findall(p.read_text())}
    if any(p.relative_to(REPO).as_posix() in EXPORT_FILES for p in used):
        services.add("s3")  # billing/exports/s3.py is handed billing/cli.py's client
    operations = {xform_name(op): (service, op) for service in services
                  for op in session.get_service_model(service).operation_names}
    actions: dict[str, set[str]] = {}
    for path in used:
        source = path.read_text()
        for name in [a or b for a, b in CALL.findall(source)] + PAGINATED.findall(source):
            if name in TRANSFER:
                action = f"s3:{TRANSFER[name]}"
            elif name in operations:
                service, op = operations[name]
                action = f"{service}:{S3_ACTIONS.get(op, op) if service == 's3' else op}"
            else:
                continue  # not an AWS call (an HTTP or Redis client's method)
            actions.setdefault(action, set()).add(path.relative_to(REPO).as_posix())
    return actions


def granted(policy: str) -> set[str]:
    """The actions of one policy local of modules/iam/main.tf (its `Action = ...` lines only, not condition keys)."""
    text = (TERRAFORM_SOURCE / "modules" / "iam" / "main.tf").read_text()
    start = text.index(f"  {policy} = {{")
    end = text.index("\n  }\n", start)
    actions = set()
    for value in re.findall(r"Action\s*=\s*(\[[^\]]*\]|\"[^\"]*\")", text[start:end]):
        actions |= set(re.findall(r"\"([\w-]+:\w+)\"", value))
    return actions


def test_the_scan_sees_every_aws_call_of_each_job():
    """A guard on the scan itself: it finds the calls the code is known to make."""
    assert {"ecs:UpdateService", "ecs:UpdateTaskProtection", "cloudwatch:PutMetricData", "s3:GetObject"} <= set(
        code_actions("gateway_task_policy"))
    assert set(code_actions("export_task_policy")) == {"s3:GetObject", "s3:PutObject"}
    assert set(code_actions("worker_task_policy")) == {"s3:ListBucket", "s3:GetObject"}


def test_each_task_role_grants_exactly_what_its_code_calls():
    for policy in JOBS:
        called = code_actions(policy)
        needed = set(called) | set(IMPLICIT[policy])
        have = granted(policy)
        missing = {action: sorted(called.get(action, ["implicit"])) for action in needed - have}
        assert missing == {}, f"{policy}: calls without a grant (AccessDenied on AWS)"
        assert have - needed == set(), f"{policy}: grants that no code of this job uses"


def test_the_serving_gateway_and_the_export_do_not_share_a_role():
    usage_export = (TERRAFORM_SOURCE / "modules" / "gateway" / "usage_export.tf").read_text()
    assert re.search(r"task_role_arn\s*=\s*var\.export_task_role_arn", usage_export)
    assert re.search(r"execution_role_arn\s*=\s*var\.export_exec_role_arn", usage_export)
    assert Path(TERRAFORM_SOURCE / "modules" / "iam" / "outputs.tf").read_text().count("export-") == 2
