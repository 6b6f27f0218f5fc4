"""Split a row's streamed text into content and tool calls, as the text arrives.

The grammar guarantees the call syntax (syntax.py), so this is a small state machine over characters:
content until the trigger, then a head that names the function, the arguments JSON (tracked by
nesting depth and string state, so a `}` inside a string is not an end), then the fixed tail. Content
that could still turn out to be the start of a call is held back until it cannot; whitespace next to
a call is not content (it separates calls). Without any call, the content is exactly the text.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from common.protocol import ToolCall, ToolCallDelta
from worker.tools.syntax import CallSyntax

_SCALAR = set("0123456789+-.eEtrufalsn")  # characters of numbers, true, false, null


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass
class _ArgumentsScanner:
    """Finds where one JSON value ends, a character at a time."""

    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    started: bool = False
    scalar: bool = False
    done: bool = False

    def feed(self, char: str) -> bool:
        """Whether `char` belongs to the value (False: the value ended before it)."""
        if not self.started:
            if char.isspace():
                return True
            self.started = True
            self.scalar = char not in '{["'
        if self.scalar:
            if char in _SCALAR:
                return True
            self.done = True
            return False
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif char == "\\":
                self.escaped = True
            elif char == '"':
                self.in_string = False
                self.done = self.depth == 0
        elif char == '"':
            self.in_string = True
        elif char in "{[":
            self.depth += 1
        elif char in "}]":
            self.depth -= 1
            self.done = self.depth == 0
        return True


@dataclass
class CallParser:
    syntax: CallSyntax
    names: tuple[str, ...]  # the functions the grammar may call
    choice: int  # the choice index stamped on the deltas
    calls_only: bool = False  # the grammar allows nothing but calls (required / named): no text is content
    # the grammar allows calls or content, never both (auto with a structured-output constraint): once a call
    # starts, the rest is calls only
    exclusive: bool = False
    calls: list[ToolCall] = field(default_factory=list)
    _state: str = "text"  # text | head | arguments | tail
    _pending: str = ""
    _after_call: bool = False
    _gap: str = ""  # whitespace before a head: dropped if the head makes a call, content if not
    _scanner: _ArgumentsScanner = field(default_factory=_ArgumentsScanner)

    def __post_init__(self):
        self._heads = {self.syntax.head(name): name for name in self.names}

    @property
    def open(self) -> bool:
        """A call was started and is not finished (the output was cut inside it)."""
        return self._state in ("arguments", "tail")

    def push(self, text: str, final: bool = False) -> tuple[str, list[ToolCallDelta]]:
        """Feed the next piece of text (`final`: the last one): the content it releases, and the call
        pieces it completes, one delta per call."""
        self._pending += text
        content: list[str] = []
        deltas: dict[int, ToolCallDelta] = {}
        while self._pending and getattr(self, f"_{self._state}")(content, deltas):
            pass
        if final and self._state == "head" and self.calls_only:
            self._cut_head(deltas)
        if final and self._state in ("text", "head"):  # held-back text, or a head cut short: content after all
            if not self.calls_only:
                content.append(self._gap + self._pending if self._state == "head" else self._pending)
            self._pending = ""
        return "".join(content), list(deltas.values())

    def _text(self, content: list[str], deltas) -> bool:
        if self._after_call:
            self._pending = self._pending.lstrip()
            if not self._pending:
                return False
            self._after_call = False
        trigger = self.syntax.trigger
        at = self._pending.find(trigger)
        if at >= 0:
            before = self._pending[:at]
            content.append(before.rstrip())
            self._gap = before[len(before.rstrip()):]
            self._pending = self._pending[at:]
            self._state = "head"
            return True
        keep = _held_back(self._pending, trigger)
        if self.calls_only:  # only separators come between calls
            self._pending = self._pending[keep:]
            return False
        released = self._pending[:keep].rstrip()
        content.append(released)
        self._pending = self._pending[len(released):]
        return False

    def _head(self, content: list[str], deltas) -> bool:
        for head, name in self._heads.items():
            if self._pending.startswith(head):
                self._pending = self._pending[len(head):]
                call = ToolCall(id=new_call_id(), name=name, arguments="")
                self.calls.append(call)
                self.calls_only = self.calls_only or self.exclusive
                deltas[len(self.calls) - 1] = ToolCallDelta(index=self.choice, call=len(self.calls) - 1, id=call.id,
                                                            name=name)
                self._scanner = _ArgumentsScanner()
                self._state = "arguments"
                return True
        if any(head.startswith(self._pending) for head in self._heads):
            return False  # wait for the rest of the head
        # not a call after all (only possible without the grammar): the trigger is content
        trigger = self.syntax.trigger
        content.append(self._gap + trigger)
        self._pending = self._pending[len(trigger):]
        self._state = "text"
        return True

    def _cut_head(self, deltas: dict[int, ToolCallDelta]) -> None:
        """The output of a calls-only grammar ended inside a call's head: when the head so far can name one function
        only, it is that function's call, cut before its arguments (OpenAI returns a call cut by max_tokens as it
        stands, with finish_reason "length"; dropping it hid that the model called a tool). With `auto` a cut
        head stays content: without the grammar's guarantee it may not be a call at all."""
        names = {name for head, name in self._heads.items() if head.startswith(self._pending)}
        if len(names) != 1:
            return
        name = names.pop()
        call = ToolCall(id=new_call_id(), name=name, arguments="")
        self.calls.append(call)
        deltas[len(self.calls) - 1] = ToolCallDelta(index=self.choice, call=len(self.calls) - 1, id=call.id, name=name)
        self._pending, self._state = "", "arguments"

    def _arguments(self, content: list[str], deltas) -> bool:
        scanner, taken = self._scanner, 0
        if not scanner.started:
            self._pending = self._pending.lstrip()
        for char in self._pending:
            if not scanner.feed(char):
                break
            taken += 1
            if scanner.done:
                break
        fragment, self._pending = self._pending[:taken], self._pending[taken:]
        if fragment:
            index = len(self.calls) - 1
            self.calls[index].arguments += fragment
            delta = deltas.setdefault(index, ToolCallDelta(index=self.choice, call=index))
            delta.arguments += fragment
        if scanner.done:
            self._state = "tail"
            return True
        return False

    def _tail(self, content: list[str], deltas) -> bool:
        tail = self.syntax.tail
        if self._pending.startswith(tail):
            self._pending = self._pending[len(tail):]
        elif tail.startswith(self._pending):
            return False
        self._state, self._after_call = "text", True
        return True


def _held_back(text: str, trigger: str) -> int:
    """Where the longest suffix of `text` that could begin `trigger` starts (len(text) when none)."""
    for start in range(max(0, len(text) - len(trigger) + 1), len(text)):
        if trigger.startswith(text[start:]):
            return start
    return len(text)

