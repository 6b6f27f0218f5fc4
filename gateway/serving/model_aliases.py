"""The model names of clients that name none: the one owner of the dialects' model aliases.

`tgi` (TGI's text-generation client), `dummy` (huggingface_hub's `chat_completion` given a URL) and `default`
(a Friendli container call, or a TGI/SGLang body, without a model) each stand for the first endpoint the caller
may see. They are resolved here, before a name reaches the endpoints layer, which knows endpoints by name only;
the same set goes to `Endpoints` as its reserved names (gateway/edge/lifespan.py), so that no endpoint may take
one and shadow the alias for every other caller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from auth import Principal
    from gateway.endpoints.controller import EndpointController
    from gateway.endpoints.service import Endpoints

DEFAULT_MODEL = "default"  # what a body that names no model is given
MODEL_ALIASES = frozenset({"tgi", "dummy", DEFAULT_MODEL})


def endpoint_named(endpoints: Endpoints, model: str | None, principal: Principal | None) -> EndpointController:
    """The endpoint `model` names; unset or an alias: the first endpoint the caller may see. EndpointNotFound (404)
    when there is none, or when it is another team's private endpoint."""
    name = model or DEFAULT_MODEL
    if name in MODEL_ALIASES and name not in endpoints.controllers:
        return endpoints.first_visible(name, principal)
    return endpoints.resolve(name, principal)
