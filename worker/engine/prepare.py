"""Turn a `GenerateRequest` into what the engine runs: prompt ids, lengths, seeds, row specs.

Everything that needs the tokenizer or the model's limits is checked here, before the request is
queued, so a bad request is answered at once and never occupies a row.
"""

from __future__ import annotations

import functools
import secrets
from dataclasses import dataclass

import torch

from common.protocol import GenerateRequest, SamplingParams
from worker.decoding.grammar import GrammarBusy, GrammarError
from worker.engine.beam_rules import validate_beams
from worker.engine.prepare_errors import RequestRejected
from worker.engine.prompt_tokens import text_ids
from worker.engine.validate import normalise_params, validate_params
from worker.tools import ToolError, ToolPlan, check_tools, plan_tools, render_chat

__all__ = ["PreparedRequest", "RequestRejected", "prepare"]

PRIORITIES = ("interactive", "batch")


@dataclass
class PreparedRequest:
    request: GenerateRequest
    prompt_ids: list[int]
    prompt_embeds: torch.Tensor | None  # [L, hidden] when embeddings replace the token lookup
    max_new_tokens: int
    min_new_tokens: int
    candidates: int  # rows generated: best_of, or n
    returned: int  # choices returned: n
    seeds: list[int]  # one per candidate row
    eos_token_ids: list[int]
    bad_word_ids: list[list[int]]
    grammar: object = None  # worker.decoding.grammar.Grammar when the request is constrained
    validation_s: float = 0.0  # how long prepare() took
    tools: ToolPlan | None = None  # when the model may call tools (its grammar is `grammar`)
    prediction_ids: list[int] | None = None  # the request's `prediction`, tokenized: draft tokens


def _prompt_ids(request: GenerateRequest, tokenizer, max_context: int, max_token_bytes: int) -> list[int]:
    """The prompt's ids, unchecked; a text tokenized no further than the context can hold (prompt_tokens.py)."""
    if request.prompt_ids is not None:
        return list(request.prompt_ids)
    bounded = functools.partial(text_ids, tokenizer, max_context=max_context, truncate=request.params.truncate,
                                max_token_bytes=max_token_bytes)
    if request.messages is not None:
        try:
            rendered = render_chat(tokenizer, request.messages, request.tools, request.add_generation_prompt,
                                   continue_final=request.continue_final_message,
                                   template_kwargs=request.chat_template_kwargs)
        except ToolError:
            raise
        except Exception as exc:  # jinja errors on malformed messages are the client's problem
            raise RequestRejected(f"cannot apply the chat template: {exc}", "messages") from exc
        return bounded(rendered, add_special_tokens=False, field="messages")
    if request.prompt is not None:
        return bounded(request.prompt, add_special_tokens=True, field="prompt")
    if request.input_embeds is not None:
        return [0] * len(request.input_embeds)  # placeholders: the embeddings are the input
    raise RequestRejected("a prompt is required", "prompt")


def _check_vocabulary(request: GenerateRequest, ids: list[int], vocab_size: int) -> None:
    if request.prompt_ids is not None:
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise RequestRejected(f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})", "prompt")


def _float32_values(values: list[list[float]] | list[float], field: str) -> torch.Tensor:
    tensor = torch.tensor(values, dtype=torch.float32)
    if not bool(torch.isfinite(tensor).all()):  # 1e39 is +inf in float32, and the model's output NaN
        raise RequestRejected(f"{field} values must be finite float32 numbers", field)
    return tensor


