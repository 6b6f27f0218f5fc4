"""Cost of the tool-calling grammar per generated token, against the model step it sits in.

    .venv/bin/python bench/tool_grammar.py [--repeat 20]

Replays fixed texts token by token through xgrammar matchers built the way the worker builds them
(worker/tools/grammar.py) and times the mask of each step (fill + apply to a [1, V] score row):

- auto, while the model writes free text, and once it writes a call (the design we ship: triggered tags);
- required (calls only);
- the alternative we did not ship, TGI's: every reply is JSON and free text is the `content` string of a
  pseudo-function "no_tool" (the text written JSON-escaped inside the grammar);
- a plain json_schema constraint of the same arguments, for reference.

Then the compile time of each grammar (cold) and one SmolLM2 decode step at batch 1 (transformers forward
with a KV cache), so the mask cost reads as a share of the step. Prints numbers; no assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("SLUICE_MODEL_CACHE", str(Path(__file__).resolve().parents[1] / ".data" / "test-model-cache"))

import torch  # noqa: E402
import xgrammar as xgr  # noqa: E402

from common.protocol import FunctionTool, ModelConfig, ToolSpec  # noqa: E402
from testkit.corpora.tools import TOOLS  # noqa: E402
from worker.loading import load_model  # noqa: E402
from worker.tools.grammar import arguments_grammar, tools_constraint  # noqa: E402
from worker.tools.syntax import JSON_CALLS  # noqa: E402

CONTENT = "The weather in Paris is mild today, with a few clouds in the afternoon and a light breeze from the west."
CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
NO_TOOL = {"type": "object", "properties": {"content": {"type": "string"}}, "required": ["content"]}


def masks(compiled, tokenizer, prefix: str, text: str, vocab: int, repeat: int) -> float:
    """Median ms to fill and apply the mask at each token of `text`, after `prefix` was accepted."""
    tokens = tokenizer(text, add_special_tokens=False).input_ids
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    scores = torch.zeros(1, vocab)
    times = []
    for _ in range(repeat):
        matcher = xgr.GrammarMatcher(compiled)
        assert matcher.accept_string(prefix) if prefix else True
        for token in tokens:
            started = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            xgr.apply_token_bitmask_inplace(scores, bitmask, vocab_size=vocab)
            times.append(time.perf_counter() - started)
            assert matcher.accept_token(token), tokenizer.decode([token])
    return statistics.median(times) * 1000


def step_ms(model, tokenizer, repeat: int) -> float:
    ids = tokenizer("Tell me about the weather in Paris. " * 12, return_tensors="pt").input_ids
    with torch.inference_mode():
        cache = model(ids, use_cache=True).past_key_values
        token = ids[:, -1:]
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            out = model(token, past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - started)
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as data:
        loaded = load_model(ModelConfig(), Path(data))
    tokenizer, vocab = loaded.tokenizer, loaded.model.config.vocab_size
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab, stop_token_ids=[tokenizer.eos_token_id])
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    grammars = {t.name: arguments_grammar(t, i) for i, t in enumerate(TOOLS)}
    no_tool = {**grammars, "no_tool": arguments_grammar(FunctionTool(name="no_tool", parameters=NO_TOOL), 0)}

    def compiled(name, build):
        started = time.perf_counter()
        result = build()
        print(f"compile {name:28} {1000 * (time.perf_counter() - started):7.1f} ms")
        return result

    auto = compiled("auto (triggered tags)", lambda: compiler.compile_structural_tag(
        tools_constraint(ToolSpec(functions=TOOLS, choice="auto"), JSON_CALLS, grammars).value))
    required = compiled("required (calls only)", lambda: compiler.compile_structural_tag(
        tools_constraint(ToolSpec(functions=TOOLS, choice="required"), JSON_CALLS, grammars).value))
    tgi = compiled("TGI-style no_tool (JSON)", lambda: compiler.compile_structural_tag(
        tools_constraint(ToolSpec(functions=TOOLS, choice="required"), JSON_CALLS, no_tool).value))
    plain = compiled("json_schema of the arguments", lambda: compiler.compile_json_schema(
        json.dumps(TOOLS[0].parameters), any_whitespace=False, strict_mode=True))
    step = step_ms(loaded.model, tokenizer, args.repeat)
    escaped = json.dumps(CONTENT)
    rows = [
        ("auto: free text", masks(auto, tokenizer, "", CONTENT, vocab, args.repeat)),
        ("auto: inside a call", masks(auto, tokenizer, "Let me check. ", CALL, vocab, args.repeat)),
        ("required: a call", masks(required, tokenizer, "", CALL, vocab, args.repeat)),
        ("TGI no_tool: free text", masks(tgi, tokenizer, '{"name": "no_tool", "arguments": {"content": ',
                                         escaped, vocab, args.repeat)),
        ("json_schema: the arguments", masks(plain, tokenizer, "", '{"city": "Paris", "unit": "celsius"}', vocab,
                                             args.repeat)),
    ]
    print(f"\nSmolLM2 decode step, batch 1: {step:.1f} ms")
    for name, cost in rows:
        print(f"mask {name:28} {cost:6.3f} ms/token = {100 * cost / step:5.2f}% of the step")


if __name__ == "__main__":
    main()
