"""The gateway's config read from an S3 object at start (`SLUICE_CONFIG_S3=s3://bucket/key[?versionId=v]`).

ECS task definitions are capped in size, and the whole TOML in an environment variable (~330 B an endpoint) stopped
fitting at 150-200 endpoints. Terraform writes the file to S3 and names the object's version in the task definition,
so a config change rolls the gateways and a rollback reads the version it was deployed with."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import boto3
import botocore.exceptions

ENV = "SLUICE_CONFIG_S3"
MAX_BYTES = 16 * 1024 * 1024  # far above any fleet's config; a wrong object never fills the gateway's memory


def parse_uri(uri: str) -> tuple[str, str, str | None]:
    """(bucket, key, version or None); ValueError names what is wrong."""
    parts = urlsplit(uri)
    query = parse_qs(parts.query, keep_blank_values=True)
    if parts.scheme != "s3" or not parts.netloc or not parts.path.strip("/") or set(query) - {"versionId"}:
        raise ValueError(f"{ENV} must be s3://<bucket>/<key> with an optional ?versionId=<version>, not {uri!r}")
    versions = query.get("versionId", [])
    if versions and (len(versions) != 1 or not versions[0]):
        raise ValueError(f"{ENV}: give one non-empty versionId, not {uri!r}")
    return parts.netloc, parts.path.lstrip("/"), versions[0] if versions else None


def read(uri: str, client=None) -> str:
    """The object's text; ValueError with one line when it cannot be read (the caller exits with it)."""
    bucket, key, version = parse_uri(uri)
    s3 = client or boto3.client("s3")
    extra = {"VersionId": version} if version else {}
    try:
        body = s3.get_object(Bucket=bucket, Key=key, **extra)["Body"]
        data = body.read(MAX_BYTES + 1)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise ValueError(str(exc)) from None
    if len(data) > MAX_BYTES:
        raise ValueError(f"over {MAX_BYTES} bytes")
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8: {exc}") from None
