"""Gateway-wide scaling settings (the `[scaling]` table of the config): windows, thresholds, backoffs."""

from __future__ import annotations

from typing import Annotated

import msgspec

DAY = 86_400.0
SCALE_IN_CALLS = 2  # ECS calls a scale-in takes together: UpdateService(desiredCount) + StopTask (provisioners/ecs.py)
Positive = Annotated[float, msgspec.Meta(gt=0, le=DAY)]  # a finite time or rate: `inf` (TOML) would never fire


class ScalingSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    stable_window_seconds: Positive = 60.0  # demand averaged over this long decides scaling down (and slow up)
    panic_window_seconds: Positive = 6.0  # demand averaged over this long decides scaling up at once
    # panic when demand passes this x capacity
    panic_threshold: Annotated[float, msgspec.Meta(ge=1, le=1000)] = 2.0
    # queued requests released per replica: target x this
    burst_factor: Annotated[float, msgspec.Meta(ge=1, le=1000)] = 2.0
    tick_seconds: Positive = 0.25  # how often each endpoint samples its demand and reconciles
    # replicas exiting during start in a row -> failed
    start_failures: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 3
    start_timeout_seconds: Positive = 600.0  # a replica not ready by then counts as a failed start
    # the same for an ECS replica: host launch + image pull + weights (ECS_MAX_WAIT_S in spec.py) with margin
    ecs_start_timeout_seconds: Positive = 1800.0
    ejection_seconds: Positive = 5.0  # a replica that failed a request sits out this long (doubling, max 60 s)
    health_interval_seconds: Positive = 0.5  # /load polling of ready replicas (starting ones: every tick)
    standby_worker: bool = True  # keep one local worker imported and waiting while some endpoint can scale
    # a fleet of gateways (gateway/endpoints/README.md, "A fleet of gateways"); ECS endpoints only
    fleet_sync_seconds: Positive = 0.25  # how often a gateway publishes its demand and reads the fleet's
    lease_seconds: Positive = 5.0  # an endpoint's scaling owner that stops renewing is replaced after this
    # the whole fleet's ECS API calls (shared through Redis); a scale-in takes UpdateService + StopTask in one
    # second's window (ecs.py), so fewer than 2 could never scale in
    ecs_api_calls_per_second: Annotated[float, msgspec.Meta(ge=SCALE_IN_CALLS, le=DAY)] = 2.0
    # how often a gateway checks the fleet's endpoint config version, besides the change messages (a lost one)
    fleet_config_check_seconds: Annotated[float, msgspec.Meta(ge=0.05, le=3600)] = 5.0

    def __post_init__(self) -> None:
        if self.fleet_sync_seconds * 2 > self.lease_seconds:
            raise ValueError(f"`lease_seconds` ({self.lease_seconds}) must be at least twice "
                             f"`fleet_sync_seconds` ({self.fleet_sync_seconds}): the owner renews at each sync")
        if self.panic_window_seconds > self.stable_window_seconds:
            raise ValueError(f"`panic_window_seconds` ({self.panic_window_seconds}) must not exceed "
                             f"`stable_window_seconds` ({self.stable_window_seconds})")
