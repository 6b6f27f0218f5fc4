"""The constraint inside the engine: with sampling, penalties, stops, n > 1, cuts, unconstrained neighbours."""

from __future__ import annotations

import json
import re
import time

import jsonschema
import pytest

from common.protocol import Constraint, SamplingParams
from testkit.corpora.grammar import EBNF, EBNF_PATTERN
from tests.worker.grammar.helpers import (
    HANG_GUARD_S,
    ask,
    check_regex_output,
    check_schema_output,
    compiles_held,
    generate,
    schema_constraint,
    submit,
)
from worker.decoding.batch import DecodingBatch
from worker.decoding.rows import RowSpec

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
PROMPT = "Describe a person as JSON."


def test_json_object_parses(grammar_engine):
    finish = generate(grammar_engine, PROMPT, temperature=0.0, max_tokens=300,
                      constraint=Constraint("json_object")).finishes[0]
    if finish.reason != "length":
        assert isinstance(json.loads(finish.text), dict)
    else:
        assert finish.incomplete
    # sampled: a different path through the grammar, still an object
    finish = generate(grammar_engine, "Give a JSON object with two keys.", temperature=1.0, seed=[3], max_tokens=300,
                      constraint=Constraint("json_object")).finishes[0]
    assert finish.incomplete if finish.reason == "length" else isinstance(json.loads(finish.text), dict)


def test_ebnf_grammar(grammar_engine):
    finish = generate(grammar_engine, "Is the sky blue?", temperature=0.7, seed=[1], max_tokens=30,
                      constraint=Constraint("ebnf", EBNF)).finishes[0]
    assert check_regex_output(finish, EBNF_PATTERN)


def test_cut_by_max_tokens_is_length_and_incomplete(grammar_engine):
    finish = generate(grammar_engine, PROMPT, temperature=0.0, max_tokens=4,
                      constraint=schema_constraint(PERSON)).finishes[0]
    assert finish.reason == "length" and finish.incomplete
    assert len(finish.token_ids) == 4
    # an unconstrained row cut the same way is not "incomplete": the flag is about grammars only
    plain = generate(grammar_engine, PROMPT, temperature=0.0, max_tokens=4).finishes[0]
    assert plain.reason == "length" and not plain.incomplete


def test_complete_output_ends_with_eos_and_is_not_incomplete(grammar_engine):
    finish = generate(grammar_engine, PROMPT, temperature=0.0, max_tokens=100,
                      constraint=schema_constraint(PERSON)).finishes[0]
    assert check_schema_output(finish, PERSON)
    assert finish.token_ids[-1] in grammar_engine.model_eos


def test_mixed_batch_leaves_unconstrained_rows_alone(grammar_engine):
    alone = generate(grammar_engine, "Tell me about cats.", temperature=0.0, max_tokens=40).finishes[0]
    runs = []
    for i in range(6):
        runs.append(submit(grammar_engine, ask(PROMPT, temperature=0.8, seed=[i], max_tokens=120,
                                               constraint=schema_constraint(PERSON))))
        runs.append(submit(grammar_engine, ask("Tell me about cats.", temperature=0.0, max_tokens=40)))
    for i, run in enumerate(runs):
        finish = run.wait(HANG_GUARD_S).finishes[0]
        if i % 2:
            assert finish.text == alone.text and not finish.incomplete  # the grammar mask touched no other row
        else:
            assert check_schema_output(finish, PERSON)


def test_n_choices_each_follow_the_grammar(grammar_engine):
    pattern = r"\d{3}-\d{4}"
    finishes = generate(grammar_engine, "A phone number, please.", temperature=1.0, seed=[11], n=4, max_tokens=30,
                        constraint=Constraint("regex", pattern)).finishes
    assert len(finishes) == 4
    assert all(check_regex_output(f, pattern) for f in finishes)
    assert len({f.text for f in finishes}) > 1  # sampled independently, each with its own matcher


def test_best_of_candidates_follow_the_grammar(grammar_engine):
    finishes = generate(grammar_engine, PROMPT, temperature=1.0, seed=[5], n=1, best_of=3, max_tokens=100,
                        constraint=schema_constraint(PERSON)).finishes
    assert len(finishes) == 1 and check_schema_output(finishes[0], PERSON)


def test_penalties_and_warpers_still_apply(grammar_engine):
    base = dict(temperature=0.9, seed=[21], max_tokens=120, constraint=schema_constraint(PERSON))
    plain = generate(grammar_engine, PROMPT, **base).finishes[0]
    tuned = generate(grammar_engine, PROMPT, repetition_penalty=1.3, presence_penalty=1.0, frequency_penalty=0.5,
                     top_k=20, top_p=0.9, min_p=0.05, logit_bias={1: -5.0}, **base).finishes[0]
    assert check_schema_output(plain, PERSON) and check_schema_output(tuned, PERSON)
    assert plain.token_ids != tuned.token_ids  # the processors ran on the constrained row


