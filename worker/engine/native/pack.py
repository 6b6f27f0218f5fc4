"""Float weights as forward.c's grouped codes: groups of 32 inputs, w = scale * code + min.

- 4-bit (`pack4`): the group's min and (max - min) / 15. A Q4_1 GGUF's projections were quantized this
  way, so their dequantized weights come back to float rounding.
- 8-bit (`pack8`): symmetric, scale max|w| / 127, codes offset by 128 so they are unsigned (min = -128 *
  scale). For matrices 4-bit groups do not reproduce (a Q6_K / Q8_0 embedding, float checkpoints).

`pick` measures each matrix: 4-bit where its relative error (max |w' - w| / max |w|) stays under
EXACT_4BIT, else 8-bit. `four_bit` takes a quantized file's 4-bit codes and group scales as they are.

The layout is forward.c's register tile, one run of bytes per matrix that the kernel reads front to back:
`tiles` [blocks, groups, code bytes + 64], block b holding rows 16b..16b+15 (the last block padded with zero
codes and scales). A tile's group is its 16 rows' codes (16 * 32 bytes in 8 bits, 16 * 16 in 4), then their
16 scales and 16 minimums as IEEE half floats (64 bytes: one cache line). Within the codes, chunk k (64
bytes) holds inputs 4k..4k+3 of each row in turn, so one 64-byte vector holds 4 consecutive codes of each of
16 rows (an int32 lane per row for vpdpbusd); 4-bit groups take 4 chunks: low nibbles inputs 4k..4k+3, high
nibbles inputs 16+4k..16+4k+3. Scales beside their codes, in half floats: a group-major float32 table read
alongside made 1-token decode steps 1.4x slower (48 interleaved streams for the prefetcher, a third more
bytes). Half floats are exact for a Q4_1 / Q8_0 GGUF, whose blocks store d and m as half floats.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

GROUP = 32
TILE_ROWS = 16  # forward.c's rows per register tile: an int32 lane each in a 512-bit vector
SCALE_BYTES = TILE_ROWS * 2 * 2  # a tile group's 16 half-float scales and 16 minimums
EXACT_4BIT = 1e-4  # a Q4_1 matrix re-packs to ~1e-7; one that was never 4-bit errs by ~1e-2
PICK_ROWS = 4096  # rows `pick` packs at a time (whole tiles)
SLICE_ROWS = 1024  # rows `pick_slices` reads at a time: its temporaries, a few MB
FIT_ROUNDS = 6  # pack4_fitted's least-squares rounds (the error barely moves after 4)
LARGEST_WEIGHT = 2.0 ** 15  # the 8-bit minimum (-128 x scale) of a larger one would pass float16's largest


@dataclass
class Packed:
    tiles: torch.Tensor  # uint8 [blocks, groups, 16 * 32 * bits / 8 + SCALE_BYTES]: the module's layout
    rows: int
    bits: int

    @property
    def cols(self) -> int:
        return self.tiles.shape[1] * GROUP

    @property
    def halves(self) -> torch.Tensor:
        """the tiles viewed as float16 [blocks, groups, bytes / 2] (the same memory), for `tile_scales`"""
        return self.tiles.view(torch.float16)

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """float32 [rows, cols] (of the given row indices, else every row)."""
        if rows is None:
            return tiled_weights(self.tiles, self.halves, self.bits)[:self.rows]
        return picked_weights(self.tiles, self.halves, self.bits, rows)


# The functions below read the layout; packed_torch.py's modules script them, so they spell out the tile's
# 16 rows and 64 scale bytes (TorchScript does not read module globals) and keep to ops it compiles.
def tile_scales(halves: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, minimum): float16 [blocks, groups, 16] of each tile group's rows, from `halves`, the tiles
    viewed as float16 (Packed.halves: TorchScript cannot reinterpret bytes itself)."""
    start = 16 * 32 * bits // 16
    return halves[:, :, start:start + 16], halves[:, :, start + 16:start + 32]


