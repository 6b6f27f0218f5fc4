"""A collected answer's token events as the worker wrote them: the event loop does not decode them.

A collected answer of `n` = 32 with 20 top logprobs a token is 9,600 token lines (5 MiB); decoding them is 0.1 s
of the event loop every team's streams share, and what is decoded then waits to be rendered anyway. So a relay
for a collected answer (`relay.attempt(..., raw_tokens=True)`) hands the lines that start as a token event does
(TOKEN_LINE: msgspec writes the tag first) on undecoded, a run of them at a time, and whoever renders the answer
decodes them (gateway/serving/collect.py, gateway/serving/render_process.py). Every other line is decoded on the
loop as before, so an Error, a Finish or the Done is acted on at once; a token line written otherwise (spaces,
another field order) is decoded there too, and still correct.
"""

from __future__ import annotations

TOKEN_LINE = b'{"type":"token",'


class TokenLines:
    """A run of consecutive token lines of one worker stream, in the order they came."""

    __slots__ = ("lines",)

    def __init__(self, lines: list[bytes]):
        self.lines = lines


def grouped(lines: list[bytes]) -> list[bytes | TokenLines]:
    """`lines`, each run of token lines in it gathered into one TokenLines."""
    items: list[bytes | TokenLines] = []
    run: list[bytes] | None = None
    for line in lines:
        if line.startswith(TOKEN_LINE):
            if run is None:
                run = []
                items.append(TokenLines(run))
            run.append(line)
        else:
            run = None
            items.append(line)
    return items
