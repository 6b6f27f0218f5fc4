"""The autoscaler's decisions, on a clock the test moves: examples of each rule, then properties that
hold for any sequence of demand, replica counts and bounds."""

from __future__ import annotations

import math

from hypothesis import given, seed, settings
from hypothesis import strategies as st

from gateway.endpoints.autoscaler import Autoscaler, Bounds, plan
from gateway.endpoints.scaling import ScalingSettings

WINDOWS = ScalingSettings(stable_window_seconds=60, panic_window_seconds=6, panic_threshold=2.0)
ZERO_OK = Bounds(min_replicas=0, max_replicas=10, target_concurrency=4, idle_seconds=30)


def run(scaler: Autoscaler, bounds: Bounds, start: float, seconds: float, demand: float, ready: int,
        starting: int = 0, step: float = 1.0):
    """Sample `demand` every `step` seconds for `seconds`; the last decision."""
    t = start
    decision = None
    while t < start + seconds:
        scaler.record(t, demand)
        decision = scaler.decide(t, bounds, ready, starting)
        t += step
    return decision


def test_scale_from_zero_happens_on_the_first_sample():
    scaler = Autoscaler(WINDOWS, now=0)
    scaler.record(100, 20)  # 20 requests arrive at an endpoint scaled to zero
    decision = scaler.decide(100, ZERO_OK, ready=0, starting=0)
    assert decision.panicking
    assert decision.desired == 5  # ceil(20 / 4)


def test_one_request_at_zero_starts_one_replica():
    scaler = Autoscaler(WINDOWS, now=0)
    scaler.record(100, 1)
    assert scaler.decide(100, ZERO_OK, ready=0, starting=0).desired == 1


def test_steady_demand_settles_on_its_replica_count():
    scaler = Autoscaler(WINDOWS, now=0)
    assert run(scaler, ZERO_OK, 0, 120, demand=10, ready=3).desired == 3  # ceil(10 / 4)


def test_panic_scales_up_at_once_when_demand_doubles_capacity():
    scaler = Autoscaler(WINDOWS, now=0)
    run(scaler, ZERO_OK, 0, 120, demand=4, ready=1)
    decision = run(scaler, ZERO_OK, 120, 3, demand=40, ready=1)
    assert decision.panicking and decision.desired == 10


def test_below_the_panic_threshold_the_stable_window_scales_up_slowly():
    scaler = Autoscaler(WINDOWS, now=0)
    run(scaler, ZERO_OK, 0, 120, demand=4, ready=4)
    decision = run(scaler, ZERO_OK, 120, 3, demand=28, ready=4)  # 1.75 x the capacity of 16: no panic
    assert not decision.panicking and decision.desired == 4
    assert run(scaler, ZERO_OK, 123, 60, demand=28, ready=4).desired == 7


def test_no_scale_down_while_panicking_then_down_when_the_stable_window_agrees():
    scaler = Autoscaler(WINDOWS, now=0)
    run(scaler, ZERO_OK, 0, 2, demand=40, ready=0)
    decision = run(scaler, ZERO_OK, 2, 30, demand=4, ready=10)
    assert decision.panicking and decision.desired == 10
    late = run(scaler, ZERO_OK, 32, 120, demand=4, ready=10)
    assert not late.panicking and late.desired == 1


def test_scale_down_never_goes_below_what_the_present_demand_needs():
    scaler = Autoscaler(WINDOWS, now=0)
    run(scaler, ZERO_OK, 0, 120, demand=0.5, ready=4)  # a quiet minute: the stable window says 1
    scaler.record(120, 12)  # but 12 are in flight right now (not twice the capacity of 4 replicas)
    assert scaler.decide(120, ZERO_OK, ready=4, starting=0).desired == 3


