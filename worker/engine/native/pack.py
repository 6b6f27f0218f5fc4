"""Float weights as forward.c's grouped codes: groups of 32 inputs, w = scale * code + min.

- 4-bit (`pack4`): the group's min and (max - min) / 15. A Q4_1 GGUF's projections were quantized this
  way, so their dequantized weights come back to float rounding.
- 8-bit (`pack8`): symmetric, scale max|w| / 127, codes offset by 128 so they are unsigned (min = -128 *
  scale). For matrices 4-bit groups do not reproduce (a Q6_K / Q8_0 embedding, float checkpoints).

`pick` measures each matrix: 4-bit where its relative error (max |w' - w| / max |w|) stays under
EXACT_4BIT, else 8-bit.

The layout is forward.c's register tile: TILE_ROWS rows side by side, so that one 64-byte vector holds 4
consecutive codes of each of 16 rows (an int32 lane per row for vpdpbusd) and a tile's 16 scales load as one
vector. `codes`: [blocks, groups, 16 * 32] (8-bit) or [blocks, groups, 16 * 16] (4-bit) bytes, block b holding
rows 16b..16b+15 (the last block padded with zero codes); within a group, chunk k (64 bytes) holds inputs
4k..4k+3 of each row in turn. 4-bit groups take 4 chunks: low nibbles inputs 4k..4k+3, high nibbles inputs
16+4k..16+4k+3. `scale` and `min`: [groups, rows] (group-major). `by_row` undoes the layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GROUP = 32
TILE_ROWS = 16  # forward.c's rows per register tile: an int32 lane each in a 512-bit vector
EXACT_4BIT = 1e-4  # a Q4_1 matrix re-packs to ~1e-7; one that was never 4-bit errs by ~1e-2
PICK_ROWS = 4096  # rows `pick` packs at a time (whole tiles)


@dataclass
class Packed:
    codes: torch.Tensor  # uint8 [blocks, groups, 512] (8-bit) or [blocks, groups, 256] (4-bit): the module's layout
    scale: torch.Tensor  # float32 [groups, rows]
    min: torch.Tensor  # float32 [groups, rows]
    bits: int

    @property
    def rows(self) -> int:
        return self.scale.shape[1]

    @property
    def cols(self) -> int:
        return self.scale.shape[0] * GROUP

    def by_row(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """uint8 codes [rows, cols] (of the given row indices, else every row), in input order."""
        if rows is None:
            return tiled_rows(self.codes, self.bits)[:self.rows]
        return picked_rows(self.codes, self.bits, rows)

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """float32 [rows, cols] (of the given row indices, else every row)."""
        codes = self.by_row(rows)
        scale, minimum = (self.scale, self.min) if rows is None else (self.scale[:, rows], self.min[:, rows])
        grouped = codes.view(codes.shape[0], -1, GROUP).float()
        return (grouped * scale.t().unsqueeze(-1) + minimum.t().unsqueeze(-1)).view(codes.shape[0], -1)


# The two functions below undo the layout; packed_torch.py's modules script them, so they spell out the tile's
# 16 rows (TorchScript does not read module globals) and keep to ops it compiles.
def tiled_rows(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes [blocks * 16, cols] of every row of `codes` (the tile layout), padding rows included."""
    blocks, groups = codes.shape[0], codes.shape[1]
    tiles = codes.reshape(blocks, groups, -1, 16, 4).permute(0, 3, 1, 2, 4)  # [block, row, group, chunk, byte]
    if bits == 4:
        tiles = torch.cat([tiles & 15, tiles >> 4], dim=3)
    return tiles.reshape(blocks * 16, -1)


def picked_rows(codes: torch.Tensor, bits: int, rows: torch.Tensor) -> torch.Tensor:
    """uint8 codes [len(rows), cols] of the given row indices of `codes` (the tile layout)."""
    blocks, groups = codes.shape[0], codes.shape[1]
    tiles = codes.reshape(blocks, groups, -1, 16, 4)[rows // 16, :, :, rows % 16]  # [n, group, chunk, byte]
    if bits == 4:
        tiles = torch.cat([tiles & 15, tiles >> 4], dim=2)
    return tiles.reshape(rows.shape[0], -1)


def _tiled(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """[rows, cols] codes -> the module's tile layout."""
    rows, cols = codes.shape
    blocks, groups = -(-rows // TILE_ROWS), cols // GROUP
    padded = torch.zeros(blocks * TILE_ROWS, cols, dtype=torch.uint8)
    padded[:rows] = codes
    chunks = padded.view(blocks, TILE_ROWS, groups, 8, 4)  # [block, row, group, chunk, byte]
    if bits == 4:
        chunks = chunks[:, :, :, :4] | (chunks[:, :, :, 4:] << 4)
    return chunks.permute(0, 2, 3, 1, 4).reshape(blocks, groups, -1).contiguous()


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
    return Packed(_tiled(codes.reshape(weight.shape[0], -1), 4), scale.t().contiguous(), low.t().contiguous(), 4)


def pack8(weight: torch.Tensor) -> Packed:
    groups = _groups(weight)
    scale = groups.abs().amax(-1) / 127
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = ((groups / safe.unsqueeze(-1)).round().clamp_(-127, 127) + 128).to(torch.uint8)
    return Packed(_tiled(codes.reshape(weight.shape[0], -1), 8), scale.t().contiguous(),
                  (-128 * scale).t().contiguous(), 8)


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
    # slices of PICK_ROWS rows are whole tiles (blocks, dim 0 of the codes); scales are [groups, rows]
    return Packed(torch.cat([p.codes for p in parts]), torch.cat([p.scale for p in parts], dim=1),
                  torch.cat([p.min for p in parts], dim=1), parts[0].bits)
