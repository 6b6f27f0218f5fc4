"""The `local` env applied to AWS served by a moto server on this machine, checked with boto3,
then destroyed, leaving nothing behind.

`applied_local_env` yields the applied env's outputs (moto endpoint, region, cluster, worker service
names, the rendered gateway config). Between apply and destroy, a real `sluice serve` started from the
SLUICE_CONFIG_TOML of the gateway's task definition scales a created worker service through its ECS
provisioner and publishes the queue depth the alarm reads.
"""

from __future__ import annotations

import datetime
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import boto3
import httpx
import pytest

from gateway.endpoints.queue_metric import METRIC_NAME
from testkit.local_aws import moto_server
from testkit.sluice import running_sluice
from tests.infra.terraform import Terraform

pytestmark = pytest.mark.slow
REGION = "us-east-1"
CREDENTIALS = {"aws_access_key_id": "local", "aws_secret_access_key": "local", "region_name": REGION}


@dataclass
class LocalAws:
    endpoint_url: str
    region: str

    def client(self, service: str):
        return boto3.client(service, endpoint_url=self.endpoint_url, **CREDENTIALS)


@dataclass
class AppliedEnv:
    aws: LocalAws
    cluster: str
    worker_services: dict[str, str]  # endpoint name -> ECS service name
    outputs: dict


@pytest.fixture(scope="module")
def local_aws() -> Iterator[LocalAws]:
    # AWS-managed policies (the ECS container-instance role) exist in moto only when loaded
    patch = pytest.MonkeyPatch()
    patch.setenv("MOTO_IAM_LOAD_MANAGED_POLICIES", "true")
    try:
        with moto_server() as url:
            # moto's backends are the process's: an earlier test's in-process moto (the ECS provisioner's) may
            # have built the IAM backend before the variable was set; a reset builds every backend again
            httpx.post(f"{url}/moto-api/reset", timeout=30).raise_for_status()
            yield LocalAws(url, REGION)
    finally:
        patch.undo()


