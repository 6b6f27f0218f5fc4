"""SGLang native request bodies: the `text` / `input_ids` / `input_embeds` + `sampling_params` structs,
their validation (SGLang's own rules and ranges) and the mapping to the internal SamplingParams; the
tokenize and detokenize bodies."""

from __future__ import annotations

from typing import Any

import msgspec

from common.protocol import Constraint, SamplingParams
from gateway.dialects import bounds
from gateway.dialects.token_ids import int_list, int_lists
from gateway.errors import ValidationFailed
from gateway.serving.dialect import check, unknown_fields

SGLANG_KEYS = {"text", "input_ids", "input_embeds", "sampling_params"}
UNSUPPORTED_INPUTS = ("image_data", "audio_data", "video_data")


class SGLangSampling(msgspec.Struct, kw_only=True):
    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    n: int | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    logit_bias: dict[str, float] | None = None
    sampling_seed: int | None = None
    custom_params: dict | None = None
    stream_interval: int | None = None  # a server pacing hint: this server sends every token


class SGLangBody(msgspec.Struct, kw_only=True):
    text: str | list[str] | None = None
    input_ids: list | None = None  # list[int] or list[list[int]]
    input_embeds: list | None = None  # [positions][hidden] or [prompts][positions][hidden]
    sampling_params: SGLangSampling | list[SGLangSampling] | None = None
    stream: bool | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    token_ids_logprob: list[int] | None = None
    return_text_in_logprobs: bool | None = None
    return_hidden_states: bool | None = None
    image_data: Any = None
    audio_data: Any = None
    video_data: Any = None
    lora_path: Any = None
    custom_logit_processor: Any = None
    session_params: Any = None
    model: str | None = None  # filled in by the route: the first served model


class TokenizeBody(msgspec.Struct, kw_only=True):
    text: str | list[str] | None = None
    prompt: str | list[str] | None = None
    add_special_tokens: bool | None = None
    model: str | None = None


class DetokenizeBody(msgspec.Struct, kw_only=True):
    tokens: list[int]
    skip_special_tokens: bool | None = None
    model: str | None = None


class BodyInvalid(ValidationFailed):
    """A request body SGLang's HTTP layer rejects (its 422, remapped to 400)."""

    status = 400


def prompts_of(body: SGLangBody) -> tuple[list[dict], bool]:
    """The prompts as GenerateRequest fields, and whether the body held a list of them."""
    given = [k for k in ("text", "input_ids", "input_embeds") if getattr(body, k) is not None]
    check(len(given) == 1, "exactly one of `text`, `input_ids` or `input_embeds` is required", "text")
    if body.text is not None:
        texts = [body.text] if isinstance(body.text, str) else body.text
        check(len(texts) > 0 and all(texts), "`text` must be a non-empty string or list of strings", "text")
        return [{"prompt": t} for t in texts], isinstance(body.text, list)
    if body.input_ids is not None:
        ids = body.input_ids
        check(len(ids) > 0, "`input_ids` must not be empty", "input_ids")
        one = int_list(ids, non_negative=True) if not isinstance(ids[0], list) else None
        batch = [one] if one is not None else int_lists(ids, non_negative=True)
        check(batch is not None, "`input_ids` must be a list of token ids or a list of such lists", "input_ids")
        return [{"prompt_ids": p} for p in batch], one is None
    embeds = body.input_embeds
    check(len(embeds) > 0, "`input_embeds` must not be empty", "input_embeds")
    batch = [embeds] if all(isinstance(v, list) and v and all(_is_num(x) for x in v) for v in embeds) else embeds
    check(all(isinstance(p, list) and p and all(isinstance(v, list) and v and all(_is_num(x) for x in v) for v in p)
              for p in batch), "`input_embeds` must be [positions][hidden] numbers (or a list of those)",
          "input_embeds")
    return [{"input_embeds": p} for p in batch], batch is embeds


def refuse_unknown_sampling(payload: Any) -> None:
    """SGLang builds `SamplingParams(**sampling_params)`, so an unknown key there fails the request (a 500 in
    SGLang itself, a 400 naming the key here); unknown top-level keys are ignored, as SGLang's dataclass does."""
    raw = payload.get("sampling_params") if isinstance(payload, dict) else None
    for entry in raw if isinstance(raw, list) else [raw]:
        for name in unknown_fields(entry, SGLangSampling):
            check(False, f"sampling_params got an unexpected keyword argument {name!r}", name)


