"""LoRA updates for a batch whose rows use different adapters (or none), inside one forward.

Rows are grouped by adapter into segments; for each segment and projection group the update is
x[rows] @ A @ B added to the base projection's output at those rows. A segment that covers every
row of the step reads x and writes the output in place (no gather). Rows of the base model are in no
segment and cost nothing. So the work is the base forward plus, per adapter present in the step, two
skinny matmuls per projection group: not one forward per adapter, and no per-row copy of weights
(the gathered bmm alternative copies every row's A and B each layer: ~15 MB per row per step on
SmolLM2 at rank 8).

`add_lora` is TorchScript-compatible: the scripted decode layer (decode_layer.py) calls it too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.lora.adapter import LoraAdapter

_ALL_ROWS = torch.empty(0, dtype=torch.long)  # a segment's rows: every row of the step


def add_lora(x: torch.Tensor, out: torch.Tensor, rows: list[torch.Tensor], weights: list[torch.Tensor],
             group: int) -> None:
    """out += the LoRA update of projection group `group` (adapter.GROUPS) for each segment.

    x: [N, in] and out: [N, out] (2-D views of the projection's input and output); rows[s]: the row
    indices of segment s (empty = all rows); weights: 8 tensors per segment (A, B per group; an empty
    A = the segment's adapter leaves this group alone)."""
    for segment in range(len(rows)):
        down = weights[8 * segment + 2 * group]
        if down.numel() == 0:
            continue
        up = weights[8 * segment + 2 * group + 1]
        picked = rows[segment]
        if picked.numel() == 0:
            out.addmm_(torch.mm(x, down), up)
        else:
            out.index_add_(0, picked, torch.mm(torch.mm(x.index_select(0, picked), down), up))


@dataclass
class LoraRows:
    """The adapter segments of one forward's rows."""

    rows: list[torch.Tensor]  # per segment: row indices (empty tensor = every row)
    adapters: list[LoraAdapter]  # per segment

    def weights(self, layer: int) -> list[torch.Tensor]:
        """What add_lora takes for `layer`: 8 tensors per segment."""
        if len(self.adapters) == 1:
            return self.adapters[0].layers[layer]
        return [tensor for adapter in self.adapters for tensor in adapter.layers[layer]]


NO_LORA = LoraRows([], [])


def lora_rows(adapters: list[LoraAdapter | None], device: torch.device) -> LoraRows:
    """Segments for rows whose adapters are `adapters` (None = base model), in first-seen order."""
    members: dict[int, list[int]] = {}
    by_id: dict[int, LoraAdapter] = {}
    for row, adapter in enumerate(adapters):
        if adapter is not None:
            members.setdefault(id(adapter), []).append(row)
            by_id[id(adapter)] = adapter
    if not members:
        return NO_LORA
    if len(members) == 1 and len(next(iter(members.values()))) == len(adapters):
        return LoraRows([_ALL_ROWS], list(by_id.values()))
    return LoraRows([torch.tensor(rows, device=device) for rows in members.values()],
                    [by_id[key] for key in members])
