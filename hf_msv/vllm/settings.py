"""Input checks of the vLLM controller: the tokenizer can express the delimiters."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["check_delimiters"]


def check_delimiters(tokenizer, delimiters: Sequence[str]) -> None:
    """Raise ValueError for a delimiter the tokenizer cannot produce (its text does not survive encode → decode,
    e.g. a character outside the vocabulary), which could never fire."""
    for delimiter in delimiters:
        ids = tokenizer(delimiter, add_special_tokens=False)["input_ids"]
        text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        unknown = tokenizer.unk_token_id is not None and tokenizer.unk_token_id in ids
        if not ids or unknown or delimiter not in text:
            raise ValueError(
                f"the tokenizer cannot express the delimiter {delimiter!r} (encodes to {ids}, decodes "
                f"to {text!r}): it would never fire."
            )
