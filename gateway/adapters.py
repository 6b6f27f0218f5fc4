"""Which LoRA adapter a request asks for, resolved against the adapters the operator registered per endpoint.

A client only ever names a registered adapter: OpenAI-style bodies as `model: "<endpoint>:<adapter>"`, TGI
as `adapter_id`, SGLang as `lora_path`. The gateway turns the name into an `AdapterRef` (name and source)
for the worker; an unknown name is a 404 in the dialect's envelope.
"""

from __future__ import annotations

from gateway.errors import NotFound
from common.protocol import AdapterRef, ModelConfig

SEPARATOR = ":"  # adapter names never hold one (common.protocol.ADAPTER_NAME_PATTERN)


def split_model(model: str, endpoints: dict) -> tuple[str, str | None]:
    """("<endpoint>", "<adapter>") of an OpenAI model name; the name itself when it is an endpoint."""
    if model in endpoints or SEPARATOR not in model:
        return model, None
    endpoint, adapter = model.rsplit(SEPARATOR, 1)
    return endpoint, adapter


def registered(models: list[ModelConfig]) -> dict[str, dict[str, str]]:
    """Endpoint name -> its adapters (name -> source), from the config."""
    return {model.name: dict(model.adapters) for model in models}


def adapter_ref(models: list[ModelConfig], endpoint: str, name: str, field: str) -> AdapterRef:
    adapters = registered(models).get(endpoint, {})
    if name not in adapters:
        known = ", ".join(sorted(adapters)) or "none are registered"
        raise NotFound(f"the adapter {name!r} is not registered for {endpoint!r} ({known})", param=field,
                       code="adapter_not_found")
    return AdapterRef(name=name, source=adapters[name])
