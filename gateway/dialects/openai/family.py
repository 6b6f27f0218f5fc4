"""The dialect base of OpenAI-shaped APIs (OpenAI, FriendliAI, MonsterAPI): the dialect's name in the
ledger, its error envelope (OpenAI's 400 contract; Friendli's 422 adds FastAPI's `detail` list) and its rule for
unknown body keys."""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.dialects.openai.errors import Wording, as_openai, chat_wording
from gateway.errors import SluiceError, UnknownParameter
from gateway.serving.dialect import Dialect, unknown_fields

# OpenAI parameters that change nothing here (storage, tagging, caching hints): accepted and ignored
OPENAI_TOLERATED = frozenset({"store", "metadata", "service_tier", "prompt_cache_key", "safety_identifier"})


class OpenAIFamily(Dialect):
    """`friendli=True` serves the /serverless and /dedicated routes: the dialect is named "friendli"."""

    name = "openai"
    openai_errors = True  # OpenAI's error contract (dialects.openai.errors); Friendli and MonsterAPI keep 422
    context_wording: Wording = staticmethod(chat_wording)
    prompt_param: str | None = "messages"

    def __init__(self, *, friendli: bool = False):
        self.friendli = friendli
        if friendli:
            self.name = "friendli"
            self.openai_errors = False

    def refuse_unknown(self, payload: Any, kind: type[msgspec.Struct]) -> None:
        """OpenAI answers a body key it does not know with 400 (a misspelt `max_token` must not pass for a
        request without it); Friendli's FastAPI server ignores extra keys, so its routes do too."""
        if not self.friendli:
            for name in unknown_fields(payload, kind, OPENAI_TOLERATED):
                raise UnknownParameter(name)

    def reported(self, error: SluiceError) -> SluiceError:
        return as_openai(error, self.context_wording, self.prompt_param) if self.openai_errors else error

    def error_body(self, error: SluiceError) -> tuple[int, Any]:
        status, body = super().error_body(error)
        if self.friendli and status == 422:
            loc = ["body", error.param] if error.param else ["body"]
            body["detail"] = [{"loc": loc, "msg": error.message, "type": "value_error"}]
        return status, body
