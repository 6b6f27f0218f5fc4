"""Sanity rules on SamplingParams that hold for every dialect (the dialects add their own on top).

Each rule names the offending field, so every dialect can render a precise 4xx. The float bounds keep
the scores of a step finite in float32: a penalty of 1e-300 is 0 there and divides logits into NaN,
a bias of 1e39 is +inf, and `length ** length_penalty` leaves the float range for long outputs.
"""

from __future__ import annotations

import math

from common.protocol import SamplingParams
from worker.engine.prepare_errors import RequestRejected

MAX_STOPS = 16
MAX_STOP_LENGTH = 256
MAX_LOGPROBS = 20
FLOAT32_MAX = 3.4028234663852886e38
MIN_TEMPERATURE = 0.01  # a lower positive temperature samples at this one, as vLLM does (see normalise_params)
PENALTY_RANGE = (1e-4, 1e4)  # repetition penalties divide or multiply logits
MAX_SCORE_SHIFT = 1e4  # |logit_bias| and watermark delta: -1e4 already bans a token, +1e4 forces it
# |cumulative logprob| x length ** |penalty| stays below float32's maximum for outputs up to 2^22 tokens
MAX_LENGTH_PENALTY = 5.0
FLOAT_FIELDS = ("temperature", "top_p", "min_p", "typical_p", "xtc_threshold", "xtc_probability",
                "repetition_penalty", "presence_penalty", "frequency_penalty", "encoder_repetition_penalty",
                "length_penalty")


def _require(condition: bool, message: str, field: str) -> None:
    if not condition:
        raise RequestRejected(message, field)


def _float32(value: float) -> bool:
    return math.isfinite(value) and abs(value) <= FLOAT32_MAX


def validate_params(params: SamplingParams) -> None:
    for field in FLOAT_FIELDS:
        _require(_float32(getattr(params, field)), f"{field} must be a finite number", field)
    _require(not (params.max_tokens is not None and params.max_total_tokens is not None),
             "max_tokens and max_total_tokens are mutually exclusive", "max_total_tokens")
    _require(not (params.min_tokens and params.min_total_tokens is not None),
             "min_tokens and min_total_tokens are mutually exclusive", "min_total_tokens")
    # 0: score the prompt only (OpenAI's echo with max_tokens 0); the dialects decide who may ask for it
    _require(params.max_tokens is None or params.max_tokens >= 0, "max_tokens must not be negative", "max_tokens")
    _require(params.max_total_tokens is None or params.max_total_tokens >= 1,
             "max_total_tokens must be at least 1", "max_total_tokens")
    _require(params.min_tokens >= 0, "min_tokens must not be negative", "min_tokens")
    _require(params.min_total_tokens is None or params.min_total_tokens >= 0,
             "min_total_tokens must not be negative", "min_total_tokens")
    _require(params.max_tokens is None or params.min_tokens <= params.max_tokens,
             "min_tokens must not exceed max_tokens", "min_tokens")
    _require(params.truncate is None or params.truncate >= 1, "truncate must be at least 1", "truncate")
    _require(params.temperature >= 0, "temperature must not be negative", "temperature")
    _require(params.top_k >= -1, "top_k must be -1, 0 (off) or positive", "top_k")
    _require(0 < params.top_p <= 1, "top_p must be in (0, 1]", "top_p")
    _require(0 <= params.min_p <= 1, "min_p must be in [0, 1]", "min_p")
    for field in ("xtc_threshold", "xtc_probability"):
        _require(0 <= getattr(params, field) <= 1, f"{field} must be in [0, 1]", field)
    _require(0 < params.typical_p <= 1, "typical_p must be in (0, 1]", "typical_p")
    low, high = PENALTY_RANGE
    for field in ("repetition_penalty", "encoder_repetition_penalty"):
        _require(low <= getattr(params, field) <= high, f"{field} must be between {low:g} and {high:g}", field)
    for field in ("presence_penalty", "frequency_penalty"):
        _require(-2 <= getattr(params, field) <= 2, f"{field} must be between -2 and 2", field)
    for field in ("no_repeat_ngram_size", "encoder_no_repeat_ngram_size"):
        _require(getattr(params, field) >= 0, f"{field} must not be negative", field)
    _require(params.n >= 1, "n must be at least 1", "n")
    _require(params.best_of is None or params.best_of >= params.n, "best_of must be at least n", "best_of")
    _require(len(params.stop) <= MAX_STOPS, f"at most {MAX_STOPS} stop sequences are allowed", "stop")
    _require(all(0 < len(s) <= MAX_STOP_LENGTH for s in params.stop),
             f"stop sequences must be 1 to {MAX_STOP_LENGTH} characters", "stop")
    _require(params.logprobs is None or 0 <= params.logprobs <= MAX_LOGPROBS,
             f"logprobs must be between 0 and {MAX_LOGPROBS}", "logprobs")
    _require(all(phrase for phrase in params.bad_words), "bad_words must not contain empty phrases", "bad_words")
    _require(all(tokens for tokens in params.bad_word_tokens), "bad_word_tokens entries must not be empty",
             "bad_word_tokens")
    _require(params.seed is None or all(0 <= s < 2**64 for s in params.seed), "seeds must be unsigned 64-bit",
             "seed")
    _require(all(_float32(b) and abs(b) <= MAX_SCORE_SHIFT for b in params.logit_bias.values()),
             f"logit_bias values must be between -{MAX_SCORE_SHIFT:g} and {MAX_SCORE_SHIFT:g}", "logit_bias")
    _require(abs(params.length_penalty) <= MAX_LENGTH_PENALTY,
             f"length_penalty must be between -{MAX_LENGTH_PENALTY:g} and {MAX_LENGTH_PENALTY:g}", "length_penalty")
    if params.watermark is not None:
        _require(0 < params.watermark.gamma < 1, "watermark gamma must be in (0, 1)", "watermark")
        _require(0 <= params.watermark.delta <= MAX_SCORE_SHIFT,
                 f"watermark delta must be between 0 and {MAX_SCORE_SHIFT:g}", "watermark")


def normalise_params(params: SamplingParams) -> None:
    """In place, after validation: a positive temperature below MIN_TEMPERATURE becomes MIN_TEMPERATURE
    (logits / 1e-300 is +-inf in float32, and sampling from it is noise, not near-greedy)."""
    if 0 < params.temperature < MIN_TEMPERATURE:
        params.temperature = MIN_TEMPERATURE
