"""Stop strings matched across token boundaries in the streamed text, without leaking partial matches."""

from __future__ import annotations


class StopMatcher:
    """Feed text deltas; get back what is safe to emit and, once, the stop string that matched.

    Text that could still be the start of a stop string is held back. When several stop strings
    appear, the one that completes first in the text wins (ties: the one starting first), which is
    what a character-by-character scan would find; the emitted text is everything before it.
    """

    def __init__(self, stops: list[str]):
        self.stops = [s for s in dict.fromkeys(stops) if s]
        self.held = ""
        self.matched: str | None = None

    def push(self, delta: str) -> tuple[str, str | None]:
        """Returns (text safe to emit now, matched stop or None). After a match, further pushes emit ""."""
        if self.matched is not None:
            return "", self.matched
        text = self.held + delta
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self.stops:
            start = text.find(stop)
            if start >= 0 and (best is None or (start + len(stop), start) < best[:2]):
                best = (start + len(stop), start, stop)
        if best is not None:
            self.held = ""
            self.matched = best[2]
            return text[: best[1]], best[2]
        keep = self._partial_suffix(text)
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], None

    def flush(self) -> str:
        """Held-back text at the end of generation (no match happened)."""
        held, self.held = self.held, ""
        return held

    def _partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        longest = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:k]):
                    longest = k
                    break
        return longest