def _embeddings(request: GenerateRequest, ids: list[int], hidden_size: int, embed) -> torch.Tensor | None:
    if request.input_embeds is not None:
        if any(len(row) != hidden_size for row in request.input_embeds):
            raise RequestRejected(f"every input_embeds vector must have {hidden_size} values", "input_embeds")
        return _float32_values(request.input_embeds, "input_embeds")
    positions = request.token_index_to_replace
    if not positions:
        if request.embedding_to_replace:
            raise RequestRejected("embedding_to_replace needs token_index_to_replace", "token_index_to_replace")
        return None
    if len(request.embedding_to_replace) != len(positions) * hidden_size:
        raise RequestRejected(f"embedding_to_replace must hold {len(positions)} x {hidden_size} values",
                           "embedding_to_replace")
    if any(not 0 <= p < len(ids) for p in positions):
        raise RequestRejected("token_index_to_replace names a position outside the prompt", "token_index_to_replace")
    replacement = _float32_values(request.embedding_to_replace, "embedding_to_replace")
    replacement = replacement.view(len(positions), hidden_size)
    with torch.inference_mode():
        # the lookup runs where the weights are (CUDA too); back on the CPU like caller-given input_embeds
        base = embed(torch.tensor(ids)).float().cpu()
        base[torch.tensor(positions)] = replacement
    return base


def _lengths(params: SamplingParams, prompt_len: int, max_context: int) -> tuple[int, int]:
    room = max_context - prompt_len
    if room <= 0:  # the completion asked for is named too: each dialect's wording counts it (OpenAI's does)
        asked = {} if params.max_tokens is None else {"max_tokens": params.max_tokens}
        raise RequestRejected(f"the prompt has {prompt_len} tokens; this model's context is {max_context} tokens",
                           "prompt", kind="too_long",
                           sizes={"max_context": max_context, "prompt_tokens": prompt_len, **asked})
    if params.max_total_tokens is not None:
        wanted = params.max_total_tokens - prompt_len
        if wanted <= 0:
            raise RequestRejected(f"max_total_tokens ({params.max_total_tokens}) leaves no room after the "
                               f"{prompt_len}-token prompt", "max_total_tokens")
    else:
        wanted = params.max_tokens if params.max_tokens is not None else room
    if wanted > room:
        raise RequestRejected(f"the prompt ({prompt_len} tokens) plus max_tokens ({wanted}) exceeds the context of "
                           f"{max_context} tokens", "max_tokens", kind="too_long",
                           sizes={"max_context": max_context, "prompt_tokens": prompt_len, "max_tokens": wanted})
    minimum = params.min_tokens
    if params.min_total_tokens is not None:
        minimum = max(0, params.min_total_tokens - prompt_len)
    return wanted, min(minimum, wanted)


def _seeds(params: SamplingParams, candidates: int) -> list[int]:
    if params.num_beams > 1:  # one search, one generator: every beam row carries the same seed
        seed = secrets.randbits(63) if params.seed is None else params.seed[0]
        return [seed] * candidates
    if params.seed is None:
        return [secrets.randbits(63) for _ in range(candidates)]
    if len(params.seed) == 1:  # one seed for several choices: consecutive seeds, still reproducible
        return [params.seed[0] + i for i in range(candidates)]
    if len(params.seed) != candidates:
        raise RequestRejected(f"seed has {len(params.seed)} values for {candidates} choices", "seed")
    return list(params.seed)


