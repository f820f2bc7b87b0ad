"""Branches: a fired row's cache forked into the decoding batch, fed its elicitation prompt, then its greedy answer.

A branch is an extra row of the decoding batch (`lockstep`): `fork_cache` copies the fired row's KV cache into the
batch, and from the next forward on the branch row is fed one token per step alongside the main rows, first its
elicitation *segment* (the newest sampled token when it belongs to the context, the re-encoded text of the
delimiter's first token that precedes the delimiter, then the elicitation prompt), then its greedy answer tokens,
until `find_box_end` says the box closed, EOS, or ``max_answer_tokens``. Greedy decoding consumes no random numbers,
so the sampling of the main rows is untouched.

A delimiter is *not* part of the branch ("…so x = 5." + elicitation prompt, not "…so x = 5. Wait" + prompt): its
earlier tokens are in the cache and must be dropped. `Cache.crop` would drop the same number of tokens from every
row, while rows firing together may need different counts (a one-token "Wait" next to "Wa"+"it"), so the fork
instead masks those positions out in the branch row's attention mask and numbers the new tokens from the first
dropped position, which is equivalent to cropping the row by its own count. Recurrent layers (conv / SSM / linear
attention: LFM2, Mamba, Qwen3-Next ...) fold every consumed token into a fixed-size state and cannot be masked, so
there the branch row starts from the recurrent state saved before the delimiter's first token
(`caches.RecurrentHistory`, saved by the run each step; `caches.branch_cache` builds the row). Feeding one token per
forward is also what keeps transformers' Mamba-1 mixers (Mamba, FalconMamba, Jamba) exact: they restart their scan
from zero on a multi-token forward over a cache.

The hidden state of answer token a_i is the LM's last-layer output (after the final norm, ``hidden_states[-1]``) at
the position where a_i is the input; only these (L, d) vectors are kept, never other layers or chain-of-thought
positions. A branch taken at step τ with a segment of P tokens and an answer of L tokens therefore feeds its last
answer token at step τ + P + L: that is when the answer is complete and becomes available (`MSVAnswer.end`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..answers import find_box_end
from .caches import fork_cache
from .delimiters import DelimiterMatch

# fork_cache lives in `caches` (every cache layer type); re-exported here, where it has always been imported from.
__all__ = ["AnswerElicitor", "Branch", "LiveBranch", "fork_cache"]


@dataclass
class Branch:
    """A row that fires at the current step and how its branch context is built.

    Args:
        row: batch row of the sequence.
        trigger: ``"delimiter"``, ``"every_k"``, ``"eos"`` or ``"budget"`` (see `MSVAnswer.trigger`).
        tau: the step at which it fired.
        drop: trailing cached chain-of-thought tokens hidden from the branch (a delimiter's earlier tokens).
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
    """The elicitation settings of a session: how a fired row becomes a branch and when an answer ends.

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
