"""Alerts on a team's request health (auth/models.py HealthAlerts, set by its owners): the share of requests that
failed and the 95th percentile of latency over a sliding window, judged on the fleet's numbers: every gateway's
records of the team in the shared ledger (billing/insights/recent.py), not the share one gateway settles.

Each request a gateway settles and records (gateway/serving/accounting.py) asks for a judgement at its time: this
gateway ships its ledger (so its own records are in), reads the team's records of the window ending then, and
judges each measure above or not above its threshold (with at least `min_requests` in the window). The state of
each measure is the fleet's, in the shared database (`health_alert_states`): a judgement changes it only when it is
later than the one that set it, and only the gateway whose judgement fired it sends the alert, through the budget
alerts' sender (same webhook signing, SMTP, retries and outbound rule: gateway/serving/budget_alerts.py). So a
crossing alerts once fleet-wide; falling back below arms it again.

A team's judgements run one after another, in the order of the requests; under load those waiting are judged
together from one read (each on its own window): a batch costs one ship of this gateway's ledger (sooner than its
shipper's linger would) and one read of at most MAX_SAMPLES + MAX_PENDING records, for teams with alerts only.
Memory is bounded: at most MAX_PENDING waiting per team, at most MAX_SAMPLES records per window; teams without
alerts keep nothing."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from datetime import UTC, datetime

import msgspec
import structlog

from auth.models import HealthAlerts
from billing.insights.recent import recent_requests
from billing.ledger import Ledger
from gateway.lifecycle import Background
from gateway.serving.budget_alerts import AlertSender

log = structlog.get_logger("gateway.health_alerts")
MAX_SAMPLES = 10_000  # per window: the newest requests, enough for a rate and a 95th percentile
MAX_PENDING = 1_000  # judgements waiting per team; past it the newest replaces the last (it judges the later window)
FLUSH_TIMEOUT_S = 10.0  # for this gateway's records to reach the shared database before a judgement
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
    def __init__(self, sender: AlertSender | None, ledger: Ledger | None) -> None:
        self._sender, self._ledger = sender, ledger
        self._pending: dict[str, list[tuple[float, HealthAlerts]]] = {}  # team -> (request time, its alerts)
        self._judging: set[str] = set()  # teams with a judge task running
        self._tasks = Background("health alerts")

    def observe(self, team_id: str, alerts: HealthAlerts | None, at: float) -> None:
        """A request of `team_id` that arrived at `at` is settled and in this gateway's ledger (`alerts`: the team's;
        None: it has none, nothing is kept)."""
        if alerts is None or self._sender is None or self._ledger is None:
            return
        pending = self._pending.setdefault(team_id, [])
        if len(pending) < MAX_PENDING:
            pending.append((at, alerts))
        else:
            pending[-1] = (at, alerts)
        if team_id not in self._judging:
            self._judging.add(team_id)
            self._start(self._judge(team_id))

    async def _judge(self, team_id: str) -> None:
        try:
            while self._pending.get(team_id):
                batch = self._pending.pop(team_id)
                try:
                    await self._judge_batch(team_id, batch)
                except Exception as error:  # noqa: BLE001 - the database away: these judgements are lost, not the next
                    log.warning("health_alert_judgement_failed", team_id=team_id, error=repr(error))
        finally:
            self._judging.discard(team_id)

    async def _judge_batch(self, team_id: str, batch: list[tuple[float, HealthAlerts]]) -> None:
        assert self._ledger is not None  # observe keeps nothing without one
        batch.sort(key=lambda judged: judged[0])  # requests settle out of the order they arrived in
        await self._ledger.flush(FLUSH_TIMEOUT_S)  # this gateway's records up to these requests are in
        store = self._ledger.store
        longest = max(alerts.window_s for _, alerts in batch)
        rows = await recent_requests(store, team_id, batch[0][0] - longest, batch[-1][0],
                                     MAX_SAMPLES + MAX_PENDING)
        times = [t for t, _, _ in rows]
        scope = f"team:{team_id}"
        judged: dict[str, bool] = {}  # measure -> above, as last set by this batch
        for at, alerts in batch:
            window = rows[max(bisect_left(times, at - alerts.window_s), bisect_right(times, at) - MAX_SAMPLES):
                          bisect_right(times, at)]
            values = _values(window, alerts)
            for measure, threshold in (("error_rate", alerts.error_rate_percent),
                                       ("latency_p95", alerts.latency_p95_ms)):
                value = values.get(measure)
                if threshold is None or value is None:
                    continue
                above = value > threshold
                if judged.get(measure) == above:
                    continue
                judged[measure] = above
                if await store.set_health_state(scope, measure, above, at) and above:
                    self._start(self._alert(team_id, alerts, measure, threshold, value, len(window), at))

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
        """Let the judgements and alerts under way finish (the sender's own timeouts and attempts bound them:
        `longest_s`, and a judgement's ledger flush FLUSH_TIMEOUT_S)."""
        if self._sender is not None:
            await self._tasks.stop(FLUSH_TIMEOUT_S + self._sender.longest_s, cancel=False)


def _values(samples: list[tuple[float, bool, float]], alerts: HealthAlerts) -> dict[str, float]:
    if len(samples) < alerts.min_requests:
        return {}
    failed = sum(1 for _, f, _ in samples if f)
    answered = [latency for _, f, latency in samples if not f]
    values = {"error_rate": round(100 * failed / len(samples), 2)}
    if answered:
        values["latency_p95"] = round(_p95(answered), 1)
    return values
