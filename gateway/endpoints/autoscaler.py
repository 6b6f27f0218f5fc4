"""How many replicas an endpoint should have: concurrency-based, after Knative's KPA.

Demand is the number of requests in flight on the endpoint's replicas plus those waiting in its
activator queue, sampled every tick. The stable window's average decides the steady count,
ceil(average / target_concurrency). When the panic window's average passes `panic_threshold` x the
ready replicas' capacity (any demand at all with no ready replica counts), the endpoint panics for a
stable window: it scales up at once to what the panic window and the present demand need and never
scales down meanwhile. Out of panic it scales down only as far as the stable window and the present
demand both allow. It scales to zero (when `min_replicas` is 0) only once nothing has been in flight
or waiting for `idle_seconds`; that rule, the user's own knob, stands in for the stable window's.

Everything takes `now` as an argument: the logic is pure and runs on any clock.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from gateway.endpoints.scaling import ScalingSettings


@dataclass(frozen=True)
class Bounds:
    """The endpoint's own scaling fields (a PATCH replaces them between two decisions)."""

    min_replicas: int
    max_replicas: int
    target_concurrency: float
    idle_seconds: float


@dataclass(frozen=True)
class Decision:
    desired: int  # replicas the endpoint should have, within [min_replicas, max_replicas]
    panicking: bool
    stable_average: float
    panic_average: float


@dataclass(frozen=True)
class Plan:
    start: int  # replicas to add
    remove: int  # ready replicas to drain and stop


def plan(desired: int, ready: int, starting: int) -> Plan:
    """Turn a decision into actions. Only ready replicas are ever removed, and none while another is
    still starting: the start was wanted moments ago, and removing a ready replica would leave a gap."""
    current = ready + starting
    if desired > current:
        return Plan(start=desired - current, remove=0)
    if desired < current and starting == 0:
        return Plan(start=0, remove=current - desired)
    return Plan(start=0, remove=0)


class Autoscaler:
    def __init__(self, settings: ScalingSettings, now: float):
        self.settings = settings
        self._samples: deque[tuple[float, float]] = deque()  # (time, demand), oldest first
        self._panic_until = -math.inf
        self._last_busy = now  # a new endpoint counts as just used: it is not scaled away at once

    def record(self, now: float, demand: float) -> None:
        """One sample of in-flight + waiting requests (call every tick, and when a request arrives)."""
        self._samples.append((now, demand))
        if demand > 0:
            self._last_busy = now
        horizon = now - self.settings.stable_window_seconds
        while self._samples and self._samples[0][0] <= horizon:
            self._samples.popleft()

    def idle_for(self, now: float) -> float:
        return now - self._last_busy

    def decide(self, now: float, bounds: Bounds, ready: int, starting: int) -> Decision:
        target = bounds.target_concurrency
        demand = self._samples[-1][1] if self._samples else 0.0
        stable = self._average(now, self.settings.stable_window_seconds)
        panic = self._average(now, self.settings.panic_window_seconds)
        current = ready + starting
        needed_now = math.ceil(demand / target)
        if demand > 0 and panic >= self.settings.panic_threshold * ready * target:
            self._panic_until = now + self.settings.stable_window_seconds
        panicking = now < self._panic_until
        if panicking:
            desired = max(math.ceil(panic / target), needed_now, current)
        else:
            desired = math.ceil(stable / target)
            if desired < current:  # down: only as far as the present demand allows too
                desired = min(current, max(desired, needed_now))
        if desired == 0 and self.idle_for(now) < bounds.idle_seconds:
            desired = min(current, 1)  # keep the last replica until the endpoint has been idle long enough
        elif self.idle_for(now) >= bounds.idle_seconds and demand == 0:
            desired = 0
        desired = min(max(desired, bounds.min_replicas), bounds.max_replicas)
        return Decision(desired, panicking, stable, panic)

    def _average(self, now: float, window: float) -> float:
        start = now - window
        values = [demand for at, demand in self._samples if at > start]
        return sum(values) / len(values) if values else 0.0
