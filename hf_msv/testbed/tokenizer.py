"""Character-level tokenizer of the testbed LM, built with ``tokenizers`` and saved as a ``PreTrainedTokenizerFast``.

Every printable ASCII character and ``\\n`` is one token; the streaming delimiter ``Wait`` is one extra token (so a
delimiter is a single, matchable token id); ``<bos>``, ``<eos>``, ``<pad>``, ``<unk>`` are special. Encoding prepends
``<bos>``; decoding concatenates the pieces (no spaces inserted).
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
WORD_TOKENS = ["Wait"]
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]


def build_tokenizer():
    """A fresh ``PreTrainedTokenizerFast`` (pad id 0, bos 1, eos 2, unk 3)."""
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + WORD_TOKENS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    pattern = "|".join(WORD_TOKENS) + r"|[\s\S]"
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