def _state_resources(terraform: Terraform) -> list[str]:
    done = terraform.run("envs/local", "state", "list", check=False)
    return [line for line in done.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def applied_local_env(terraform: Terraform, local_aws: LocalAws) -> Iterator[AppliedEnv]:
    """`terraform apply` of envs/local against moto; `terraform destroy` afterwards, checked empty."""
    certificate = local_aws.client("acm").request_certificate(DomainName="api.sluice.test")["CertificateArn"]
    variables = ["-var", f"aws_endpoint={local_aws.endpoint_url}", "-var", f"certificate_arn={certificate}"]
    terraform.init("envs/local")
    terraform.run("envs/local", "apply", "-auto-approve", "-input=false", *variables, timeout=900)
    outputs = {k: v["value"] for k, v in json.loads(terraform.run("envs/local", "output", "-json").stdout).items()}
    applied = AppliedEnv(local_aws, outputs["ecs_cluster_name"], outputs["worker_service_names"], outputs)
    yield applied
    terraform.run("envs/local", "destroy", "-auto-approve", "-input=false", *variables, timeout=900)
    assert _state_resources(terraform) == []
    _assert_nothing_left(applied)


def _assert_nothing_left(env: AppliedEnv) -> None:
    aws = env.aws
    ecs = aws.client("ecs")
    clusters = ecs.describe_clusters(clusters=[env.cluster])["clusters"]
    assert all(c["status"] == "INACTIVE" for c in clusters), clusters
    assert aws.client("s3").list_buckets()["Buckets"] == []
    assert [v for v in aws.client("ec2").describe_vpcs()["Vpcs"] if not v.get("IsDefault")] == []
    roles = [r["RoleName"] for r in aws.client("iam").list_roles()["Roles"] if r["RoleName"].startswith("sluice-")]
    assert roles == []
    secrets = aws.client("secretsmanager").list_secrets()["SecretList"]
    assert [s["Name"] for s in secrets if "DeletedDate" not in s] == []
    groups = aws.client("logs").describe_log_groups(logGroupNamePrefix="/sluice/")["logGroups"]
    assert groups == []
    assert aws.client("efs").describe_file_systems()["FileSystems"] == []
    active = ecs.list_task_definitions(status="ACTIVE")["taskDefinitionArns"]
    assert active == []


def test_worker_services_exist_at_zero_on_the_gpu_capacity_provider(applied_local_env: AppliedEnv):
    ecs = applied_local_env.aws.client("ecs")
    cluster = ecs.describe_clusters(clusters=[applied_local_env.cluster])["clusters"][0]
    assert set(cluster["capacityProviders"]) == {"FARGATE", "sluice-local-gpu"}
    provider = ecs.describe_capacity_providers(capacityProviders=["sluice-local-gpu"])["capacityProviders"][0]
    scaling = provider["autoScalingGroupProvider"]
    assert scaling["managedScaling"]["status"] == "ENABLED"
    group = applied_local_env.aws.client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"]
    assert [(g["MinSize"], g["MaxSize"]) for g in group] == [(0, 2)]
    names = list(applied_local_env.worker_services.values())
    assert set(applied_local_env.worker_services) == {"HuggingFaceTB/SmolLM2-135M-Instruct", "tiny/random-llama"}
    services = ecs.describe_services(cluster=applied_local_env.cluster, services=names)["services"]
    assert {s["serviceName"] for s in services} == set(names)
    for service in services:
        assert service["desiredCount"] == 0
        assert service["status"] == "ACTIVE"
        definition = ecs.describe_task_definition(taskDefinition=service["taskDefinition"])["taskDefinition"]
        container = definition["containerDefinitions"][0]
        assert container["resourceRequirements"] == [{"type": "GPU", "value": "1"}]
        assert container["command"][:1] == ["worker"] and "--model-json" in container["command"]
        assert container["user"] == "10001:10001"
        # the very secret the gateway sends: a worker on 0.0.0.0 refuses to start without it
        secret_arn = applied_local_env.outputs["secret_arns"]["worker_secret"]
        assert container["secrets"] == [{"name": "SLUICE_WORKER_SECRET", "valueFrom": secret_arn}]


def test_the_gateway_service_gets_its_secrets_and_the_wal_volume(applied_local_env: AppliedEnv):
    ecs = applied_local_env.aws.client("ecs")
    gateway = ecs.describe_services(cluster=applied_local_env.cluster,
                                    services=[applied_local_env.outputs["gateway_service_name"]])["services"][0]
    assert gateway["launchType"] == "FARGATE" and gateway["desiredCount"] == 1
    definition = ecs.describe_task_definition(taskDefinition=gateway["taskDefinition"])["taskDefinition"]
    container = definition["containerDefinitions"][0]
    secrets = {s["name"]: s["valueFrom"] for s in container["secrets"]}
    arns = applied_local_env.outputs["secret_arns"]
    assert secrets == {"SLUICE_ADMIN_KEY": arns["admin_key"], "SLUICE_KEY_PEPPER": arns["key_pepper"],
                       "SLUICE_WORKER_SECRET": arns["worker_secret"], "SLUICE_METRICS_TOKEN": arns["metrics_token"]}
    environment = {e["name"]: e["value"] for e in container["environment"]}
    assert not any(word in name for name in environment for word in ("KEY", "PEPPER", "PASSWORD"))
    volume = definition["volumes"][0]["efsVolumeConfiguration"]
    assert volume["transitEncryption"] == "ENABLED"
    assert container["mountPoints"][0]["containerPath"] == "/var/lib/sluice"
    value = applied_local_env.aws.client("secretsmanager").get_secret_value(
        SecretId=secrets["SLUICE_KEY_PEPPER"])["SecretString"]
    assert len(value) == 64  # generated by Secrets Manager, never in a tfvars file


def test_no_secret_value_is_in_the_terraform_state(applied_local_env: AppliedEnv, terraform: Terraform):
    """The generated secrets reach Secrets Manager (write-only, from ephemeral values) but not the state."""
    manager = applied_local_env.aws.client("secretsmanager")
    values = {key: manager.get_secret_value(SecretId=arn)["SecretString"]
              for key, arn in applied_local_env.outputs["secret_arns"].items()}
    assert set(values) == {"admin_key", "key_pepper", "worker_secret", "metrics_token"}
    assert all(len(v) >= 48 for v in values.values())
    state = terraform.run("envs/local", "state", "pull").stdout
    assert '"secret_arns"' in state and '"aws_secretsmanager_secret_version"' in state  # the state read is the env's
    assert [key for key, value in values.items() if value in state] == []


def test_buckets_block_public_access_and_are_encrypted_and_versioned(applied_local_env: AppliedEnv):
    s3 = applied_local_env.aws.client("s3")
    for key, name in applied_local_env.outputs["bucket_names"].items():
        block = s3.get_public_access_block(Bucket=name)["PublicAccessBlockConfiguration"]
        assert all(block.values()) and len(block) == 4, block
        rule = s3.get_bucket_encryption(Bucket=name)["ServerSideEncryptionConfiguration"]["Rules"][0]
        # the ALB delivers its access logs only to SSE-S3 buckets
        algorithm = rule["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"]
        assert algorithm == ("AES256" if key == "alb-logs" else "aws:kms")
        assert s3.get_bucket_versioning(Bucket=name)["Status"] == "Enabled"
        policy = json.loads(s3.get_bucket_policy(Bucket=name)["Policy"])
        assert policy["Statement"][0]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_the_gateway_role_may_scale_only_the_worker_services(applied_local_env: AppliedEnv):
    iam = applied_local_env.aws.client("iam")
    document = iam.get_role_policy(RoleName="sluice-local-gateway-task", PolicyName="gateway-task")["PolicyDocument"]
    if isinstance(document, str):
        document = json.loads(document)
    scale = next(s for s in document["Statement"] if s["Sid"] == "ScaleWorkerServices")
    assert scale["Resource"].endswith(":service/sluice-local/sluice-local-worker-*")
    actions = sorted({a for s in document["Statement"] for a in ([s["Action"]] if isinstance(s["Action"], str)
                                                                   else s["Action"])})
    assert actions == sorted(["ecs:UpdateService", "ecs:DescribeServices", "ecs:ListTasks", "ecs:DescribeTasks",
                              "ecs:StopTask", "ecs:UpdateTaskProtection", "s3:GetObject", "kms:Decrypt",
                              "elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite",
                              "cloudwatch:PutMetricData", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                              "s3:ListBucketMultipartUploads", "kms:GenerateDataKey"])
    publish = next(s for s in document["Statement"] if s["Sid"] == "PublishQueueMetric")
    namespace = applied_local_env.outputs["activator_queue_metric_namespace"]
    assert publish["Condition"] == {"StringEquals": {"cloudwatch:namespace": namespace}}


def test_the_network_admits_the_internet_only_at_the_alb(applied_local_env: AppliedEnv):
    ec2 = applied_local_env.aws.client("ec2")
    groups = ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": ["sluice-local-*"]}])
    open_ports = []
    for group in groups["SecurityGroups"]:
        for permission in group["IpPermissions"]:
            if any(r.get("CidrIp") == "0.0.0.0/0" for r in permission.get("IpRanges", [])):
                open_ports.append((group["GroupName"], permission["FromPort"], permission["ToPort"]))
    assert sorted(open_ports) == [("sluice-local-alb", 80, 80), ("sluice-local-alb", 443, 443)]


# the test's timers laid into the rendered config: a task has 3 s to become reachable (600 s by default),
# the queue depth is sent every half second (60 s)
# The request gives up waiting (SCALE_UP_WAIT_S) before the replica nobody placed is given up (START_TIMEOUT_S,
# counted from the scale-up, which comes after the request): so it ends "starting". The test sees it waiting in
# between: seconds, not a hair, on a loaded machine.
SCALE_UP_WAIT_S, START_TIMEOUT_S = 8, 12
TEST_TIMERS = ("\n[scaling]\nstable_window_seconds = 1\npanic_window_seconds = 0.5\ntick_seconds = 0.1\n"
               f"ecs_start_timeout_seconds = {START_TIMEOUT_S}\nstandby_worker = false\n")
# what ECS injects from Secrets Manager: the rendered config prints no key (print_bootstrap_keys = false)
ADMIN_KEY = "operator-admin-key-from-secrets-manager-0123456789"
ENDPOINT = "tiny/random-llama"


def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout} s")
        time.sleep(0.05)


