"""W8A8: int8 weights and int8 activations for every projection of the lean forward
(`quantization = "w8a8"`, CPU; what `auto` picks where the CPU has AVX2, worker/cpu_features.py). A
decode step at 16 rows is GEMM-bound in float32; FBGEMM's int8 kernels do the same products about 3x
faster on an AVX2 core, and the whole 16-row forward runs in about half the time. The result is close
to float32, not equal to it (README.md has the measured agreement); `quantization = "none"` with
`dtype = "float32"` is the exact mode.

The recipe, each part measured on SmolLM2 (README.md):
- Calibration: one forward pass over CALIBRATION_TEXT records max|x_j| per input channel j of
  every projection (~1-2 s on a small host), remembered on disk under the weights' id and the recipe,
  so a worker's later starts skip it.
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

import hashlib
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from worker.build_once import build_once
from worker.engine.layers import Projection
from worker.engine.runner import UnsupportedModel

WEIGHT_LEVELS = 63  # |q| <= 63: no int16 overflow in AVX2's u8 x s8 pair sums (see above)
ACTIVATION_SCALE, ACTIVATION_ZERO = 1.0 / 127, 127  # [-1, 1] -> 0..254
SMOOTHING = 0.5  # SmoothQuant's alpha
OUTLIERS = 16  # input channels per projection kept in float32 (the largest calibrated max|x|)
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
        weight = weight.detach().float()
        smooth = (input_peaks.clamp_min(1e-5).pow(smoothing)
                  / weight.abs().amax(0).clamp_min(1e-5).pow(1.0 - smoothing)).clamp_min(1e-5)
        inverse = 1.0 / smooth
        # the loudest channels bypass int8: zero in the quantized path, an exact float32 product instead
        self.outlier_index = input_peaks.topk(min(outliers, len(input_peaks))).indices.sort().values
        self.outlier_weight = weight[:, self.outlier_index].t().contiguous()  # [outliers, out]
        weight = weight * smooth
        weight[:, self.outlier_index] = 0.0
        inverse[self.outlier_index] = 0.0
        self.inverse_smooth = inverse.contiguous()
        scales = (weight.abs().amax(1).clamp_min(1e-8) / WEIGHT_LEVELS).double()
        with warnings.catch_warnings():  # torch.ao's quantized tensors are deprecated in favour of torchao
            warnings.simplefilter("ignore")
            zero_points = torch.zeros_like(scales, dtype=torch.long)
            quantized = torch.quantize_per_channel(weight.contiguous(), scales, zero_points, 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(quantized, None)
        self.bias = None if bias is None else bias.detach().float()
        self.out_features = weight.shape[0]
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


def calibrated_peaks(model: nn.Module, tokenizer, modules: list[nn.Module], cache: Path | None,
                     weights_id: str | None) -> dict[nn.Module, torch.Tensor]:
    """`input_peaks`, remembered in `cache` under the weights' id and the recipe (no cache or no id: computed)."""
    if cache is None or weights_id is None:
        return input_peaks(model, tokenizer, modules)
    recipe = f"{weights_id}\0{WEIGHT_LEVELS}\0{SMOOTHING}\0{OUTLIERS}\0{CALIBRATION_TEXT}\0{len(modules)}"

    def calibrate(staging: Path) -> None:
        peaks = input_peaks(model, tokenizer, modules)
        save_file({str(index): peaks[module] for index, module in enumerate(modules)}, staging / "peaks.safetensors")

    target = build_once(cache / hashlib.sha256(recipe.encode()).hexdigest(), "peaks.safetensors", calibrate)
    saved = load_file(target / "peaks.safetensors")
    return {module: saved[str(index)] for index, module in enumerate(modules)}


def quantize_runner(runner, tokenizer, release: bool = False, cache: Path | None = None,
                    weights_id: str | None = None) -> None:
    """Swap every projection the runner calls (fused q/k/v, o, fused gate/up, down, lm_head) for an
    Int8Linear. The Hugging Face modules keep their float32 weights unless `release` (the runner is the
    model's only user, as in a worker): then each layer's float32 projections are dropped as soon as its
    int8 ones exist, ~400 MB of SmolLM2's 540 (the tied embedding stays: lookups need it). `cache`,
    `weights_id`: where the calibration is remembered (`calibrated_peaks`)."""
    if any(f.qkv is None or f.gate_up is None for f in runner.fused) or type(runner.lm_head) is not nn.Linear:
        raise UnsupportedModel("w8a8 needs plain float32 Linear projections (a gated MLP, no bitsandbytes)")
    observed = [m for layer in runner.layers for m in (layer.self_attn.q_proj, layer.self_attn.o_proj,
                                                       layer.mlp.gate_proj, layer.mlp.down_proj)] + [runner.lm_head]
    peaks = calibrated_peaks(runner.model, tokenizer, observed, cache, weights_id)
    for layer, fused in zip(runner.layers, runner.fused):
        attention, mlp = layer.self_attn, layer.mlp
        fused.qkv = _int8(fused.qkv, peaks[attention.q_proj])
        fused.o_proj = _int8(attention.o_proj, peaks[attention.o_proj])
        fused.gate_up = _int8(fused.gate_up, peaks[mlp.gate_proj])
        fused.down_proj = _int8(mlp.down_proj, peaks[mlp.down_proj])
        if release:
            for module in (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj,
                           mlp.gate_proj, mlp.up_proj, mlp.down_proj):
                _release(module)
    runner.set_head(_int8(runner.lm_head, peaks[runner.lm_head]))


def _int8(projection: Projection | nn.Linear, peaks: torch.Tensor) -> Int8Linear:
    return Int8Linear(projection.weight, projection.bias, peaks)


def _release(module: nn.Linear) -> None:
    """The module's weight becomes a shapeless placeholder (meta device): its float32 memory is freed, and a
    call of the Hugging Face forward fails loudly instead of computing with stale weights."""
    module.weight = nn.Parameter(module.weight.to("meta"), requires_grad=False)
    if module.bias is not None:
        module.bias = nn.Parameter(module.bias.to("meta"), requires_grad=False)
