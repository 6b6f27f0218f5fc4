"""A collected answer's token events as the worker wrote them: the event loop does not decode them, nor cut them apart.

A collected answer of `n` = 32 with 20 top logprobs a token is 9,600 token lines (5 MiB); decoding them is 0.1 s
of the event loop every team's streams share, and what is decoded then waits to be rendered anyway. So a relay
for a collected answer (`relay.attempt(..., raw_tokens=True)`) hands the lines that start as a token event does
(TOKEN_LINE: msgspec writes the tag first) on undecoded, and whoever renders the answer decodes them
(gateway/serving/collect.py, gateway/serving/render_process.py). Every other line is decoded on the loop as before,
so an Error, a Finish or the Done is acted on at once; a token line written otherwise (spaces, another field order)
is decoded there too, and still correct.

Nor are the token lines cut into a bytes object each: making, grouping and counting 9,600 of them cost the loop
milliseconds at a time (what had arrived at once, a few hundred lines, without a turn for anyone else). The relay
reads what arrived as one block of whole lines (`token_runs`): a block of token lines alone, found by two scans in
C, passes on as it is, one TokenLines; only a block with another event in it is split into lines.
"""

from __future__ import annotations

TOKEN_LINE = b'{"type":"token",'
_NEXT_TOKEN_LINE = b"\n" + TOKEN_LINE


class TokenLines:
    """A run of consecutive token lines of one worker stream, in the order they came: `piece` holds them, each
    ending in a newline; `count` says how many."""

    __slots__ = ("count", "piece")

    def __init__(self, piece: bytes, count: int):
        self.piece, self.count = piece, count


def token_runs(block: bytes) -> list[bytes | TokenLines]:
    """The lines of `block` (whole lines, each ending in a newline): each run of token lines one TokenLines,
    every other line on its own (without its newline)."""
    lines = block.count(b"\n")
    if lines and block.startswith(TOKEN_LINE) and block.count(_NEXT_TOKEN_LINE) == lines - 1:
        return [TokenLines(block, lines)]  # every line a token's
    return grouped(block.split(b"\n")[:-1])


def grouped(lines: list[bytes]) -> list[bytes | TokenLines]:
    """`lines` (without their newlines), each run of token lines in it gathered into one TokenLines."""
    items: list[bytes | TokenLines] = []
    run: list[bytes] = []
    for line in lines:
        if line.startswith(TOKEN_LINE):
            run.append(line)
            continue
        if run:
            items.append(_joined(run))
            run = []
        items.append(line)
    if run:
        items.append(_joined(run))
    return items


def _joined(run: list[bytes]) -> TokenLines:
    return TokenLines(b"\n".join([*run, b""]), len(run))


def split_lines(piece: bytes) -> list[bytes]:
    """A TokenLines' piece cut back into its lines (without their newlines)."""
    return piece.split(b"\n")[:-1]
