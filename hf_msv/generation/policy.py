"""`ElicitationPolicy`: where a chain's answers are elicited, the one rule every engine calls.

The rule, per newest token of a chain: EOS fires the terminal answer; otherwise, in streaming mode, a completed
delimiter fires, else every K generated tokens, either only once ``min_gap_tokens`` tokens have passed since the
chain's previous elicitation when the settings space answers; a chain the engine ends without EOS (its token
budget) gets its terminal answer at its last token, unless a delimiter fired at that very token (that answer
already sees the whole chain). `GenerationRun` (``model.generate``), the vLLM controller and trace re-encoding
(`collect.reencode`) all call `ElicitationPolicy.fire` and `ElicitationPolicy.at_budget`, and read EOS ids through
`eos_token_ids`, so a verifier meets the schedule it was trained on whichever engine runs it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence

import torch

from ..elicitation import ElicitationSettings
from .delimiters import DelimiterMatcher
from .forking import AnswerElicitor, Branch

__all__ = ["ElicitationPolicy", "eos_token_ids"]


def eos_token_ids(config, tokenizer=None) -> set[int]:
    """The token ids that end a chain of thought.

    Args:
        config: anything with an ``eos_token_id`` (a `GenerationConfig`, a model config; an int, a list, a tensor
            or `None`).
        tokenizer: also count its ``eos_token_id`` (engines such as vLLM stop on both); `None`: the config's only,
            as ``model.generate`` stops.

    Returns:
        The set of ids (empty when neither names one).
    """
    eos = getattr(config, "eos_token_id", None)
    ids: set[int]
    if torch.is_tensor(eos):
        ids = set(eos.flatten().tolist())
    elif isinstance(eos, int):
        ids = {eos}
    else:
        ids = set(eos or ())
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


class ElicitationPolicy:
    """The elicitation settings of a run, made concrete for one tokenizer and EOS set.

    Args:
        tokenizer: the LM's tokenizer (delimiter matching, elicitation prompt).
        settings: the `ElicitationSettings` (`hf_msv.elicitation.resolve_elicitation`).
        eos_ids: the ids that end a chain (`eos_token_ids`).

    Attributes:
        elicitor: the `AnswerElicitor` (how a fired row becomes a branch, when an answer ends).
        matcher: the `DelimiterMatcher`, or `None` (no delimiters, or terminal mode).
    """

    def __init__(self, tokenizer, settings: ElicitationSettings, eos_ids: Iterable[int] = ()):
        self.settings = settings
        self.streaming = settings.mode == "streaming"
        self.eos_ids = set(eos_ids)
        self.elicitor = AnswerElicitor(tokenizer, settings.prompt, settings.max_answer_tokens, settings.keep_delimiter)
        use_delimiters = settings.delimiters and self.streaming
        self.matcher = DelimiterMatcher(tokenizer, list(settings.delimiters)) if use_delimiters else None

    def with_eos(self, eos_ids: Iterable[int]) -> ElicitationPolicy:
        """The same policy for another EOS set (a ``generate`` call may pass its own ``eos_token_id``); the
        tokenizer tables are shared, not rebuilt.

        Args:
            eos_ids: the EOS token ids.

        Returns:
            A shallow copy of this policy with those EOS ids.
        """
        policy = copy.copy(self)
        policy.eos_ids = set(eos_ids)
        return policy

    def fire(self, row: int, history: Sequence[int], t: int, previous: Branch | None = None) -> Branch | None:
        """Whether the newest token of a chain fires an elicitation.

        Args:
            row: the chain's row (carried into the `Branch`).
            history: the chain's generated tokens, newest (token t) last.
            t: the step of the newest token (0 at the first generated token).
            previous: the chain's last fired branch, or `None` (read only when the settings space answers).

        Returns:
            The `Branch` to elicit (trigger ``"eos"``, ``"delimiter"`` or ``"every_k"``), or `None`.
        """
        token = history[-1]
        if token in self.eos_ids:
            return Branch(row, "eos", t)
        if not self.streaming:
            return None
        if self.settings.too_soon(t, None if previous is None else previous.tau):
            return None  # too soon after the last answer: the delimiter is skipped, not deferred
        if self.matcher is not None and self.matcher.could_complete(token):
            found = self.matcher.match(history)
            if found is not None:
                return self.elicitor.delimiter_branch(row, t, found)
        every_k = self.settings.every_k_tokens
        if every_k and len(history) % every_k == 0:
            return Branch(row, "every_k", t, feed_newest=True)
        return None

    def at_budget(self, row: int, t: int, previous: Branch | None) -> Branch | None:
        """The terminal answer of a chain the engine ended without EOS after token t.

        Args:
            previous: the chain's last fired branch, or `None`. When it fired at t it becomes the terminal answer
                (marked in place): it already sees the whole chain, and eliciting again would duplicate it.

        Returns:
            The ``"budget"`` `Branch` to elicit, or `None` when `previous` is the terminal answer.
        """
        if previous is not None and previous.tau == t:
            previous.terminal = True
            return None
        return Branch(row, "budget", t, feed_newest=True)

    @property
    def extra_tokens(self) -> int:
        """The most context tokens an elicitation adds beyond the chain: re-fed delimiter text, the elicitation
        prompt and the answer."""
        window = self.matcher.window if self.matcher is not None else 0
        return len(self.elicitor.prompt_ids) + window + self.settings.max_answer_tokens
