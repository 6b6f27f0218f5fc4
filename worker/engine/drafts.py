"""Draft tokens for speculative decoding, with no draft model: a row's guesses of its next tokens.

Two sources, as OpenAI's Predicted Outputs and prompt lookup (vLLM's `ngram`, llama.cpp's lookup decoding):

- the request's **prediction** (its tokens): a cursor follows the output along it; where the output leaves it
  (an edit), the output's last tokens are looked up in it again (the longest n-gram first, nearest after
  where the cursor was), and the cursor goes on from the match;
- **prompt lookup**: the output's last n tokens (n = 3, then 2) looked up in the prompt and the output so far;
  the tokens that followed their latest earlier occurrence are the draft.

How many to offer is the row's own business, from its recent acceptance (`Acceptance`): the verify forward
scores every draft token like a row of the batch, so a token is worth drafting only while the chance that it
is accepted beats what it costs (`draft_length`). A prediction's refusals come in bursts (an edit), not one by
one: a row that has followed it for a run of n tokens since the last edit offers at least n (up to its limit),
rather than waiting for its average to climb back. Where nothing matches there is no draft and the step costs
what it did without speculation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LOOKUP_NGRAMS = (3, 2)  # a single token repeats too often to predict what follows it
PREDICTION_NGRAMS = (4, 3, 2)  # where the output rejoins the prediction after an edit
MAX_LOOKUP_DRAFT = 8
MAX_PREDICTION_DRAFT = 16
# The native forward on a CPU reads every weight once per forward, so a forward of a few tokens costs about what
# one costs; past ~a dozen it costs each token in full (SmolLM2 q4, one thread: 1 row + 7 drafts ~2x one token,
# 16 rows + 15 drafts ~2x 16 rows). So a step holds at most STEP_TOKENS tokens with its drafts (16 rows draft
# nothing), and below that a draft token is worth scoring while its chance of being accepted beats the share
# tokens / (FIXED_COST_TOKENS + tokens) it adds to the step's cost.
STEP_TOKENS = 12
FIXED_COST_TOKENS = 5.0
MIN_REACH = 0.4  # and never a token less likely than this to be reached and taken: the logits head costs per token
RECOVERY = 0.02  # a source that stopped drafting regains this much acceptance a step, up to where it started
ALPHA_STEP = 0.25  # weight of one verified draft token in its source's acceptance estimate


class NGramIndex:
    """For n in `sizes`: each n-gram of a growing token list -> where what followed its occurrences starts."""

    def __init__(self, sizes: tuple[int, ...], tokens: list[int] | None = None, keep_all: bool = False):
        self.sizes, self.keep_all = sizes, keep_all
        self.tokens: list[int] = []
        self.last: dict[tuple[int, ...], int] = {}  # without keep_all: the latest occurrence's
        self.every: dict[tuple[int, ...], list[int]] = {}  # with keep_all: every occurrence's, in order
        self.extend(tokens or [])

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self.tokens.append(token)
            end = len(self.tokens) - 1  # the n-grams ending just before it are followed by it
            for n in self.sizes:
                if end >= n:
                    key = tuple(self.tokens[end - n:end])
                    if self.keep_all:
                        self.every.setdefault(key, []).append(end)
                    else:
                        self.last[key] = end

    def follow(self, tail: list[int], after: int = 0) -> int | None:
        """Where the tokens that followed `tail`'s last n tokens start (longest n first; with `keep_all`, the
        first occurrence at or after `after`, else the first), or None."""
        found = self.match(tail, after)
        return None if found is None else found[0]

    def match(self, tail: list[int], after: int = 0) -> tuple[int, int] | None:
        """`follow`'s start and the n that matched."""
        for n in self.sizes:
            if len(tail) < n:
                continue
            key = tuple(tail[-n:])
            if self.keep_all:
                if (starts := self.every.get(key)) is not None:
                    return next((start for start in starts if start >= after), starts[0]), n
            elif (latest := self.last.get(key)) is not None:
                return latest, n
        return None


@dataclass
class Acceptance:
    """How often a source's draft tokens were accepted lately: an exponential average over verified tokens."""
    alpha: float
    start: float = 0.0

    def __post_init__(self) -> None:
        self.start = self.alpha

    def idle(self) -> None:
        """A step it drafted nothing for want of acceptance: it creeps back, so a row tries again later."""
        self.alpha = min(self.start, self.alpha + RECOVERY)

    def record(self, drafted: int, accepted: int) -> None:
        for index in range(min(drafted, accepted + 1)):  # tokens past the first rejection were never judged
            self.alpha += ALPHA_STEP * ((index < accepted) - self.alpha)


