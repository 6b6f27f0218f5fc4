"""Documentation-only shapes of SGLang's helper replies and error envelopes (the OpenAPI document)."""

from __future__ import annotations

import msgspec


class SGLangOutput(msgspec.Struct):
    """One output object of `/generate` (rendering builds plain dicts)."""

    text: str
    output_ids: list[int]
    meta_info: dict


class ModelInfoDoc(msgspec.Struct):
    model_path: str
    tokenizer_path: str
    is_generation: bool
    preferred_sampling_params: dict | None
    weight_version: str


class TokenizeDoc(msgspec.Struct):
    tokens: list  # ids, or a list of id lists for a list of texts
    count: int | list[int]
    max_model_len: int


class ErrorDoc(msgspec.Struct):
    """An engine refusal: `{"error": {"message"}}`."""

    error: dict


class BodyErrorDoc(msgspec.Struct):
    """A body SGLang's HTTP layer rejects: `{"object": "error", ...}`."""

    object: str
    message: str
    type: str
    param: str | None
    code: int


ERRORS = {400: ("Bad request", (ErrorDoc, BodyErrorDoc)), 401: ("Missing or invalid API key", ErrorDoc),
          404: ("Unknown model", ErrorDoc), 413: ("Body too large", ErrorDoc), 503: ("No ready worker", ErrorDoc)}
