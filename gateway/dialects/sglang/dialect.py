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

from common.protocol import (
    Accepted,
    Done,
    Event,
    Finish,
    GenerateRequest,
    Token,
    TopLogprob,
)
from gateway.dialects import bounds
from gateway.dialects.sglang.request import (
    BodyInvalid,
    SGLangBody,
    SGLangSampling,
    lora_adapter,
    prompts_of,
    refuse_unknown_sampling,
    refuse_unsupported,
    sampling,
)
from gateway.errors import SluiceError, ValidationFailed
from gateway.serving.collect import Result
from gateway.serving.dialect import SSE_DONE, Dialect, Meta, Parsed, check, convert, incomplete, sse


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


class SGLang(Dialect):
    name = "sglang"
    model_optional = True
    reports_failed_choices = True  # finish_reason {"type": "abort", "message"}, as SGLang reports an aborted request

    def parse(self, payload, route: str) -> Parsed:
        try:
            return self._parse(payload)
        except ValidationFailed as error:
            raise BodyInvalid(error.message, param=error.param) from error

    def _parse(self, payload) -> Parsed:
        refuse_unknown_sampling(payload)
        body = convert(payload, SGLangBody)
        refuse_unsupported(body)
        prompts, batched = prompts_of(body)
        count = len(prompts)
        given = next(k for k in ("text", "input_ids", "input_embeds") if getattr(body, k) is not None)
        bounds.prompts(count, 1, given)
        raw = body.sampling_params
        per_prompt = raw if isinstance(raw, list) else [raw or SGLangSampling()] * count
        check(len(per_prompt) == count, f"sampling_params has {len(per_prompt)} entries for {count} prompts",
              "sampling_params")
        params = [sampling(s, body) for s in per_prompt]
        check(len({p.n for p in params}) == 1, "every prompt must use the same n", "sampling_params")
        bounds.prompts(count, params[0].n, "sampling_params")
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
        return Parsed(body.model or "", requests, bool(body.stream), options, adapter=lora_adapter(body),
                      adapter_field="lora_path")

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
            def triple(lp, tid, piece):
                return [lp, tid, piece if options.with_text else None]

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

    async def stream(self, parsed: Parsed, events: AsyncIterator[tuple[int, Event]],
                     meta: Meta) -> AsyncIterator[bytes]:
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
        yield SSE_DONE

    def error_body(self, error: SluiceError) -> tuple[int, Any]:
        if isinstance(error, BodyInvalid):
            return 400, {"object": "error", "message": error.message, "type": "Bad Request", "param": error.param,
                         "code": 400}
        status = 400 if error.status in (400, 422) else error.status
        return status, {"error": {"message": error.message, **error.fields}}

    def stream_error(self, error: SluiceError) -> bytes:
        return sse({"error": {"message": error.message, **error.fields}}) + SSE_DONE


def _triples(items: list[TopLogprob] | None, triple) -> list | None:
    return [triple(x.logprob, x.token_id, x.text) for x in items] if items is not None else None


def finish_reason(finish: Finish, length: int) -> dict:
    if finish.reason == "length":
        return {"type": "length", "length": length}
    if finish.reason in ("stop_sequence", "stop_token"):
        return {"type": "stop", "matched": finish.matched_stop}
    if finish.reason == "eos_token":
        return {"type": "stop", "matched": finish.token_ids[-1] if finish.token_ids else None}
    if finish.reason == "error":
        return {"type": "abort", "message": "the structured-output grammar refused the model's next token"}
    return {"type": "abort", "message": f"the request ended: {finish.reason}"}


SGLANG = SGLang()
