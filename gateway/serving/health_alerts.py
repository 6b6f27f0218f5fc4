"""Alerts on a team's request health (auth/models.py HealthAlerts, set by its owners): the share of requests that
failed and the 95th percentile of latency over a sliding window, fed by every request's settlement
(gateway/serving/accounting.py), in this process.

Each measure of each team is armed until it crosses above its threshold (with at least `min_requests` in the
window): then one alert goes out, through the budget alerts' sender (same webhook signing, SMTP, retries and
outbound rule: gateway/serving/budget_alerts.py), and the measure stays quiet until it falls back below, which
arms it again. Each gateway of a fleet watches the requests it settles (its own window of them), so each may
alert on its own crossing. Memory is bounded: at most MAX_SAMPLES per team; teams without alerts keep nothing."""

from __future__ import annotations

import time
from collections import deque
from datetime import UTC, datetime

import msgspec
import structlog

from auth.models import HealthAlerts
from gateway.lifecycle import Background
from gateway.serving.budget_alerts import AlertSender

log = structlog.get_logger("gateway.health_alerts")
MAX_SAMPLES = 10_000  # per team: the newest requests of its window, enough for a rate and a 95th percentile
MEASURES = ("error_rate", "latency_p95")


class HealthAlert(msgspec.Struct, frozen=True):
    """What a webhook receives (JSON) and an e-mail says."""

    scope: str  # "team:<id>"
    measure: str  # "error_rate" (percent) or "latency_p95" (ms)
    threshold: float
    value: float
    window_s: int
    requests: int  # in the window
    at: str  # ISO 8601 UTC
    kind: str = "health"

    @property
    def subject(self) -> str:
        what = "error rate" if self.measure == "error_rate" else "p95 latency"
        unit = "%" if self.measure == "error_rate" else " ms"
        return f"Sluice alert: {self.scope} {what} {self.value:g}{unit} is above {self.threshold:g}{unit}"

    def text(self) -> str:
        return (f"{self.subject}, over the last {self.window_s} s ({self.requests} requests), at {self.at}. "
                "No new alert is sent until it falls back below the threshold.\n")


def _p95(latencies: list[float]) -> float:
    ranked = sorted(latencies)
    return ranked[min(len(ranked) - 1, int(0.95 * len(ranked)))]


class HealthWatch:
    def __init__(self, sender: AlertSender | None) -> None:
        self._sender = sender
        self._samples: dict[str, deque[tuple[float, bool, float]]] = {}  # team -> (time, failed, latency ms)
        self._fired: set[tuple[str, str]] = set()  # (team, measure) above its threshold, already alerted
        self._tasks = Background("health alerts")

    def observe(self, team_id: str, alerts: HealthAlerts | None, status: str, latency_ms: float,
                now: float | None = None) -> None:
        """One settled request of `team_id` (`alerts`: the team's, None: it has none, nothing is kept)."""
        if alerts is None or self._sender is None:
            self._samples.pop(team_id, None)
            return
        now = time.time() if now is None else now
        samples = self._samples.setdefault(team_id, deque(maxlen=MAX_SAMPLES))
        samples.append((now, status == "error", latency_ms))
        while samples and samples[0][0] < now - alerts.window_s:
            samples.popleft()
        values = self._values(samples, alerts)
        for measure, threshold in (("error_rate", alerts.error_rate_percent), ("latency_p95", alerts.latency_p95_ms)):
            value = values.get(measure)
            if threshold is None or value is None:
                continue
            key = (team_id, measure)
            if value <= threshold:
                self._fired.discard(key)  # armed again
            elif key not in self._fired:
                self._fired.add(key)
                self._start(self._alert(team_id, alerts, measure, threshold, value, len(samples), now))

    @staticmethod
    def _values(samples: deque, alerts: HealthAlerts) -> dict[str, float]:
        if len(samples) < alerts.min_requests:
            return {}
        failed = sum(1 for _, f, _ in samples if f)
        answered = [latency for _, f, latency in samples if not f]
        values = {"error_rate": round(100 * failed / len(samples), 2)}
        if answered:
            values["latency_p95"] = round(_p95(answered), 1)
        return values

    def _start(self, job) -> None:
        self._tasks.spawn(job)

    async def _alert(self, team_id: str, alerts: HealthAlerts, measure: str, threshold: float, value: float,
                     requests: int, now: float) -> None:
        scope = f"team:{team_id}"
        log.info("health_alert", scope=scope, measure=measure, value=value, threshold=threshold)
        alert = HealthAlert(scope, measure, threshold, value, alerts.window_s, requests,
                            datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        if self._sender is not None:  # the sender reads only `subject`, `text()` and the JSON of an alert
            await self._sender.send(alert, alerts.webhook_url, list(alerts.emails))  # type: ignore[arg-type]

    async def close(self) -> None:
        """Let the alerts under way finish (the sender's own timeouts and attempts bound them: `longest_s`)."""
        if self._sender is not None:
            await self._tasks.stop(self._sender.longest_s, cancel=False)
