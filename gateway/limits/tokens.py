"""How many tokens a request reserves at admission. The gateway computes it; the rule lives here so that
every dialect reserves the same way.

reserve = prompt tokens + max new tokens x sequences that cost compute, where sequences is
``num_beams`` under beam search (every beam decodes, whatever n returns), else ``max(n, best_of)``
(best_of candidates are all generated even if only n come back). The prompt counts once: the sequences
share it, and the worker bills it once. Settle with what was actually processed: prompt + completion
tokens of all sequences.

The reservation is an upper bound of that charge, so that no body overruns tpm or a budget: the prompt's
tokens are bounded by the UTF-8 bytes of everything that reaches it (a byte-level BPE token is at least one
byte): the messages' JSON, the tools' JSON and tool prompt, the chat template variables a client sets (each as
printed, once per message and once more), and what the model's chat template adds (`PromptOverhead`, measured by
the worker). Where the prompt's length decides how many tokens may be
generated (no max_tokens: up to the context or max_total_tokens), the worst case is the shortest prompt.
"""

from __future__ import annotations

from common.prompt_size import function_bytes, message_bytes
from common.protocol import GenerateRequest, PromptOverhead


def reservation_tokens(prompt_tokens: int, max_new_tokens: int, *, n: int = 1, best_of: int | None = None,
                       num_beams: int = 1) -> int:
    sequences = num_beams if num_beams > 1 else max(n, best_of or 1)
    return prompt_tokens + max_new_tokens * sequences


def prompt_bounds(request: GenerateRequest, overhead: PromptOverhead) -> tuple[int, int]:
    """(fewest, most) prompt tokens the worker can count for `request`."""
    if request.prompt_ids is not None:
        fewest = most = len(request.prompt_ids)
    elif request.input_embeds is not None:
        fewest = most = len(request.input_embeds)
    elif request.messages is not None:
        fewest = 1
        most = overhead.fixed + sum(message_bytes(m) + overhead.per_message for m in request.messages)
        if request.chat_template_kwargs:  # a template may print a variable once, or once per message
            printed = sum(len(str(value).encode()) for value in request.chat_template_kwargs.values())
            most += printed * (len(request.messages) + 1)
        tools = request.tools
        if tools is not None and tools.choice != "none" and tools.functions:
            most += overhead.tools + len((tools.prompt or "").encode())
            most += sum(function_bytes(f) + overhead.per_tool for f in tools.functions)
    else:
        fewest, most = 1, len((request.prompt or "").encode()) + overhead.text
    truncate = request.params.truncate
    if truncate is not None:
        fewest, most = min(fewest, truncate), min(most, truncate)
    return fewest, most


def request_reservation(request: GenerateRequest, context: int, overhead: PromptOverhead, *,
                        context_known: bool = True) -> int:
    """The most one request (one prompt, all its sequences) can be charged on a model of `context` tokens; the
    worker refuses a prompt and length that do not fit the context, which are charged nothing. `context_known`:
    a worker described the model (else `context` is a default, and nothing is taken as refused)."""
    params = request.params
    fewest, most = prompt_bounds(request, overhead)
    if context_known and params.max_tokens is not None and fewest + params.max_tokens > context:
        return 0  # the worker refuses it as too long before any token: the client hears 400, not never_fits
    if params.max_tokens is not None:  # the charge grows with the prompt, as far as max_tokens leaves room
        prompt, new = max(fewest, min(most, context - params.max_tokens)), params.max_tokens
    else:  # up to max_total_tokens or the context: the shorter the prompt, the more every sequence may generate
        limit = params.max_total_tokens if params.max_total_tokens is not None else context
        prompt, new = fewest, max(limit - fewest, 0)
    # a prediction's rejected tokens are billed as completion tokens (OpenAI's rule), each sequence at most the
    # prediction's tokens, which its bytes bound
    predicted = len(request.prediction.encode()) if request.prediction else 0
    return reservation_tokens(prompt, new + predicted, n=params.n, best_of=params.best_of, num_beams=params.num_beams)


def fewest_prompt_tokens(request: GenerateRequest, max_token_bytes: int) -> int:
    """The fewest tokens the worker can count for `request`'s prompt before any `truncate`: its ids or embeddings
    one a position, a text at least its bytes over the most bytes one token covers (`ModelInfo.max_token_bytes`,
    0: unknown). A chat's rendering is the worker's (its template may leave text out): 0 here."""
    if request.prompt_ids is not None:
        return len(request.prompt_ids)
    if request.input_embeds is not None:
        return len(request.input_embeds)
    if request.prompt is not None and max_token_bytes > 0:
        return -(-len(request.prompt.encode()) // max_token_bytes)
    return 0