def _team_key(url: str) -> dict[str, str]:
    """A team key made through the admin API, as an operator does on ECS."""
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    teams = httpx.get(f"{url}/admin/teams", headers=admin, timeout=10).json()["data"]
    team = next(t["id"] for t in teams if t["name"] == "default")
    made = httpx.post(f"{url}/admin/keys", headers=admin, json={"name": "local-apply", "team_id": team}, timeout=10)
    assert made.status_code == 201, made.text
    return {"authorization": f"Bearer {made.json()['key']}"}


def test_a_gateway_configured_by_terraform_wakes_the_worker_service_and_publishes_its_queue(
        applied_local_env: AppliedEnv, tmp_path):
    """moto runs no containers, so ECS never places a task: the gateway asks for one (desiredCount 0 -> 1),
    the request waits in the activator (the queue depth the alarm reads), gets the 503 a client sees when
    no replica becomes ready in time, and the replica nobody placed is given up after the start timeout
    (desiredCount back to 0, the endpoint asleep again). Routing to a task's address is proven against a
    played ECS in tests/gateway/endpoints/test_ecs.py."""
    aws, outputs = applied_local_env.aws, applied_local_env.outputs
    ecs = aws.client("ecs")
    gateway = ecs.describe_services(cluster=applied_local_env.cluster, services=[outputs["gateway_service_name"]])
    definition = ecs.describe_task_definition(taskDefinition=gateway["services"][0]["taskDefinition"])
    container = definition["taskDefinition"]["containerDefinitions"][0]
    environment = {e["name"]: e["value"] for e in container["environment"]}
    config = environment["SLUICE_CONFIG_TOML"]  # what ECS hands the gateway task
    assert config == outputs["gateway_config_toml"]
    config = config.replace("[cloudwatch]\n", "[cloudwatch]\ninterval_seconds = 0.5\nsample_seconds = 0.1\n")
    service = applied_local_env.worker_services[ENDPOINT]

    def desired() -> int:
        found = ecs.describe_services(cluster=applied_local_env.cluster, services=[service])["services"]
        return found[0]["desiredCount"]

    env = {"SLUICE_CONFIG_TOML": config + TEST_TIMERS, "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
           "SLUICE_ADMIN_KEY": ADMIN_KEY}
    with running_sluice(tmp_path / "gateway", env=env) as sluice:
        assert "shown once" not in sluice.output  # no key in the logs CloudWatch keeps
        headers = _team_key(sluice.url)

        def state() -> dict:
            listed = httpx.get(f"{sluice.url}/v1/endpoints", headers=headers, timeout=10).json()["data"]
            return next(e for e in listed if e["id"] == ENDPOINT)

        assert state()["state"] == "scaled_to_zero" and desired() == 0
        answers = []
        waits = {**headers, "x-scale-up-timeout": str(SCALE_UP_WAIT_S)}
        request = threading.Thread(target=lambda: answers.append(httpx.post(
            f"{sluice.url}/v1/completions", headers=waits, timeout=120,
            json={"model": ENDPOINT, "prompt": "Hi", "max_tokens": 4})))
        request.start()
        try:
            _until(lambda: desired() == 1, SCALE_UP_WAIT_S, "the service's scale-up")
            waiting = state()
            assert waiting["state"] == "starting" and waiting["waiting"] == 1
        finally:
            request.join(timeout=120)
        (answer,) = answers
        assert answer.status_code == 503 and "retry-after" in answer.headers, answer.text
        error = answer.json()["error"]
        assert error["code"] == "scale_up_timeout" and error["endpoint_state"] == "starting"
        _until(lambda: desired() == 0, 120, "the service's scale-in")
        _until(lambda: state()["state"] == "scaled_to_zero", 120, "the endpoint's sleep")
        given_up = sluice.log_events("replica_start_failed")
        assert [e["reason"] for e in given_up] == [f"no capacity: it got no address in {START_TIMEOUT_S} s"]
        assert desired() == 0 and httpx.get(f"{sluice.url}/health", timeout=10).status_code == 200
    cloudwatch = aws.client("cloudwatch")
    alarm = cloudwatch.describe_alarms(AlarmNames=["sluice-local-activator-queue-depth"])["MetricAlarms"][0]
    assert (alarm["Namespace"], alarm["MetricName"], alarm["Dimensions"]) == (
        outputs["activator_queue_metric_namespace"], METRIC_NAME, [])
    now = datetime.datetime.now(datetime.UTC)
    points = cloudwatch.get_metric_statistics(
        Namespace=alarm["Namespace"], MetricName=alarm["MetricName"], Dimensions=alarm["Dimensions"],
        StartTime=now - datetime.timedelta(minutes=5), EndTime=now + datetime.timedelta(minutes=5), Period=60,
        Statistics=[alarm["Statistic"]])["Datapoints"]
    assert max(p[alarm["Statistic"]] for p in points) == 1.0  # the one request that waited


