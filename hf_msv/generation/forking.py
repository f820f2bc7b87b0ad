"""Branches: a fired row copied into the decoding batch, fed its elicitation segment, then its greedy answer.

`Branch` says how a fired row's branch context is built, `LiveBranch` is a branch while it is a row of the decoding
batch (`lockstep`), and `AnswerElicitor` turns fired rows into branches and decides when an answer ends. A branch
row is fed one token per forward: its *segment* (the newest sampled token when it belongs to the context, the text
of the delimiter's first token that precedes the delimiter, the elicitation prompt), then its greedy answer tokens,
until the box closes, EOS or ``max_answer_tokens``. A delimiter is not part of the branch: its tokens already in the
cache are left out (`caches.branch_cache`). The hidden state of answer token a_i is the LM's last-layer output
(``hidden_states[-1]``, after the final norm) where a_i is the input. Design and timing: ``docs/generation.md``;
how left-out tokens are hidden on each cache layer type: ``docs/caches.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..answers import find_box_end
from .delimiters import DelimiterMatch

__all__ = ["CHAIN_ENDS", "AnswerElicitor", "Branch", "LiveBranch", "ends_chain"]

CHAIN_ENDS = ("eos", "budget")  # the triggers of an answer elicited because its chain ended


def ends_chain(trigger: str) -> bool:
    """Whether an answer elicited by `trigger` is elicited because its chain ended (EOS or the token budget): the
    one place that knows which triggers end a chain."""
    return trigger in CHAIN_ENDS


@dataclass
class Branch:
    """A row that fires at the current step and how its branch context is built.

    Args:
        row: batch row of the sequence.
        trigger: ``"delimiter"``, ``"every_k"``, ``"eos"`` or ``"budget"`` (see `MSVAnswer.trigger`).
        tau: the step at which it fired.
        drop: trailing cached chain-of-thought tokens hidden from the branch (a delimiter's leading tokens).
        feed_newest: whether the newest sampled token (not in the cache yet) belongs to the context.
        prefix_ids: tokens fed before the elicitation prompt (text of the delimiter's first token that precedes it).
        terminal: its answer is the sequence's terminal answer (EOS, budget, or a delimiter at the last step).
    """

    row: int
    trigger: str
    tau: int = -1
    drop: int = 0
    feed_newest: bool = False
    prefix_ids: list[int] = field(default_factory=list)
    terminal: bool = False

    @property
    def ends_chain(self) -> bool:
        """Its chain ended here (EOS or budget): the chain decodes no further token."""
        return ends_chain(self.trigger)

    @property
    def is_terminal(self) -> bool:
        """Its answer is its chain's terminal answer (the chain ended, or a delimiter fired at the last step)."""
        return self.terminal or self.ends_chain

    @property
    def kept(self) -> int:
        """Chain-of-thought tokens in the branch's context: tokens 0..τ, less the newest when it is not fed and the
        delimiter tokens left out."""
        return self.tau + 1 - (0 if self.feed_newest else 1) - self.drop


@dataclass
class LiveBranch:
    """A branch while it is a row of the decoding batch.

    Args:
        branch: how it was taken.
        segment: the tokens fed before the answer (newest token, prefix, elicitation prompt).
        fed: segment tokens fed so far.
        token_ids: answer tokens chosen so far (the last one not fed yet).
        hidden: `(d,)` last-layer states of the answer tokens fed so far.
        token_logprobs: log p of each chosen answer token.
        closed: the last chosen token ends the answer (it still has to be fed for its hidden state).
    """

    branch: Branch
    segment: list[int]
    fed: int = 0
    token_ids: list[int] = field(default_factory=list)
    hidden: list[torch.Tensor] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    closed: bool = False

    @property
    def answering(self) -> bool:
        """The next input is an answer token (its hidden state is kept)."""
        return self.fed == len(self.segment)

    def next_input(self) -> int:
        return self.token_ids[-1] if self.answering else self.segment[self.fed]

    @property
    def complete(self) -> bool:
        """Every answer token, the closing one included, has been fed."""
        return self.closed and len(self.hidden) == len(self.token_ids)


class AnswerElicitor:
    """The elicitation settings of an `MSVSession`: how a fired row becomes a branch and when an answer ends.

    Args:
        tokenizer: the LM's tokenizer.
        elicitation_prompt: text appended to a branch to elicit its answer.
        max_answer_tokens: cap on answer tokens.
        keep_delimiter: keep the delimiter in the branch context instead of branching just before it.
    """

    def __init__(self, tokenizer, elicitation_prompt: str, max_answer_tokens: int, keep_delimiter: bool):
        self.tokenizer = tokenizer
        self.max_answer_tokens = max_answer_tokens
        self.keep_delimiter = keep_delimiter
        self.prompt_ids = tokenizer(elicitation_prompt, add_special_tokens=False)["input_ids"]
        if not self.prompt_ids:
            raise ValueError("the elicitation prompt must encode to at least one token.")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id = pad if pad is not None else 0

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def delimiter_branch(self, row: int, tau: int, found: DelimiterMatch) -> Branch:
        """The branch of a row whose newest token completed the delimiter occurrence `found`."""
        if self.keep_delimiter:
            return Branch(row, "delimiter", tau, feed_newest=True)
        prefix = self.tokenizer(found.prefix, add_special_tokens=False)["input_ids"] if found.prefix else []
        return Branch(row, "delimiter", tau, drop=found.num_tokens - 1, prefix_ids=prefix)

    def start(self, branch: Branch, history: Sequence[int]) -> LiveBranch:
        """The live state of `branch`, whose sequence has generated `history` (newest token included)."""
        newest = [history[-1]] if branch.feed_newest else []
        return LiveBranch(branch, newest + branch.prefix_ids + self.prompt_ids)

    def ends_answer(self, ids: Sequence[int], eos_ids: set[int]) -> bool:
        """Whether the answer tokens `ids` are complete: EOS, the cap, or a closed box."""
        return ids[-1] in eos_ids or len(ids) >= self.max_answer_tokens or find_box_end(self.decode(ids)) is not None
