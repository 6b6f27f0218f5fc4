"""How much prompt a step prefills while rows decode: about what one decode step costs, measured as the engine runs.

Every prefill forward stalls every running row. With a fixed `max_batched_tokens` of 512 a chunk cost 1.2 s on
two cores where a 15-row decode step costs 80 ms, so streams beside a long prompt waited 15x their usual gap;
64-token chunks still tripled it. The cost of a token differs by orders of magnitude between a CPU and a GPU,
and grows with the prompt's position, so no fixed budget fits: the pace is measured.

- Each prefill forward is timed and fitted as `overhead + per_token x tokens` (least squares over the recent
  forwards, older ones weighing less). Forwards of close sizes give only the ratio (overhead 0): a slope
  fitted over a narrow range is noise. A forward prefills at most twice the largest forward measured, so a
  fit is never trusted far beyond what it saw; a step may run several such forwards (short prompts of a
  burst: the fit was measured on their like, and a cap on the step's total let a burst that reached a woken
  worker over a few milliseconds join two prompts a step, its rows a wave behind one another for its whole run).
- Each decode step's time is averaged.
- While rows decode, a step's prefill may add `PACE` x one decode step (its *allowance*), times the prompts
  waiting when more than one waits: a burst of requests is mostly waiting prompts, and holding 15 of them back
  to spare the streams already running their pace cost every one of them seconds to its first token (16
  streams at once: 0.7 decode steps gave 83 tok/s and a TTFT p99 of 17 s; this rule 111 tok/s and 7.6 s; no
  pacing 134 tok/s and 4.5 s but a 0.9 s gap in the running streams). A forward's fixed
  overhead counts against the allowance up to half of it: past that (a GPU, where a forward of 500 tokens costs
  about what one of 10 does) the overhead is the price of any progress and the tokens get the other half.
  A step's first forward gets at least `MIN_CHUNK` tokens, so a prompt always moves on.
- With no row decoding nothing is stalled: a step prefills up to `max_batched_tokens`.
- Until a prefill and a decode step have been measured, a step that decodes prefills `MIN_CHUNK` tokens.
- A prompt longer than the KV cache holds would make the cache grow all at once in the middle of a step
  (kv_cache.py: most of a second for 2,048 positions on SmolLM2); while rows decode, the scheduler grows it one
  layer a step instead, from the prompt's admission on, and the step's chunk gets the allowance minus what a
  layer's growth costs (measured per byte, like the forwards).
"""

from __future__ import annotations

PACE = 0.7  # a step's prefill adds at most this share of a decode step while rows decode
MIN_CHUNK = 8  # prompt tokens the first forward of a step always gets (or the rest of its prompt)
_DECAY = 0.8  # weight of the older forwards in the fit, per newer forward
_SMOOTHING = 0.3  # weight of the newest decode step in its moving average


class PrefillPace:
    """Measured by the executor's forwards; asked by the scheduler for each step's `Allowance`."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.decode_s: float | None = None
        self.byte_s: float | None = None  # seconds per byte of a KV cache layer's growth
        self._sums = [0.0] * 5  # decayed sums of 1, tokens, seconds, tokens^2, tokens x seconds
        self.largest = 0  # the most tokens a measured forward had: the fit is trusted up to twice that

    def record_prefill(self, tokens: int, seconds: float) -> None:
        """A prefill forward of `tokens` prompt tokens took `seconds`."""
        if tokens <= 0:
            return
        self._sums = [_DECAY * total + sample for total, sample in
                      zip(self._sums, (1.0, tokens, seconds, tokens * tokens, tokens * seconds))]
        self.largest = max(self.largest, tokens)

    def record_decode(self, seconds: float) -> None:
        self.decode_s = _average(self.decode_s, seconds)

    def record_growth(self, size: int, seconds: float) -> None:
        """A KV cache layer grew by allocating `size` bytes, in `seconds`."""
        self.byte_s = _average(self.byte_s, seconds / size)

    def growth_s(self, size: int) -> float:
        """What growing a layer to `size` bytes is expected to cost; half a decode step before it was measured."""
        if self.byte_s is None:
            return 0.5 * PACE * (self.decode_s or 0.0)
        return self.byte_s * size

    def cost(self) -> tuple[float, float] | None:
        """(overhead seconds per forward, seconds per token) as fitted, or None before any forward."""
        weight, tokens, seconds, squares, products = self._sums
        if weight == 0.0:
            return None
        mean_tokens, mean_seconds = tokens / weight, seconds / weight
        variance = squares / weight - mean_tokens ** 2
        if variance > (0.5 * mean_tokens) ** 2:  # sizes differ enough to tell the overhead from the tokens
            per_token = (products / weight - mean_tokens * mean_seconds) / variance
            overhead = mean_seconds - per_token * mean_tokens
            if per_token > 0.0 and overhead >= 0.0:
                return overhead, per_token
            if per_token <= 0.0:  # noise over forwards whose size barely matters
                return mean_seconds, 0.0
        return 0.0, seconds / tokens

    def allowance(self, decoding: bool, prompts: int = 1) -> Allowance:
        """What the next step may prefill: `max_batched_tokens`, and seconds as well while rows decode
        (scaled by the `prompts` waiting)."""
        if not decoding:
            return Allowance(self.max_tokens, None, None)
        cost = self.cost()
        if cost is None or self.decode_s is None:
            return Allowance(min(self.max_tokens, MIN_CHUNK), None, None)
        return Allowance(self.max_tokens, PACE * self.decode_s * max(1, prompts), cost, forward_tokens=2 * self.largest)


class Allowance:
    """One step's prefill budget, spent forward by forward (`grant`); `forward_tokens` bounds each forward."""

    def __init__(self, tokens: int, seconds: float | None, cost: tuple[float, float] | None,
                 forward_tokens: int | None = None):
        self.tokens, self.seconds, self._cost = tokens, seconds, cost
        self.forward_tokens = tokens if forward_tokens is None else forward_tokens
        self.forwards = 0

    @property
    def open(self) -> bool:
        """Whether another forward may start in this step."""
        if self.tokens <= 0:
            return False
        if self.seconds is None or self.forwards == 0:
            return True
        overhead, per_token = self._cost
        return self.seconds >= overhead + per_token * min(MIN_CHUNK, self.tokens, self.forward_tokens)

    def grant(self, wanted: int) -> int:
        """Tokens the next forward prefills out of the `wanted` rest of its prompt (0 when it has none), spent."""
        granted = min(wanted, self.tokens, self.forward_tokens)
        if self.seconds is not None and granted > 0:
            overhead, per_token = self._cost
            charged = min(overhead, self.seconds / 2) if self.forwards == 0 else overhead
            if per_token > 0.0:
                fits = max(int((self.seconds - charged) / per_token), 0)
                granted = min(granted, max(fits, MIN_CHUNK if self.forwards == 0 else 0))
            self.seconds -= charged + per_token * granted
        self.tokens = 0 if granted < wanted else self.tokens - granted  # a prompt cut short ends the step's prefill
        self.forwards += 1
        return granted

    def reserve(self, seconds: float) -> None:
        """Other work of the step (the cache's growth) takes `seconds` of the allowance."""
        if self.seconds is not None:
            self.seconds -= seconds

    def close(self) -> None:
        """No other forward in this step."""
        self.tokens = 0


def _average(current: float | None, sample: float) -> float:
    return sample if current is None else (1 - _SMOOTHING) * current + _SMOOTHING * sample