def draft_length(alpha: float, tokens: int, limit: int) -> int:
    """The most draft tokens worth scoring for a row whose tokens are accepted with probability `alpha`, in a
    step of `tokens` tokens: the j-th is kept while alpha^j (the chance it is reached and accepted) beats the
    share one more token adds to the step's cost."""
    threshold = max(tokens / (FIXED_COST_TOKENS + tokens), MIN_REACH)
    length, reach = 0, alpha
    while length < limit and reach > threshold:
        length += 1
        reach *= alpha
    return length


@dataclass
class Drafter:
    """One row's draft source: its prompt + output so far, its prediction (if any) and how well each did."""
    prompt: list[int]
    prediction: list[int] | None = None
    lookup: bool = True  # prompt lookup (ModelConfig.prompt_lookup)
    cursor: int | None = 0  # where the next output token is expected in the prediction (None: lost)
    seen: NGramIndex | None = None  # built on first use: a row that never drafts never indexes its prompt
    predicted: NGramIndex | None = None
    from_prediction: Acceptance = field(default_factory=lambda: Acceptance(0.9))
    from_lookup: Acceptance = field(default_factory=lambda: Acceptance(0.6))
    accepted_prediction: int = 0  # prediction tokens the output took
    rejected_prediction: int = 0  # prediction tokens scored and refused
    last_source: str = ""
    lost_at: int = 0  # where the output last left the prediction
    followed: int = 0  # output tokens the cursor has followed
    run: int = 0  # output tokens in a row that matched the prediction where the cursor is now

    def propose(self, output: list[int], tokens: int, room: int) -> list[int]:
        """Draft tokens for the row whose output so far is `output`, in a step of `tokens` tokens, at most
        `room`; [] when nothing is worth drafting."""
        if room <= 0:
            return []
        if self.prediction:
            self._follow(self.prediction, output)
            limit = min(room, MAX_PREDICTION_DRAFT)
            length = draft_length(self.from_prediction.alpha, tokens, limit)
            if length:  # an edit breaks a run and rejoining one is likely to go on: the run, not the average
                length = max(length, min(self.run, limit))
            start = self.cursor
            if not length:
                self.from_prediction.idle()
            elif start is not None and start < len(self.prediction):
                self.last_source = "prediction"
                return self.prediction[start:start + length]
        if not self.lookup:
            return []
        length = draft_length(self.from_lookup.alpha, tokens, min(room, MAX_LOOKUP_DRAFT))
        if not length:
            self.from_lookup.idle()
            return []
        if self.seen is None:
            self.seen = NGramIndex(LOOKUP_NGRAMS, self.prompt)
        self.seen.extend(output[len(self.seen.tokens) - len(self.prompt):])
        start = self.seen.follow(self.seen.tokens)
        if start is None:
            return []
        self.last_source = "lookup"
        return self.seen.tokens[start:start + length]

    def verified(self, drafted: list[int], accepted: int) -> None:
        """`accepted` of the `drafted` tokens were taken."""
        if self.last_source == "prediction":
            self.from_prediction.record(len(drafted), accepted)
            self.accepted_prediction += accepted
            self.rejected_prediction += len(drafted) - accepted
        elif self.last_source == "lookup":
            self.from_lookup.record(len(drafted), accepted)
        self.last_source = ""

    def _follow(self, prediction: list[int], output: list[int]) -> None:
        """The prediction's cursor follows the output tokens not followed yet; lost, it looks for the output's last
        tokens in the prediction, nearest after where it was lost."""
        for token in output[self.followed:]:
            if self.cursor is not None and self.cursor < len(prediction) and prediction[self.cursor] == token:
                self.cursor += 1
                self.run += 1
            elif self.cursor is not None:
                self.lost_at, self.cursor, self.run = self.cursor, None, 0
        self.followed = len(output)
        if self.cursor is None:
            if self.predicted is None:
                self.predicted = NGramIndex(PREDICTION_NGRAMS, prediction, keep_all=True)
            found = self.predicted.match(output, self.lost_at)
            self.cursor, self.run = (None, 0) if found is None else found
