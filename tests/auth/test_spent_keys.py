"""A key that spent its rejection budget (`auth.throttle.SpentKeys`, held by the gateway's
gateway/serving/rejections.py) is refused at authentication until its window frees, and only once its secret
matched; the end-to-end proof (its body unread) is tests/security/test_rejection_budget.py."""

from __future__ import annotations

import pytest

from auth import AuthError
from auth.throttle import SpentKeys


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_held_key_waits_out_its_window_and_a_later_hold_never_shortens_it():
    clock = Clock()
    spent = SpentKeys(clock)
    assert spent.wait("k") is None
    spent.hold("k", 30.0)
    assert spent.wait("k") == 30.0 and spent.wait("other") is None
    spent.hold("k", 5.0)  # a shorter wait from another refusal keeps the longer one
    clock.now += 20
    assert spent.wait("k") == pytest.approx(10.0)
    clock.now += 10
    assert spent.wait("k") is None


def test_the_held_keys_are_swept_as_they_grow():
    clock = Clock()
    spent = SpentKeys(clock)
    for index in range(5000):
        spent.hold(f"key-{index}", 1.0)
        clock.now += 0.01  # each hold outlives the next 99 only
    assert len(spent._until) < 1200  # bounded by the keys held at once, not by every key ever held


async def test_a_spent_key_is_refused_with_its_wait_and_a_wrong_secret_learns_nothing(service, boot):
    clock = Clock()
    service.spent_keys = SpentKeys(clock)
    key = f"Bearer {boot.first_key}"
    principal = await service.authenticate(key, None, "10.0.0.1")
    service.spent_keys.hold(principal.key_id, 12.0)
    with pytest.raises(AuthError) as refused:
        await service.authenticate(key, None, "10.0.0.2")
    assert refused.value.status == 429 and refused.value.retry_after == 12.0
    assert "rejected requests" in refused.value.message
    forged = key[:-4] + ("aaaa" if not key.endswith("aaaa") else "bbbb")  # the same key id, a wrong secret
    with pytest.raises(AuthError) as unknown:
        await service.authenticate(forged, None, "10.0.0.3")
    assert unknown.value.status == 401
    clock.now += 12
    assert (await service.authenticate(key, None, "10.0.0.1")).key_id == principal.key_id
