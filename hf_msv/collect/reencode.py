"""Re-encoding: sampled chains of thought → the answers live collection would elicit, from one prefill per trace.

`encode_trace` (tokenise, check, apply the context rule), `plan_branches` (where live generation elicits, replayed
on the trace's tokens), `TraceReencoder` (chunked prefill, a copy of each branch's KV rows, batched greedy
elicitation) and `BufferedLayer` (a cache layer written in place). Only full-attention `DynamicLayer` caches are
supported. How it reproduces live collection, and its memory budgets: ``docs/collection.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from ..answers import extract_boxed
from ..data.problems import Problem
from ..generation import ElicitationPolicy, MSVAnswer
from ..generation.caches import cache_argument
from ..generation.forking import Branch
from .lm import prompt_token_ids
from .traces import FINISH_EOS, Trace, TraceError

__all__ = ["BranchPoint", "BufferedLayer", "EncodedTrace", "TraceReencoder", "encode_trace", "plan_branches"]


@dataclass
class EncodedTrace:
    """One trace, tokenised: `prompt_ids`, per sequence its generated tokens (EOS included when it ended with
    one) and finish reason (``"eos"`` or ``"budget"``), its trace confidences (`None` unless read from logprobs) and
    how many completions the context rule `cut`."""

    problem: Problem
    prompt_ids: list[int]
    sequences: list[list[int]]
    finish: list[str]
    confidence: list[np.ndarray] | None = None
    cut: int = 0


def _render_prompt(trace: Trace, tokenizer, build_prompt, chat_template) -> list[int]:
    """The prompt tokens as live collection's ``MSVSession.generate`` makes them (or as the trace gives them)."""
    if trace.prompt_token_ids is not None:
        return list(trace.prompt_token_ids)
    prompt = (
        trace.messages
        if trace.messages is not None
        else (trace.prompt if trace.prompt is not None else build_prompt(trace.problem()))
    )
    return prompt_token_ids(prompt, tokenizer, chat_template)


def _completion_ids(
    c, i: int, line: int, tokenizer, eos_ids: set[int], sampled_budget: int | None = None
) -> list[int]:
    """Completion `i`'s generated tokens (EOS included when it ended with one); raises `TraceError`.

    A text completion that says how it ended gets EOS after ``"eos"``/``"stop"``; one that does not (harness files
    keep no finish reason) gets EOS when it is shorter than the budget it was sampled with (`sampled_budget`, the
    trace's ``sampling["max_new_tokens"]``): a completion that fills its budget was cut, not finished."""
    if c.token_ids is not None:
        ids = list(c.token_ids)
    else:
        ids = tokenizer(c.text, add_special_tokens=False)["input_ids"]
        back = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if back != c.text:
            at = next((j for j, (a, b) in enumerate(zip(back, c.text)) if a != b), min(len(back), len(c.text)))
            raise TraceError(
                line,
                f"completion {i} does not survive the tokenizer round trip (first difference "
                f"at character {at}: {c.text[at : at + 20]!r} became {back[at : at + 20]!r}); "
                "give token_ids instead",
            )
        below_budget = c.finish_reason is None and sampled_budget is not None and len(ids) < sampled_budget
        if eos_ids and (c.finish_reason in FINISH_EOS or below_budget):
            ids.append(min(eos_ids))
    early = [j for j, t in enumerate(ids[:-1]) if t in eos_ids]
    if early:
        raise TraceError(line, f"completion {i} has an EOS token at position {early[0]} before its end")
    if max(ids) >= len(tokenizer):
        raise TraceError(line, f"completion {i} has token ids outside the vocabulary")
    return ids


def _trace_confidence(c, i: int, line: int, ids: list[int], top_k: int | None) -> np.ndarray:
    if top_k is None or c.logprobs is None:
        return np.zeros(0, dtype=np.float32)
    if len(c.logprobs) != len(ids):
        raise TraceError(line, f"completion {i} has {len(ids)} tokens but {len(c.logprobs)} logprob lists")
    return np.array([-np.mean(sorted(row, reverse=True)[:top_k]) for row in c.logprobs], dtype=np.float32)


