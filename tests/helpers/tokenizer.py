"""Tiny tokenizers for tests, no downloads, built in milliseconds: characters plus chosen whole-word tokens."""

import re

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL = ["<pad>", "<bos>", "<eos>", "<unk>"]  # ids 0, 1, 2, 3
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]


def word_level_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    """Characters plus `words` as single tokens (longest match first), left padding, lossless decoding."""
    vocab = {t: i for i, t in enumerate(SPECIAL + words + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    pattern = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)) + r"|[\s\S]"
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
