"""Float weights as forward.c's grouped codes: groups of 32 inputs, w = scale * code + min.

- 4-bit (`pack4`): the group's min and (max - min) / 15. A Q4_1 GGUF's projections were quantized this
  way, so their dequantized weights come back to float rounding.
- 8-bit (`pack8`): symmetric, scale max|w| / 127, codes offset by 128 so they are unsigned (min = -128 *
  scale). For matrices 4-bit groups do not reproduce (a Q6_K / Q8_0 embedding, float checkpoints).

`pick` measures each matrix: 4-bit where its relative error (max |w' - w| / max |w|) stays under
EXACT_4BIT, else 8-bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GROUP = 32
EXACT_4BIT = 1e-4  # a Q4_1 matrix re-packs to ~1e-7; one that was never 4-bit errs by ~1e-2
PICK_ROWS = 4096  # rows `pick` packs at a time


@dataclass
class Packed:
    codes: torch.Tensor  # uint8: [rows, cols / 2] (4-bit, two codes a byte: `_nibbles`) or [rows, cols]
    scale: torch.Tensor  # float32 [rows, cols / 32]
    min: torch.Tensor  # float32 [rows, cols / 32]
    bits: int

    @property
    def rows(self) -> int:
        return self.codes.shape[0]

    @property
    def cols(self) -> int:
        return self.codes.shape[1] * (2 if self.bits == 4 else 1)

    def dequantize(self) -> torch.Tensor:
        codes = self.codes
        if self.bits == 4:
            codes = _unnibble(codes)
        grouped = codes.view(self.rows, -1, GROUP).float()
        return (grouped * self.scale.unsqueeze(-1) + self.min.unsqueeze(-1)).view(self.rows, -1)


def _groups(weight: torch.Tensor) -> torch.Tensor:
    rows, cols = weight.shape
    if cols % GROUP:
        raise ValueError(f"a projection's input width ({cols}) must be a multiple of {GROUP}")
    return weight.detach().float().reshape(rows, cols // GROUP, GROUP)


def pack4(weight: torch.Tensor) -> Packed:
    groups = _groups(weight)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = (high - low) / 15
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = ((groups - low.unsqueeze(-1)) / safe.unsqueeze(-1)).round().clamp_(0, 15).to(torch.uint8)
    return Packed(_nibbles(codes.reshape(weight.shape[0], -1)), scale.contiguous(), low.contiguous(), 4)


def _nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[rows, cols] codes 0..15 -> [rows, cols / 2] bytes. Each 64 inputs (two groups) take 32 bytes, byte j
    = code j | code j + 32 << 4, so forward.c decodes two groups with a shift and a mask; an odd last group
    takes 16 bytes, byte j = code j | code j + 16 << 4."""
    rows, cols = codes.shape
    paired = cols // 64 * 64
    pairs = codes[:, :paired].reshape(rows, -1, 64)
    parts = [(pairs[..., :32] | (pairs[..., 32:] << 4)).reshape(rows, -1)]
    if paired < cols:
        last = codes[:, paired:]
        parts.append(last[:, :16] | (last[:, 16:] << 4))
    return torch.cat(parts, dim=1).contiguous()


def _unnibble(packed: torch.Tensor) -> torch.Tensor:
    """`_nibbles` undone."""
    rows = packed.shape[0]
    paired = packed.shape[1] // 32 * 32
    pairs = packed[:, :paired].reshape(rows, -1, 32)
    parts = [torch.cat([pairs & 15, pairs >> 4], dim=-1).reshape(rows, -1)]
    if paired < packed.shape[1]:
        last = packed[:, paired:]
        parts.append(torch.cat([last & 15, last >> 4], dim=-1))
    return torch.cat(parts, dim=1)


def pack8(weight: torch.Tensor) -> Packed:
    groups = _groups(weight)
    scale = groups.abs().amax(-1) / 127
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = ((groups / safe.unsqueeze(-1)).round().clamp_(-127, 127) + 128).to(torch.uint8)
    return Packed(codes.reshape(weight.shape[0], -1).contiguous(), scale.contiguous(), (-128 * scale).contiguous(), 8)


def relative_error(packed: Packed, weight: torch.Tensor) -> float:
    weight = weight.detach().float()
    return float((packed.dequantize() - weight).abs().max() / weight.abs().max().clamp_min(1e-30))


def pick(weight: torch.Tensor) -> Packed:
    """4-bit where it reproduces `weight` (EXACT_4BIT), else 8-bit. Packed PICK_ROWS rows at a time: the whole
    of SmolLM2's vocabulary matrix at once took ~0.5 GB of float32 temporaries, a cold start's peak."""
    slices = weight.detach().split(PICK_ROWS)
    fours = [pack4(part) for part in slices]
    error = max(float((four.dequantize() - part.float()).abs().max()) for four, part in zip(fours, slices))
    if error <= EXACT_4BIT * float(weight.detach().abs().max().clamp_min(1e-30)):
        return _joined(fours)
    del fours
    return _joined([pack8(part) for part in slices])


def _joined(parts: list[Packed]) -> Packed:
    if len(parts) == 1:
        return parts[0]
    return Packed(*(torch.cat([getattr(p, name) for p in parts]) for name in ("codes", "scale", "min")), parts[0].bits)