def tiled_rows(tiles: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes [blocks * 16, cols] of every row of `tiles`, padding rows included."""
    blocks, groups = tiles.shape[0], tiles.shape[1]
    chunks = tiles[:, :, :16 * 32 * bits // 8].reshape(blocks, groups, -1, 16, 4).permute(0, 3, 1, 2, 4)
    if bits == 4:  # [block, row, group, chunk, byte]
        chunks = torch.cat([chunks & 15, chunks >> 4], dim=3)
    return chunks.reshape(blocks * 16, -1)


def picked_rows(tiles: torch.Tensor, bits: int, rows: torch.Tensor) -> torch.Tensor:
    """uint8 codes [len(rows), cols] of the given row indices of `tiles`."""
    blocks, groups = tiles.shape[0], tiles.shape[1]
    chunks = tiles[:, :, :16 * 32 * bits // 8].reshape(blocks, groups, -1, 16, 4)[rows // 16, :, :, rows % 16]
    if bits == 4:  # [n, group, chunk, byte]
        chunks = torch.cat([chunks & 15, chunks >> 4], dim=2)
    return chunks.reshape(rows.shape[0], -1)


def tiled_weights(tiles: torch.Tensor, halves: torch.Tensor, bits: int) -> torch.Tensor:
    """float32 weights [blocks * 16, cols] of every row of `tiles`, padding rows included."""
    codes = tiled_rows(tiles, bits)
    rows, groups = codes.shape[0], tiles.shape[1]
    scale, minimum = tile_scales(halves, bits)  # [block, group, row] -> [block * 16 + row, group, 1]
    scale = scale.permute(0, 2, 1).reshape(rows, groups, 1).to(torch.float32)
    minimum = minimum.permute(0, 2, 1).reshape(rows, groups, 1).to(torch.float32)
    return (codes.reshape(rows, groups, -1).to(torch.float32) * scale + minimum).reshape(rows, -1)


def picked_weights(tiles: torch.Tensor, halves: torch.Tensor, bits: int, rows: torch.Tensor) -> torch.Tensor:
    """float32 weights [len(rows), cols] of the given row indices of `tiles`."""
    codes = picked_rows(tiles, bits, rows)
    groups = tiles.shape[1]
    scale, minimum = tile_scales(halves, bits)  # [block, group, row] -> [n, group, 1]
    scale = scale[rows // 16, :, rows % 16].reshape(-1, groups, 1).to(torch.float32)
    minimum = minimum[rows // 16, :, rows % 16].reshape(-1, groups, 1).to(torch.float32)
    return (codes.reshape(-1, groups, 32).to(torch.float32) * scale + minimum).reshape(rows.shape[0], -1)


def _tiled(codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, bits: int) -> Packed:
    """[rows, cols] codes and [rows, groups] half-float scales and minimums -> the module's tile layout."""
    rows, cols = codes.shape
    blocks, groups = -(-rows // TILE_ROWS), cols // GROUP
    padded = torch.zeros(blocks * TILE_ROWS, cols, dtype=torch.uint8)
    padded[:rows] = codes
    chunks = padded.view(blocks, TILE_ROWS, groups, 8, 4)  # [block, row, group, chunk, byte]
    if bits == 4:
        chunks = chunks[:, :, :, :4] | (chunks[:, :, :, 4:] << 4)
    parameters = torch.zeros(blocks * TILE_ROWS, groups, 2, dtype=torch.float16)
    parameters[:rows, :, 0], parameters[:rows, :, 1] = scale, minimum
    parameters = parameters.view(blocks, TILE_ROWS, groups, 2).permute(0, 2, 3, 1)  # [block, group, which, row]
    tiles = torch.cat([chunks.permute(0, 2, 3, 1, 4).reshape(blocks, groups, -1),
                       parameters.contiguous().view(torch.uint8).reshape(blocks, groups, SCALE_BYTES)], dim=2)
    return Packed(tiles, rows, bits)


def _groups(weight: torch.Tensor) -> torch.Tensor:
    return _checked(weight)[0]


def _checked(weight: torch.Tensor) -> tuple[torch.Tensor, float]:
    """`weight` as float32 groups [rows, cols / 32, 32], and its largest |w|."""
    rows, cols = weight.shape
    if cols % GROUP:
        raise ValueError(f"a projection's input width ({cols}) must be a multiple of {GROUP}")
    groups = weight.detach().float().reshape(rows, cols // GROUP, GROUP)
    largest = float(groups.abs().max()) if groups.numel() else 0.0
    if not math.isfinite(largest) or largest > LARGEST_WEIGHT:  # a NaN anywhere makes the max NaN
        raise ValueError(f"a projection's weights must be finite and within +-{LARGEST_WEIGHT:g}")
    return groups, largest


def _four(groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """pack4's codes (uint8, as `groups`), scales and minimums (float16 [rows, groups])."""
    low = groups.amin(-1).half()
    scale = ((groups.amax(-1) - low.float()) / 15).half()  # from the rounded minimum: the top code stays 15
    step = scale.float()
    safe = torch.where(step > 0, step, torch.ones_like(step))
    codes = ((groups - low.float().unsqueeze(-1)) / safe.unsqueeze(-1)).round().clamp_(0, 15).to(torch.uint8)
    return codes, scale, low


def pack4(weight: torch.Tensor) -> Packed:
    codes, scale, low = _four(_groups(weight))
    return _tiled(codes.reshape(weight.shape[0], -1), scale, low, 4)


def _error4(groups: torch.Tensor) -> float:
    """max |w' - w| of pack4's weights w' (what its tiles dequantize to, the same float operations), without
    laying out the tiles."""
    codes, scale, low = _four(groups)
    back = codes.to(torch.float32) * scale.float().unsqueeze(-1) + low.float().unsqueeze(-1)
    return float((back - groups).abs().max()) if groups.numel() else 0.0


def pack4_fitted(weight: torch.Tensor) -> Packed:
    """4 bits for a matrix they do not reproduce (a family's `vocab_bits`): from `pack4`'s min / max, FIT_ROUNDS
    rounds of each group's scale and minimum fitted by least squares to its codes, then the codes rounded again
    to them: each half of a round lowers the group's squared error (Gemma 3's vocabulary: RMS 7% below pack4's,
    its perplexity 1.08x float32's against 1.12x). A group 4 bits reproduce keeps its codes."""
    groups = _groups(weight)
    low = groups.amin(-1)
    scale = (groups.amax(-1) - low) / 15
    for _ in range(FIT_ROUNDS):
        codes = _codes4(groups, scale, low)
        mean_code, mean_weight = codes.mean(-1), groups.mean(-1)
        spread = (codes * codes).mean(-1) - mean_code * mean_code
        fitted = ((codes * groups).mean(-1) - mean_code * mean_weight) / spread.clamp_min(1e-12)
        scale = torch.where(spread > 1e-6, fitted, scale)
        low = mean_weight - scale * mean_code
    scale, low = scale.half(), low.half()
    codes = _codes4(groups, scale.float(), low.float()).to(torch.uint8)
    return _tiled(codes.reshape(weight.shape[0], -1), scale, low, 4)


def _codes4(groups: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return ((groups - low.unsqueeze(-1)) / safe.unsqueeze(-1)).round().clamp_(0, 15)


def pack8(weight: torch.Tensor) -> Packed:
    return _eight(_groups(weight), weight.shape[0])


def _eight(groups: torch.Tensor, rows: int) -> Packed:
    scale = (groups.abs().amax(-1) / 127).half()
    step = scale.float()
    safe = torch.where(step > 0, step, torch.ones_like(step))
    codes = ((groups / safe.unsqueeze(-1)).round().clamp_(-127, 127) + 128).to(torch.uint8)
    return _tiled(codes.reshape(rows, -1), scale, (-128 * step).half(), 8)


def four_bit(codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> Packed:
    """4-bit codes [rows, cols] and their groups' scales and minimums [rows, cols / 32] as a quantized file
    holds them (a GGUF's Q4_0 / Q4_1 / Q4_K blocks) -> the layout, without a float copy of the matrix. The
    half floats are exact for Q4_0 / Q4_1, whose blocks store them so; Q4_K's scales (a half-float scale times
    a 6-bit one) round to a relative 2^-11, a tenth of what repacking its dequantized weights in 8 bits errs."""
    if codes.shape[1] % GROUP or scale.shape != (codes.shape[0], codes.shape[1] // GROUP) != minimum.shape:
        raise ValueError(f"4-bit codes {tuple(codes.shape)} need scales of [rows, {codes.shape[1] // GROUP}]")
    largest = float((scale.abs() * 15 + minimum.abs()).max()) if scale.numel() else 0.0
    if not math.isfinite(largest) or largest > LARGEST_WEIGHT:
        raise ValueError(f"a projection's weights must be finite and within +-{LARGEST_WEIGHT:g}")
    return _joined([_tiled(c, s, m, 4) for c, s, m in zip(codes.split(PICK_ROWS), scale.split(PICK_ROWS),
                                                          minimum.split(PICK_ROWS))])


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


def pick_slices(slices: Callable[[], Iterable[torch.Tensor]], rows: int) -> Packed:
    """`pick` of a matrix of `rows` rows read from a file a few at a time (`slices()` yields them, whole tiles
    but the last, and reads them again when called again): no float copy of the whole exists, nor a 4-bit
    pack beside the 8-bit one, nor the slices' packs beside their join. The first pass packs 8 bits and
    measures 4; only a matrix that 4 bits reproduce is read again."""
    measured = {"error": 0.0, "largest": 0.0}

    def eights() -> Iterator[Packed]:
        for part in slices():
            groups, largest = _checked(part)  # once for both: the check, 4 bits' error and the 8-bit pack
            measured["error"] = max(measured["error"], _error4(groups))
            measured["largest"] = max(measured["largest"], largest)
            yield _eight(groups, part.shape[0])

    packed = _gathered(eights(), rows)
    if measured["error"] > EXACT_4BIT * max(measured["largest"], 1e-30):
        return packed
    del packed
    return _gathered((pack4(part) for part in slices()), rows)


def pack_fixed(weight: torch.Tensor, bits: int) -> Packed:
    """`weight` in `bits` (4 or 8) whether or not that reproduces it (a family's `vocab_bits`), PICK_ROWS rows at
    a time."""
    return _joined([_PACKERS[bits](part) for part in weight.detach().split(PICK_ROWS)])


def fixed_slices(slices: Callable[[], Iterable[torch.Tensor]], rows: int, bits: int) -> Packed:
    """`pack_fixed` of a matrix read a slice at a time (`pick_slices`' `slices`), in one pass."""
    return _gathered((_PACKERS[bits](part) for part in slices()), rows)


def _gathered(parts: Iterable[Packed], rows: int) -> Packed:
    """Slices' packs copied one by one into the whole matrix's tiles (a join would hold both)."""
    tiles, at, bits = None, 0, 0
    for part in parts:
        if tiles is None:
            tiles, bits = torch.empty(-(-rows // TILE_ROWS), *part.tiles.shape[1:], dtype=torch.uint8), part.bits
        if part.rows % TILE_ROWS and at + part.tiles.shape[0] < tiles.shape[0] or \
                at + part.tiles.shape[0] > tiles.shape[0]:
            raise ValueError(f"slices of a {rows}-row matrix must be whole tiles of {TILE_ROWS} rows but the last")
        tiles[at:at + part.tiles.shape[0]] = part.tiles
        at += part.tiles.shape[0]
    if tiles is None or at != tiles.shape[0]:
        raise ValueError(f"a projection's slices hold {at * TILE_ROWS} rows, not {rows}")
    return Packed(tiles, rows, bits)


_PACKERS: dict[int, Callable[[torch.Tensor], Packed]] = {4: pack4_fitted, 8: pack8}


def _joined(parts: list[Packed]) -> Packed:
    if len(parts) == 1:
        return parts[0]
    # slices of PICK_ROWS rows are whole tiles (blocks, dim 0)
    return Packed(torch.cat([p.tiles for p in parts]), sum(p.rows for p in parts), parts[0].bits)
