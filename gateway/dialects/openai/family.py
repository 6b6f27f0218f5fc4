"""The dialect base of OpenAI-shaped APIs (OpenAI, FriendliAI, MonsterAPI): the dialect's name in the
ledger and its error envelope, where Friendli's 422 adds FastAPI's `detail` list."""

from __future__ import annotations

from typing import Any

from gateway.dialects.base import Dialect
from gateway.errors import SluiceError


class OpenAIFamily(Dialect):
    """`friendli=True` serves the /serverless and /dedicated routes: the dialect is named "friendli"."""

    name = "openai"

    def __init__(self, *, friendli: bool = False):
        self.friendli = friendli
        if friendli:
            self.name = "friendli"

    def error_body(self, error: SluiceError) -> tuple[int, Any]:
        status, body = super().error_body(error)
        if self.friendli and status == 422:
            loc = ["body", error.param] if error.param else ["body"]
            body["detail"] = [{"loc": loc, "msg": error.message, "type": "value_error"}]
        return status, body