def encode_trace(
    trace: Trace,
    tokenizer,
    build_prompt,
    *,
    eos_ids: set[int],
    budget: Callable[[int], int | None],
    chat_template: str | None = None,
    confidence_top_k: int | None = None,
) -> EncodedTrace:
    """Tokenise one trace, check it and apply the context rule.

    Args:
        build_prompt: ``Problem -> str | chat messages`` for traces that give no prompt (`prompt_builder`).
        eos_ids: the LM's EOS ids; a text completion that finished with ``"stop"`` / ``"eos"`` gets the first.
        budget: prompt length -> the most chain-of-thought tokens the LM's context leaves room for, or `None`
            (`hf_msv.collect.job.sequence_budget`); a longer completion is cut there (finish ``"budget"``, as live
            collection samples it), and may raise `ValueError` for a prompt too long.
        confidence_top_k: read DeepConf confidences from the trace's logprobs with this k (`None`: don't).

    Returns:
        The `EncodedTrace` (``cut``: how many completions were cut).

    Raises:
        TraceError: a bad line, naming it.
    """
    line = trace.line
    try:
        prompt = _render_prompt(trace, tokenizer, build_prompt, chat_template)
    except Exception as e:  # a chat template that fails on these messages, a prompt that is not text, ...
        raise TraceError(line, f"cannot build the prompt: {e}") from None
    if not prompt:  # the first generated token's distribution is read at the prompt's last position
        raise TraceError(line, "the prompt is empty")
    if max(prompt) >= len(tokenizer):
        raise TraceError(line, "the prompt has token ids outside the vocabulary")
    try:
        limit = budget(len(prompt))
    except ValueError as e:
        raise TraceError(line, str(e)) from None
    sequences, finish, confidence, cut = [], [], [], 0
    for i, c in enumerate(trace.completions):
        ids = _completion_ids(c, i, line, tokenizer, eos_ids, trace.sampling.get("max_new_tokens"))
        conf = _trace_confidence(c, i, line, ids, confidence_top_k)
        if limit is not None and len(ids) > limit:
            ids, conf, cut = ids[:limit], conf[:limit], cut + 1
        sequences.append(ids)
        finish.append("eos" if ids[-1] in eos_ids else "budget")
        confidence.append(conf)
    return EncodedTrace(
        trace.problem(), prompt, sequences, finish, confidence if confidence_top_k is not None else None, cut
    )


@dataclass
class BranchPoint:
    """Where one live answer was elicited.

    Args:
        sequence, step, tau, trigger, terminal: as in `MSVAnswer`.
        kept: generated tokens in the branch context (`MSVAnswer.cot_tokens`).
        fed: P, the segment tokens live generation feeds before the answer, one per step (`AnswerElicitor.start`:
            the newest token when kept, the prefix, the elicitation prompt): the answer is available at τ + P + L.
        prefix_ids: tokens fed before the elicitation prompt (text of a delimiter's first token preceding it).
    """

    sequence: int
    step: int
    tau: int
    trigger: str
    kept: int
    fed: int
    terminal: bool = False
    prefix_ids: list[int] = field(default_factory=list)


def plan_branches(sequence: Sequence[int], n: int, policy: ElicitationPolicy) -> list[BranchPoint]:
    """The answers live generation elicits for sequence `n` whose generated tokens are `sequence` (EOS included if
    it ended so): `ElicitationPolicy`'s rule, as `GenerationRun` applies it (``docs/collection.md``), without the
    LM."""
    points: list[BranchPoint] = []
    history: list[int] = []
    previous: Branch | None = None

    def add(branch: Branch, kept: int) -> None:
        fed = len(policy.elicitor.start(branch, history).segment)
        points.append(
            BranchPoint(
                n,
                len(points),
                branch.tau,
                branch.trigger,
                kept,
                fed,
                terminal=branch.ends_chain,
                prefix_ids=list(branch.prefix_ids),
            )
        )

    for t, token in enumerate(sequence):
        history.append(token)
        branch = policy.fire(n, history, t, previous)
        if branch is not None:
            add(branch, len(history) - (0 if branch.feed_newest else 1) - branch.drop)  # GenerationRun._complete
            previous = branch
    if sequence[-1] not in policy.eos_ids:  # ended by the budget (GenerationRun._end_budget_rows)
        branch = policy.at_budget(n, len(sequence) - 1, previous)
        if branch is None:
            points[-1].terminal = True
        else:
            add(branch, len(sequence))
    return points


