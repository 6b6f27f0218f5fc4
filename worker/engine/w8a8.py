"""W8A8: int8 weights and int8 activations for every projection of the lean forward
(`quantization = "w8a8"`, CPU; what `auto` picks where the CPU has AVX2 but q4 cannot run, worker/cpu_features.py). A
decode step at 16 rows is GEMM-bound in float32; FBGEMM's int8 kernels do the same products about 3x
faster on an AVX2 core, and the whole 16-row forward runs in about half the time. The result is close
to float32, not equal to it (README.md has the measured agreement); `quantization = "none"` with
`dtype = "float32"` is the exact mode.

The recipe, each part measured on SmolLM2 (README.md):
- Calibration: one forward pass over CALIBRATION_TEXT records max|x_j| per input channel j of
  every projection (~1-2 s on a small host), remembered on disk (worker/tensor_cache.py: keyed by the
  weights' id, the recipe, the torch version and the CPU, checked on every read), so a worker's later
  starts skip it. So are the quantized projections themselves: a later start reads them and only lets
  FBGEMM pack them, instead of computing them from the float32 weights (~1.5 s of a wake).
- Outliers: the 16 loudest input channels of each projection (up to 100x the median) stay in
  float32, as an exact extra product; in the int8 path they are zero.
- SmoothQuant (Xiao et al. 2023) on the other channels: x_j is divided by
  s_j = max|x_j|^0.5 / max|W_j|^0.5 and the weight's column j multiplied by it. The product is
  unchanged, and both sides quantize with less error.
- Weights: symmetric int8 per output channel, limited to +-63. AVX2 multiplies unsigned 8-bit
  activations by signed 8-bit weights and adds pairs into int16 (vpmaddubsw); 255 x 127 x 2
  overflows it, 254 x 63 x 2 does not.
- Activations: per token. Each row is scaled to max|x| = 1 and quantized with the fixed mapping
  [-1, 1] -> 0..254 (scale 1/127, zero point 127), and its output is scaled back: a row's result
  depends on that row only, and a quiet row is not flattened by a loud one.

Not batch-invariant: float32 attention rounds differently at different batch shapes (~1e-7), which
float32 projections leave at ~1e-6 but an int8 rounding step can turn into a different token later
on. Requests are deterministic for a given batch, but a seed reproduces the same tokens whatever
shares the batch only in the exact float32 mode.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from worker.engine.runner import UnsupportedModel
from worker.tensor_cache import cached_tensors

WEIGHT_LEVELS = 63  # |q| <= 63: no int16 overflow in AVX2's u8 x s8 pair sums (see above)
ACTIVATION_SCALE, ACTIVATION_ZERO = 1.0 / 127, 127  # [-1, 1] -> 0..254
SMOOTHING = 0.5  # SmoothQuant's alpha
OUTLIERS = 16  # input channels per projection kept in float32 (the largest calibrated max|x|)
CALIBRATION_DIR, PACKED_DIR = "w8a8-calibration", "w8a8-packed"  # under the model cache
PACKED_FORMAT = 1  # the names and layout of the cached projections' tensors
CALIBRATION_TEXT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nCan you explain how a bill becomes a law, step by step?<|im_end|>\n"
    "<|im_start|>assistant\nSure. First, a member of Congress introduces the bill; a committee studies it, "
    "holds hearings and may amend it. If the committee approves, the full chamber debates and votes.\n"
    "def merge_sorted(a, b):\n    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n"
    "            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n"
    "The mitochondria produce ATP through oxidative phosphorylation, 36 molecules per glucose in theory. "
    "In 1848, revolutions spread across Europe: Paris in February, Vienna and Berlin in March. "
    "Quarterly revenue rose 12.5% to $4.2 billion, while operating costs fell by 3%. "
    "SELECT name, COUNT(*) FROM orders WHERE total > 100 GROUP BY name ORDER BY 2 DESC; "
    "Il était une fois une petite ville au bord de la mer. Der schnelle braune Fuchs springt. "
    "Q: What is 17 * 23? A: 391. Q: Name three primary colors. A: Red, yellow and blue.\n"
    "Dear customer, thank you for your patience; your order #48213 has shipped and will arrive Monday."
)


class Int8Linear(nn.Module):
    """x -> x @ W.T + b with int8 weights and per-token int8 activations (see the module docstring)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, input_peaks: torch.Tensor,
                 smoothing: float = SMOOTHING, outliers: int = OUTLIERS):
        super().__init__()
        self._pack(quantized_parts(weight, bias, input_peaks, smoothing, outliers))

    @classmethod
    def from_parts(cls, parts: dict[str, torch.Tensor]) -> Int8Linear:
        """The projection `quantized_parts` described (as the packed cache keeps it)."""
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module._pack(parts)
        return module

    def _pack(self, parts: dict[str, torch.Tensor]) -> None:
        self.outlier_index, self.outlier_weight = parts["outlier_index"], parts["outlier_weight"]
        self.inverse_smooth = parts["inverse_smooth"]
        scales = parts["weight_scales"]
        with warnings.catch_warnings():  # torch.ao's quantized tensors are deprecated in favour of torchao
            warnings.simplefilter("ignore")
            quantized = torch._make_per_channel_quantized_tensor(
                parts["weight_int8"], scales, torch.zeros_like(scales, dtype=torch.long), 0)
            self.packed = torch.ops.quantized.linear_prepack(quantized, None)  # FBGEMM's layout, its own copy
        self.bias = parts.get("bias")
        self.out_features = quantized.shape[0]
        self.activation_scale, self.activation_zero = ACTIVATION_SCALE, ACTIVATION_ZERO  # TorchScript reads no globals

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # TorchScript-compatible (decode_layer.py)
        shape = x.shape
        rows = x.reshape(-1, shape[-1]).float()
        smoothed = rows * self.inverse_smooth
        peak = smoothed.abs().amax(-1, keepdim=True).clamp_min_(1e-20)
        out = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
            smoothed.div_(peak), self.activation_scale, self.activation_zero, self.packed).mul_(peak)
        out.addmm_(rows[:, self.outlier_index], self.outlier_weight)
        bias = self.bias
        if bias is not None:
            out += bias
        return out.view(list(shape[:-1]) + [self.out_features])