def test_a_gateway_configured_by_terraform_keeps_batch_files_in_its_bucket(applied_local_env: AppliedEnv, tmp_path):
    """The rendered [batches] table sends file bodies to the data module's batch-files bucket, under the prefix the
    task role's grant names: an uploaded file is an object there, read back through the API, gone once deleted."""
    outputs = applied_local_env.outputs
    bucket = outputs["bucket_names"]["batch-files"]
    s3 = applied_local_env.aws.client("s3")
    env = {"SLUICE_CONFIG_TOML": outputs["gateway_config_toml"], "AWS_ACCESS_KEY_ID": "local",
           "AWS_SECRET_ACCESS_KEY": "local", "AWS_DEFAULT_REGION": REGION, "SLUICE_ADMIN_KEY": ADMIN_KEY}
    # moto serves plain HTTP, which the bucket's TLS-only policy refuses (as AWS would; boto3 speaks HTTPS there):
    # proven here, then the policy is lifted for the test and put back for the destroy
    tls_only = s3.get_bucket_policy(Bucket=bucket)["Policy"]
    with pytest.raises(s3.exceptions.ClientError, match="Forbidden|AccessDenied"):
        s3.put_object(Bucket=bucket, Key="batch-files/plain-http.jsonl", Body=b"{}")
    s3.delete_bucket_policy(Bucket=bucket)
    try:
        _keeps_a_file_in(bucket, s3, env, tmp_path)
    finally:  # no version left behind: moto fails to dispose of a delete marker when destroy empties the bucket
        listed = s3.list_object_versions(Bucket=bucket)
        for version in listed.get("Versions", []) + listed.get("DeleteMarkers", []):
            s3.delete_object(Bucket=bucket, Key=version["Key"], VersionId=version["VersionId"])
        s3.put_bucket_policy(Bucket=bucket, Policy=tls_only)


def _keeps_a_file_in(bucket: str, s3, env: dict[str, str], tmp_path) -> None:
    line = json.dumps({"custom_id": "one", "method": "POST", "url": "/v1/completions",
                       "body": {"model": ENDPOINT, "prompt": "Hi", "max_tokens": 4}}) + "\n"
    with running_sluice(tmp_path / "gateway", env=env) as sluice:
        headers = _team_key(sluice.url)
        made = httpx.post(f"{sluice.url}/v1/files", headers=headers, data={"purpose": "batch"},
                          files={"file": ("requests.jsonl", line.encode())}, timeout=30)
        assert made.status_code == 200, made.text
        file_id = made.json()["id"]
        stored = s3.list_objects_v2(Bucket=bucket).get("Contents", [])
        assert [o["Key"] for o in stored] == [f"batch-files/{file_id}.jsonl"]
        content = httpx.get(f"{sluice.url}/v1/files/{file_id}/content", headers=headers, timeout=10)
        assert content.status_code == 200 and content.text == line
        assert httpx.delete(f"{sluice.url}/v1/files/{file_id}", headers=headers, timeout=10).status_code == 200
        assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0
