"""Documentation-only shapes of TGI's replies (the OpenAPI document; rendering builds plain dicts)."""

from __future__ import annotations

from typing import Literal

import msgspec

from gateway.dialects.openapi import documented
from gateway.dialects.tgi.request import GenerateBody

FinishName = Literal["length", "eos_token", "stop_sequence"]


class TokenDoc(msgspec.Struct):
    id: int
    text: str
    logprob: float | None
    special: bool


class PrefillDoc(msgspec.Struct):
    id: int
    text: str
    logprob: float | None


class BestOfDoc(msgspec.Struct):
    generated_text: str
    finish_reason: FinishName
    generated_tokens: int
    prefill: list[PrefillDoc]
    tokens: list[TokenDoc]
    seed: int | None = None


class DetailsDoc(msgspec.Struct):
    finish_reason: FinishName
    generated_tokens: int
    prefill: list[PrefillDoc]
    tokens: list[TokenDoc]
    seed: int | None = None
    top_tokens: list[list[TokenDoc]] | None = None
    best_of_sequences: list[BestOfDoc] | None = None


class GenerateDoc(msgspec.Struct):
    generated_text: str
    details: DetailsDoc | None = None


class StreamDetailsDoc(msgspec.Struct):
    finish_reason: FinishName
    generated_tokens: int
    seed: int | None = None


class StreamDoc(msgspec.Struct):
    index: int
    token: TokenDoc
    top_tokens: list[TokenDoc] = []
    generated_text: str | None = None
    details: StreamDetailsDoc | None = None


class ErrorDoc(msgspec.Struct):
    error: str
    error_type: str


class ProxyErrorDoc(msgspec.Struct):
    """A refusal in front of TGI (key, permission, unknown model): no error_type, as Hugging Face answers it."""

    error: str


class InfoDoc(msgspec.Struct):
    model_id: str
    max_concurrent_requests: int
    max_best_of: int
    max_stop_sequences: int
    max_input_tokens: int
    max_total_tokens: int
    validation_workers: int
    max_client_batch_size: int
    router: str
    version: str
    model_sha: str | None = None
    model_dtype: str | None = None
    model_device_type: str | None = None
    model_pipeline_tag: str | None = None
    sha: str | None = None
    docker_label: str | None = None


ERRORS = {400: ("Invalid JSON", ErrorDoc), 401: ("Missing or invalid API key", ProxyErrorDoc),
          402: ("A budget is spent (as Hugging Face answers credit run out)", ProxyErrorDoc),
          404: ("Unknown model", ProxyErrorDoc), 413: ("Body too large", ErrorDoc),
          422: ("Input validation error", ErrorDoc), 424: ("Generation error", ErrorDoc),
          429: ("Model is overloaded or rate limited", ErrorDoc), 503: ("No ready worker", ErrorDoc)}


TGI_DOC = documented(GenerateBody, {200: ("Generated text", GenerateDoc), **ERRORS})
TGI_STREAM_DOC = documented(GenerateBody, {200: ("A stream of tokens (text/event-stream)", None), **ERRORS},
                            stream_item=StreamDoc)
COMPAT_DOC = documented(GenerateBody, {200: ("A one-element array, or a token stream when stream is true",
                                             list[GenerateDoc]), **ERRORS}, stream_item=StreamDoc)
# public; a key that is sent holds (401 bad, 403 a model outside its allow-list, 404 nothing it may see)
INFO_DOC = documented(None, {200: ("Served model info", InfoDoc), 401: ("Invalid API key", ProxyErrorDoc),
                             403: ("Model not allowed for this key", ProxyErrorDoc), 404: ("No model", ProxyErrorDoc),
                             503: ("No ready worker", ErrorDoc)})
