"""Each row's first maximum and logsumexp, what choosing a token needs of a step's scores: in C where the
native library is loaded (worker/engine/native/logit_stats.c, one pass a reduction), else in torch / NumPy.

The engine's q4 runner hands the library over when it loads it (`use_native`); other runners leave torch's
reductions in place. Either way a row's results depend on that row alone (batch-invariant logprobs).
"""

from __future__ import annotations

import ctypes

import torch

_native = None  # the library's sluice_logit_stats, once handed over


def use_native(library: ctypes.CDLL) -> None:
    """Reduce with the native library's `sluice_logit_stats` from now on in this process."""
    global _native
    function = library.sluice_logit_stats
    function.restype = None
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                         ctypes.c_void_p, ctypes.c_void_p]
    _native = function


def _native_fits(*tensors: torch.Tensor) -> bool:
    first = tensors[0]
    return all(t.device.type == "cpu" and t.dtype == torch.float32 and t.dim() == 2 and t.stride(1) == 1
               and t.shape == first.shape and t.stride(0) == first.stride(0) for t in tensors) \
        and first.shape[0] > 0 and first.shape[1] > 0


def argmax(scores: torch.Tensor) -> torch.Tensor:
    """`scores.argmax(dim=-1)`: the same index (the first of equal maxima; a NaN counts as the maximum), from
    NumPy's vectorized argmax on a CPU tensor, which takes microseconds where torch's takes ~0.15 ms per row
    of a 49k vocabulary."""
    if scores.device.type != "cpu" or scores.dtype != torch.float32 or scores.dim() != 2:
        return scores.argmax(dim=-1)
    return torch.from_numpy(scores.detach().numpy().argmax(axis=-1))


def argmax_and_logsumexp(scores: torch.Tensor, logprob_scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(`argmax(scores)`, `torch.logsumexp(logprob_scores, dim=-1)`) of [B, V] tensors."""
    if _native is None or not _native_fits(scores, logprob_scores):
        return argmax(scores), torch.logsumexp(logprob_scores, dim=-1)
    rows, cols = scores.shape
    best = torch.empty(rows, dtype=torch.long)
    lse = torch.empty(rows, dtype=torch.float32)
    _native(scores.data_ptr(), logprob_scores.data_ptr(), rows, cols, scores.stride(0), best.data_ptr(),
            lse.data_ptr())
    return best, lse