def _is_num(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def lora_names(body: SGLangBody) -> list:
    return body.lora_path if isinstance(body.lora_path, list) else [body.lora_path] if body.lora_path else []


def lora_adapter(body: SGLangBody) -> str | None:
    """The one registered adapter a body names (a list names one per prompt; they must agree here)."""
    names = set(lora_names(body))
    check(all(n is None or isinstance(n, str) for n in names), "lora_path must be a name or a list of names",
          "lora_path")
    check(len(names) <= 1, "every prompt of a request must use the same lora_path", "lora_path")
    return next(iter(names), None)


def refuse_unsupported(body: SGLangBody) -> None:
    check(body.custom_logit_processor is None, "custom_logit_processor is refused: it is serialized client code "
          "and this server never executes code sent by clients", "custom_logit_processor")
    for name in lora_names(body):
        if isinstance(name, str) and ("/" in name or "\\" in name or name.startswith(".")):
            check(False, f"lora_path {name!r} looks like a filesystem path; only a registered adapter name "
                  "is accepted", "lora_path")
    for field in UNSUPPORTED_INPUTS:
        check(getattr(body, field) is None, f"{field} is not supported by this model", field)
    check(body.session_params is None, "session_params is not supported by this server", "session_params")


def sampling(s: SGLangSampling, body: SGLangBody) -> SamplingParams:
    max_new = s.max_new_tokens if s.max_new_tokens is not None else 128
    check(max_new >= 1, "max_new_tokens must be at least 1 (prefill-only requests are not supported)",
          "max_new_tokens")
    min_new = s.min_new_tokens or 0
    check(0 <= min_new <= max_new, "min_new_tokens must be between 0 and max_new_tokens", "min_new_tokens")
    temperature = s.temperature if s.temperature is not None else 1.0
    check(temperature >= 0, "temperature must be non-negative", "temperature")
    top_p = s.top_p if s.top_p is not None else 1.0
    check(0 < top_p <= 1, "top_p must be in (0, 1]", "top_p")
    top_k = s.top_k if s.top_k is not None else -1
    check(top_k == -1 or top_k >= 1, "top_k must be -1 (disable) or at least 1", "top_k")
    min_p = s.min_p if s.min_p is not None else 0.0
    check(0 <= min_p <= 1, "min_p must be in [0, 1]", "min_p")
    for field in ("frequency_penalty", "presence_penalty"):
        value = getattr(s, field)
        check(value is None or -2 <= value <= 2, f"{field} must be in [-2, 2]", field)
    repetition = s.repetition_penalty if s.repetition_penalty is not None else 1.0
    check(0 < repetition <= 2, "repetition_penalty must be in (0, 2]", "repetition_penalty")
    n = s.n if s.n is not None else 1
    check(1 <= n <= 64, "n must be between 1 and 64", "n")
    stops = [s.stop] if isinstance(s.stop, str) else list(s.stop or [])
    bounds.stops(stops, bounds.MAX_STOPS)
    check(all(stops), "stop strings must not be empty", "stop")
    check(s.stop_regex is None, "stop_regex is not supported by this server", "stop_regex")
    check(s.structural_tag is None, "structural_tag is not supported by this server", "structural_tag")
    check(s.custom_params is None, "custom_params only feed a custom_logit_processor, which is refused",
          "custom_params")
    check(s.spaces_between_special_tokens in (None, True), "spaces_between_special_tokens=false is not supported",
          "spaces_between_special_tokens")
    check(s.stream_interval is None or s.stream_interval >= 1, "stream_interval must be at least 1",
          "stream_interval")
    bounds.at_most(s.stop_token_ids, bounds.MAX_TOKEN_IDS, "stop_token_ids", "token ids")
    check(all(t >= 0 for t in s.stop_token_ids or []), "stop_token_ids must be token ids", "stop_token_ids")
    constraints = [(k, v) for k, v in (("json_schema", s.json_schema), ("regex", s.regex), ("ebnf", s.ebnf))
                   if v is not None]
    check(len(constraints) <= 1, "only one of json_schema, regex and ebnf may be set", "json_schema")
    constraint = None
    if constraints:
        kind, value = constraints[0]
        bounds.grammar(value, kind)
        if kind == "json_schema":
            try:
                check(isinstance(msgspec.json.decode(value), dict), "json_schema must be a JSON object schema",
                      "json_schema")
            except msgspec.DecodeError:
                check(False, "json_schema must be a JSON string holding a schema", "json_schema")
        constraint = Constraint(kind=kind, value=value)
    check(s.sampling_seed is None or 0 <= s.sampling_seed < 2**64, "sampling_seed must be a non-negative integer",
          "sampling_seed")
    top = body.top_logprobs_num or 0
    check(0 <= top <= 20, "top_logprobs_num must be between 0 and 20", "top_logprobs_num")
    bounds.at_most(body.token_ids_logprob, bounds.MAX_TOKEN_IDS, "token_ids_logprob", "token ids")
    check(all(t >= 0 for t in body.token_ids_logprob or []), "token_ids_logprob must be token ids",
          "token_ids_logprob")
    start = body.logprob_start_len if body.logprob_start_len is not None else -1
    check(start >= -1, "logprob_start_len must be -1 (output only) or a prompt position", "logprob_start_len")
    want_logprob = bool(body.return_logprob)
    return SamplingParams(
        max_tokens=max_new, min_tokens=min_new, temperature=0.0 if temperature < 1e-6 else temperature,
        top_p=top_p, top_k=0 if top_k == -1 else top_k, min_p=min_p,
        frequency_penalty=s.frequency_penalty or 0.0, presence_penalty=s.presence_penalty or 0.0,
        repetition_penalty=repetition, stop=stops, stop_token_ids=list(s.stop_token_ids or []),
        ignore_eos=bool(s.ignore_eos), skip_special_tokens=s.skip_special_tokens is not False, n=n,
        logit_bias=bounds.logit_bias(s.logit_bias), seed=[s.sampling_seed] if s.sampling_seed is not None else None,
        constraint=constraint, logprobs=top if want_logprob else None,
        prompt_logprobs=want_logprob and start >= 0, prompt_logprobs_start=max(start, 0),
        token_ids_logprob=list(body.token_ids_logprob or []) if want_logprob else [],
        return_hidden_states=bool(body.return_hidden_states))
