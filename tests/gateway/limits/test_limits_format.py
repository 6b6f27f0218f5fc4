"""Header spelling, the reservation rule, and the in-process limiter's memory hygiene."""

from __future__ import annotations

import pytest

from gateway.limits import LimitScope, open_limiter, reservation_tokens
from gateway.limits.headers import go_duration


@pytest.mark.parametrize(("us", "text"), [
    (0, "0s"), (1, "1ms"), (20_000, "20ms"), (999_000, "999ms"), (1_000_000, "1s"), (1_500_000, "1.5s"),
    (59_998_000, "59.998s"), (60_000_000, "1m0s"), (360_000_000, "6m0s"), (90_250_000, "1m30.25s"),
    (3_600_000_000, "1h0m0s"), (-5, "0s"),
])
def test_go_duration_matches_openai_spelling(us, text):
    assert go_duration(us) == text


def test_reservation_rule():
    assert reservation_tokens(100, 50) == 150
    assert reservation_tokens(100, 50, n=3) == 250  # the prompt is shared, each choice decodes
    assert reservation_tokens(100, 50, n=2, best_of=5) == 350  # every best_of candidate decodes
    assert reservation_tokens(100, 50, n=2, num_beams=4) == 300  # beams decode whatever n returns


def test_idle_scopes_are_forgotten(clock):
    lim = open_limiter(None, clock=clock)
    for i in range(5000):
        ticket = lim.admit_now([LimitScope(f"key:{i}", rpm=10, max_concurrency=2)], 1)
        lim.settle_now(ticket, 1)
    clock.advance(61)
    for _ in range(5000):
        lim.admit_now([LimitScope("key:hot", rpm=10**9)], 1)
    assert len(lim._states) < 5000  # the sweep dropped scopes with nothing in their window


def test_a_length_past_the_known_context_reserves_nothing():
    """The worker refuses it before any token (400, too long), so the limiter must not answer never_fits first;
    on a model no worker has described, the context is a default and nothing is taken as refused."""
    from common.protocol import GenerateRequest, PromptOverhead, SamplingParams
    from gateway.limits.tokens import request_reservation

    request = GenerateRequest(request_id="r", model="m", prompt="x", params=SamplingParams(max_tokens=10**7))
    assert request_reservation(request, 2048, PromptOverhead()) == 0
    assert request_reservation(request, 2048, PromptOverhead(), context_known=False) >= 10**7
    fits = GenerateRequest(request_id="r", model="m", prompt="x", params=SamplingParams(max_tokens=100, n=2))
    assert request_reservation(fits, 2048, PromptOverhead()) >= 200
