"""A tiny SentencePiece-style tokenizer (Metaspace + byte fallback, as Llama/Mistral), built in memory."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

SAY, HELLO, WORLD, BANG, SPACE = 3, 4, 5, 6, 7
EMOJI = [8, 9, 10, 11]  # the four UTF-8 bytes of 😀 as <0x..> byte-fallback tokens


def sentencepiece_style_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "▁Say": SAY, "▁Hello": HELLO, "▁world": WORLD, "!": BANG,
             "▁": SPACE}
    for i, byte in enumerate("😀".encode()):
        vocab[f"<0x{byte:02X}>"] = EMOJI[i]
    model = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    # the Llama decoder: ▁ -> space, bytes fused, and the first leading space of a decode stripped
    model.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=model, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
