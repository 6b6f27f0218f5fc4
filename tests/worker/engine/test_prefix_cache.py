"""Prefix caching (worker/engine/prefix_cache.py) on a tiny random Llama: a prompt served from a cached
prefix gives what transformers `generate()` and an engine without the cache give (greedy, seeded
sampling, beams, LoRA), the cache is partitioned per tenant and per adapter, bounded, and can be off."""

from __future__ import annotations

import msgspec
import pytest
import torch

from common.protocol import AdapterRef, ModelConfig
from gateway.config import load_settings
from testkit.lora_adapters import write_adapter
from testkit.tiny_model import tiny_llama
from tests.worker.beam.helpers import beam_reference
from tests.worker.engine.runs import request, running_engine, submit
from tests.worker.lora.adapters import greedy, merged
from worker.engine.prefix_cache import BLOCK

SYSTEM = ("You are a terse assistant for a bicycle shop. Answer in one sentence, name the part, quote the price "
          "from the list, and never promise a delivery date. Parts: chain 20, brake pads 12, tube 6, tyre 30. ")
QUESTIONS = ["What does a new chain cost?", "Do you sell tubes?", "My brakes squeal, what should I buy?"]


@pytest.fixture(scope="module")
def tiny(smol):
    return tiny_llama(smol.tokenizer, seed=3)


@pytest.fixture(scope="module")
def adapter(tiny, tmp_path_factory):
    directory = write_adapter(tiny.model, tmp_path_factory.mktemp("prefix-lora") / "shop", 5)
    return AdapterRef(name="shop", source=str(directory))


@pytest.fixture(scope="module")
def engines(tiny):
    """The same engine with and without the cache; small prefill chunks, so prompts also span chunks."""
    common = dict(max_batch_size=8, max_context=256, max_batched_tokens=24, decode_threads=2)
    with running_engine(tiny, "cached", **common) as cached, \
            running_engine(tiny, "uncached", prefix_cache_bytes=0, **common) as uncached:
        yield cached, uncached


def run(engine, prompt, tenant="team-a", adapter=None, **params):
    generate = request(prompt, tenant=tenant, **params)
    generate.adapter = adapter
    return submit(engine, generate, strict=True).wait()


def logprobs(result) -> list[float]:
    return [token.logprob for token in result.tokens()]


def test_a_shared_prefix_is_reused_and_the_greedy_output_equals_generate(tiny, engines):
    cached, uncached = engines
    eos = tiny.tokenizer.eos_token_id
    first = run(cached, SYSTEM + QUESTIONS[0], max_tokens=12, temperature=0, logprobs=0)
    assert first.done.cached_tokens == 0
    for question in QUESTIONS[1:]:
        ids = tiny.tokenizer(SYSTEM + question).input_ids
        hit = run(cached, SYSTEM + question, max_tokens=12, temperature=0, logprobs=0)
        shared = len(tiny.tokenizer(SYSTEM).input_ids)
        assert shared - BLOCK < hit.done.cached_tokens <= shared and hit.done.cached_tokens % BLOCK == 0
        assert hit.finishes[0].token_ids == greedy(tiny.model, ids, 12, eos)
        plain = run(uncached, SYSTEM + question, max_tokens=12, temperature=0, logprobs=0)
        assert plain.done.cached_tokens == 0
        assert hit.finishes[0].token_ids == plain.finishes[0].token_ids
        assert logprobs(hit) == pytest.approx(logprobs(plain), abs=1e-5)
    # the same prompt again: everything but its last token comes from the cache
    again = run(cached, SYSTEM + QUESTIONS[0], max_tokens=12, temperature=0, logprobs=0)
    whole = len(tiny.tokenizer(SYSTEM + QUESTIONS[0]).input_ids) - 1
    assert again.done.cached_tokens == whole // BLOCK * BLOCK
    assert again.finishes[0].token_ids == first.finishes[0].token_ids
    assert logprobs(again) == pytest.approx(logprobs(first), abs=1e-5)


def test_seeded_sampling_and_beams_from_the_cache_equal_the_uncached_engine(tiny, engines):
    cached, uncached = engines
    prompt = SYSTEM + QUESTIONS[2]
    run(cached, prompt, max_tokens=2, temperature=0)  # the prefix is cached now
    sampled = dict(max_tokens=16, temperature=0.9, top_p=0.95, seed=[11], n=2, logprobs=0)
    hit, plain = run(cached, prompt, **sampled), run(uncached, prompt, **sampled)
    assert hit.done.cached_tokens > 0
    assert [f.token_ids for f in hit.finishes] == [f.token_ids for f in plain.finishes]
    for index in range(2):
        assert [t.logprob for t in hit.tokens(index)] == pytest.approx([t.logprob for t in plain.tokens(index)],
                                                                       abs=1e-5)
    beams = dict(num_beams=3, n=2, max_tokens=8)
    hit, plain = run(cached, prompt, **beams), run(uncached, prompt, **beams)
    assert hit.done.cached_tokens > 0
    expected, scores = beam_reference(tiny.model, tiny.tokenizer(prompt).input_ids, beams,
                                      [tiny.tokenizer.eos_token_id])
    assert [f.token_ids for f in hit.finishes] == [f.token_ids for f in plain.finishes] == expected
    assert [f.score for f in hit.finishes] == pytest.approx(scores, abs=1e-3)
    assert [f.cumulative_logprob for f in hit.finishes] == pytest.approx(
        [f.cumulative_logprob for f in plain.finishes], abs=1e-5)


