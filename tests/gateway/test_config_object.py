"""The config read from an S3 object at start (SLUICE_CONFIG_S3, gateway/config_object.py): what Terraform writes
for fleets whose config no longer fits a task definition. A real S3 API (moto); every mistake exits with one line."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from gateway.config import load_settings

ENDPOINT = '[[models]]\nname = "m{i}"\nprovisioner = {{ kind = "static", urls = ["http://10.0.{j}.{k}:8100"] }}\n'


@pytest.fixture
def s3(monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("SLUICE_CONFIG_TOML", raising=False)
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="sluice-config")
        client.put_bucket_versioning(Bucket="sluice-config", VersioningConfiguration={"Status": "Enabled"})
        yield client


def test_a_fleet_past_the_task_definition_limit_loads_from_s3(s3, monkeypatch):
    # 1,000 endpoints: ~120 kB of TOML, twice the 64 KiB a whole task definition may hold
    text = "".join(ENDPOINT.format(i=i, j=i // 250, k=i % 250 + 1) for i in range(1000))
    assert len(text) > 65536
    s3.put_object(Bucket="sluice-config", Key="gateway/config.toml", Body=text.encode())
    monkeypatch.setenv("SLUICE_CONFIG_S3", "s3://sluice-config/gateway/config.toml")
    settings = load_settings()
    assert len(settings.models) == 1000 and settings.models[999].name == "m999"


def test_the_named_version_is_read_not_the_latest(s3, monkeypatch):
    first = s3.put_object(Bucket="sluice-config", Key="c.toml", Body=ENDPOINT.format(i=1, j=0, k=1).encode())
    s3.put_object(Bucket="sluice-config", Key="c.toml", Body=ENDPOINT.format(i=2, j=0, k=2).encode())
    monkeypatch.setenv("SLUICE_CONFIG_S3", f"s3://sluice-config/c.toml?versionId={first['VersionId']}")
    assert [m.name for m in load_settings().models] == ["m1"]  # a rolled-back task reads its own version
    monkeypatch.setenv("SLUICE_CONFIG_S3", "s3://sluice-config/c.toml")
    assert [m.name for m in load_settings().models] == ["m2"]


@pytest.mark.parametrize(("uri", "words"), [
    ("s3://sluice-config/missing.toml", ["cannot read the config from s3://", "NoSuchKey"]),
    ("s3://no-such-bucket/c.toml", ["cannot read the config from s3://", "NoSuchBucket"]),
    ("https://sluice-config/c.toml", ["s3://<bucket>/<key>"]),
    ("s3://sluice-config/", ["s3://<bucket>/<key>"]),
    ("s3://sluice-config/c.toml?version=1", ["s3://<bucket>/<key>"]),
    ("s3://sluice-config/c.toml?versionId=", ["one non-empty versionId"]),
    ("s3://sluice-config/bad.toml", ["cannot read the config from s3://", "bad.toml"]),
    ("s3://sluice-config/binary.toml", ["not UTF-8"]),
])
def test_a_config_object_that_cannot_be_read_is_one_line(s3, monkeypatch, uri, words):
    s3.put_object(Bucket="sluice-config", Key="bad.toml", Body=b"port = \n")
    s3.put_object(Bucket="sluice-config", Key="binary.toml", Body=b"\xff\xfe")
    monkeypatch.setenv("SLUICE_CONFIG_S3", uri)
    with pytest.raises(SystemExit) as failure:
        load_settings()
    message = str(failure.value)
    assert message.startswith("sluice: ") and "\n" not in message and all(w in message for w in words), message


def test_both_sources_at_once_are_refused(s3, monkeypatch):
    monkeypatch.setenv("SLUICE_CONFIG_S3", "s3://sluice-config/c.toml")
    monkeypatch.setenv("SLUICE_CONFIG_TOML", ENDPOINT.format(i=1, j=0, k=1))
    with pytest.raises(SystemExit, match="set one of SLUICE_CONFIG_TOML and SLUICE_CONFIG_S3"):
        load_settings()
