"""The continuous-batching engine on the real SmolLM2 weights, checked against transformers generate()."""

from __future__ import annotations

import time

import pytest
import torch

from tests.worker.engine.runs import generate, request, running_engine, submit
from worker.engine.prepare import RequestRejected

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "List three colors:",
           "Water boils at", "My favourite programming language is"]


def reference(smol, prompt: str, max_new_tokens: int, **kwargs) -> list[int]:
    ids = smol.tokenizer(prompt).input_ids
    with torch.inference_mode():
        out = smol.model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                  pad_token_id=smol.tokenizer.eos_token_id, **kwargs)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_transformers_generate(engine, smol, prompt):
    run = generate(engine, prompt, max_tokens=24, temperature=0)
    assert run.finishes[0].token_ids == reference(smol, prompt, 24)


def test_greedy_parity_while_sharing_the_batch_with_seven_other_settings(engine, smol):
    others = [
        request("Tell me a story", max_tokens=40, temperature=0.9, top_p=0.8, seed=[1]),
        request("Numbers:", max_tokens=30, temperature=1.2, top_k=20, seed=[2], n=2),
        request("Hello", max_tokens=25, temperature=0.7, repetition_penalty=1.3, seed=[3]),
        request("The weather", max_tokens=35, temperature=0, no_repeat_ngram_size=2),
        request("Poem:", max_tokens=20, temperature=1.0, min_p=0.1, presence_penalty=1.0, seed=[4]),
        request("Cats and dogs", max_tokens=28, temperature=0.5, typical_p=0.9, frequency_penalty=0.5, seed=[5]),
        request("Recipe", max_tokens=22, temperature=0, bad_words=["the"], stop=["\n\n"]),
    ]
    background = [submit(engine, r) for r in others]
    target = request(PROMPTS[0], max_tokens=24, temperature=0)
    run = submit(engine, target).wait()
    for other in background:
        other.wait()
    assert run.finishes[0].token_ids == reference(smol, PROMPTS[0], 24)


def test_penalised_greedy_matches_transformers(engine, smol):
    prompt = "The weather today is"
    run = generate(engine, prompt, max_tokens=20, temperature=0, repetition_penalty=1.4, no_repeat_ngram_size=3)
    assert run.finishes[0].token_ids == reference(smol, prompt, 20, repetition_penalty=1.4, no_repeat_ngram_size=3)


def test_streamed_tokens_add_up_to_the_final_text(engine, smol):
    run = generate(engine, "Write a haiku about rain:", max_tokens=30, temperature=0.8, seed=[11])
    finish = run.finishes[0]
    tokens = run.tokens()
    assert [t.token_id for t in tokens] == finish.token_ids
    assert "".join(t.text for t in tokens) == finish.text
    assert smol.tokenizer.decode(finish.token_ids, skip_special_tokens=True).startswith(finish.text)


def test_same_seed_same_tokens_whatever_shares_the_batch(engine):
    alone = generate(engine, "Once upon a time", max_tokens=20, temperature=1.0, seed=[1234]).finishes[0]
    crowd = [submit(engine, request(p, max_tokens=30, temperature=1.0, seed=[i])) for i, p in enumerate(PROMPTS)]
    shared = submit(engine, request("Once upon a time", max_tokens=20, temperature=1.0, seed=[1234]))
    assert shared.wait().finishes[0].token_ids == alone.token_ids
    for run in crowd:
        run.wait()


def test_n_choices_are_seeded_and_distinct(engine):
    run = generate(engine, "Name a fruit:", max_tokens=12, temperature=1.0, n=3, seed=[5])
    assert [f.index for f in run.finishes] == [0, 1, 2]
    assert run.accepted.seeds == [5, 6, 7]
    assert len({tuple(f.token_ids) for f in run.finishes}) > 1
    again = generate(engine, "Name a fruit:", max_tokens=12, temperature=1.0, n=3, seed=[5])
    assert [f.token_ids for f in again.finishes] == [f.token_ids for f in run.finishes]
    assert run.done.completion_tokens == sum(len(f.token_ids) for f in run.finishes)


