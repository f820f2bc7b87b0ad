"""Delimiter detection on decoded text, independent of how the tokenizer splits or merges the delimiter."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["DelimiterMatch", "DelimiterMatcher"]


@dataclass
class DelimiterMatch:
    """A delimiter occurrence that ends inside the newest token.

    Args:
        delimiter: which delimiter matched.
        num_tokens: how many trailing tokens (newest included) overlap the occurrence.
        prefix: text of the first overlapping token that precedes the delimiter (e.g. ``"\\n\\n"`` of a
            ``"\\n\\nWait"`` token).
    """

    delimiter: str
    num_tokens: int
    prefix: str


# Decoding a 150k-token vocabulary takes ~2 s, which each `MSVSession` set-up would pay again; keyed weakly so that a
# tokenizer's table goes with it, and by vocabulary size so that tokens added later are seen.
_VOCABULARY_TEXTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def vocabulary_texts(tokenizer) -> list[str]:
    """The text of each token id decoded on its own (special tokens kept), computed once per tokenizer."""
    try:
        cached = _VOCABULARY_TEXTS.get(tokenizer)
    except TypeError:  # a tokenizer that cannot be weakly referenced or hashed: no cache
        cached = None
    if cached is not None and cached[0] == len(tokenizer):
        return cached[1]
    texts: list[str] = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False)
    with contextlib.suppress(TypeError):  # a tokenizer that cannot be weakly referenced is not cached
        _VOCABULARY_TEXTS[tokenizer] = (len(tokenizer), texts)
    return texts


class DelimiterMatcher:
    """Finds new occurrences of text delimiters at the end of a token sequence, independent of tokenisation.

    A delimiter such as ``"Wait"`` may be one token, split over several (``"Wa"`` + ``"it"``) or merged with what
    precedes it (``" Wait"``, ``"\\n\\nWait"``), so matching is done on decoded text: an occurrence counts when it
    ends inside the newest token, which makes every occurrence count exactly once, at the token that completes it.
    Matching is case-sensitive substring matching.

    Decoding every row at every step would dominate the per-step cost, so a per-vocabulary table first rules out
    tokens that cannot complete an occurrence: the newest token must contain the delimiter's last character (or be
    a token whose text is only known in context, such as a partial UTF-8 byte).

    Args:
        tokenizer: the LM's tokenizer.
        delimiters: the text delimiters, e.g. ``["Wait"]``.

    Raises:
        ValueError: if a delimiter is empty.
    """

    def __init__(self, tokenizer, delimiters: Sequence[str]):
        if any(not d for d in delimiters):
            raise ValueError("delimiters must be non-empty strings.")
        self.tokenizer = tokenizer
        self.delimiters = list(delimiters)
        # A delimiter of c characters spans at most c tokens that decode to at least one character; the margin
        # covers tokens that decode to nothing on their own.
        self.window = max(len(d) for d in self.delimiters) + 4
        last_chars = {d[-1] for d in self.delimiters}
        texts = vocabulary_texts(tokenizer)
        self._candidate = [(not text) or ("\ufffd" in text) or any(c in text for c in last_chars) for text in texts]
        # A token can start an occurrence that completes later only if its text ends with a proper prefix of a
        # delimiter, so it ends with one of these characters (or its text is only known in context).
        prefix_ends = {d[m - 1] for d in self.delimiters for m in range(1, len(d))}
        self._start_candidate = [(not text) or ("\ufffd" in text) or text[-1] in prefix_ends for text in texts]

    def could_complete(self, token_id: int) -> bool:
        """Cheap pre-filter: whether `token_id` can be the last token of an occurrence.

        Args:
            token_id: the newest token (ids beyond the vocabulary table are always candidates).

        Returns:
            Whether an occurrence may end at it.
        """
        return token_id >= len(self._candidate) or self._candidate[token_id]

    def could_start(self, generated: Sequence[int], back: int = 1) -> bool:
        """Whether an occurrence starting inside token ``generated[-back]`` may still complete at a later token.

        True when the decoded text ends with a proper prefix of a delimiter that begins inside that token (or the
        text from that token on is only known in context, e.g. a partial UTF-8 byte). A recurrent model's branch
        must start before such a token, so the `MSVSession` saves its state then and keeps it while this holds
        (`caches.RecurrentHistory`).

        Args:
            generated: the chain's generated token ids so far.
            back: which token from the end (1: the newest).

        Returns:
            Whether such an occurrence may still complete.
        """
        if not generated or back > min(len(generated), self.window - 1):
            return False  # an occurrence spans at most `window` tokens
        if back == 1 and generated[-1] < len(self._start_candidate) and not self._start_candidate[generated[-1]]:
            return False
        window = list(generated[-self.window :])
        j = len(window) - back
        full = self._decode(window)
        begin, end = len(self._decode(window[:j])), len(self._decode(window[: j + 1]))
        if end <= begin or "\ufffd" in full[begin:]:
            return True
        return any(
            full.endswith(d[:m]) and begin <= len(full) - m < end for d in self.delimiters for m in range(1, len(d))
        )

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def match(self, generated: Sequence[int]) -> DelimiterMatch | None:
        """The occurrence (earliest-starting, if several) that ends inside the last token of `generated`.

        Args:
            generated: the generated token ids of one sequence (prompt excluded, so a delimiter that starts in
                the prompt does not count).

        Returns:
            The `DelimiterMatch`, or `None` when no occurrence ends in the last token.
        """
        if not generated:
            return None
        window = list(generated[-self.window :])
        full = self._decode(window)
        prev_len = len(self._decode(window[:-1]))
        best = None
        for delimiter in self.delimiters:
            # Starting here guarantees that the occurrence ends after the text of the previous tokens.
            start = full.find(delimiter, max(0, prev_len - len(delimiter) + 1))
            if start != -1 and (best is None or start < best[0]):
                best = (start, delimiter)
        if best is None:
            return None
        start, delimiter = best
        # Find the token that contains the occurrence's first character.
        j = len(window) - 1
        while j > 0:
            prefix_len = len(self._decode(window[:j]))
            if prefix_len <= start:
                break
            j -= 1
        prefix_len = len(self._decode(window[:j])) if j > 0 else 0
        return DelimiterMatch(delimiter, len(window) - j, full[prefix_len:start])


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