def prepare(request: GenerateRequest, tokenizer, *, vocab_size: int, hidden_size: int, max_context: int,
            max_rows: int, model_eos: list[int], embed, tokenize_bad_words,
            compile_grammar=None, max_token_bytes: int = 0) -> PreparedRequest:
    params = request.params
    if request.priority not in PRIORITIES:  # msgspec checks it on the wire; an in-process caller may not
        raise RequestRejected(f"priority must be one of {', '.join(PRIORITIES)}", "priority")
    validate_params(params)
    validate_beams(request)
    normalise_params(params)
    try:
        check_tools(request)
        ids = _prompt_ids(request, tokenizer, max_context, max_token_bytes)
    except ToolError as exc:
        raise RequestRejected(exc.message, exc.field) from None
    if params.truncate is not None and params.truncate < len(ids):
        ids = ids[len(ids) - params.truncate:]
    if not ids:
        raise RequestRejected("the prompt is empty", "prompt")
    # the lengths first: nothing that grows with the prompt (its embeddings: kilobytes a token) is made for a
    # prompt the context cannot hold
    max_new, min_new = _lengths(params, len(ids), max_context)
    _check_vocabulary(request, ids, vocab_size)
    embeds = _embeddings(request, ids, hidden_size, embed)
    candidates = max(params.best_of or params.n, params.n, params.num_beams)
    if candidates > max_rows:
        raise RequestRejected(f"{candidates} sequences exceed this worker's {max_rows} rows",
                           "num_beams" if params.num_beams > 1 else "n")
    extra_eos = [t for t in params.eos_token_ids + params.stop_token_ids if not 0 <= t < vocab_size]
    if extra_eos:
        raise RequestRejected(f"token id {extra_eos[0]} is outside the vocabulary", "stop_token_ids")
    for field, tokens in (("forced_output_tokens", params.forced_output_tokens), ("logit_bias", params.logit_bias),
                          ("bad_word_tokens", [t for phrase in params.bad_word_tokens for t in phrase])):
        outside = [t for t in tokens if not 0 <= t < vocab_size]
        if outside:  # an index past the batch's score columns would fail every request in the step
            raise RequestRejected(f"token id {outside[0]} is outside the vocabulary (0..{vocab_size - 1})", field)
    eos = [] if params.ignore_eos else sorted(set(model_eos) | set(params.eos_token_ids))
    bad_word_ids = tokenize_bad_words(tokenizer, params.bad_words)
    tools = _tools(request, tokenizer, min_new, compile_grammar)  # last: grammars are the only slow step
    grammar = tools.grammar if tools else _grammar(params, min_new, compile_grammar, request.tenant)
    return PreparedRequest(request, ids, embeds, max_new, min_new, candidates, params.n, _seeds(params, candidates),
                           eos, bad_word_ids, grammar, tools=tools,
                           prediction_ids=_prediction(request, tokenizer, max_context, max_token_bytes))


def _prediction(request: GenerateRequest, tokenizer, max_context: int, max_token_bytes: int) -> list[int] | None:
    """The prediction's tokens, bounded like a prompt: a text the context cannot hold is refused."""
    if not request.prediction:
        return None
    ids = text_ids(tokenizer, request.prediction, add_special_tokens=False, max_context=max_context, truncate=None,
                   max_token_bytes=max_token_bytes, field="prediction")
    if len(ids) > max_context:
        raise RequestRejected(f"the prediction has {len(ids)} tokens; this model's context is {max_context} tokens",
                              "prediction", kind="too_long", sizes={"max_context": max_context})
    return ids


def _tools(request: GenerateRequest, tokenizer, min_new: int, compile_grammar) -> ToolPlan | None:
    if request.tools is None or compile_grammar is None:
        return None
    try:
        return plan_tools(request, tokenizer, min_new, functools.partial(compile_grammar, tenant=request.tenant))
    except GrammarBusy as exc:
        raise RequestRejected(str(exc), "tools", kind="overloaded") from None
    except ToolError as exc:
        raise RequestRejected(exc.message, exc.field) from None


def _grammar(params: SamplingParams, min_new: int, compile_grammar, tenant: str):
    """Compile the structured-output constraint (cached) in the tenant's turn; every problem is a 422 on
    response_format, but a tenant with too many compiles waiting is told to retry (429)."""
    if params.constraint is None or compile_grammar is None:
        return None
    if params.num_beams > 1:
        raise RequestRejected("structured output cannot be combined with beam search (num_beams > 1)",
                              "response_format")
    if min_new > 0:
        raise RequestRejected("min_tokens cannot be combined with structured output: the grammar decides where "
                           "the output ends", "min_tokens")
    try:
        return compile_grammar(params.constraint, tenant=tenant)
    except GrammarBusy as exc:
        raise RequestRejected(str(exc), "response_format", kind="overloaded") from None
    except GrammarError as exc:
        raise RequestRejected(str(exc), "response_format") from None