def test_best_of_returns_the_most_likely_and_bills_every_candidate(engine):
    run = generate(engine, "A short sentence:", max_tokens=10, temperature=1.0, n=1, best_of=4, seed=[9])
    assert len(run.finishes) == 1
    assert not run.tokens()  # candidates stay private until the best is known
    candidates = [generate(engine, "A short sentence:", max_tokens=10, temperature=1.0, seed=[9 + i]).finishes[0]
                  for i in range(4)]
    best = max(candidates, key=lambda f: f.cumulative_logprob)
    assert run.finishes[0].token_ids == best.token_ids
    assert run.done.compute_tokens == sum(len(c.token_ids) for c in candidates)
    assert run.done.completion_tokens == len(best.token_ids)


def test_stop_string_is_excluded_and_reported(engine):
    free = generate(engine, "The capital of France is", max_tokens=20, temperature=0).finishes[0]
    stop = free.text[5:9]
    run = generate(engine, "The capital of France is", max_tokens=20, temperature=0, stop=[stop])
    finish = run.finishes[0]
    assert finish.reason == "stop_sequence" and finish.matched_stop == stop
    assert finish.text == free.text.split(stop)[0]
    assert "".join(t.text for t in run.tokens()) == finish.text


def test_stop_token_ids_and_ignore_eos_with_min_tokens(engine):
    free = generate(engine, "The capital of France is", max_tokens=10, temperature=0).finishes[0]
    run = generate(engine, "The capital of France is", max_tokens=10, temperature=0, stop_token_ids=[free.token_ids[2]])
    assert run.finishes[0].reason == "stop_token"
    assert run.finishes[0].token_ids == free.token_ids[:3]
    long = generate(engine, "Hi", max_tokens=40, min_tokens=40, temperature=0, ignore_eos=True).finishes[0]
    assert len(long.token_ids) == 40 and long.reason == "length"


def test_chat_messages_use_the_template(engine, smol):
    messages = [{"role": "user", "content": "What is 2+2?"}]
    run = generate(engine, messages=messages, max_tokens=12, temperature=0)
    expected = smol.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert run.accepted.prompt_ids == smol.tokenizer(expected, add_special_tokens=False).input_ids


def test_truncate_keeps_the_last_prompt_tokens(engine, smol):
    prompt = "one two three four five six seven eight nine ten"
    run = generate(engine, prompt, max_tokens=3, temperature=0, truncate=4)
    assert run.accepted.prompt_ids == smol.tokenizer(prompt).input_ids[-4:]


def test_prompt_logprobs_match_a_full_forward(engine, smol):
    prompt = "The quick brown fox jumps over the lazy dog"
    run = generate(engine, prompt, max_tokens=1, temperature=0, prompt_logprobs=True)
    details = run.accepted.prompt_details
    ids = smol.tokenizer(prompt).input_ids
    with torch.inference_mode():
        logits = smol.model(torch.tensor([ids], device=smol.model.device)).logits[0].float()
    expected = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:], device=logits.device)[:, None])[:, 0]
    expected = expected.cpu()
    assert details[0].logprob is None
    assert [d.id for d in details] == ids
    assert torch.allclose(torch.tensor([d.logprob for d in details[1:]]), expected, atol=1e-4)
    assert details[0].top_logprobs is None and details[1].top_logprobs is None