class BufferedLayer(DynamicLayer):
    """A `DynamicLayer` whose keys/values are views of buffers of `capacity` tokens, so a forward writes its new
    tokens in place instead of concatenating (``DynamicLayer.update`` copies the whole layer at every step, which
    for a batch of long contexts decoding 40 answer tokens dominates the cost). Outgrowing the buffer, or a row
    gather (``batch_select_indices`` makes new tensors), moves the states into a new buffer with room to spare.

    Shallow copies (`fork_cache` of every row) share the buffer and write past the original's length: the original
    must not be updated afterwards (re-encoding never does).
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self._view: torch.Tensor | None = None

    @classmethod
    def from_states(cls, keys: torch.Tensor, values: torch.Tensor, length: int, capacity: int) -> BufferedLayer:
        """A layer over existing buffers `(batch, heads, capacity, dim)` whose first `length` positions are filled."""
        layer = cls(capacity)
        layer.lazy_initialization(keys, values)
        layer._keys, layer._values = keys, values
        layer.keys, layer.values = keys[:, :, :length], values[:, :, :length]
        layer._view = layer.keys
        return layer

    def _move(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        length = keys.shape[-2]
        self._keys = keys.new_empty(*keys.shape[:2], capacity, keys.shape[-1])
        self._values = values.new_empty(*values.shape[:2], capacity, values.shape[-1])
        self._keys[:, :, :length], self._values[:, :, :length] = keys, values
        self.keys, self.values = self._keys[:, :, :length], self._values[:, :, :length]
        self._view = self.keys

    def states(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The filled keys and values `(batch, heads, length, dim)` of an initialized layer."""
        if self.keys is None or self.values is None:
            raise RuntimeError("the layer holds no states yet")
        return self.keys, self.values

    def _buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._keys is None or self._values is None:
            raise RuntimeError("the layer holds no buffers yet")
        return self._keys, self._values

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._move(key_states[:, :, :0], value_states[:, :, :0], max(self.capacity, key_states.shape[-2]))
        keys, values = self.states()
        length, new = keys.shape[-2], key_states.shape[-2]
        if keys is not self._view or length + new > self._buffers()[0].shape[-2]:  # gathered, or full
            self._move(keys, values, max(2 * (length + new), self.capacity))
        key_buffer, value_buffer = self._buffers()
        key_buffer[:, :, length : length + new] = key_states
        value_buffer[:, :, length : length + new] = value_states
        self.keys, self.values = key_buffer[:, :, : length + new], value_buffer[:, :, : length + new]
        self._view = self.keys
        return self.keys, self.values


@dataclass
class _Pending:
    """A branch waiting for elicitation: its problem, plan and the `(layers, 2)` KV rows of its context."""

    problem: int
    point: BranchPoint
    context: int
    kv: list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class _Work:
    """One `TraceReencoder.answers` call: the traces, their branch plans per (trace, sequence), the elicitation
    queue and the answers found so far per trace."""

    traces: Sequence[EncodedTrace]
    plans: dict
    queue: list = field(default_factory=list)
    answers: list = field(default_factory=list)

    def length(self, row: tuple[int, int]) -> int:
        """Prompt + sequence tokens of row ``(trace, sequence)``."""
        return len(self.traces[row[0]].prompt_ids) + len(self.traces[row[0]].sequences[row[1]])


