"""The activator's queue depth published to CloudWatch, for the alarm infra/terraform/modules/observability sets.

Off unless `[cloudwatch] namespace` is set. The gateway samples the number of requests waiting in every
endpoint's activator each `sample_seconds` and, every `interval_seconds`, sends the highest sample of the
interval as `ActivatorQueueDepth` (no dimensions, unit Count) in that namespace: the alarm reads its
`Maximum`, so a queue that filled and emptied between two sends is still seen. A send that fails is logged
and the next interval tries again; requests never wait on it (the call runs in a thread, bounded by short
timeouts). The gateway's task role may call `cloudwatch:PutMetricData` in this namespace only (modules/iam).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Annotated

import boto3
import msgspec
import structlog
from botocore.config import Config

from gateway.endpoints.spec import check_url
from gateway.lifecycle import Background

log = structlog.get_logger(__name__)
STOP_S = 5.0  # a stop cancels the publishing: what a call to CloudWatch under way gets to unwind
METRIC_NAME = "ActivatorQueueDepth"  # the alarm's metric_name (modules/observability)
NAMESPACE_PATTERN = re.compile(r"[0-9A-Za-z.\-_/#:]{1,255}")
CLIENT_CONFIG = Config(connect_timeout=2, read_timeout=5, retries={"max_attempts": 2, "mode": "standard"})


class CloudWatchSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    namespace: str = ""  # "" = publish nothing; the alarm's namespace otherwise, e.g. "Sluice/sluice-prod"
    region: str = ""  # "" = the AWS SDK's own (AWS_REGION, which ECS sets)
    endpoint_url: str = ""  # "" = AWS itself; a moto or LocalStack URL otherwise
    interval_seconds: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 60.0
    sample_seconds: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 1.0

    def __post_init__(self) -> None:
        if self.namespace and (not NAMESPACE_PATTERN.fullmatch(self.namespace) or self.namespace.startswith("AWS/")):
            raise ValueError(f"`cloudwatch.namespace` must be 1-255 of A-Z a-z 0-9 . - _ / # : and not start with "
                             f"AWS/ (got {self.namespace[:60]!r})")
        if self.endpoint_url:
            check_url("cloudwatch.endpoint_url", self.endpoint_url)
        if self.sample_seconds > self.interval_seconds:
            raise ValueError(f"`cloudwatch.sample_seconds` ({self.sample_seconds}) must not exceed "
                             f"`cloudwatch.interval_seconds` ({self.interval_seconds})")


class QueueDepthPublisher:
    def __init__(self, settings: CloudWatchSettings, depth: Callable[[], int], *, client=None):
        """`depth` answers how many requests wait in the activators now."""
        self.settings = settings
        self.depth = depth
        self.client = client or boto3.client("cloudwatch", region_name=settings.region or None,
                                             endpoint_url=settings.endpoint_url or None, config=CLIENT_CONFIG)
        self.sent = 0
        self._task = Background("cloudwatch queue depth")

    def start(self) -> QueueDepthPublisher:
        self._task.spawn(self._run(), name="cloudwatch queue depth")
        log.info("queue_metric_publishing", namespace=self.settings.namespace,
                 interval_s=self.settings.interval_seconds)
        return self

    async def stop(self) -> None:
        await self._task.stop(STOP_S)

    async def _run(self) -> None:
        while True:
            try:
                await self.publish(await self._highest_of_interval())
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one bad interval end the publishing
                log.exception("queue_metric_interval_failed")
                await asyncio.sleep(self.settings.interval_seconds)

    async def _highest_of_interval(self) -> int:
        loop = asyncio.get_running_loop()
        send_at = loop.time() + self.settings.interval_seconds
        highest = self.depth()
        while loop.time() < send_at:
            await asyncio.sleep(min(self.settings.sample_seconds, max(0.0, send_at - loop.time())))
            highest = max(highest, self.depth())
        return highest

    async def publish(self, value: int) -> None:
        try:
            await asyncio.to_thread(self.client.put_metric_data, Namespace=self.settings.namespace,
                                    MetricData=[{"MetricName": METRIC_NAME, "Value": float(value), "Unit": "Count"}])
        except Exception as error:  # CloudWatch away or refusing: the gateway goes on serving
            log.warning("queue_metric_publish_failed", namespace=self.settings.namespace, error=str(error)[:300])
            return
        self.sent += 1
