"""The activator's queue depth sent to CloudWatch (gateway/endpoints/queue_metric.py), against a real moto server:
the highest depth of each interval arrives under the alarm's namespace and name, with no dimensions; a
CloudWatch that cannot be reached is logged and changes nothing else; every `[cloudwatch]` rule is one line."""

from __future__ import annotations

import asyncio
import datetime

import boto3
import pytest
from litestar.testing import AsyncTestClient
from structlog.testing import capture_logs

from gateway.config import load_settings
from gateway.edge.app import create_app
from gateway.edge.lifespan import STATE_FAILURE
from gateway.endpoints.queue_metric import METRIC_NAME, CloudWatchSettings, QueueDepthPublisher
from testkit.local_aws import moto_server
from testkit.servers import free_port
from tests.gateway.app_client import app_client

NAMESPACE = "Sluice/sluice-test"


@pytest.fixture(scope="module")
def cloudwatch_url():
    with moto_server() as url:
        yield url


@pytest.fixture
def credentials(monkeypatch):
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, value)


def published(url: str, namespace: str) -> list[dict]:
    """Every datapoint of the queue metric with no dimensions (what the alarm reads), oldest first."""
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1", endpoint_url=url)
    now = datetime.datetime.now(datetime.UTC)
    answer = cloudwatch.get_metric_statistics(Namespace=namespace, MetricName=METRIC_NAME, Dimensions=[],
                                              StartTime=now - datetime.timedelta(minutes=5),
                                              EndTime=now + datetime.timedelta(minutes=5), Period=60,
                                              Statistics=["Maximum", "SampleCount"])
    return sorted(answer["Datapoints"], key=lambda point: point["Timestamp"])


async def test_the_highest_depth_of_each_interval_arrives_under_the_alarms_name(cloudwatch_url, credentials):
    settings = CloudWatchSettings(namespace=NAMESPACE, region="us-east-1", endpoint_url=cloudwatch_url,
                                  interval_seconds=0.6, sample_seconds=0.05)
    depth, samples = [0], []

    def sampled() -> int:
        samples.append(depth[0])
        return depth[0]

    publisher = QueueDepthPublisher(settings, sampled).start()
    try:
        await asyncio.sleep(0.1)
        depth[0] = 7  # a burst that is gone again before the interval's send
        while 7 not in samples:  # sampled once, however late a loaded machine runs the sampler
            await asyncio.sleep(0.01)
        depth[0] = 2
        sent = publisher.sent
        while publisher.sent <= sent:  # the interval that sampled it is sent (or, on a slow loop, a later one)
            await asyncio.sleep(0.05)
    finally:
        await publisher.stop()
    (point,) = published(cloudwatch_url, NAMESPACE)
    assert point["Maximum"] == 7.0 and point["Unit"] == "Count"
    metrics = boto3.client("cloudwatch", region_name="us-east-1", endpoint_url=cloudwatch_url).list_metrics(
        Namespace=NAMESPACE)["Metrics"]
    assert metrics == [{"Namespace": NAMESPACE, "MetricName": METRIC_NAME, "Dimensions": []}]


async def test_an_unreachable_cloudwatch_is_logged_and_tried_again(credentials):
    settings = CloudWatchSettings(namespace=NAMESPACE, region="us-east-1",
                                  endpoint_url=f"http://127.0.0.1:{free_port()}", interval_seconds=0.1,
                                  sample_seconds=0.1)
    asked = []
    with capture_logs() as logs:
        publisher = QueueDepthPublisher(settings, lambda: asked.append(1) or 3).start()
        try:
            while sum(1 for e in logs if e["event"] == "queue_metric_publish_failed") < 2:
                await asyncio.sleep(0.05)
        finally:
            await publisher.stop()
    failures = [e for e in logs if e["event"] == "queue_metric_publish_failed"]
    assert publisher.sent == 0 and failures[0]["log_level"] == "warning"
    assert "127.0.0.1" in failures[0]["error"]  # says where it could not send
    assert len(asked) >= 2  # the loop went on sampling after the failure


@pytest.mark.parametrize(("table", "words"), [
    ('namespace = "AWS/ECS"', ["cloudwatch.namespace", "AWS/"]),
    ('namespace = "Sluice prod"', ["cloudwatch.namespace"]),
    (f'namespace = "{"x" * 256}"', ["cloudwatch.namespace"]),
    ('namespace = "Sluice/x"\nendpoint_url = "ftp://moto"', ["cloudwatch.endpoint_url"]),
    ('namespace = "Sluice/x"\ninterval_seconds = 0', ["cloudwatch.interval_seconds", "> 0"]),
    ('namespace = "Sluice/x"\ninterval_seconds = 5\nsample_seconds = 10', ["cloudwatch.sample_seconds"]),
    ('namespace = "Sluice/x"\nperiod = 60', ["period"]),
    ("namespace = 7", ["cloudwatch.namespace", "str"]),
])
def test_a_bad_cloudwatch_table_is_one_line(monkeypatch, table, words):
    monkeypatch.setenv("SLUICE_CONFIG_TOML", f"[cloudwatch]\n{table}\n")
    with pytest.raises(SystemExit) as failure:
        load_settings()
    message = str(failure.value)
    assert message.startswith("sluice: ") and "\n" not in message and all(w in message for w in words), message


async def test_the_gateway_publishes_once_configured(gateway_settings, cloudwatch_url, credentials):
    gateway_settings.cloudwatch = CloudWatchSettings(namespace="Sluice/app-test", region="us-east-1",
                                                     endpoint_url=cloudwatch_url, interval_seconds=0.2,
                                                     sample_seconds=0.1)
    async with app_client(gateway_settings) as client:
        assert (await client.get("/health")).status_code == 200
        while not published(cloudwatch_url, "Sluice/app-test"):
            await asyncio.sleep(0.1)
    assert published(cloudwatch_url, "Sluice/app-test")[0]["Maximum"] == 0.0  # nobody waited


async def test_off_unless_a_namespace_is_set(gateway_settings, monkeypatch):
    # no region anywhere: a publisher could not even be built, yet the gateway starts and serves
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    gateway_settings.cloudwatch = CloudWatchSettings(endpoint_url="http://127.0.0.1:9")
    async with app_client(gateway_settings) as client:
        assert (await client.get("/health")).status_code == 200
    gateway_settings.cloudwatch = CloudWatchSettings(namespace="Sluice/x")
    app = create_app(gateway_settings, supervise=False)
    with pytest.raises(ExceptionGroup):  # the lifespan's StartupError, through the test client's task group
        async with AsyncTestClient(app=app):
            pass
    failure = app.state[STATE_FAILURE]
    assert failure.startswith("cannot publish to CloudWatch") and "cloudwatch.region" in failure, failure


async def test_a_failing_sample_is_logged_and_the_next_interval_publishes(cloudwatch_url, credentials):
    settings = CloudWatchSettings(namespace="Sluice/after-a-failure", region="us-east-1", endpoint_url=cloudwatch_url,
                                  interval_seconds=0.2, sample_seconds=0.1)
    calls = []

    def depth() -> int:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the endpoints could not be read")
        return 4

    with capture_logs() as logs:
        publisher = QueueDepthPublisher(settings, depth).start()
        try:
            while publisher.sent < 1:
                await asyncio.sleep(0.05)
        finally:
            await publisher.stop()
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["queue_metric_interval_failed"]
    assert published(cloudwatch_url, "Sluice/after-a-failure")[0]["Maximum"] == 4.0
