"""Tiny random decoders of every family the lean runner describes (worker/families/), built offline from
transformers' config classes (4 layers, hidden 64, float32; Gemma 3's heads x head_dim wider than its hidden, as
in the 270M), on a word-level tokenizer of VOCAB words, so a test serves each through the engine and compares it
with transformers `generate()` on the same weights."""

from __future__ import annotations

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from worker.loading import LoadedModel

VOCAB = 512
EOS = 0
WINDOW = 6  # short enough that prompts and outputs cross it
_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256, eos_token_id=EOS, pad_token_id=EOS,
               bos_token_id=1, tie_word_embeddings=False)
_ALTERNATING = ["sliding_attention", "full_attention"] * 2
# per family: (config class, model class, what differs from _COMMON)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=WINDOW)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=WINDOW,
                                                      max_window_layers=2)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=16, sliding_window=WINDOW, layer_types=_ALTERNATING,
                                                         query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                                                         final_logit_softcapping=3.0)),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(head_dim=32, sliding_window=WINDOW,
                                                                  layer_types=_ALTERNATING, query_pre_attn_scalar=24,
                                                                  rope_local_base_freq=100.0)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(rope_parameters=dict(
        rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.5, original_max_position_embeddings=16,
        short_factor=[1.0 + i / 8 for i in range(4)], long_factor=[2.0 + i / 4 for i in range(4)]))),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(rotary_pct=0.5, use_parallel_residual=True)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2,
                                                            sliding_window=WINDOW)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(head_dim=16, num_experts=4, num_experts_per_tok=2,
                                                                moe_intermediate_size=48, norm_topk_prob=False,
                                                                decoder_sparse_step=2)),
}


def word_tokenizer() -> PreTrainedTokenizerFast:
    words = ["<eos>", "<bos>"] + [f"w{i}" for i in range(2, VOCAB)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<eos>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", bos_token="<bos>", pad_token="<eos>")


def tiny_family(name: str, tokenizer=None, seed: int = 0) -> LoadedModel:
    """A random model of family `name`; its biases and norm weights perturbed (they start at zero or one)."""
    config_class, model_class, extra = FAMILIES[name]
    torch.manual_seed(seed)
    settings = {**_COMMON, **extra}
    if name == "gpt_neox":  # one key/value head per query head
        del settings["num_key_value_heads"]
    config = getattr(transformers, config_class)(**settings)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith("bias") or "norm" in parameter_name:
                parameter.add_(torch.randn_like(parameter) * 0.2)
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = EOS
    return LoadedModel(model, tokenizer or word_tokenizer(), f"tiny-{name}", torch.device("cpu"), torch.float32,
                       "none")