def test_to_zero_only_after_idle_seconds_without_demand():
    scaler = Autoscaler(WINDOWS, now=0)
    run(scaler, ZERO_OK, 0, 10, demand=2, ready=1)
    assert run(scaler, ZERO_OK, 10, 29, demand=0, ready=1).desired == 1  # idle 28 s < 30 s
    assert run(scaler, ZERO_OK, 39, 3, demand=0, ready=1).desired == 0
    assert scaler.idle_for(41) >= 30


def test_a_new_endpoint_is_not_scaled_away_at_once():
    scaler = Autoscaler(WINDOWS, now=1000)
    scaler.record(1001, 0)
    assert scaler.decide(1001, ZERO_OK, ready=1, starting=0).desired == 1


def test_min_replicas_hold_without_demand_and_max_caps_a_burst():
    bounds = Bounds(min_replicas=2, max_replicas=3, target_concurrency=1, idle_seconds=0)
    scaler = Autoscaler(WINDOWS, now=0)
    assert run(scaler, bounds, 0, 200, demand=0, ready=2).desired == 2
    assert run(scaler, bounds, 200, 2, demand=100, ready=2).desired == 3


def test_a_patch_of_the_bounds_applies_to_the_next_decision():
    scaler = Autoscaler(WINDOWS, now=0)
    run(scaler, ZERO_OK, 0, 100, demand=8, ready=2)
    patched = Bounds(min_replicas=5, max_replicas=6, target_concurrency=4, idle_seconds=30)
    assert scaler.decide(100, patched, ready=2, starting=0).desired == 5


def test_the_plan_never_removes_a_starting_replica():
    assert plan(desired=1, ready=1, starting=2) == plan(desired=1, ready=1, starting=2)
    assert plan(desired=1, ready=1, starting=2).remove == 0
    assert plan(desired=1, ready=3, starting=0).remove == 2
    assert plan(desired=4, ready=1, starting=1).start == 2
    assert plan(desired=2, ready=1, starting=1) == plan(desired=2, ready=2, starting=0)


# ---- properties ----

bounds_strategy = st.builds(
    lambda low, extra, target, idle: Bounds(low, max(1, low + extra), target, idle),
    st.integers(0, 4), st.integers(0, 6), st.sampled_from([0.5, 1.0, 2.0, 4.0, 16.0]),
    st.sampled_from([0.0, 5.0, 30.0, 300.0]))
step_strategy = st.tuples(st.floats(0.05, 20), st.integers(0, 200), st.integers(0, 12), st.integers(0, 3))


@seed(18)
@settings(max_examples=300, deadline=None)
@given(bounds=bounds_strategy, steps=st.lists(step_strategy, min_size=1, max_size=60))
def test_properties_of_every_decision(bounds, steps):
    scaler = Autoscaler(WINDOWS, now=0)
    now = 0.0
    last_busy = 0.0
    for gap, demand, ready, starting in steps:
        now += gap
        scaler.record(now, demand)
        last_busy = now if demand else last_busy
        decision = scaler.decide(now, bounds, ready, starting)
        current = ready + starting
        needed = min(bounds.max_replicas, math.ceil(demand / bounds.target_concurrency))
        # always within the bounds
        assert bounds.min_replicas <= decision.desired <= bounds.max_replicas
        # never below what the present demand needs when scaling down
        if decision.desired < current:
            assert decision.desired >= needed
        # any demand at zero replicas starts at least one
        if demand and current == 0:
            assert decision.desired >= 1
        # zero only when allowed, idle long enough and nothing in flight or waiting
        if decision.desired == 0:
            assert bounds.min_replicas == 0 and demand == 0
            assert now - last_busy >= bounds.idle_seconds or current == 0
        # no scale-down while panicking, but for the idle rule
        idle = demand == 0 and now - last_busy >= bounds.idle_seconds
        if decision.panicking and not idle:
            assert decision.desired >= min(current, bounds.max_replicas)
        # the plan removes ready replicas only, and none while others start
        actions = plan(decision.desired, ready, starting)
        assert actions.remove <= ready and (actions.remove == 0 or starting == 0)
        assert not (actions.start and actions.remove)