def test_an_adapter_never_reuses_the_base_models_prefix(tiny, engines, adapter):
    cached, _ = engines
    prompt = SYSTEM + QUESTIONS[1]
    run(cached, prompt, tenant="lora-team", max_tokens=2, temperature=0)  # the base model's KV is cached
    adapted = run(cached, prompt, tenant="lora-team", adapter=adapter, max_tokens=10, temperature=0)
    assert adapted.done.cached_tokens == 0
    ids = tiny.tokenizer(prompt).input_ids
    expected = greedy(merged(tiny.model, adapter_dir(adapter)), ids, 10, tiny.tokenizer.eos_token_id)
    assert adapted.finishes[0].token_ids == expected
    again = run(cached, SYSTEM + QUESTIONS[0], tenant="lora-team", adapter=adapter, max_tokens=10, temperature=0)
    assert again.done.cached_tokens > 0  # the adapter's own prefix
    assert again.finishes[0].token_ids == greedy(merged(tiny.model, adapter_dir(adapter)),
                                                 tiny.tokenizer(SYSTEM + QUESTIONS[0]).input_ids, 10,
                                                 tiny.tokenizer.eos_token_id)


def adapter_dir(ref: AdapterRef):
    from pathlib import Path

    return Path(ref.source)


def test_one_tenants_cached_prefix_is_not_reused_for_another(engines):
    cached, _ = engines
    prompt = "Confidential: the merger with Initech closes on Friday. " * 3 + "Summarise."
    before = cached.load().prefix_cache
    assert run(cached, prompt, tenant="team-a", max_tokens=1).done.cached_tokens == 0
    assert run(cached, prompt, tenant="team-b", max_tokens=1).done.cached_tokens == 0  # B prefills it all
    assert run(cached, prompt, tenant="team-a", max_tokens=1).done.cached_tokens > 0
    assert run(cached, prompt, tenant="team-b", max_tokens=1).done.cached_tokens > 0  # now B's own copy
    after = cached.load().prefix_cache
    assert after.enabled and after.lookups - before.lookups == 4 and after.hits - before.hits == 2
    assert after.tokens_reused > before.tokens_reused


def test_prompt_logprobs_and_embeddings_do_not_read_the_cache(tiny, engines):
    cached, uncached = engines
    prompt = SYSTEM + QUESTIONS[0]
    run(cached, prompt, max_tokens=1)
    scored = run(cached, prompt, max_tokens=1, prompt_logprobs=True)
    assert scored.done.cached_tokens == 0
    reference = run(uncached, prompt, max_tokens=1, prompt_logprobs=True)
    assert [p.logprob for p in scored.accepted.prompt_details] == \
        pytest.approx([p.logprob for p in reference.accepted.prompt_details], abs=1e-5)
    ids = tiny.tokenizer(prompt).input_ids
    with torch.inference_mode():
        embeds = tiny.model.get_input_embeddings()(torch.tensor(ids)).tolist()
    assert run(cached, None, input_embeds=embeds, max_tokens=1).done.cached_tokens == 0


def test_the_cache_stays_within_its_bytes_and_evicts_the_least_recently_used(tiny):
    prompts = [f"Story {n}: " + "once upon a time there was a fox. " * 6 for n in range(3)]
    blocks = (len(tiny.tokenizer(prompts[0]).input_ids) - 1) // BLOCK  # whole blocks of each prompt
    assert blocks >= 3 and all((len(tiny.tokenizer(p).input_ids) - 1) // BLOCK == blocks for p in prompts)
    block_bytes = 2 * 2 * 2 * 16 * 4 * BLOCK  # layers, keys and values, kv heads, head_dim, float32
    with running_engine(tiny, "small", max_batch_size=4, max_context=256, decode_threads=1,
                        prefix_cache_bytes=2 * blocks * block_bytes + block_bytes // 2) as engine:
        for prompt in prompts[:2]:
            run(engine, prompt, max_tokens=1)
        stats = engine.load().prefix_cache
        assert stats.capacity_bytes == 2 * blocks * block_bytes and stats.bytes == stats.capacity_bytes
        assert run(engine, prompts[1], max_tokens=1).done.cached_tokens == blocks * BLOCK
        run(engine, prompts[2], max_tokens=1)  # room is made from the least recently used: prompt 0, tail first
        stats = engine.load().prefix_cache
        assert stats.bytes == stats.capacity_bytes and stats.evicted_blocks == blocks
        assert run(engine, prompts[1], max_tokens=1).done.cached_tokens == blocks * BLOCK
        assert run(engine, prompts[0], max_tokens=1).done.cached_tokens == 0


def test_zero_bytes_turns_the_cache_off(engines):
    _, uncached = engines
    run(uncached, SYSTEM, max_tokens=1)
    assert run(uncached, SYSTEM, max_tokens=1).done.cached_tokens == 0
    stats = uncached.load().prefix_cache
    assert not stats.enabled and stats.lookups == stats.blocks == 0


@pytest.mark.parametrize("value", [-1, 2**41, "128MiB", 1.5])
def test_bad_sizes_are_refused_naming_the_field(tmp_path, value):
    with pytest.raises(msgspec.ValidationError, match="prefix_cache_bytes"):
        msgspec.convert({"prefix_cache_bytes": value}, ModelConfig)
    config = tmp_path / "sluice.toml"
    config.write_text(f"[[models]]\nprefix_cache_bytes = {value!r}\n".replace("'", '"'))
    with pytest.raises(SystemExit, match="prefix_cache_bytes"):
        load_settings(str(config))
    config.write_text("[[models]]\nprefix_cache_bytes = 0\n")
    assert load_settings(str(config)).models[0].prefix_cache_bytes == 0
