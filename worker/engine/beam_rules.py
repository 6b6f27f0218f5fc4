"""What a beam search request may ask for; checked in `prepare`, so every dialect answers 422 naming
the field. The rules follow FriendliAI's completions (num_beams 1-31, n <= num_beams, no stop strings
and no streaming with beams, DETERMINISTIC without top_k / top_p)."""

from __future__ import annotations

from common.protocol import GenerateRequest
from worker.engine.prepare_errors import RequestRejected

MAX_BEAMS = 31


def _require(condition: bool, message: str, field: str) -> None:
    if not condition:
        raise RequestRejected(message, field)


def validate_beams(request: GenerateRequest) -> None:
    params = request.params
    _require(1 <= params.num_beams <= MAX_BEAMS, f"num_beams must be between 1 and {MAX_BEAMS}", "num_beams")
    _require(params.beam_compat_pre_normalization or not params.beam_compat_no_post_normalization,
             "beam_compat_no_post_normalization is only valid with beam_compat_pre_normalization",
             "beam_compat_no_post_normalization")
    if params.num_beams == 1:
        return
    _require(params.n <= params.num_beams, f"n ({params.n}) must not exceed num_beams ({params.num_beams})", "n")
    _require(params.best_of is None or params.best_of == params.n, "best_of cannot be combined with num_beams",
             "best_of")
    _require(not request.stream, "beam search results cannot be streamed; set stream to false", "stream")
    _require(not params.stop, "stop strings are not supported with beam search; use stop tokens", "stop")
    _require(params.seed is None or len(params.seed) == 1, "beam search takes a single seed", "seed")
    _require(params.constraint is None, "structured output cannot be combined with beam search (num_beams > 1)",
             "response_format")
    if params.beam_search_type == "DETERMINISTIC":
        _require(params.top_k <= 0, "DETERMINISTIC beam search does not allow top_k", "top_k")
        _require(params.top_p >= 1.0, "DETERMINISTIC beam search does not allow top_p", "top_p")
    else:
        _require(params.temperature > 0, f"{params.beam_search_type} beam search needs a temperature above 0",
                 "temperature")
