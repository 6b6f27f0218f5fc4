"""SGLang native `POST|PUT /generate`: `text` / `input_ids` / `input_embeds` + `sampling_params`.

Lists of prompts come back as a JSON array in order (n > 1: batch x n, flattened). Streams are
cumulative (each event holds the whole text so far) and end with `data: [DONE]`. Body errors are
SGLang's 400 `{"object": "error", ...}`; engine refusals its 400 `{"error": {"message"}}`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.collect import Result
from gateway.dialects.base import Dialect, Meta, Parsed, check, convert, incomplete, sse
from gateway.errors import SluiceError, ValidationFailed
from worker.protocol import (
    Accepted,
    Constraint,
    Done,
    Event,
    Finish,
    GenerateRequest,
    SamplingParams,
    Token,
    TopLogprob,
)

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


class SGLangOutput(msgspec.Struct):
    """Documentation of one output object (rendering builds plain dicts)."""

    text: str
    output_ids: list[int]
    meta_info: dict


class BodyInvalid(ValidationFailed):
    """A request body SGLang's HTTP layer rejects (its 422, remapped to 400)."""

    status = 400


@dataclass
class Options:
    batch: bool  # reply with an array
    n: int
    ids: list[str]  # rid per prompt
    logprob: bool
    top: int
    token_ids: bool
    prompt_from: int | None  # logprob_start_len, None = output only
    with_text: bool
    hidden: bool
    no_stop_trim: list[bool]
    started: float


def _prompts(body: SGLangBody) -> tuple[list[dict], bool]:
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
        batch = [ids] if all(_is_int(t) for t in ids) else ids
        check(all(isinstance(p, list) and p and all(_is_int(t) and t >= 0 for t in p) for p in batch),
              "`input_ids` must be a list of token ids or a list of such lists", "input_ids")
        return [{"prompt_ids": list(p)} for p in batch], batch is ids
    embeds = body.input_embeds
    check(len(embeds) > 0, "`input_embeds` must not be empty", "input_embeds")
    batch = [embeds] if all(isinstance(v, list) and v and all(_is_num(x) for x in v) for v in embeds) else embeds
    check(all(isinstance(p, list) and p and all(isinstance(v, list) and v and all(_is_num(x) for x in v) for v in p)
              for p in batch), "`input_embeds` must be [positions][hidden] numbers (or a list of those)",
          "input_embeds")
    return [{"input_embeds": p} for p in batch], batch is embeds


def logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    result = {}
    for key, value in (bias or {}).items():
        check(key.isdigit(), f"logit_bias key {key!r} is not a token id", "logit_bias")
        result[int(key)] = value
    return result


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _refuse_unsupported(body: SGLangBody) -> None:
    check(body.custom_logit_processor is None, "custom_logit_processor is refused: it is serialized client code "
          "and this server never executes code sent by clients", "custom_logit_processor")
    if body.lora_path is not None:
        names = body.lora_path if isinstance(body.lora_path, list) else [body.lora_path]
        for name in names:
            if isinstance(name, str) and ("/" in name or "\\" in name or name.startswith(".")):
                check(False, f"lora_path {name!r} looks like a filesystem path; only a registered adapter name "
                      "is accepted", "lora_path")
            check(name is None, f"lora_path {name!r} is not a registered adapter (none are registered)",
                  "lora_path")
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
    check(all(stops), "stop strings must not be empty", "stop")
    check(s.stop_regex is None, "stop_regex is not supported by this server", "stop_regex")
    check(s.structural_tag is None, "structural_tag is not supported by this server", "structural_tag")
    check(s.custom_params is None, "custom_params only feed a custom_logit_processor, which is refused",
          "custom_params")
    check(s.spaces_between_special_tokens in (None, True), "spaces_between_special_tokens=false is not supported",
          "spaces_between_special_tokens")
    check(s.stream_interval is None or s.stream_interval >= 1, "stream_interval must be at least 1",
          "stream_interval")
    check(all(t >= 0 for t in s.stop_token_ids or []), "stop_token_ids must be token ids", "stop_token_ids")
    constraints = [(k, v) for k, v in (("json_schema", s.json_schema), ("regex", s.regex), ("ebnf", s.ebnf))
                   if v is not None]
    check(len(constraints) <= 1, "only one of json_schema, regex and ebnf may be set", "json_schema")
    constraint = None
    if constraints:
        kind, value = constraints[0]
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
        logit_bias=logit_bias(s.logit_bias), seed=[s.sampling_seed] if s.sampling_seed is not None else None,
        constraint=constraint, logprobs=top if want_logprob else None,
        prompt_logprobs=want_logprob and start >= 0, prompt_logprobs_start=max(start, 0),
        token_ids_logprob=list(body.token_ids_logprob or []) if want_logprob else [],
        return_hidden_states=bool(body.return_hidden_states))


