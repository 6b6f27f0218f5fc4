"""How much one request may ask for, in every dialect: the count of each list a body carries and the size of
what it holds. Each prompt opens a worker stream, each choice a batch row, and every ban or bias entry is work
the worker does at every step, so one tenant's request must not hold an unbounded number of them.

The limits live here, one place for every dialect (documented in docs/api.md, "Bounds on one request"); a
dialect whose real server has a tighter rule keeps it (OpenAI's and TGI's 4 stop sequences). A breach is the
dialect's validation error (422, SGLang's 400) naming the field and the limit.
"""

from __future__ import annotations

import json
from collections.abc import Sized

from gateway.serving.dialect import check, fail

MAX_PROMPTS = 128  # prompts in one request (OpenAI `prompt` lists, SGLang `text` / `input_ids` batches)
MAX_SEQUENCES = 256  # prompts x the candidates each one generates (best_of, n or beams): batch rows
MAX_MESSAGES = 1024  # chat `messages`
MAX_STOPS = 16  # stop strings where the dialect has no tighter rule (SGLang)
MAX_STOP_CHARS = 256  # characters of one stop string
MAX_BAD_WORDS = 64  # `bad_words` and `bad_word_tokens` entries: multi-token bans are checked at every step
MAX_BAD_WORD_CHARS = 256  # characters of one `bad_words` entry
MAX_SEQUENCE_TOKENS = 32  # tokens of one `bad_word_tokens` / `stop_tokens` entry
MAX_TOKEN_IDS = 256  # `stop_tokens`, `stop_token_ids`, `eos_token`, `token_ids_logprob` entries
MAX_LOGIT_BIAS = 300  # `logit_bias` entries (OpenAI's own limit)
LOGIT_BIAS_RANGE = 100.0  # every bias in [-100, 100], as OpenAI requires
MAX_DENSE_LOGIT_BIAS = 1 << 18  # TGI's list-shaped `logit_bias` (one bias per token id): at most a vocabulary
# A grammar (JSON schema, regex, EBNF; or a chat request's tool parameter schemas, all together) is compiled by
# the worker: a 1 MB 40,000-value enum took 50 s and 366 MB. Compiles are cached and killed when they overrun
# the worker's grammar_compile_timeout_s; these keep one request's grammar far below that.
MAX_GRAMMAR_BYTES = 65_536  # UTF-8 bytes of the grammar's text (a schema as the JSON it was sent as)
MAX_ENUM_VALUES = 1024  # values of one `enum` in a schema
# `metadata` of a Responses request is stored with the response: OpenAI's own bounds (16 pairs of strings)
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512


def at_most(items: Sized | None, limit: int, param: str, what: str) -> None:
    """`items` holds at most `limit` entries (None = none)."""
    if items is not None and len(items) > limit:
        fail(f"{param} may hold at most {limit} {what}; this request has {len(items)}", param)


def each_at_most(items: list | None, limit: int, param: str, what: str) -> None:
    """Every entry of `items` is at most `limit` long (characters of a string, or tokens of a list)."""
    if items and (longest := max(map(len, items))) > limit:
        fail(f"each {param} entry may be at most {limit} {what} long; one has {longest}", param)


def prompts(count: int, candidates: int, param: str) -> None:
    """A request's prompt count and the sequences they generate together."""
    if count > MAX_PROMPTS:
        fail(f"{param} may hold at most {MAX_PROMPTS} prompts; this request has {count}", param)
    if count * candidates > MAX_SEQUENCES:
        fail(f"{count} prompts x {candidates} candidates each = {count * candidates} sequences; one request may "
             f"generate at most {MAX_SEQUENCES}", param)


def stops(values: list[str], limit: int, param: str = "stop") -> None:
    at_most(values, limit, param, "stop sequences")
    each_at_most(values, MAX_STOP_CHARS, param, "characters")


def bad_words(words: list[str] | None, token_lists: list[list[int]] | None) -> None:
    at_most(words, MAX_BAD_WORDS, "bad_words", "words")
    each_at_most(words, MAX_BAD_WORD_CHARS, "bad_words", "characters")
    at_most(token_lists, MAX_BAD_WORDS, "bad_word_tokens", "token sequences")
    each_at_most(token_lists, MAX_SEQUENCE_TOKENS, "bad_word_tokens", "tokens")


