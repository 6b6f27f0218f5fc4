"""In-process limiter (one gateway): sliding-window log per scope and lease-based concurrency slots (budgets are
the budget book's: budgets.py). Decisions are synchronous (no await between check and reserve), so they are
atomic on the event loop; a lock makes them safe from threads too."""

from __future__ import annotations

import itertools
import threading
from collections import deque

from gateway.limits.clock import Clock, MonotonicWall, to_us
from gateway.limits.headers import Usage
from gateway.limits.metrics import REJECTIONS
from gateway.limits.model import Ticket
from gateway.limits.scope import LimitScope
from gateway.limits.verdict import Failure, refuse_impossible, reject

WINDOW_US = 60_000_000


class _State:
    """One scope's usage. The log holds (time_us, seq) tuples of ints, which the garbage collector stops
    tracking, and ``amounts`` maps seq -> tokens charged; a seq missing from it has left the window, so a
    late refund does not touch the running sum."""

    __slots__ = ("log", "amounts", "sum", "slots", "inflight")

    def __init__(self) -> None:
        self.log: deque[tuple[int, int]] = deque()
        self.amounts: dict[int, int] = {}
        self.sum = 0
        # ticket seq -> (lease expiry µs, concurrency slots held), in expiry order (insertion order)
        self.slots: dict[int, tuple[int, int]] = {}
        self.inflight = 0  # the slots held: the sum of the second fields

    def trim(self, cut: int) -> None:
        log = self.log
        while log and log[0][0] <= cut:
            self.sum -= self.amounts.pop(log.popleft()[1])

    def reclaim(self, now: int) -> None:
        slots = self.slots
        while slots:
            first = next(iter(slots))
            if slots[first][0] > now:
                return
            self.inflight -= slots.pop(first)[1]

    def release(self, seq: int) -> None:
        held = self.slots.pop(seq, None)
        if held is not None:
            self.inflight -= held[1]

    def token_wait(self, need: int, now: int) -> int:
        """µs until the oldest entries freeing at least `need` tokens have left the window."""
        freed = 0
        amounts = self.amounts
        for t, seq in self.log:
            freed += amounts[seq]
            if freed >= need:
                return t + WINDOW_US - now
        return 0


class InProcessLimiter:
    degraded: str | None = None  # its limits always hold (Limiter.degraded)

    def __init__(self, clock: Clock | None = None, *, concurrency_lease: float = 900.0,
                 concurrency_retry: float = 1.0):
        self._clock = MonotonicWall(clock)
        self._lease_us = to_us(concurrency_lease)
        self._conc_retry_us = to_us(concurrency_retry)
        self._states: dict[str, _State] = {}
        self._seq = itertools.count(1)
        self._lock = threading.Lock()
        self._since_sweep = 0

    async def admit(self, scopes: list[LimitScope], tokens: int, sequences: int = 1) -> Ticket:
        return self.admit_now(scopes, tokens, sequences)

    async def settle(self, ticket: Ticket, used_tokens: int) -> None:
        self.settle_now(ticket, used_tokens)

    async def close(self) -> None:
        self._states.clear()

    def admit_now(self, scopes: list[LimitScope], tokens: int, sequences: int = 1) -> Ticket:
        refuse_impossible(scopes, tokens)
        with self._lock:
            now = self._clock.now_us()
            cut = now - WINDOW_US
            states = []
            failures: list[Failure] | None = None
            for s in scopes:
                st = self._states.get(s.id)
                if st is None:
                    st = self._states[s.id] = _State()
                states.append(st)
                if s.rpm is not None or s.tpm is not None:
                    st.trim(cut)
                    if s.rpm is not None and len(st.log) >= s.rpm:
                        wait = st.log[len(st.log) - s.rpm][0] + WINDOW_US - now
                        failures = (failures or []) + [("rpm", s, wait, len(st.log))]
                    if s.tpm is not None and st.sum + tokens > s.tpm:
                        wait = st.token_wait(st.sum + tokens - s.tpm, now)
                        failures = (failures or []) + [("tpm", s, wait, st.sum)]
                if s.max_concurrency is not None:
                    st.reclaim(now)
                    if st.inflight + s.slots(sequences) > s.max_concurrency:
                        failures = (failures or []) + [("concurrency", s, None, st.inflight)]
            if failures:
                refusal = reject(failures, tokens, now, WINDOW_US, self._usage(scopes, states), self._conc_retry_us)
                REJECTIONS.labels(refusal.kind).inc()
                raise refusal
            seq = next(self._seq)
            hold = []
            for s, st in zip(scopes, states):
                logged = s.rpm is not None or s.tpm is not None
                if logged:
                    st.log.append((now, seq))
                    st.amounts[seq] = tokens
                    st.sum += tokens
                if s.max_concurrency is not None:
                    st.slots[seq] = (now + self._lease_us, s.slots(sequences))
                    st.inflight += s.slots(sequences)
                hold.append((st, logged))
            self._since_sweep += 1
            if self._since_sweep >= 4096:
                self._sweep(now)
            return Ticket(str(seq), tokens, (now, WINDOW_US, self._usage(scopes, states)), (seq, hold))

    def settle_now(self, ticket: Ticket, used_tokens: int) -> None:
        if ticket.settled or ticket.degraded:
            return
        if used_tokens < 0:
            raise ValueError("used_tokens must be >= 0")
        ticket.settled = True
        delta = used_tokens - ticket.tokens  # < 0 refunds; > 0 charges an overrun
        seq, hold = ticket._hold
        with self._lock:
            for st, logged in hold:
                if logged and seq in st.amounts:  # still inside the window: adjust entry and sum together
                    st.amounts[seq] += delta
                    st.sum += delta
                st.release(seq)

    @staticmethod
    def _usage(scopes: list[LimitScope], states: list[_State]) -> list[Usage]:
        return [(s, len(st.log), st.sum, st.log[0][0] if st.log else None) for s, st in zip(scopes, states)]

    def _sweep(self, now: int) -> None:
        """Forget idle scopes so a gateway that sees many keys does not grow without bound."""
        self._since_sweep = 0
        cut = now - WINDOW_US
        for sid in list(self._states):
            st = self._states[sid]
            st.trim(cut)
            st.reclaim(now)
            if not st.log and not st.slots:
                del self._states[sid]
