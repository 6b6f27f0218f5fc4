"""What each client holds of one gateway process's HTTP edge, against its share (gateway/edge/http_limits.py).

A client is `auth.forwarded.client_group` of its address: the TCP peer, or, from a trusted proxy (an ALB: one
address carries every client), the client its `X-Forwarded-For` names; an IPv6 client is its /64.
- **Slots**: a direct peer's open connections, a proxied client's requests in progress; at most
  `max_connections_per_client` of them together.
- **Body bytes**: bytes of request bodies that have started and not ended (a stalled body holds them until
  `body_timeout_s`), per client at most `max_buffered_body_bytes_per_client`, in all at most
  `max_buffered_body_bytes`. Past the per-client share the client's newest body is cut (whichever connection's
  bytes arrived last, the body the client began first goes on); past the total,
  the connection holding the most of the client holding the most is cut (the others' bodies go on), so a client
  spreading stalled bodies over many addresses evicts itself before anyone who sends at the pace of the network.
  A streamed body (a route that reads its body as it comes: file uploads) holds only what waits for the app to
  read it, which uvicorn keeps to about 64 KiB by pausing the connection.
"""

from __future__ import annotations

from typing import Protocol


class Holder(Protocol):
    body_held: int


class ClientShares:
    def __init__(self, slots: int, body_bytes: int, body_bytes_per_client: int) -> None:
        self.slot_cap = slots  # 0: none
        self.body_cap = body_bytes
        self.body_cap_per_client = body_bytes_per_client
        self.slots: dict[str, int] = {}
        self.body_total = 0
        self._body_of: dict[str, int] = {}
        self._holders: dict[str, dict[Holder, None]] = {}  # per client, in the order their bodies began

    # --- slots ---
    def take_slot(self, client: str) -> bool:
        """One more slot for `client`; False (nothing taken) when it holds its share already."""
        if not self.slot_cap:
            return True
        count = self.slots.get(client, 0)
        if count >= self.slot_cap:
            return False
        self.slots[client] = count + 1
        return True

    def give_slot(self, client: str) -> None:
        if not self.slot_cap:
            return
        left = self.slots.get(client, 0) - 1
        if left > 0:
            self.slots[client] = left
        else:
            self.slots.pop(client, None)

    # --- body bytes ---
    def hold(self, holder: Holder, client: str, size: int) -> None:
        """Count `size` more bytes of `holder`'s unfinished body for `client`."""
        holder.body_held += size
        self.body_total += size
        self._body_of[client] = self._body_of.get(client, 0) + size
        self._holders.setdefault(client, {})[holder] = None

    def set_held(self, holder: Holder, client: str, size: int) -> None:
        """`holder`'s body holds `size` bytes now (a streamed body: what waits for the app), keeping its place."""
        change = size - holder.body_held
        holder.body_held = size
        self.body_total += change
        self._body_of[client] = self._body_of.get(client, 0) + change
        self._holders.setdefault(client, {}).setdefault(holder, None)

    def over_share(self, client: str) -> Holder | None:
        """While `client` holds more than its share: its newest body, for the caller to cut (which releases it)."""
        if self._body_of.get(client, 0) <= self.body_cap_per_client:
            return None
        holders = self._holders.get(client)
        return next(reversed(holders)) if holders else None

    def release(self, holder: Holder, client: str) -> None:
        """`holder`'s body ended, was cut, or its connection closed: its bytes are no longer held."""
        size, holder.body_held = holder.body_held, 0
        if not size:
            return
        self.body_total -= size
        left = self._body_of.get(client, 0) - size
        holders = self._holders.get(client)
        if holders is not None:
            holders.pop(holder, None)
        if left > 0:
            self._body_of[client] = left
        else:
            self._body_of.pop(client, None)
            self._holders.pop(client, None)

    def over_total(self) -> bool:
        return self.body_total > self.body_cap

    def largest_holder(self) -> Holder | None:
        """The connection holding the most body bytes of the client holding the most."""
        if not self._body_of:
            return None
        client = max(self._body_of, key=self._body_of.__getitem__)
        holders = self._holders.get(client)
        return max(holders, key=lambda h: h.body_held) if holders else None
