"""Property tests of the algorithm against a brute-force reference, on both backends, with a manual clock.

The reference is the documented semantics: a sliding 60 s log where an admission at t counts against
every window containing t, for [t, t + 60 s); a request is admitted iff every limit still has room.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.limits import LimitExceeded, LimitScope, open_limiter

from .manual_clock import START, ManualClock

W = 60_000_000
gaps = st.one_of(st.just(0), st.integers(1, 2_000_000), st.integers(1, 40_000_000))
BACKENDS = ["memory", "redis"]


def examples(backend: str):
    return settings(max_examples=250 if backend == "memory" else 25, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def run(backend_url: str | None, scenario) -> None:
    """Each example gets a fresh limiter (fresh keys on Redis) and its own event loop."""
    async def main():
        clock = ManualClock(START)
        lim = open_limiter(backend_url, clock=clock, key_prefix=f"p:{uuid.uuid4().hex}")
        try:
            await scenario(lim, clock)
        finally:
            await lim.close()

    asyncio.run(main())


def url_for(backend: str, request) -> str | None:
    return request.getfixturevalue("redis").url if backend == "redis" else None


def rpm_scenario(rpm: int, arrivals: list[int]):
    async def scenario(lim, clock):
        admitted: list[int] = []
        for gap in arrivals:
            clock.advance_us(gap)
            now = clock.us
            window = [t for t in admitted if t > now - W]
            try:
                await lim.admit([LimitScope("k", rpm=rpm)], 0)
            except LimitExceeded as err:
                assert len(window) >= rpm, "refused although the window had room"
                # exact: the admission that must leave the window for one more to fit
                assert round(err.retry_after * 1_000_000) == window[len(window) - rpm] + W - now
            else:
                assert len(window) < rpm, "admitted past the limit"
                admitted.append(now)
        for t in admitted:  # any 60 s window holds at most rpm admissions
            assert sum(1 for u in admitted if t <= u < t + W) <= rpm
    return scenario


@pytest.mark.parametrize("backend", BACKENDS)
def test_rpm_matches_sliding_window(backend, request):
    url = url_for(backend, request)

    @examples(backend)
    @given(st.integers(1, 6), st.lists(gaps, max_size=40))
    def check(rpm, arrivals):
        run(url, rpm_scenario(rpm, arrivals))

    check()


def tpm_scenario(tpm: int, steps: list[tuple[int, int, float, int]]):
    """steps: (gap µs, tokens reserved, fraction used, steps until settle)."""
    async def scenario(lim, clock):
        charged: dict[int, list[int]] = {}  # step -> [admission µs, tokens charged]
        pending: dict[int, list[tuple[object, int, int]]] = {}  # settle step -> [(ticket, used, its step)]
        for i, (gap, reserve, fraction, delay) in enumerate(steps):
            clock.advance_us(gap)
            now = clock.us
            for due in [k for k in pending if k <= i]:
                for ticket, used, step in pending.pop(due):
                    await lim.settle(ticket, used)
                    charged[step][1] = used
            live = sorted(v for v in charged.values() if v[0] > now - W)
            in_window = sum(v[1] for v in live)
            try:
                ticket = await lim.admit([LimitScope("k", tpm=tpm)], reserve)
            except LimitExceeded as err:
                assert err.kind == "rate_limit" and in_window + reserve > tpm
                need, freed = in_window + reserve - tpm, 0
                for t, amount in live:
                    freed += amount
                    if freed >= need:
                        assert round(err.retry_after * 1_000_000) == t + W - now
                        break
            else:
                assert in_window + reserve <= tpm, "admitted past the token limit"
                assert ticket.headers()["x-ratelimit-remaining-tokens"] == str(tpm - in_window - reserve)
                charged[i] = [now, reserve]
                pending.setdefault(i + delay, []).append((ticket, int(reserve * fraction), i))
        # refunds never create capacity: every window's final charge stays within the limit
        times = [v[0] for v in charged.values()]
        for t in times:
            assert sum(v[1] for v in charged.values() if t <= v[0] < t + W) <= tpm
    return scenario


@pytest.mark.parametrize("backend", BACKENDS)
def test_tpm_with_refunds_matches_reference(backend, request):
    url = url_for(backend, request)
    step = st.tuples(gaps, st.integers(0, 400), st.sampled_from([0.0, 0.3, 1.0]), st.integers(0, 4))

    @examples(backend)
    @given(st.integers(1, 1000), st.lists(step, max_size=40))
    def check(tpm, steps):
        run(url, tpm_scenario(tpm, [(g, min(r, tpm), f, d) for g, r, f, d in steps]))

    check()


def retry_scenario(limits: list[tuple[int | None, int | None]], history: list[tuple[int, int]], tokens: int):
    async def scenario(lim, clock):
        scopes = [LimitScope(f"s{i}", rpm=r, tpm=t) for i, (r, t) in enumerate(limits)]
        for gap, reserve in history:
            clock.advance_us(gap)
            try:
                await lim.admit(scopes, reserve)
            except LimitExceeded:
                pass
        try:
            await lim.admit(scopes, tokens)
            return
        except LimitExceeded as err:
            if err.kind == "never_fits":
                return
            wait = round(err.retry_after * 1_000_000)
            assert err.headers["retry-after"] == str(-(-wait // 1_000_000))
        # nothing else happens meanwhile: refused 1 µs early, admitted exactly at now + retry_after
        clock.advance_us(wait - 1)
        with pytest.raises(LimitExceeded):
            await lim.admit(scopes, tokens)
        clock.advance_us(1)
        await lim.admit(scopes, tokens)
    return scenario


@pytest.mark.parametrize("backend", BACKENDS)
def test_retry_after_is_exact(backend, request):
    url = url_for(backend, request)
    limit = st.tuples(st.one_of(st.none(), st.integers(1, 5)), st.one_of(st.none(), st.integers(1, 500)))

    @examples(backend)
    @given(st.lists(limit, min_size=1, max_size=3), st.lists(st.tuples(gaps, st.integers(0, 300)), max_size=25),
           st.integers(0, 300))
    def check(limits, history, tokens):
        run(url, retry_scenario(limits, history, tokens))

    check()


def concurrency_scenario(cap: int, ops: list[int]):
    """ops: 0 = admit, k > 0 = settle the k-th oldest in-flight ticket (if any)."""
    async def scenario(lim, clock):
        inflight: list = []
        for op in ops:
            clock.advance_us(1000)
            if op == 0:
                try:
                    inflight.append(await lim.admit([LimitScope("k", max_concurrency=cap)], 1))
                except LimitExceeded as err:
                    assert err.kind == "concurrency" and len(inflight) == cap
                else:
                    assert len(inflight) <= cap
            elif inflight:
                await lim.settle(inflight.pop((op - 1) % len(inflight)), 1)
    return scenario


@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrency_never_exceeds_cap(backend, request):
    url = url_for(backend, request)

    @examples(backend)
    @given(st.integers(1, 4), st.lists(st.integers(0, 3), max_size=50))
    def check(cap, ops):
        run(url, concurrency_scenario(cap, ops))

    check()