def test_sampling_is_reproducible_with_a_seed(grammar_engine):
    params = dict(temperature=1.0, seed=[99], max_tokens=100, constraint=schema_constraint(PERSON))
    first = generate(grammar_engine, PROMPT, **params).finishes[0]
    second = generate(grammar_engine, PROMPT, **params).finishes[0]
    assert first.token_ids == second.token_ids


def test_stop_string_cutting_the_output_marks_it_incomplete(grammar_engine):
    finish = generate(grammar_engine, PROMPT, temperature=0.0, max_tokens=100, stop=[","],
                      constraint=schema_constraint(PERSON)).finishes[0]
    assert finish.reason == "stop_sequence" and finish.incomplete
    assert "," not in finish.text


def test_ignore_eos_still_ends_when_the_grammar_completes(grammar_engine):
    finish = generate(grammar_engine, "Yes or no?", temperature=0.0, max_tokens=50, ignore_eos=True,
                      constraint=Constraint("regex", "(yes|no)")).finishes[0]
    assert finish.reason == "eos_token" and not finish.incomplete
    assert finish.text in ("yes", "no")


def test_bans_never_force_an_invalid_token(grammar_engine):
    """Banning every token the grammar allows falls back to the grammar, not to an invalid token."""
    tokenizer = grammar_engine.tokenizer
    pieces = [tokenizer.convert_tokens_to_ids(t) for t in ("x", "xx", "xxx", "xxxx")]
    bans = [[t] for t in pieces if t is not None and t != tokenizer.unk_token_id]
    finish = generate(grammar_engine, "Say x.", temperature=0.0, max_tokens=10, bad_word_tokens=bans,
                      constraint=Constraint("regex", "x{2}")).finishes[0]
    assert finish.reason == "eos_token" and finish.text == "xx"


def test_compiled_grammars_are_cached(grammar_engine):
    compiler = grammar_engine.grammars
    constraint = schema_constraint({"type": "object", "properties": {"cache_probe": {"type": "integer"},
                                                                     "stamp": {"const": time.time()}}})
    assert not compiler.cached(constraint)
    first = compiler.compile(constraint)
    with compiles_held(compiler):  # a second compile could not finish: this one is the cached grammar
        second = compiler.compile(constraint, timeout_s=0.000001)
    assert second is first and compiler.cached(constraint)


def test_compile_timeout_is_a_clear_error(grammar_engine):
    """A caller that stops waiting gets a clear error; the compile goes on and lands in the cache. The compile is
    held (its processes stopped) while the caller waits, so it cannot beat the caller's limit on any machine."""
    from worker.decoding.grammar import GrammarTimeout

    compiler = grammar_engine.grammars
    constraint = schema_constraint({"type": "object", "properties": {f"f{i}": {"type": "string", "format": "email"}
                                                                     for i in range(30)}, "stamp": time.time()})
    with compiles_held(compiler):
        with pytest.raises(GrammarTimeout) as timed_out:
            compiler.compile(constraint, timeout_s=0.05)
    assert "took longer than 0.05 s" in str(timed_out.value)
    deadline = time.monotonic() + HANG_GUARD_S
    while not compiler.cached(constraint):
        assert time.monotonic() < deadline, "the compile never finished"
        time.sleep(0.05)
    assert compiler.compile(constraint, timeout_s=0.000001) is not None  # from the cache, however short the wait


def test_duplicated_rows_fork_their_matcher(grammar_engine):
    """reorder() duplicates (n > 1 forks, beams) get independent grammar states."""
    grammar = grammar_engine.grammars.compile(Constraint("regex", "(ab|ac)d"))
    batch = DecodingBatch(grammar_engine.vocab_size)
    batch.add(RowSpec(SamplingParams(), [1], 0, grammar_engine.model_eos, grammar=grammar))
    tokenizer = grammar_engine.tokenizer
    a, b, c, d = (tokenizer.convert_tokens_to_ids(t) for t in "abcd")
    batch.append([a])
    batch.reorder([0, 0])
    batch.append([b, c])
    scores = batch.process(torch_zeros(2, grammar_engine.vocab_size))
    for row in range(2):
        allowed = (scores[row] > -float("inf")).nonzero().flatten().tolist()
        assert allowed == [d], allowed  # each fork continues from its own "ab" / "ac"
    batch.append([d, d])
    assert all(r.grammar.accepted for r in batch.rows)


def torch_zeros(*shape):
    import torch
    return torch.zeros(*shape)


def test_json_schema_draft_validation_of_a_cached_grammar_output(grammar_engine):
    """The same schema reused by a later request (cache hit) still constrains."""
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 3, "maxItems": 3}
    for seed in (1, 2):
        finish = generate(grammar_engine, "Three digits as a JSON list.", temperature=1.0, seed=[seed], max_tokens=40,
                          constraint=schema_constraint(schema)).finishes[0]
        assert check_schema_output(finish, schema)
        jsonschema.validate(json.loads(finish.text), schema)
        assert re.fullmatch(r"\[\d, \d, \d\]", finish.text)
