"""The edge's per-client body shares (gateway/edge/client_shares.py) for a streamed body: `set_held` moves what
the body holds up and down without changing which of the client's bodies is newest, and the shares still refuse a
client over its share, whatever mix of whole and streamed bodies it holds."""

from __future__ import annotations

from gateway.edge.client_shares import ClientShares


class Body:
    def __init__(self) -> None:
        self.body_held = 0


def test_a_streamed_body_holds_only_what_waits_and_keeps_its_place():
    shares = ClientShares(0, body_bytes=1000, body_bytes_per_client=100)
    streamed, whole = Body(), Body()
    shares.set_held(streamed, "a", 60)
    shares.hold(whole, "a", 30)
    assert shares.over_share("a") is None and shares.body_total == 90
    shares.set_held(streamed, "a", 10)  # the app read what waited
    assert shares.body_total == 40 and streamed.body_held == 10
    shares.set_held(streamed, "a", 80)  # 80 + 30 over 100: the newest body (the whole one) goes first
    assert shares.over_share("a") is whole
    shares.release(whole, "a")
    assert shares.over_share("a") is None
    shares.set_held(streamed, "a", 101)
    assert shares.over_share("a") is streamed
    shares.release(streamed, "a")
    assert shares.body_total == 0 and shares.largest_holder() is None
