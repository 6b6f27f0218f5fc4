"""How a tool call looks in the model's output text: the grammar enforces it and the parser reads it.

A call is `<opener>{"name": "<name>", "arguments": <arguments JSON>}<closer>`. Templates without a
tools slot get the bare JSON object (the tool prompt tells the model so); templates that ask for
Hermes-style `<tool_call>` tags (Qwen2.5, Hermes, SmolLM3 and others) get those tags around it.
Names are plain (^[A-Za-z0-9_-]+$, checked in plan.py), so a name never needs escaping.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CallSyntax:
    opener: str  # text before the call's JSON object
    closer: str  # text after it
    separator: str  # between calls where nothing but calls may be written (required / named choice)

    def head(self, name: str) -> str:
        """Everything before the arguments of a call to `name`."""
        return f'{self.opener}{{"name": "{name}", "arguments": '

    @property
    def tail(self) -> str:
        """Everything after the arguments."""
        return "}" + self.closer

    @property
    def trigger(self) -> str:
        """The text that starts a call when the model may also write content (auto): a prefix of every head."""
        return self.opener or '{"name": "'

    def render(self, name: str, arguments: str) -> str:
        """A past call as the model would have written it (multi-turn history)."""
        return self.head(name) + arguments + self.tail


JSON_CALLS = CallSyntax(opener="", closer="", separator="\n")
TAGGED_CALLS = CallSyntax(opener="<tool_call>\n", closer="\n</tool_call>", separator="\n")


def syntax_of(template: str | None) -> CallSyntax:
    """The call syntax a tools-aware chat template asks for."""
    return TAGGED_CALLS if template and "<tool_call>" in template else JSON_CALLS
