"""LoRA on the real SmolLM2 weights: greedy output with each adapter equals PEFT's merged model,
alone and in a batch that mixes three adapters with the base model, in the engine and through the
worker's HTTP API."""

from __future__ import annotations

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from common.protocol import AdapterRef, Done, Error, Finish, GenerateRequest, ModelInfo, SamplingParams, decode_event
from testkit.lora_adapters import ATTENTION, EVERY, write_adapter
from tests.worker.engine.runs import request, running_engine, submit
from tests.worker.lora.adapters import references, serve_greedy
from worker.server import create_worker_app

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
TOKENS = 16


@pytest.fixture(scope="module")
def smol_adapters(smol, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("smol-adapters")
    model = smol.model
    return {
        "support": write_adapter(model, root / "support", 11, ATTENTION, rank=8, alpha=16, strength=0.3),
        "sql": write_adapter(model, root / "sql", 12, EVERY, rank=16, alpha=16, strength=0.2),
        "poet": write_adapter(model, root / "poet", 13, ["gate_proj", "up_proj", "down_proj"], rank=8, alpha=8,
                              strength=0.3, use_rslora=True),
    }


@pytest.fixture(scope="module")
def expected(smol, smol_adapters) -> dict:
    """PEFT's merged-model greedy tokens for every prompt, per adapter (None: the base model)."""
    ids = [smol.tokenizer(p).input_ids for p in PROMPTS]
    eos = smol.tokenizer.eos_token_id
    table = {None: references(smol.model, None, ids, TOKENS, eos)}
    for name, directory in smol_adapters.items():
        table[name] = references(smol.model, directory, ids, TOKENS, eos)
        assert table[name] != table[None], name  # each adapter changes what the model says
    return table


@pytest.fixture(scope="module")
def smol_engine(smol):
    with running_engine(smol, "lora-smol", max_batch_size=16, max_context=512, decode_threads=2) as engine:
        yield engine


def ref(smol_adapters, name):
    return None if name is None else AdapterRef(name=name, source=str(smol_adapters[name]))


def test_each_adapter_alone_equals_peft_generate(smol_engine, smol_adapters, expected):
    for name in smol_adapters:
        generate = request(PROMPTS[0], max_tokens=TOKENS, temperature=0)
        generate.adapter = ref(smol_adapters, name)
        assert submit(smol_engine, generate, strict=True).wait().finishes[0].token_ids == expected[name][0], name


def test_three_adapters_and_the_base_model_in_one_batch_equal_peft(smol_engine, smol_adapters, expected):
    jobs = [(name, index) for index in range(len(PROMPTS)) for name in [None, "support", "sql", "poet"]]
    # 8 rows: two row groups of four, each mixing adapters
    got = serve_greedy(smol_engine, [(PROMPTS[index], name and smol_adapters[name]) for name, index in jobs], TOKENS)
    for (name, index), tokens in zip(jobs, got):
        assert tokens == expected[name][index], (name, index)


@pytest.fixture(scope="module")
def app(smol_engine):
    info = ModelInfo(model_id="smol", model_dtype="float32", device="cpu", quantization="none", max_context=512,
                     max_rows=16, vocab_size=smol_engine.vocab_size, eos_token_ids=smol_engine.model_eos)
    return create_worker_app(smol_engine, info)


async def post(app, payload: bytes):
    async with AsyncTestClient(app=app) as client:
        return await client.post("/generate", content=payload, headers={"content-type": "application/json"})


def body(adapter: AdapterRef | None, prompt: str = PROMPTS[1]) -> bytes:
    return msgspec.json.encode(GenerateRequest(request_id=f"http-{id(adapter)}", model="smol", prompt=prompt,
                                               params=SamplingParams(max_tokens=TOKENS, temperature=0.0),
                                               adapter=adapter))


async def test_the_worker_http_api_serves_adapters(app, smol_adapters, expected):
    response = await post(app, body(ref(smol_adapters, "sql")))
    assert response.status_code == 200, response.text
    events = [decode_event(line.encode()) for line in response.text.splitlines() if line]
    assert next(e for e in events if isinstance(e, Finish)).token_ids == expected["sql"][1]
    assert isinstance(events[-1], Done)


async def test_an_adapter_that_cannot_load_ends_the_stream_with_its_error(app, smol_adapters, tmp_path):
    response = await post(app, body(AdapterRef(name="gone", source=str(tmp_path / "gone"))))
    assert response.status_code == 200
    (error,) = [decode_event(line.encode()) for line in response.text.splitlines() if line]
    assert isinstance(error, Error) and (error.kind, error.field) == ("not_found", "adapter")


@pytest.mark.parametrize("adapter", [{"name": "../etc", "source": "/x"}, {"name": "a:b", "source": "/x"},
                                     {"name": "ok", "source": ""}, {"name": "ok"}, "ok"])
async def test_malformed_adapter_fields_are_422(app, adapter):
    payload = {"request_id": "bad-adapter", "model": "smol", "prompt": "Hi", "adapter": adapter}
    response = await post(app, msgspec.json.encode(payload))
    assert response.status_code == 422, response.text
    assert response.json()["kind"] == "validation" and "adapter" in response.json()["message"]