def test_max_tokens_zero_scores_the_prompt_and_generates_nothing(engine):
    """OpenAI's echo scoring (`max_tokens: 0`): the prompt's logprobs as a generating request gets them, then
    empty choices ending with "length", no completion tokens billed; the engine serves the next request as usual."""
    prompt = "The quick brown fox jumps over the lazy dog"
    scored = generate(engine, prompt, max_tokens=0, n=2, prompt_logprobs=True, logprobs=1)
    generated = generate(engine, prompt, max_tokens=1, temperature=0, prompt_logprobs=True, logprobs=1)
    assert [d.id for d in scored.accepted.prompt_details] == [d.id for d in generated.accepted.prompt_details]
    assert [d.logprob for d in scored.accepted.prompt_details[1:]] == pytest.approx(
        [d.logprob for d in generated.accepted.prompt_details[1:]], abs=1e-4)
    assert [(f.index, f.reason, f.text, f.token_ids) for f in scored.finishes] == [(0, "length", "", []),
                                                                                  (1, "length", "", [])]
    assert (scored.done.completion_tokens, scored.done.compute_tokens) == (0, 0) and not scored.tokens()
    assert generated.finishes[0].token_ids and generated.done.completion_tokens == 1


def test_prompt_top_and_requested_logprobs_match_a_full_forward(engine, smol):
    prompt = "The quick brown fox jumps over the lazy dog"
    ids = smol.tokenizer(prompt).input_ids
    asked = [ids[2], 5, smol.tokenizer.vocab_size + 10]  # the last is outside the vocabulary: skipped
    run = generate(engine, prompt, max_tokens=1, temperature=0, prompt_logprobs=True, prompt_logprobs_start=2,
                   logprobs=3, token_ids_logprob=asked)
    details = run.accepted.prompt_details
    with torch.inference_mode():
        expected = torch.log_softmax(smol.model(torch.tensor([ids], device=smol.model.device)).logits[0].float(), -1)
    expected = expected.cpu()
    assert all(d.logprob is None and d.top_logprobs is None and d.token_ids_logprobs is None for d in details[:2])
    for position, detail in enumerate(details[2:], start=2):
        row = expected[position - 1]  # the logits that predicted this position
        top = row.topk(3)
        assert [t.token_id for t in detail.top_logprobs] == top.indices.tolist()
        assert torch.allclose(torch.tensor([t.logprob for t in detail.top_logprobs]), top.values, atol=1e-4)
        assert detail.top_logprobs[0].text == smol.tokenizer.decode([top.indices[0].item()])
        assert [t.token_id for t in detail.token_ids_logprobs] == asked[:2]
        assert torch.allclose(torch.tensor([t.logprob for t in detail.token_ids_logprobs]), row[asked[:2]], atol=1e-4)


def test_logprobs_and_top_alternatives(engine):
    run = generate(engine, "The capital of France is", max_tokens=5, temperature=0, logprobs=3)
    for token in run.tokens():
        assert len(token.top_logprobs) == 3
        assert token.top_logprobs[0].token_id == token.token_id  # greedy picks the most likely
        assert token.logprob == pytest.approx(token.top_logprobs[0].logprob, abs=1e-5)
        assert token.piece is not None


def test_input_embeddings_reproduce_the_token_prompt(engine, smol):
    prompt = "The capital of France is"
    ids = smol.tokenizer(prompt).input_ids
    with torch.inference_mode():
        embeds = smol.model.get_input_embeddings()(torch.tensor(ids, device=smol.model.device)).tolist()
    by_ids = generate(engine, prompt, max_tokens=8, temperature=0).finishes[0]
    by_embeds = generate(engine, input_embeds=embeds, max_tokens=8, temperature=0).finishes[0]
    assert by_embeds.token_ids == by_ids.token_ids
    hidden = len(embeds[0])
    same = generate(engine, prompt, max_tokens=8, temperature=0, token_index_to_replace=[1],
                    embedding_to_replace=embeds[1]).finishes[0]
    assert same.token_ids == by_ids.token_ids
    changed = generate(engine, prompt, max_tokens=8, temperature=0, token_index_to_replace=[1, 2, 3],
                       embedding_to_replace=[0.5] * (3 * hidden)).finishes[0]
    assert changed.token_ids != by_ids.token_ids


def test_hidden_states_and_output_logits(engine, smol):
    run = generate(engine, "Hi", max_tokens=3, temperature=0, return_hidden_states=True, include_output_logits=True)
    for token in run.tokens():
        assert len(token.hidden_state) == smol.model.config.hidden_size
        assert len(token.logits) == smol.model.config.vocab_size
        assert max(range(len(token.logits)), key=token.logits.__getitem__) == token.token_id