class SGLang(Dialect):
    name = "sglang"

    def parse(self, payload, route: str) -> Parsed:
        try:
            return self._parse(payload)
        except ValidationFailed as error:
            raise BodyInvalid(error.message, param=error.param) from error

    def _parse(self, payload) -> Parsed:
        body = convert(payload, SGLangBody)
        _refuse_unsupported(body)
        prompts, batched = _prompts(body)
        count = len(prompts)
        raw = body.sampling_params
        per_prompt = raw if isinstance(raw, list) else [raw or SGLangSampling()] * count
        check(len(per_prompt) == count, f"sampling_params has {len(per_prompt)} entries for {count} prompts",
              "sampling_params")
        params = [sampling(s, body) for s in per_prompt]
        check(len({p.n for p in params}) == 1, "every prompt must use the same n", "sampling_params")
        rids = [body.rid] * count if isinstance(body.rid, str) or body.rid is None else body.rid
        check(len(rids) == count, f"rid has {len(rids)} entries for {count} prompts", "rid")
        requests = [GenerateRequest(request_id="", model=body.model or "", params=p, **prompt)
                    for prompt, p in zip(prompts, params)]
        start = body.logprob_start_len if body.logprob_start_len is not None else -1
        options = Options(batch=batched or params[0].n > 1, n=params[0].n, ids=[r or uuid.uuid4().hex for r in rids],
                          logprob=bool(body.return_logprob), top=body.top_logprobs_num or 0,
                          token_ids=bool(body.token_ids_logprob),
                          prompt_from=start if start >= 0 else None,
                          with_text=bool(body.return_text_in_logprobs), hidden=bool(body.return_hidden_states),
                          no_stop_trim=[bool(s.no_stop_trim) for s in per_prompt], started=time.perf_counter())
        reserve = sum(p.n * (p.max_tokens or 0) for p in params)
        return Parsed(body.model or "", requests, bool(body.stream), options, reserve_tokens=reserve)

    # ---- rendering ----

    def _output(self, options: Options, prompt: int, accepted: Accepted | None, tokens: list[Token],
                finish: Finish | None, text: str, ids: list[int], prompt_tokens: int) -> dict:
        meta: dict = {"id": options.ids[prompt], "finish_reason": finish_reason(finish, len(ids)) if finish else None,
                      "prompt_tokens": prompt_tokens, "completion_tokens": len(ids), "cached_tokens": 0,
                      "e2e_latency": round(time.perf_counter() - options.started, 4), "weight_version": "default",
                      **incomplete(finish)}
        if finish is not None and options.no_stop_trim[prompt] and finish.reason == "stop_sequence" \
                and isinstance(finish.matched_stop, str):
            text += finish.matched_stop
        if options.logprob:
            triple = (lambda lp, tid, piece: [lp, tid, piece if options.with_text else None])
            meta["output_token_logprobs"] = [triple(t.logprob, t.token_id, t.piece) for t in tokens]
            details = accepted.prompt_details if accepted and accepted.prompt_details else []
            details = details[options.prompt_from or 0:]
            meta["input_token_logprobs"] = [triple(p.logprob, p.id, p.text) for p in details]
            if options.top:
                meta["output_top_logprobs"] = [_triples(t.top_logprobs or [], triple) for t in tokens]
                meta["input_top_logprobs"] = [_triples(p.top_logprobs, triple) for p in details]
            if options.token_ids:
                meta["output_token_ids_logprobs"] = [_triples(t.token_ids_logprobs, triple) for t in tokens]
                meta["input_token_ids_logprobs"] = [_triples(p.token_ids_logprobs, triple) for p in details]
        if options.hidden:
            meta["hidden_states"] = [t.hidden_state for t in tokens if t.hidden_state is not None]
        return {"text": text, "output_ids": ids, "meta_info": meta}

    def render(self, parsed: Parsed, results: list[Result], meta: Meta) -> Any:
        options: Options = parsed.options
        outputs = []
        for prompt, result in enumerate(results):
            prompt_tokens = result.done.prompt_tokens if result.done else 0
            for choice in result.ordered():
                finish = choice.finish
                outputs.append(self._output(options, prompt, result.accepted, choice.tokens, finish, finish.text,
                                            list(finish.token_ids), prompt_tokens))
        return outputs if options.batch else outputs[0]

    async def stream(self, parsed: Parsed, events: AsyncIterator[tuple[int, Event]], meta: Meta) -> AsyncIterator[bytes]:
        options: Options = parsed.options
        state: dict[tuple[int, int], dict] = {}
        accepted: dict[int, Accepted] = {}
        async for prompt, event in events:
            if isinstance(event, Accepted):
                accepted[prompt] = event
                continue
            if isinstance(event, Done) or not isinstance(event, (Token, Finish)):
                continue
            row = state.setdefault((prompt, event.index), {"text": "", "ids": [], "tokens": []})
            finish = None
            if isinstance(event, Token):
                row["text"] += event.text
                row["ids"].append(event.token_id)
                row["tokens"].append(event)
            else:
                finish = event
            head = accepted.get(prompt)
            output = self._output(options, prompt, head, row["tokens"], finish, row["text"], list(row["ids"]),
                                  head.prompt_tokens if head else 0)
            if options.batch:
                output["index"] = prompt * options.n + event.index
            yield sse(output)
        yield b"data: [DONE]\n\n"

    def error_body(self, error: SluiceError) -> tuple[int, Any]:
        if isinstance(error, BodyInvalid):
            return 400, {"object": "error", "message": error.message, "type": "Bad Request", "param": error.param,
                         "code": 400}
        status = 400 if error.status in (400, 422) else error.status
        return status, {"error": {"message": error.message}}

    def stream_error(self, error: SluiceError) -> bytes:
        return sse({"error": {"message": error.message}}) + b"data: [DONE]\n\n"


def _triples(items: list[TopLogprob] | None, triple) -> list | None:
    return [triple(x.logprob, x.token_id, x.text) for x in items] if items is not None else None


def finish_reason(finish: Finish, length: int) -> dict:
    if finish.reason == "length":
        return {"type": "length", "length": length}
    if finish.reason in ("stop_sequence", "stop_token"):
        return {"type": "stop", "matched": finish.matched_stop}
    if finish.reason == "eos_token":
        return {"type": "stop", "matched": finish.token_ids[-1] if finish.token_ids else None}
    return {"type": "abort", "message": f"the request ended: {finish.reason}"}


SGLANG = SGLang()


def sglang_error(error: SluiceError):
    from gateway.flow import error_response

    return error_response(SGLANG, error)
