"""What a decoder family is to the lean runner: where its modules sit in the Hugging Face model and which
variant of each shared layer (engine/layers.py) it uses. A family is data, not code: the runner reads it
(engine/runner.py, engine/layer_plan.py), the quantized paths (engine/w8a8.py, engine/native/model.py) to refuse
what they do not compute, and q4's loading to build the model without transformers' code (skeleton.py). A model
whose family has no description, or which uses a part its description does not cover, raises UnsupportedModel
with the reason; the engine then serves it another way.
"""

from __future__ import annotations

from dataclasses import dataclass


class UnsupportedModel(RuntimeError):
    pass


@dataclass(frozen=True)
class Family:
    name: str
    # where the modules are: attribute names on the causal LM, its decoder and each decoder layer
    decoder: str = "model"
    embed: str = "embed_tokens"
    final_norm: str = "norm"
    head: str = "lm_head"
    attention: str = "self_attn"
    qkv: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")  # one name: a fused projection [q | k | v]
    qkv_by_head: bool = False  # the fused rows run q, k, v of head 0, then of head 1, ... (GPT-NeoX)
    out: str = "o_proj"
    mlp: str = "mlp"
    gate_up: tuple[str, ...] = ("gate_proj", "up_proj")  # one name: fused [gate | up]; () = ungated MLP
    up: str = "up_proj"  # the ungated MLP's input projection
    down: str = "down_proj"
    act: str = "act_fn"
    # norms: kind "rms" (w * x / rms), "rms_wide" (OLMo 2: (w * x / rms) in float32, then cast),
    # "gemma" ((1 + w) * x / rms, in float32), "layer" (LayerNorm); None = the layer has no such norm
    norm: str = "rms"
    input_norm: str | None = "input_layernorm"  # before attention
    attention_out_norm: str | None = None  # on attention's output, before the residual add (Gemma, OLMo 2)
    mlp_norm: str | None = "post_attention_layernorm"  # before the MLP
    mlp_out_norm: str | None = None  # on the MLP's output, before the residual add
    qk_norm: str | None = None  # "head": per head, before the rotation (Qwen3, Gemma 3); "full": over all heads
    parallel_residual: str | None = None  # the config flag for x + attn(norm1 x) + mlp(norm2 x) (GPT-NeoX)
    # sliding window: "config" = config.sliding_window on every layer; "layer_types" = on the layers
    # config.layer_types calls "sliding_attention"; None = full attention everywhere
    window: str | None = None
    rope_by_layer_type: bool = False  # a rotary table per config.layer_types entry (Gemma 3's local / global bases)
    softcap: bool = False  # config.attn_logit_softcapping and config.final_logit_softcapping
    moe: bool = False  # the MLP is a top-k mixture of experts (moe.py)
    moe_normalised: str | None = None  # the config flag that renormalises the top-k router weights; None = always
    # q4's vocabulary matrix (and an untied embedding) in this many bits whether or not 4-bit groups reproduce it;
    # None: as any matrix (4 bits where exact, else 8). 4 where the vocabulary is most of a token's reads and the
    # family's models keep the quality rule so (bench/vocab_bits.py); none does yet (Gemma 3 270M: 1.077x perplexity)
    vocab_bits: int | None = None
    # what skeleton.py builds without transformers' modeling code: which projections carry a bias (the name of
    # the config flag that decides, or fixed), what scales attention's scores (config.<name> ** -0.5; None:
    # head_dim ** -0.5) and whether embeddings are scaled by sqrt(hidden)
    qkv_bias: str | bool = "attention_bias"
    out_bias: str | bool = "attention_bias"
    mlp_bias: str | bool = False
    attention_scalar: str | None = None
    scaled_embedding: bool = False

    @property
    def gated(self) -> bool:
        return bool(self.gate_up)