def quantized_parts(weight: torch.Tensor, bias: torch.Tensor | None, input_peaks: torch.Tensor,
                    smoothing: float = SMOOTHING, outliers: int = OUTLIERS) -> dict[str, torch.Tensor]:
    """The tensors of x @ weight.T + bias in int8 (the recipe of the module docstring), before FBGEMM packs
    the weight: `input_peaks` is the calibrated max|x_j| per input channel."""
    weight = weight.detach().float()
    smooth = (input_peaks.clamp_min(1e-5).pow(smoothing)
              / weight.abs().amax(0).clamp_min(1e-5).pow(1.0 - smoothing)).clamp_min(1e-5)
    inverse = 1.0 / smooth
    # the loudest channels bypass int8: zero in the quantized path, an exact float32 product instead
    outlier_index = input_peaks.topk(min(outliers, len(input_peaks))).indices.sort().values
    parts = {"outlier_index": outlier_index, "outlier_weight": weight[:, outlier_index].t().contiguous()}
    weight = weight * smooth
    weight[:, outlier_index] = 0.0
    inverse[outlier_index] = 0.0
    scales = (weight.abs().amax(1).clamp_min(1e-8) / WEIGHT_LEVELS).double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zero_points = torch.zeros_like(scales, dtype=torch.long)
        quantized = torch.quantize_per_channel(weight.contiguous(), scales, zero_points, 0, torch.qint8)
    parts.update(inverse_smooth=inverse.contiguous(), weight_int8=quantized.int_repr(), weight_scales=scales)
    if bias is not None:
        parts["bias"] = bias.detach().float()
    return parts


@torch.inference_mode()
def input_peaks(model: nn.Module, tokenizer, modules: list[nn.Module]) -> dict[nn.Module, torch.Tensor]:
    """max |x_j| per input channel of each module over one forward pass of CALIBRATION_TEXT."""
    peaks: dict[nn.Module, torch.Tensor] = {}

    def record(module, args):
        seen = args[0].detach().reshape(-1, args[0].shape[-1]).abs().amax(0).float()
        peaks[module] = seen if module not in peaks else torch.maximum(peaks[module], seen)

    hooks = [m.register_forward_pre_hook(record) for m in modules]
    try:
        ids = tokenizer(CALIBRATION_TEXT, return_tensors="pt").input_ids.to(next(model.parameters()).device)
        model(ids)
    finally:
        for hook in hooks:
            hook.remove()
    return peaks