def logit_bias(bias: dict[str, float] | list[float] | None) -> dict[int, float]:
    """`{"<token id>": bias}` (OpenAI), or TGI's list `[bias of token 0, bias of token 1, ...]` (huggingface_hub's
    `logit_bias: list[float]`; zeros are no bias) -> {id: bias}: at most MAX_LOGIT_BIAS biased tokens, each bias
    within the range."""
    if isinstance(bias, list):
        at_most(bias, MAX_DENSE_LOGIT_BIAS, "logit_bias", "entries")
        bias = {str(token): float(value) for token, value in enumerate(bias) if value != 0}
    at_most(bias, MAX_LOGIT_BIAS, "logit_bias", "entries")
    result = {}
    for key, value in (bias or {}).items():
        check(key.isascii() and key.isdigit(), f"logit_bias key {key!r} is not a token id", "logit_bias")
        check(-LOGIT_BIAS_RANGE <= value <= LOGIT_BIAS_RANGE,
              f"logit_bias values must be between {-LOGIT_BIAS_RANGE:g} and {LOGIT_BIAS_RANGE:g}", "logit_bias")
        result[int(key)] = value
    return result


def metadata(pairs: dict | None, param: str = "metadata") -> None:
    """OpenAI's `metadata`: at most MAX_METADATA_PAIRS pairs of strings, keys at most MAX_METADATA_KEY_CHARS and
    values MAX_METADATA_VALUE_CHARS characters. A long key is named by its first characters only."""
    if pairs is None:
        return
    if len(pairs) > MAX_METADATA_PAIRS:
        fail(f"Invalid '{param}': too many properties. Expected an object with at most {MAX_METADATA_PAIRS} "
             f"properties, but got an object with {len(pairs)} properties instead.", param)
    for key, value in pairs.items():
        if len(key) > MAX_METADATA_KEY_CHARS:
            fail(f"Invalid '{param}': key {key[:MAX_METADATA_KEY_CHARS]!r}... too long. Expected a string with "
                 f"maximum length {MAX_METADATA_KEY_CHARS}, but got a string with length {len(key)} instead.", param)
        if not isinstance(value, str):
            fail(f"Invalid type for '{param}.{key}': expected a string, but got {type(value).__name__} instead.",
                 param)
        if len(value) > MAX_METADATA_VALUE_CHARS:
            fail(f"Invalid '{param}.{key}': string too long. Expected a string with maximum length "
                 f"{MAX_METADATA_VALUE_CHARS}, but got a string with length {len(value)} instead.", param)


def grammar(text: str, param: str, schema: object = None) -> None:
    """A constraint's text is at most MAX_GRAMMAR_BYTES, and every enum of its JSON `schema` (when it is one; the
    text is decoded when `schema` is None and the text is JSON) holds at most MAX_ENUM_VALUES values."""
    size = len(text.encode())
    if size > MAX_GRAMMAR_BYTES:
        fail(f"{param} may be at most {MAX_GRAMMAR_BYTES} bytes (MAX_GRAMMAR_BYTES) as JSON or text; this one "
             f"has {size}", param)
    if schema is None:
        try:
            schema = json.loads(text)
        except (ValueError, RecursionError):
            return  # a regex or EBNF grammar; a malformed schema is the worker's 422, which names the problem
    if (widest := _widest_enum(schema)) > MAX_ENUM_VALUES:
        fail(f"an enum in {param} may hold at most {MAX_ENUM_VALUES} values (MAX_ENUM_VALUES); one has {widest}",
             param)


def _widest_enum(schema: object) -> int:
    """The most values of any `enum` in a JSON schema (literal values under const/default/examples skipped).
    Iterative: a schema nested thousands deep is walked, not a RecursionError."""
    widest, stack = 0, [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            for key, value in node.items():
                if key == "enum" and isinstance(value, list):
                    widest = max(widest, len(value))
                elif key not in ("const", "default", "examples"):
                    stack.append(value)
    return widest
