"""A model directory's config.json checked before anything is built from it.

transformers fills every field a config.json leaves out with its family's defaults: a config without
`hidden_size` builds a 4,096-wide Llama and then fails deep in loading on a size mismatch, or, where the
checkpoint happens to fit, serves the wrong model. An architecture transformers does not know, or one that
is not a causal LM (an encoder, a seq2seq model), fails later with a message about auto classes. Each is
said here in one line that names the field or the architecture.
"""

from __future__ import annotations

import json
from pathlib import Path

# the sizes a model is built from; a family whose config has no such attribute (Mamba: no heads) needs none
SIZE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")


class ModelConfigError(RuntimeError):
    """config.json cannot describe a causal LM that transformers builds."""


def check_model_config(location: Path | str) -> None:
    """Raise ModelConfigError naming what is wrong with a local directory's config.json (other sources:
    nothing to check here; transformers writes the configs of GGUF files itself)."""
    path = Path(location) / "config.json"
    if not path.is_file():
        return
    try:
        raw = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelConfigError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(raw, dict):
        raise ModelConfigError(f"{path} holds no JSON object")
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = raw.get("model_type")
    architectures = raw.get("architectures") or []
    named = f" ({', '.join(map(str, architectures))})" if isinstance(architectures, list) and architectures else ""
    if not isinstance(model_type, str) or not model_type:
        raise ModelConfigError(f"{path} names no model_type{named}")
    if model_type not in CONFIG_MAPPING_NAMES:
        raise ModelConfigError(f"unknown architecture: model_type {model_type[:80]!r}{named[:200]} is not one "
                               f"transformers {transformers.__version__} knows")
    # the names transformers exports, read without importing a class (its modeling code costs ~170 MB: a q4
    # worker never imports it, families/skeleton.py)
    exported = set(dir(transformers))
    unknown = [name for name in architectures if not isinstance(name, str) or name not in exported] \
        if isinstance(architectures, list) else [architectures]
    if unknown:
        raise ModelConfigError(f"unknown architecture {str(unknown[0])[:80]!r} in {path.name}: transformers "
                               f"{transformers.__version__} has no such model class")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelConfigError(f"{model_type}{named[:200]} is not a causal language model: the worker serves "
                               "text generation by decoder models only")
    text_config = raw.get("text_config")
    fields: dict = text_config if isinstance(text_config, dict) else raw
    config_class = CONFIG_MAPPING[model_type]
    text_class = getattr(config_class, "sub_configs", {}).get("text_config") if fields is not raw else None
    missing = _missing(fields, text_class or config_class)
    if missing:
        raise ModelConfigError(f"{path} lacks {', '.join(missing)}: transformers would build {model_type}'s "
                               "default size instead of this checkpoint's")


def _missing(fields: dict, config_class) -> list[str]:
    """The size fields the family has that `fields` gives under none of their names."""
    defaults = config_class()
    aliases = getattr(config_class, "attribute_map", {})
    missing = []
    for field in SIZE_FIELDS:
        if not hasattr(defaults, field):
            continue
        names = {field, aliases.get(field, field)} | {alias for alias, target in aliases.items() if target == field}
        if not names & fields.keys():
            missing.append(field)
    return missing
