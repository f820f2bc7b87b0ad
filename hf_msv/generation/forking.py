"""Branching sampled sequences off the live KV cache and decoding their answers greedily, without recomputation.

The rows that fire at a step are forked from the main cache with one gather (`caches.fork_cache`), into tensors of
their own, so the main cache is never written and the sampled sequences continue unperturbed.
A delimiter is *not* part of the branch ("…so x = 5." + elicitation prompt, not "…so x = 5. Wait" + prompt): its
earlier tokens are in the cache and must be dropped. `Cache.crop` would drop the same number of tokens from every
row, while rows firing together may need different counts (a one-token "Wait" next to "Wa"+"it"), so the fork instead
masks those positions out in the attention mask and numbers the new tokens from the first dropped position, which is
equivalent to cropping each row by its own count. Recurrent layers (conv / SSM / linear attention: LFM2, Mamba,
Qwen3-Next ...) cannot be masked, so their branch starts from the state saved before the delimiter's first token
(`caches.branch_cache`, `caches.RecurrentHistory`; the run saves it). Text that shares the delimiter's first token
(the "\\n\\n" of a "\\n\\nWait" token) is re-encoded and fed before the prompt. The elicitation prompt of every
fired row is fed in one forward (segments of different lengths are left-padded *inside* the segment and masked),
then the answer is decoded greedily, batched over the fired rows, up to ``max_answer_tokens`` or until
`find_box_end` says the box closed.
With recurrent layers a padding token would enter the state, and transformers' Mamba-1 mixers (Mamba, FalconMamba,
Jamba) restart their scan from zero on a multi-token forward over a cache, so there the branches are batched by
segment length and each segment is fed one token per forward (exact for every layer type).
Greedy decoding consumes no random numbers, so the sampling stream of the main sequences is untouched and, with
early stopping off, the sampled tokens equal those of a plain ``generate`` with the same seed (tested). The hidden
state of answer token a_i is the LM's last-layer output (after the final norm, ``hidden_states[-1]``) at the position
where a_i is the input, so an answer of L tokens costs one prompt forward plus L single-token forwards. Only these
(L, d) vectors are kept, never other layers or chain-of-thought positions.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache

from ..answers import find_box_end
from .caches import RecurrentHistory, attention_length, branch_cache, fork_cache, has_recurrent_state
from .delimiters import DelimiterMatch

__all__ = ["AnswerElicitor", "Branch", "DecodeState", "ElicitedAnswer"]


@dataclass
class Branch:
    """A row that fires at the current step and how its branch context is built.

    Args:
        row: batch row of the sequence.
        trigger: ``"delimiter"``, ``"every_k"``, ``"eos"`` or ``"budget"`` (see `MSVAnswer.trigger`).
        drop: trailing cached chain-of-thought tokens hidden from the branch (a delimiter's earlier tokens).
        feed_newest: whether the newest sampled token (not in the cache yet) belongs to the context.
        prefix_ids: tokens fed before the elicitation prompt (text of the delimiter's first token that precedes it).
    """

    row: int
    trigger: str
    drop: int = 0
    feed_newest: bool = False
    prefix_ids: list[int] = field(default_factory=list)


@dataclass
class DecodeState:
    """What ``generate`` passed to the LM's latest decode forward: references only, no copies.

    Args:
        cache: the `Cache`, holding every token except the newest sampled one.
        attention_mask: `(batch, S)` 2D mask, or `None`.
        position_ids: `(batch, 1)` positions of the last forward's input, or `None`.
    """

    cache: Cache | None = None
    attention_mask: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None

    def record(self, kwargs: dict):
        """Take the references from the keyword arguments of a forward call (Mamba-style models name their
        cache ``cache_params``)."""
        self.cache = kwargs.get("past_key_values")
        if self.cache is None:
            self.cache = kwargs.get("cache_params")
        self.attention_mask = kwargs.get("attention_mask")
        self.position_ids = kwargs.get("position_ids")


@dataclass
class ElicitedAnswer:
    """One branch's greedy answer.

    Args:
        token_ids: the L answer tokens, up to and including the one that closes the box.
        raw_text: their decoded text.
        hidden_states: `(L, d)` last-layer hidden states (after the final norm) at the answer tokens.
        token_logprobs: L floats, log p(answer token i | context, tokens < i).
        fed_tokens: tokens fed before the answer (newest token, prefix, elicitation prompt).
    """

    token_ids: list[int]
    raw_text: str
    hidden_states: torch.Tensor
    token_logprobs: list[float]
    fed_tokens: int


def _rng_guard(model):
    """Keep elicitation forwards from consuming the sampling RNG (only dropout would; greedy decoding does not)."""
    if not model.training:
        return contextlib.nullcontext()
    device = next(model.parameters()).device
    devices = [device.index or 0] if device.type == "cuda" else []
    return torch.random.fork_rng(devices=devices)


class AnswerElicitor:
    """Elicits the answers of fired rows from the recorded decode state with the LM's own forward.

    Args:
        model: the decoder-only LM.
        tokenizer: its tokenizer.
        elicitation_prompt: text appended to a branch to elicit its answer.
        max_answer_tokens: cap on answer tokens.
        keep_delimiter: keep the delimiter in the branch context instead of branching just before it.

    Attributes:
        forwarding: True while an elicitation forward runs, so the session's pre-hook can tell these forwards from
            the main decoding loop's.
    """

    def __init__(self, model, tokenizer, elicitation_prompt: str, max_answer_tokens: int, keep_delimiter: bool):
        self.model, self.tokenizer = model, tokenizer
        self.max_answer_tokens = max_answer_tokens
        self.keep_delimiter = keep_delimiter
        self.prompt_ids = tokenizer(elicitation_prompt, add_special_tokens=False)["input_ids"]
        if not self.prompt_ids:
            raise ValueError("the elicitation prompt must encode to at least one token.")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id = pad if pad is not None else 0
        parameters = inspect.signature(model.forward).parameters
        self.accepts_position_ids = "position_ids" in parameters
        self.accepts_logits_to_keep = "logits_to_keep" in parameters
        self.cache_argument = "cache_params" if "cache_params" in parameters else "past_key_values"
        self.forwarding = False

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def delimiter_branch(self, row: int, found: DelimiterMatch) -> Branch:
        """The branch of a row whose newest token completed the delimiter occurrence `found`."""
        if self.keep_delimiter:
            return Branch(row, "delimiter", feed_newest=True)
        prefix = self.tokenizer(found.prefix, add_special_tokens=False)["input_ids"] if found.prefix else []
        return Branch(row, "delimiter", drop=found.num_tokens - 1, prefix_ids=prefix)

    @torch.no_grad()
    def elicit(self, state: DecodeState, branches: list[Branch], histories: Sequence[Sequence[int]],
               eos_ids: set[int], device: torch.device, step: int = 0,
               history: RecurrentHistory | None = None) -> list[ElicitedAnswer]:
        """One answer per branch, batched over the branches (over branches of equal segment length, for a
        recurrent cache).

        Args:
            state: the recorded decode state; its cache is never modified.
            branches: the rows that fire at the current step.
            histories: per batch row, the generated token ids so far (newest included).
            eos_ids: tokens that end an answer like a closed box.
            device: device of the main loop's tensors.
            step: the current step.
            history: recurrent states saved before possible delimiter starts (recurrent caches, dropped tokens).
        """
        segments = [([histories[b.row][-1]] if b.feed_newest else []) + b.prefix_ids + self.prompt_ids
                    for b in branches]
        groups = [list(range(len(branches)))]
        if has_recurrent_state(state.cache):
            lengths = sorted({len(segment) for segment in segments})
            groups = [[i for i, segment in enumerate(segments) if len(segment) == w] for w in lengths]
        answers: list[ElicitedAnswer | None] = [None] * len(branches)
        for group in groups:
            group_branches, group_segments = [branches[i] for i in group], [segments[i] for i in group]
            fork, mask, position, logits = self._feed_segments(state, group_branches, group_segments, device,
                                                               step, history)
            answer_ids, hidden, logprobs = self._greedy_answers(fork, mask, position, logits, eos_ids)
            del fork, logits  # the branches' cache copies are not needed for detokenisation
            for i, ids, states, lps in zip(group, answer_ids, hidden, logprobs):
                answers[i] = ElicitedAnswer(token_ids=ids, raw_text=self.decode(ids), hidden_states=torch.stack(states),
                                            token_logprobs=lps, fed_tokens=len(segments[i]))
        return answers

    def _feed_segments(self, state: DecodeState, branches: list[Branch], segments: list[list[int]],
                       device: torch.device, step: int, history: RecurrentHistory | None):
        """Fork the fired rows and feed their elicitation segments (one forward, or one per token over a
        recurrent cache).

        Returns the fork, the attention mask `(n, S + W)` (`None` for a cache without attention layers), the next
        position `(n,)` and the last-position logits `(n, V)`.
        """
        n = len(branches)
        rows = torch.tensor([b.row for b in branches], device=device)
        drops = [b.drop for b in branches]
        fork = branch_cache(state.cache, rows, drops, step, history)
        context_mask, first = self._context(state, rows, drops)
        # Segments of different lengths are left-padded inside the segment; the padding is masked out and new
        # tokens are numbered from the first hidden position, so each row reads as its own contiguous sequence.
        width = max(len(segment) for segment in segments)
        input_ids = torch.full((n, width), self.pad_token_id, dtype=torch.long, device=device)
        segment_mask = torch.zeros(n, width, dtype=torch.long, device=device)
        positions = torch.zeros(n, width, dtype=torch.long, device=device)
        for i, segment in enumerate(segments):
            pad = width - len(segment)
            input_ids[i, pad:] = torch.tensor(segment, device=device)
            segment_mask[i, pad:] = 1
            positions[i, pad:] = torch.arange(first[i], first[i] + len(segment), device=device)
            positions[i, :pad] = first[i]  # masked; any valid position
        mask = torch.cat([context_mask, segment_mask], dim=1) if context_mask is not None else None
        if not has_recurrent_state(fork):
            out = self._forward(input_ids, mask, positions, fork, hidden=False)
        else:  # equal lengths (no padding); one token per forward (Mamba-1 mixers need it, see module docstring)
            for j in range(width):
                column_mask = None if mask is None else mask[:, : mask.shape[1] - width + j + 1]
                out = self._forward(input_ids[:, j : j + 1], column_mask, positions[:, j : j + 1], fork, hidden=False)
        return fork, mask, positions[:, -1] + 1, out.logits[:, -1]

    def _context(self, state: DecodeState, rows: torch.Tensor, drops: list[int]):
        """The branches' context mask `(n, S)` with each branch's dropped tokens hidden (`None` for a cache
        without attention layers, which has nothing to mask) and the position of each branch's first new token
        (a list of n ints: the first dropped position, or the newest token's)."""
        context = attention_length(state.cache)
        if context is None:  # Mamba-style: positions are unused too
            return None, [0] * len(rows)
        if state.attention_mask is not None:
            context_mask = state.attention_mask[rows].to(torch.long)
        else:
            context_mask = torch.ones(len(rows), context, dtype=torch.long, device=rows.device)
        # Position of the newest sampled token, whose key/value is not in the cache yet.
        if state.position_ids is not None and state.position_ids.dim() == 2:
            newest_position = state.position_ids[rows, -1] + 1
        else:
            newest_position = context_mask.sum(-1)
        for i, drop in enumerate(drops):
            if drop:  # hide the delimiter's earlier tokens: a per-row crop
                context_mask[i, context - drop:] = 0
        return context_mask, (newest_position - torch.tensor(drops, device=rows.device)).tolist()

    def _greedy_answers(self, fork: Cache, mask: torch.Tensor, position: torch.Tensor, logits: torch.Tensor,
                        eos_ids: set[int]):
        """Greedy answer decoding, batched over the branches, until each box closes (or EOS, or the cap).

        Returns per branch the answer token ids, their last-layer hidden states (list of `(d,)`) and their
        log-probabilities under the LM (list of floats).
        """
        cap = self.max_answer_tokens
        n = logits.shape[0]
        tokens = logits.argmax(-1)
        answer_ids: list[list[int]] = [[] for _ in range(n)]
        hidden: list[list[torch.Tensor]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        finished = [False] * n
        batch = list(range(n))  # batch[p]: the branch at batch position p
        for _ in range(cap):
            closing = []
            chosen = torch.log_softmax(logits.float(), -1).gather(1, tokens[:, None]).squeeze(1).tolist()
            for bi, token, lp in zip(batch, tokens.tolist(), chosen):
                if finished[bi]:
                    continue
                logprobs[bi].append(lp)
                ids = answer_ids[bi]
                ids.append(token)
                if token in eos_ids or len(ids) >= cap or find_box_end(self.decode(ids)) is not None:
                    closing.append(bi)
            # Every answer token is fed, the closing one included: its hidden state is the output at its position.
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones(len(batch), 1)], dim=1)
            out = self._forward(tokens[:, None], mask, position[:, None], fork, hidden=True)
            last_hidden = out.hidden_states[-1][:, -1]  # (batch, d), after the final norm
            for p, bi in enumerate(batch):
                if not finished[bi]:
                    hidden[bi].append(last_hidden[p])
            for bi in closing:
                finished[bi] = True
            live = [p for p, bi in enumerate(batch) if not finished[bi]]
            if not live:
                break
            logits = out.logits[:, -1]
            tokens, position = logits.argmax(-1), position + 1
            if len(live) <= len(batch) // 2:
                # Most rows are done: stop spending forwards on them (one gather of the remaining rows).
                keep = torch.tensor(live, device=tokens.device)
                fork = fork_cache(fork, keep)
                mask = None if mask is None else mask[keep]
                tokens, position, logits = tokens[keep], position[keep], logits[keep]
                batch = [batch[p] for p in live]
        return answer_ids, hidden, logprobs

    def _forward(self, input_ids, attention_mask, position_ids, cache, hidden: bool):
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask, self.cache_argument: cache,
                  "use_cache": True}
        if self.accepts_position_ids:
            kwargs["position_ids"] = position_ids
        if self.accepts_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        if hidden:
            kwargs["output_hidden_states"] = True
        self.forwarding = True
        try:
            with _rng_guard(self.model):
                return self.model(**kwargs)
        finally:
            self.forwarding = False