def recipe(weights_id: str, projections: int) -> str:
    """Names the derivation of the int8 projections from these weights (the calibration and the quantization)."""
    return f"{weights_id}\0{WEIGHT_LEVELS}\0{SMOOTHING}\0{OUTLIERS}\0{CALIBRATION_TEXT}\0{projections}"


def calibrated_peaks(model: nn.Module, tokenizer, modules: list[nn.Module], cache: Path | None,
                     weights_id: str | None) -> dict[nn.Module, torch.Tensor]:
    """`input_peaks`, remembered in `cache` under the weights' id and the recipe (worker/tensor_cache.py; no
    cache or no id: computed)."""
    if cache is None or weights_id is None:
        return input_peaks(model, tokenizer, modules)

    def calibrate() -> dict[str, torch.Tensor]:
        peaks = input_peaks(model, tokenizer, modules)
        return {str(index): peaks[module] for index, module in enumerate(modules)}

    saved = cached_tensors(cache, f"w8a8 calibration\0{recipe(weights_id, len(modules))}", calibrate)
    return {module: saved[str(index)] for index, module in enumerate(modules)}


def quantize_runner(runner, tokenizer, release: bool = False, cache: Path | None = None,
                    weights_id: str | None = None) -> None:
    """Swap every projection the runner calls (fused q/k/v, o, fused gate/up, down, lm_head) for an
    Int8Linear (a mixture of experts keeps its experts in float32). The Hugging Face modules keep their
    float32 weights unless `release` (the runner is the model's only user, as in a worker): then each layer's
    float32 projections are dropped as soon as its int8 ones exist, ~400 MB of SmolLM2's 540 (the tied
    embedding stays: lookups need it).

    `cache` (a model cache directory), `weights_id`: where the calibration (`CALIBRATION_DIR`) and the
    quantized projections (`PACKED_DIR`, worker/tensor_cache.py) are remembered, so that a later start only
    reads them and lets FBGEMM pack them. No cache or no id: both computed."""
    if any(f.qkv is None or (f.gate_up is None and not plan.moe) for plan, f in zip(runner.plans, runner.fused)) \
            or type(runner.lm_head) is not nn.Linear:
        raise UnsupportedModel("w8a8 needs plain float32 Linear projections (no bitsandbytes)")
    # each fused projection's calibration input is that of its first member; experts stay float32
    sources = [{"qkv": plan.qkv_modules[0], "o_proj": plan.out}
               | ({} if plan.moe else {"gate_up": plan.gate_up_modules[0], "down_proj": plan.down})
               for plan in runner.plans]
    observed = [m for layer in sources for m in layer.values()] + [runner.lm_head]

    def quantize() -> dict[str, torch.Tensor]:
        peaks = calibrated_peaks(runner.model, tokenizer, observed, cache and cache / CALIBRATION_DIR, weights_id)
        parts = {}
        for index, (layer, fused) in enumerate(zip(sources, runner.fused)):
            for name, seen in layer.items():
                projection = getattr(fused, name)
                layer_parts = quantized_parts(projection.weight, projection.bias, peaks[seen])
                parts.update({f"{index}.{name}.{part}": tensor for part, tensor in layer_parts.items()})
        head = quantized_parts(runner.lm_head.weight, runner.lm_head.bias, peaks[runner.lm_head])
        return {**parts, **{f"head.{part}": tensor for part, tensor in head.items()}}

    if cache is None or weights_id is None:
        parts = quantize()
    else:
        parts = cached_tensors(cache / PACKED_DIR, f"w8a8 {PACKED_FORMAT}\0{recipe(weights_id, len(observed))}",
                               quantize)
    for index, (layer, plan, fused) in enumerate(zip(sources, runner.plans, runner.fused)):
        for name in layer:
            setattr(fused, name, Int8Linear.from_parts(_named(parts, f"{index}.{name}.")))
        if release:
            for module in plan.projections:
                _release(module)
    runner.set_head(Int8Linear.from_parts(_named(parts, "head.")))


def _named(parts: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {name.removeprefix(prefix): tensor for name, tensor in parts.items() if name.startswith(prefix)}


def _release(module: nn.Linear) -> None:
    """The module's weight becomes a shapeless placeholder (meta device): its float32 memory is freed, and a
    call of the Hugging Face forward fails loudly instead of computing with stale weights."""
    module.weight = nn.Parameter(module.weight.to("meta"), requires_grad=False)
    if module.bias is not None:
        module.bias = nn.Parameter(module.bias.to("meta"), requires_grad=False)