class TraceReencoder:
    """Elicits the answers of encoded traces from one prefill per sequence (``docs/collection.md``).

    Args:
        model, tokenizer: the LM (eval mode) and its tokenizer.
        policy: where and how answers are elicited (`ElicitationPolicy`, with the LM's EOS ids).
        max_batch_tokens: KV budget of a prefill group and of an elicitation batch, in tokens.
        chunk_tokens: positions per prefill forward (rows × columns).
        confidence_top_k: k of DeepConf's confidence, or `None` not to compute it from the prefill.
    """

    def __init__(
        self,
        model,
        tokenizer,
        policy: ElicitationPolicy,
        *,
        max_batch_tokens: int = 32768,
        chunk_tokens: int = 2048,
        confidence_top_k: int | None = 20,
    ):
        self.model, self.tokenizer, self.policy = model, tokenizer, policy
        self.elicitor, self.eos_ids = policy.elicitor, policy.eos_ids
        self.max_batch_tokens, self.chunk_tokens = max_batch_tokens, chunk_tokens
        self.confidence_top_k = confidence_top_k
        self.device = next(model.parameters()).device
        self.cache_argument = cache_argument(model)  # read once: a signature lookup per forward would be waste
        self.forwards = 0  # LM forward calls (prefill chunks and elicitation steps), for benchmarks

    @torch.no_grad()
    def answers(self, traces: Sequence[EncodedTrace]) -> tuple[list[list[MSVAnswer]], list[list[np.ndarray]]]:
        """Per trace, its `MSVAnswer`s (classes unassigned) and per sequence its `(len,)` model confidences (empty
        arrays when `confidence_top_k` is `None`).

        Args:
            traces: the encoded traces of one batch.

        Returns:
            ``(answers, confidence)``: per trace its list of `MSVAnswer`s, and per trace one array per sequence.
        """
        rows = [(p, n) for p, tr in enumerate(traces) for n in range(len(tr.sequences))]
        plans = {(p, n): plan_branches(traces[p].sequences[n], n, self.policy) for p, n in rows}
        work = _Work(traces, plans, answers=[[] for _ in traces])
        confidence = [[np.zeros(0, dtype=np.float32)] * len(tr.sequences) for tr in traces]
        rows.sort(key=lambda r: -work.length(r))  # similar lengths share a prefill group: little padding
        for group in self._prefill_groups(rows, work):
            for (p, n), conf in zip(group, self._prefill(group, work)):
                confidence[p][n] = conf
        self._flush(work)
        return work.answers, confidence

    def _prefill_groups(self, rows, work: _Work) -> list[list[tuple[int, int]]]:
        """Consecutive rows (longest first) whose padded prefill fits `max_batch_tokens` (a longer row alone)."""
        groups, current = [], []
        for row in rows:
            if current and (len(current) + 1) * work.length(current[0]) > self.max_batch_tokens:
                groups.append(current)
                current = []
            current.append(row)
        return groups + ([current] if current else [])

    def _prefill(self, group, work: _Work) -> list[np.ndarray]:
        """Prefill `group`'s rows ``(trace, sequence)`` in chunks, queueing each branch's context once the chunk
        holding its end is in the cache; returns each row's model confidences (one per generated token)."""
        tokens = [work.traces[p].prompt_ids + work.traces[p].sequences[n] for p, n in group]
        width, pad = max(map(len, tokens)), self.elicitor.pad_token_id
        ids = torch.tensor([t + [pad] * (width - len(t)) for t in tokens], device=self.device)
        # Right padding: no real token sees it (causal), the mask only keeps padding out of the pad-token warning.
        mask = torch.tensor([[1] * len(t) + [0] * (width - len(t)) for t in tokens], device=self.device)
        cache = DynamicCache(config=self.model.config)
        _check_layers(cache)
        layers = [BufferedLayer(width) for _ in range(self.model.config.get_text_config().num_hidden_layers)]
        cache.layers = layers  # pyright: ignore[reportAttributeAccessIssue]  (list is invariant: one layer type)
        todo = [sorted(work.plans[r], key=lambda b: b.kept) for r in group]
        parts = []
        step = max(1, self.chunk_tokens // len(group))
        for start in range(0, width, step):
            stop = min(width, start + step)
            positions = torch.arange(start, stop, device=self.device).expand(len(group), -1)
            out = self.model(
                input_ids=ids[:, start:stop],
                attention_mask=mask[:, :stop],
                position_ids=positions,
                **{self.cache_argument: cache},
                use_cache=True,
                **({} if self.confidence_top_k else {"logits_to_keep": 1}),
            )
            self.forwards += 1
            if self.confidence_top_k:
                logprobs = torch.log_softmax(out.logits.float(), dim=-1)
                k = min(self.confidence_top_k, logprobs.shape[-1])
                parts.append(-logprobs.topk(k, dim=-1).values.mean(-1).cpu())  # (rows, columns)
            del out
            for i, (p, _) in enumerate(group):
                prompt = len(work.traces[p].prompt_ids)
                while todo[i] and prompt + todo[i][0].kept <= stop:  # its context is in the cache now
                    point = todo[i].pop(0)
                    context = prompt + point.kept
                    kv = [
                        (k[i, :, :context].clone(), v[i, :, :context].clone())
                        for k, v in map(BufferedLayer.states, cast("list[BufferedLayer]", cache.layers))
                    ]
                    self._enqueue(_Pending(p, point, context, kv), work)
        del cache
        if not parts:
            return [np.zeros(0, dtype=np.float32)] * len(group)
        conf = torch.cat(parts, dim=1).numpy()
        # Logits at position i are the distribution of token i + 1: generated token t is at prompt + t.
        return [
            conf[i, len(work.traces[p].prompt_ids) - 1 :][: len(work.traces[p].sequences[n])]
            for i, (p, n) in enumerate(group)
        ]

    def _enqueue(self, item: _Pending, work: _Work) -> None:
        """Queue a branch, first eliciting the queue if the padded batch would exceed `max_batch_tokens`."""
        longest = max([item.context] + [q.context for q in work.queue])
        if work.queue and (len(work.queue) + 1) * longest > self.max_batch_tokens:
            self._flush(work)
        work.queue.append(item)

    def _batch_cache(self, queue: list[_Pending]) -> tuple[DynamicCache, torch.Tensor]:
        """The queued contexts left-padded into one cache `(n, heads, width + room, dim)` per layer, and its mask
        `(n, width)`."""
        n, width = len(queue), max(q.context for q in queue)
        # Room for the widest elicitation segment and the answer: the answer tokens are written in place.
        room = (
            max(len(q.point.prefix_ids) for q in queue)
            + len(self.elicitor.prompt_ids)
            + self.elicitor.max_answer_tokens
            + 1
        )
        layers = []
        for layer in range(len(queue[0].kv)):
            k0, v0 = queue[0].kv[layer]
            # Zeros, not garbage, under the padding: masked scores get weight 0, and 0 × NaN would be NaN.
            keys = k0.new_zeros(n, k0.shape[0], width + room, k0.shape[-1])
            values = v0.new_zeros(n, v0.shape[0], width + room, v0.shape[-1])
            for i, q in enumerate(queue):
                keys[i, :, width - q.context : width], values[i, :, width - q.context : width] = q.kv[layer]
            layers.append(BufferedLayer.from_states(keys, values, width, width + room))
        mask = torch.zeros(n, width, dtype=torch.long, device=self.device)
        for i, q in enumerate(queue):
            mask[i, width - q.context :] = 1
        cache = DynamicCache()
        cache.layers = layers
        return cache, mask

    def _flush(self, work: _Work) -> None:
        """Elicit every queued branch in one batch and add its `MSVAnswer` to its trace's answers."""
        if not work.queue:
            return
        items = list(work.queue)
        work.queue.clear()
        cache, mask = self._batch_cache(items)  # the context copies now live in this cache only
        position = torch.tensor([q.context for q in items], device=self.device)
        segments = [q.point.prefix_ids + self.elicitor.prompt_ids for q in items]  # the newest token is in context
        elicited = self.elicit(cache, mask, position, segments)
        for item, (ids, hidden, logprobs) in zip(items, elicited):
            point, raw = item.point, self.elicitor.decode(ids)
            work.answers[item.problem].append(
                MSVAnswer(
                    text=extract_boxed(raw),
                    raw_text=raw,
                    token_ids=ids,
                    prompt=item.problem,
                    sequence=point.sequence,
                    step=point.step,
                    tau=point.tau,
                    length=len(ids),
                    end=point.tau + point.fed + len(ids),
                    trigger=point.trigger,
                    terminal=point.terminal,
                    cot_tokens=point.kept,
                    elicitation_ids=point.prefix_ids + self.elicitor.prompt_ids,
                    hidden_states=hidden.cpu(),
                    token_logprobs=logprobs,
                )
            )

    def elicit(
        self, cache: DynamicCache, mask: torch.Tensor, position: torch.Tensor, segments: list[list[int]]
    ) -> list[tuple[list[int], torch.Tensor, list[float]]]:
        """Greedy answers of a batch of contexts: each row is fed its segment, then its answer tokens until
        `AnswerElicitor.ends_answer` (the live rule); every answer token is fed, the closing one included, for its
        hidden state.

        Args:
            cache: the contexts, left-padded, written in place; mask: its `(n, S)` long attention mask.
            position: `(n,)` position of each row's first segment token (its context length).
            segments: per row, the tokens fed before the answer.

        Returns per row its answer token ids, `(L, d)` last-layer states (after the final norm) and L log-probs.
        """
        n, width = len(segments), max(map(len, segments))
        pad = torch.tensor([width - len(s) for s in segments], device=self.device)
        ids = torch.tensor([[self.elicitor.pad_token_id] * (width - len(s)) + s for s in segments], device=self.device)
        # Segments are left-padded inside the segment (masked); each row numbers its own tokens from `position`.
        offsets = (torch.arange(width, device=self.device)[None] - pad[:, None]).clamp(min=0)
        mask = torch.cat([mask, (torch.arange(width, device=self.device)[None] >= pad[:, None]).long()], dim=1)
        logits = self._forward(ids, mask, position[:, None] + offsets, cache, hidden=False).logits[:, -1]
        position = position + pad.new_tensor([len(s) for s in segments])
        answers = [([], [], []) for _ in range(n)]
        rows, done = list(range(n)), [False] * n  # rows[p]: the branch at batch position p
        while True:
            logits = logits.float()
            chosen = logits.argmax(-1)
            chosen_lp = torch.log_softmax(logits, -1).gather(1, chosen[:, None]).squeeze(1).tolist()
            chosen_ids = chosen.tolist()
            mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
            out = self._forward(chosen[:, None], mask, position[:, None], cache, hidden=True)
            states = out.hidden_states[-1][:, -1]  # (rows, d), after the final norm
            for p, i in enumerate(rows):
                if not done[i]:
                    answers[i][0].append(chosen_ids[p])
                    answers[i][1].append(states[p])
                    answers[i][2].append(chosen_lp[p])
                    done[i] = self.elicitor.ends_answer(answers[i][0], self.eos_ids)
            live = [p for p, i in enumerate(rows) if not done[i]]
            if not live:
                return [(tokens, torch.stack(hidden), lps) for tokens, hidden, lps in answers]
            logits, position = out.logits[:, -1], position + 1
            if len(live) <= len(rows) // 2:  # most rows are done: one gather, then no forwards spent on them
                keep = torch.tensor(live, device=self.device)
                cache.batch_select_indices(keep)
                mask, position, logits = mask[keep], position[keep], logits[keep]
                rows = [rows[p] for p in live]

    def _forward(self, input_ids, attention_mask, position_ids, cache, hidden: bool):
        self.forwards += 1
        return self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **{self.cache_argument: cache},
            use_cache=True,
            logits_to_keep=1,
            output_hidden_states=hidden,
        )


def _check_layers(cache) -> None:
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise NotImplementedError(
                f"re-encoding cuts each branch's context out of a full-attention cache; this LM's cache has a "
                f"{type(layer).__name__} (sliding-window or other layers are not supported)"
            )
