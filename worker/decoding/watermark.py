"""Kirchenbauer et al. (2023) green-list watermark and its z-score detector.

The green list for the next token is seeded by the previous token and a fixed key. Instead of one
`randperm(V)` per row per step, membership is a 32-bit integer hash of (key, previous token, candidate
token), computed for the whole [rows, V] block at once; a token is green when its hash falls below
gamma * 2^32. Each token is then green with probability gamma independently, which is all the
detector's z-test needs. All arithmetic stays below 2^63 so int64 never overflows.
"""

from __future__ import annotations

import math

import torch

HASH_KEY = 15485863  # the paper's fixed key (a prime)
_MASK = 0xFFFFFFFF


def _mix(x: torch.Tensor) -> torch.Tensor:
    """An avalanche hash on 32-bit values held in int64 (multipliers < 2^31 keep products < 2^63)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _MASK
    return x ^ (x >> 16)


def _seed(previous: torch.Tensor, key: int) -> torch.Tensor:
    return _mix((previous.long() ^ key) & _MASK)


def _threshold(gamma: torch.Tensor) -> torch.Tensor:
    return (gamma.double() * 2.0**32).long()


def green_mask(previous: torch.Tensor, vocab_size: int, gamma: torch.Tensor, key: int = HASH_KEY) -> torch.Tensor:
    """[rows, V] bool: the green list of each row given its previous token ([rows] long) and gamma ([rows])."""
    vocab = torch.arange(vocab_size, device=previous.device, dtype=torch.long)
    hashed = _mix(_seed(previous, key)[:, None] ^ vocab[None, :])
    return hashed < _threshold(gamma).to(previous.device)[:, None]


def is_green(previous: torch.Tensor, tokens: torch.Tensor, gamma: float, key: int = HASH_KEY) -> torch.Tensor:
    """[T] bool: whether each token is on the green list of the token before it."""
    return _mix(_seed(previous, key) ^ tokens.long()) < int(gamma * 2.0**32)


def apply_watermark(scores: torch.Tensor, rows: torch.Tensor, previous: torch.Tensor, gamma, delta) -> None:
    """In place: add delta to the green-list logits of `rows` (filtered -inf scores stay -inf)."""
    green = green_mask(previous, scores.shape[-1], gamma)
    scores[rows] = scores[rows] + delta[:, None] * green


def watermark_z_score(
    token_ids: list[int],
    vocab_size: int,
    gamma: float = 0.5,
    key: int = HASH_KEY,
    context: int | None = None,
) -> float:
    """z = (green - gamma T) / sqrt(T gamma (1 - gamma)) over the T scored tokens.

    `token_ids` is the generated text; `context` is the token before it (the prompt's last token) so the
    first generated token is scored too. Around 4 or more means watermarked.
    """
    seq = ([context] if context is not None else []) + list(token_ids)
    if len(seq) < 2:
        return 0.0
    ids = torch.tensor(seq, dtype=torch.long)
    previous, current = ids[:-1], ids[1:]
    if int(ids.max()) >= vocab_size:
        raise ValueError("token id outside the vocabulary")
    hits = int(is_green(previous, current, gamma, key).sum())
    total = len(current)
    return (hits - gamma * total) / math.sqrt(total * gamma * (1 - gamma))
