"""A decoder built from its family's description (family.py) and its config alone: the modules, tensor names and
shapes of transformers' class for it, without transformers' modeling code.

Why: `transformers.modeling_utils`, which every model class imports, imports torch._dynamo, torch.distributed.tensor
and sympy whatever the model: ~170 MB of a worker's RSS and seconds of a core before a weight is read. q4 needs
none of it (forward.c computes the layers; the lean runner reads the skeleton's tensors and a few attributes:
engine/runner.py, engine/layer_plan.py), so a q4 load builds this one. `lean_skeleton` returns None where the
config asks for a part it does not build (a family outside LEAN_FAMILIES, a rotary whose table changes with the
length, partial rotary, another activation): the caller builds transformers' class.
tests/worker/families/test_skeleton.py holds every name, shape, computed buffer and output to transformers' own.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from worker.families import FAMILIES
from worker.families.family import Family

# the families forward.c computes (native/model.py): what q4 serves
LEAN_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3")
_ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {"silu": nn.SiLU,
                                                    "gelu_pytorch_tanh": partial(nn.GELU, approximate="tanh")}
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # computed once; dynamic and longrope change with the length


class LeanRMSNorm(nn.Module):
    """w * x / rms(x), in float32 and cast back before the weight (Llama's)."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype | None = None):
        super().__init__()
        self.weight, self.variance_epsilon = nn.Parameter(torch.ones(size, dtype=dtype)), eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        wide = hidden.float()
        return self.weight * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)).to(
            hidden.dtype)


class LeanGemmaRMSNorm(nn.Module):
    """(1 + w) * x / rms(x), all in float32 (Gemma's)."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype | None = None):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.zeros(size, dtype=dtype)), eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        wide = hidden.float()
        normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).type_as(hidden)


class ScaledEmbedding(nn.Embedding):
    """Embeddings times sqrt(hidden) (Gemma), the scale a buffer cast to the weight's dtype as transformers does."""

    embed_scale: torch.Tensor

    def __init__(self, rows: int, width: int, padding_idx: int | None, scale: float, dtype: torch.dtype):
        super().__init__(rows, width, padding_idx, _weight=_unset(rows, width, dtype))
        self.scalar_embed_scale = scale
        with torch.device("cpu"):  # computed, never read: built whole even inside a meta skeleton
            self.register_buffer("embed_scale", torch.tensor(scale), persistent=False)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(token_ids) * self.embed_scale.to(self.weight.dtype)


class LeanRotary(nn.Module):
    """cos / sin of each position: one table, or one per layer type where the family keys them (Gemma 3's local and
    global bases). The inverse frequencies are transformers' (its rope-type functions for scaled types)."""

    def __init__(self, config):
        super().__init__()
        with torch.device("cpu"):  # computed, never read: built whole even inside a meta skeleton (where an
            self._tables(config)  # arange's meta kernel would import torch._dynamo)

    def _tables(self, config) -> None:
        keyed = FAMILIES[config.model_type].rope_by_layer_type
        keys = sorted(set(config.layer_types)) if keyed else [None]
        self.rope_type: str | dict[str, str] = {} if keyed else ""
        self.scaling: dict[str | None, float] = {}
        for key in keys:
            parameters = config.rope_parameters[key] if keyed else config.rope_parameters
            if parameters is None:
                continue
            kind = parameters["rope_type"]
            if keyed:
                self.rope_type[key] = kind  # type: ignore[index]
            else:
                self.rope_type = kind
            if kind == "default":
                width = head_dim(config)
                inverse = 1.0 / (parameters["rope_theta"] ** (torch.arange(0, width, 2, dtype=torch.float) / width))
                scaling = 1.0
            else:
                from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

                compute = ROPE_INIT_FUNCTIONS[kind]
                inverse, scaling = compute(config, None, layer_type=key) if keyed else compute(config)
            self.register_buffer(f"{key}_inv_freq" if keyed else "inv_freq", inverse, persistent=False)
            self.scaling[key] = scaling

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None):
        inverse = getattr(self, f"{layer_type}_inv_freq" if layer_type is not None else "inv_freq")
        freqs = position_ids[..., None].float() * inverse.to(device=x.device, dtype=torch.float)
        angles = torch.cat((freqs, freqs), dim=-1)
        scaling = self.scaling[layer_type]
        return (angles.cos() * scaling).to(dtype=x.dtype), (angles.sin() * scaling).to(dtype=x.dtype)


