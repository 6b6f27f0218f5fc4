"""The LoRA adapters registered per endpoint, and which one a request asks for.

The operator registers adapters in the config (`adapters = { <name> = "<source>" }` on an endpoint) and
through the admin API (gateway/adapters_admin.py); a source is a PEFT adapter directory or an s3:// prefix.
A client only ever names a registered adapter: OpenAI-style bodies as `model: "<endpoint>:<adapter>"`, TGI
as `adapter_id`, SGLang as `lora_path`. The gateway turns the name into an `AdapterRef` (name and source)
for the worker; an unknown name is a 404 in the dialect's envelope. Registrations made through the API live
in memory (the config is the durable list).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.errors import NotFound
from common.protocol import AdapterRef, ModelConfig

SEPARATOR = ":"  # adapter names never hold one (common.protocol.ADAPTER_NAME_PATTERN)


def split_model(model: str, endpoints) -> tuple[str, str | None]:
    """("<endpoint>", "<adapter>") of an OpenAI model name; the name itself when it is an endpoint."""
    if model in endpoints or SEPARATOR not in model:
        return model, None
    endpoint, adapter = model.rsplit(SEPARATOR, 1)
    return endpoint, adapter


@dataclass
class AdapterRegistry:
    by_endpoint: dict[str, dict[str, str]] = field(default_factory=dict)  # endpoint -> adapter name -> source

    @classmethod
    def from_models(cls, models: list[ModelConfig]) -> AdapterRegistry:
        return cls({model.name: dict(model.adapters) for model in models})

    def of(self, endpoint: str) -> dict[str, str]:
        return self.by_endpoint.get(endpoint, {})

    def ref(self, endpoint: str, name: str, field_name: str) -> AdapterRef:
        adapters = self.of(endpoint)
        if name not in adapters:
            known = ", ".join(sorted(adapters)) or "none are registered"
            raise NotFound(f"the adapter {name!r} is not registered for {endpoint!r} ({known})", param=field_name,
                           code="adapter_not_found")
        return AdapterRef(name=name, source=adapters[name])

    def add(self, endpoint: str, name: str, source: str) -> None:
        self.by_endpoint.setdefault(endpoint, {})[name] = source

    def remove(self, endpoint: str, name: str) -> None:
        self.ref(endpoint, name, "name")
        del self.by_endpoint[endpoint][name]
