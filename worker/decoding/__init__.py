"""Per-row, batch-vectorized decoding: logits processors, warpers, sampling, stops, detokenizer."""

from worker.decoding.bad_words import tokenize_bad_words
from worker.decoding.batch import DecodingBatch
from worker.decoding.detokenizer import IncrementalDetokenizer
from worker.decoding.finish import finish_reason
from worker.decoding.rows import RowSpec
from worker.decoding.sampling import Choice
from worker.decoding.stops import StopMatcher
from worker.decoding.watermark import watermark_z_score

__all__ = [
    "Choice",
    "DecodingBatch",
    "IncrementalDetokenizer",
    "RowSpec",
    "StopMatcher",
    "finish_reason",
    "tokenize_bad_words",
    "watermark_z_score",
]