def _unset(rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """An embedding's weight as given, not initialised: nn.Embedding's own init draws normal_ values, whose meta
    kernel imports torch._dynamo (what this module exists to avoid)."""
    return torch.empty(rows, width, dtype=dtype)


def activation_name(config) -> str:
    """The MLP gate's function as the config names it (Gemma: hidden_activation)."""
    return str(getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu"))


def head_dim(config) -> int:
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def _flag(config, rule: str | bool) -> bool:
    return bool(getattr(config, rule, False)) if isinstance(rule, str) else rule


def _declined(family: Family | None, config) -> bool:
    if family is None or family.name not in LEAN_FAMILIES:
        return True
    keyed = family.rope_by_layer_type
    parameters = config.rope_parameters or {}
    tables = [parameters[key] for key in set(config.layer_types)] if keyed else [parameters]
    return (activation_name(config) not in _ACTIVATIONS or getattr(config, "use_bidirectional_attention", False)
            or any(table is not None and (table.get("rope_type") not in _STATIC_ROPE
                                          or table.get("partial_rotary_factor", 1.0) != 1.0) for table in tables))


def _attention(family: Family, config, head_dim: int, dtype: torch.dtype) -> nn.Module:
    hidden, heads = config.hidden_size, config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    attention = nn.Module()
    qkv_bias = _flag(config, family.qkv_bias)
    widths = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
    if len(family.qkv) == 1:
        widths = [sum(widths)]
    for name, width in zip(family.qkv, widths):
        setattr(attention, name, nn.Linear(hidden, width, bias=qkv_bias, dtype=dtype))
    setattr(attention, family.out, nn.Linear(heads * head_dim, hidden, bias=_flag(config, family.out_bias),
                                             dtype=dtype))
    if family.qk_norm is not None:
        attention.q_norm, attention.k_norm = (_norm(family, config, head_dim, dtype) for _ in range(2))
    scalar = getattr(config, family.attention_scalar) if family.attention_scalar else head_dim
    attention.scaling = scalar ** -0.5
    return attention


class GatedMLP(nn.Module):
    """down(act(gate x) * up x), gate and up as two projections or one fused [gate | up], under the family's names
    (the runner calls it whole where it cannot fuse the projections itself: biased ones)."""

    def __init__(self, family: Family, config, dtype: torch.dtype):
        super().__init__()
        hidden, inner, bias = config.hidden_size, config.intermediate_size, _flag(config, family.mlp_bias)
        self.names = family.gate_up, family.down, family.act
        for name in family.gate_up:
            setattr(self, name, nn.Linear(hidden, inner * (2 if len(family.gate_up) == 1 else 1), bias=bias,
                                          dtype=dtype))
        setattr(self, family.down, nn.Linear(inner, hidden, bias=bias, dtype=dtype))
        setattr(self, family.act, _ACTIVATIONS[activation_name(config)]())

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        members, down, act = self.names
        if len(members) == 1:
            gate, up = getattr(self, members[0])(hidden).chunk(2, dim=-1)
        else:
            gate, up = (getattr(self, name)(hidden) for name in members)
        return getattr(self, down)(getattr(self, act)(gate) * up)


def _norm(family: Family, config, size: int, dtype: torch.dtype) -> nn.Module:
    return (LeanGemmaRMSNorm if family.norm == "gemma" else LeanRMSNorm)(size, config.rms_norm_eps, dtype)


def _layer(family: Family, config, head_dim: int, dtype: torch.dtype) -> nn.Module:
    layer = nn.Module()
    setattr(layer, family.attention, _attention(family, config, head_dim, dtype))
    setattr(layer, family.mlp, GatedMLP(family, config, dtype))
    for name in (family.input_norm, family.attention_out_norm, family.mlp_norm, family.mlp_out_norm):
        if name is not None:
            setattr(layer, name, _norm(family, config, config.hidden_size, dtype))
    return layer


class LeanCausalLM(nn.Module):
    """The causal LM: its decoder (embedding, layers, final norm, rotary) and its head, under the family's names."""

    def __init__(self, family: Family, config, dtype: torch.dtype):
        from transformers import GenerationConfig

        super().__init__()
        self.config, self.family = config, family
        self.generation_config = GenerationConfig.from_model_config(config)
        width = head_dim(config)
        decoder = nn.Module()
        vocab, hidden = config.vocab_size, config.hidden_size
        padding = getattr(config, "pad_token_id", None)
        padding = padding if isinstance(padding, int) and 0 <= padding < vocab else None
        embedding = ScaledEmbedding(vocab, hidden, padding, hidden ** 0.5, dtype) if family.scaled_embedding \
            else nn.Embedding(vocab, hidden, padding, _weight=_unset(vocab, hidden, dtype))
        setattr(decoder, family.embed, embedding)
        decoder.layers = nn.ModuleList(_layer(family, config, width, dtype)
                                       for _ in range(config.num_hidden_layers))
        setattr(decoder, family.final_norm, _norm(family, config, hidden, dtype))
        decoder.rotary_emb = LeanRotary(config)
        setattr(self, family.decoder, decoder)
        setattr(self, family.head, nn.Linear(hidden, vocab, bias=False, dtype=dtype))

    def tie_weights(self) -> None:
        if getattr(self.config, "tie_word_embeddings", False):
            self.get_output_embeddings().weight = self.get_input_embeddings().weight

    def get_input_embeddings(self) -> nn.Module:
        return getattr(getattr(self, self.family.decoder), self.family.embed)

    def get_output_embeddings(self) -> nn.Module:
        return getattr(self, self.family.head)


def lean_skeleton(config, dtype: torch.dtype) -> LeanCausalLM | None:
    """The causal LM of `config` on the meta device (every tensor a placeholder) without transformers' modeling
    code, or None where it has a part this module does not build."""
    family = FAMILIES.get(getattr(config, "model_type", None) or "")
    if _declined(family, config):
        return None
    assert family is not None
    with torch.device("meta"):
        return LeanCausalLM(family, config, dtype)
