"""N-gram indexes for no-repeat n-gram bans: {first n-1 tokens: set of tokens that followed them}."""

from __future__ import annotations


class NGramIndex:
    """Incremental index of every n-gram seen in a token sequence.

    `extend(seq)` indexes the n-grams ending in the tokens added since the last call, so each step costs
    O(n) instead of rescanning the history.
    """

    def __init__(self, n: int, tokens: list[int]):
        self.n = n
        self.follow: dict[tuple[int, ...], set[int]] = {}
        self.done = 0  # length of the sequence already indexed
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        n = self.n
        for end in range(max(self.done + 1, n), len(tokens) + 1):
            self.follow.setdefault(tuple(tokens[end - n : end - 1]), set()).add(tokens[end - 1])
        self.done = len(tokens)

    def banned(self, tokens: list[int]) -> set[int]:
        """Tokens that would repeat an indexed n-gram if they came next after `tokens`."""
        if len(tokens) < self.n - 1:
            return set()
        key = tuple(tokens[len(tokens) - self.n + 1 :])
        return self.follow.get(key, set())

    def copy(self) -> NGramIndex:
        twin = NGramIndex.__new__(NGramIndex)
        twin.n, twin.done = self.n, self.done
        twin.follow = {k: set(v) for k, v in self.follow.items()}
        return twin