def test_cancellation_frees_rows_within_a_step(engine):
    run = submit(engine, request("Count to a thousand:", max_tokens=1500, temperature=0.8, ignore_eos=True, seed=[1]))
    deadline = time.monotonic() + 60
    while not run.tokens() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.load().running_rows == 1
    engine.cancel(run.request_id)
    run.wait(60)
    assert engine.load().running_rows == 0
    assert run.done.completion_tokens >= 1


@pytest.mark.parametrize(("params", "field"), [
    ({"max_tokens": 5, "max_total_tokens": 20}, "max_total_tokens"),
    ({"min_tokens": 2, "min_total_tokens": 5}, "min_total_tokens"),
    ({"n": 3, "best_of": 2}, "best_of"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"no_repeat_ngram_size": -2}, "no_repeat_ngram_size"),
    ({"stop": ["x"] * 17}, "stop"),
    ({"logprobs": 50}, "logprobs"),
    ({"seed": [1, 2], "n": 3}, "seed"),
    ({"max_tokens": 5000}, "max_tokens"),
    ({"max_total_tokens": 2}, "max_total_tokens"),
    ({"n": 40}, "n"),
])
def test_invalid_parameters_are_refused_naming_the_field(engine, params, field):
    with pytest.raises(RequestRejected) as refused:
        engine.prepare(request("Hello there", **params))
    assert refused.value.field == field
    assert refused.value.message


def test_over_long_prompt_is_refused(engine):
    with pytest.raises(RequestRejected) as refused:
        engine.prepare(request(prompt_ids=[42] * 2048, max_tokens=1))
    assert refused.value.kind == "too_long"
    sizes = refused.value.event()  # what the gateway needs to word it as each dialect does
    assert sizes.prompt_tokens == 2048 and 0 < sizes.max_context <= 2048 and sizes.max_tokens in (None, 1)
    with pytest.raises(RequestRejected):
        engine.prepare(request(prompt_ids=[49152], max_tokens=1))


def test_missed_deadline_is_a_timeout_error(engine):
    """Not "overloaded": SDKs retry that automatically, and a retry with the same deadline misses it again."""
    run = submit(engine, request("Slow", max_tokens=500, ignore_eos=True, temperature=0,
                                 deadline_unix=time.time() + 0.2)).wait(30)
    errors = [e for e in run.events if type(e).__name__ == "Error"]
    assert errors and errors[0].kind == "timeout"
    assert engine.load().running_rows == 0


def test_rows_move_after_the_cache_grew(engine, smol):
    """A row that outgrows the initial cache, then finishes before a later row: the later row is moved
    into its slot. Regression: growth inside inference mode made that move fail the whole batch."""
    long_prompt = smol.tokenizer("word " * 300).input_ids[:300]
    first = submit(engine, request(prompt_ids=long_prompt, max_tokens=8, temperature=0))
    second = submit(engine, request("The capital of France is", max_tokens=30, temperature=0))
    assert first.wait().finishes[0].reason in ("length", "eos_token")
    assert second.wait().finishes[0].token_ids == reference(smol, "The capital of France is", 30)
    assert not [e for e in first.events + second.events if type(e).__name__ == "Error"]


def test_accepted_reports_validation_and_queue_time(smol):
    """With one row, a request submitted behind another cannot start before the first finishes: it
    reports the wait as queue time, and every request reports how long its own validation took."""
    with running_engine(smol, "queue-test", max_batch_size=1, max_context=512) as single:
        first = submit(single, request("Count slowly:", max_tokens=24, temperature=0, ignore_eos=True))
        second = submit(single, request("Then", max_tokens=1, temperature=0))
        first.wait(), second.wait()
    assert first.accepted.validation_time_s > 0 and second.accepted.validation_time_s > 0
    assert second.accepted.queue_time_s > first.accepted.queue_time_s
