"""Every name an alarm, a log metric filter or the metrics collector in Terraform reads is a name the code emits
(issue #50): a renamed log event, metric or field would leave its alarm at "no data" (treated as not breaching)
on AWS, silently; here it fails. The names are read from the modules' files and from the code itself (the log
calls' event names by AST, the Prometheus series from the gateway's registry). The slow `test_local_apply.py`
also checks the queue alarm end to end against a moto CloudWatch."""

from __future__ import annotations

import ast
import re

from gateway.endpoints.queue_metric import METRIC_NAME
from gateway.metrics import REGISTRY
from tests.infra.terraform import REPO

MODULES = REPO / "infra" / "terraform" / "modules"
OBSERVABILITY = MODULES / "observability"
LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical"}


def _logged_events() -> set[str]:
    """The event names of every structlog call in the gateway and billing code (`log.<level>("name", ...)`)."""
    events = set()
    for folder in ("gateway", "billing"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in LOG_METHODS and node.args and isinstance(node.args[0], ast.Constant)
                        and isinstance(node.args[0].value, str)):
                    events.add(node.args[0].value)
    return events


def test_every_gateway_event_an_alarm_counts_is_logged_under_that_name():
    text = (OBSERVABILITY / "gateway_events.tf").read_text()
    counted = set(re.findall(r'\$\.event = \\"([a-z_]+)\\"', text))
    assert {"limiter_backend_down", "limiter_backend_still_down", "endpoint_failed", "ecs_throttled"} <= counted
    assert counted <= _logged_events(), counted - _logged_events()
    # each filter's metric is the one its alarm and the dashboard read (same local, same namespace)
    metrics = re.findall(r'metric\s+=\s+"(\w+)"', text)
    assert len(metrics) == len(set(metrics)) == text.count("pattern   =")


def test_the_unintended_5xx_filter_reads_the_fields_of_the_access_log():
    pattern = re.search(r'pattern\s+=\s+"(\{ \(\$\.http_status.*?\})"', (OBSERVABILITY / "main.tf").read_text())
    assert pattern, "the unintended 5xx filter"
    fields = set(re.findall(r"\$\.(\w+)", pattern.group(1)))
    assert fields == {"http_status", "status"}
    source = ast.parse((REPO / "gateway" / "edge" / "access_log.py").read_text())
    logged = {(node.args[0].value, keyword.arg) for node in ast.walk(source)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "info"
              and node.args and isinstance(node.args[0], ast.Constant) for keyword in node.keywords}
    # generation requests log `http_status` on `request_done`, every other request `status` on `http_request`
    assert ("request_done", "http_status") in logged and ("http_request", "status") in logged, logged


def test_the_usage_export_line_the_alarm_waits_for_is_what_the_export_prints():
    text = (OBSERVABILITY / "gateway_events.tf").read_text()
    done = r'resource "aws_cloudwatch_log_metric_filter" "usage_export_done".*?pattern\s+=\s+"\\"(.+?)\\""'
    (pattern,) = re.findall(done, text, re.S)
    assert pattern in (REPO / "billing" / "cli.py").read_text()
    # the export task writes to the gateway's log group, where the filter looks
    export = (MODULES / "gateway" / "usage_export.tf").read_text()
    assert "awslogs-group         = var.log_group_name" in export


def test_the_queue_alarm_reads_the_metric_the_gateway_publishes_in_the_namespace_it_is_given():
    main = (OBSERVABILITY / "main.tf").read_text()
    alarm = re.search(r'resource "aws_cloudwatch_metric_alarm" "activator_queue" \{(.*?)\n\}', main, re.S).group(1)
    assert f'metric_name         = "{METRIC_NAME}"' in alarm
    assert 'namespace           = "Sluice/${var.name}"' in alarm and "dimensions" not in alarm  # the gateway sends none
    outputs = (OBSERVABILITY / "outputs.tf").read_text()
    # the namespace the gateways are configured with is the alarm's own (an output of it, not a second spelling)
    assert "value       = aws_cloudwatch_metric_alarm.activator_queue.namespace" in outputs
    platform = (MODULES / "platform" / "main.tf").read_text()
    assert "metric_namespace  = module.observability.activator_queue_metric_namespace" in platform
    assert "[cloudwatch]\nnamespace = ${jsonencode(metric_namespace)}" in (
        MODULES / "platform" / "gateway.toml.tftpl").read_text()


def test_the_collector_keeps_series_the_gateway_serves_and_their_model_label():
    collector = (MODULES / "gateway" / "metrics_collector.tf").read_text()
    selectors = re.findall(r'"(\^sluice_[a-z_]+\$?)"', collector)
    assert len(selectors) == 5, selectors
    assert 'dimensions            = [["model"]]' in collector
    # the names the Prometheus receiver sees: counters keep `_total` (ADOT leaves NormalizeName off)
    families = {metric.name + ("_total" if metric.type == "counter" else ""): metric for metric in REGISTRY.collect()}
    labels = {name: collector_labels(name) for name in families}
    for selector in selectors:
        matched = [name for name in families if re.match(selector, name)]
        assert matched, f"{selector} matches no series of /metrics"
        for name in matched:  # awsemf drops a metric that lacks a declared dimension
            assert "model" in labels[name], (name, labels[name])


def collector_labels(name: str) -> tuple[str, ...]:
    """The label names of the series `name` (a family's name as the receiver sees it)."""
    base = name.removesuffix("_total")
    for collector, names in REGISTRY._collector_to_names.items():
        if base in names or name in names:
            return tuple(getattr(collector, "_labelnames", ()))
    return ()
