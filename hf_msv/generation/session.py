"""Parallel sampling with a Multi-Sequence Verifier inside ``model.generate``.

This module elicits answers while a Hugging Face causal LM samples N sequences per prompt, captures the last-layer
hidden states of the answer tokens, scores the answers with an `MSVVerifier`, and stops a prompt's N sequences as
soon as the best available answer reaches a threshold λ (paper, "Applications": t* = min{t : max over answers with
τ + L ≤ t of ỹ ≥ λ}; output that candidate, or the best final answer if no answer ever reaches λ).

Usage::

    msv = prepare_generation(model, tokenizer, verifier=verifier, delimiters=["Wait"])
    model.generate(**inputs, do_sample=True, num_return_sequences=16, max_new_tokens=4096,
                   stopping_criteria=[MSVEarlyStop(0.9)])
    result = msv.pop_results()[0]          # one `MSVResult` per prompt
    result.chosen.text, result.confidence, result.stop_step
    msv.detach()                           # or use `with prepare_generation(...) as msv:`

    # or in one call
    results = msv_generate(model, tokenizer, ["What is 2+2?"], verifier=verifier, threshold=0.9, num_sequences=16)

Without a verifier (``verifier=None``) the same machinery only collects answers and, with
``capture_hidden_states=True``, their hidden states: the data-collection path.

Design
======

**Why a hook, a stopping criterion and a thin ``generate`` wrapper.** In transformers 5.x a `StoppingCriteria` is
called right after each sampled token with ``(input_ids, scores)`` only: no cache, no hidden states. The session
therefore registers a forward *pre*-hook (``with_kwargs=True``) on the LM that records, at every decode forward, the
``past_key_values`` Cache object, the 2D attention mask and the position ids that `generate` passes in (references
only: no copy, no extra compute). When `MSVEarlyStop` is then called, that cache holds the keys/values of every token
except the newest sampled one, which is exactly the state needed to branch a sequence. Recording *inputs* (a
pre-hook) rather than outputs keeps the hook independent of each model's output class. The ``generate`` wrapper
(installed as an instance attribute, removed by `MSVSession.detach`) is needed because criteria get no start/end
callbacks: it resets the per-call state, binds the `MSVEarlyStop` it finds in ``stopping_criteria`` (adding a
never-stopping one when there is none, so collection needs no criterion), reads N, the EOS ids and the token budget
from the effective generation config, and after the decoding loop elicits the terminal answers of the sequences that
ran out of budget (the length criterion fires in the same call as ours, so their cache is still the one recorded)
and assembles the results.

**Branching without recomputation.** The rows that fire at a step are forked from the main cache with one gather
(`fork_cache`: shallow copies of the cache's layers followed by ``batch_select_indices``). `DynamicLayer.update`
concatenates into new tensors, so the main cache is never written and the sampled sequences continue unperturbed.
A delimiter is *not* part of the branch ("…so x = 5." + elicitation prompt, not "…so x = 5. Wait" + prompt): its
earlier tokens are in the cache and must be dropped. `Cache.crop` would drop the same number of tokens from every
row, while rows firing together may need different counts (a one-token "Wait" next to "Wa"+"it"), so the fork instead
masks those positions out in the attention mask and numbers the new tokens from the first dropped position, which is
equivalent to cropping each row by its own count. Text that shares the delimiter's first token (the "\\n\\n" of a
"\\n\\nWait" token) is re-encoded and fed before the prompt. The elicitation prompt of every fired row is fed in one
forward (segments of different lengths are left-padded *inside* the segment and masked), then the answer is decoded
greedily, batched over the fired rows, up to ``max_answer_tokens`` or until `find_box_end` says the box closed.
Greedy decoding consumes no random numbers, so the sampling stream of the main sequences is untouched and, with
early stopping off, the sampled tokens equal those of a plain ``generate`` with the same seed (tested). The hidden
state of answer token a_i is the LM's last-layer output (after the final norm, ``hidden_states[-1]``) at the position
where a_i is the input, so an answer of L tokens costs one prompt forward plus L single-token forwards. Only these
(L, d) vectors are kept, never other layers or chain-of-thought positions.

**Time line and scoring.** Time t is the shared decode step (0 at the first generated token). An answer elicited at
step τ with L tokens becomes available at τ + L (the paper's causality, as if answer decoding ran alongside the
chain of thought), so answers wait in a queue and are released to the verifier's online `MSVCache` in end-time
order: at step t every queued answer with τ + L ≤ t is scored, which is what makes online scores equal the offline
forward. After each release the stopping rule is applied per prompt; a prompt that stops has all its rows reported
done to `generate`, whose loop ends once every prompt has stopped or finished. When all sequences of a prompt have
ended (EOS or budget), its remaining queued answers are scored in end order and the rule is applied to them too; if
no answer ever reached λ, the chosen answer is the best-scored final answer of each sequence. In terminal mode only
the end of each sequence is elicited and a prompt's N terminal answers are scored once, offline, when its last
sequence ends (logit averaging happens inside the verifier). With N > M = ``verifier.config.num_sequences``, the N
sequences of a prompt are split into groups of M scored independently (paper, "Scaling with MSV_M"); the stopping
rule still looks at all N. Equivalence classes (`EquivalenceClasses`, one per prompt) are assigned when an answer is
elicited; γ is left to the verifier.

**Token accounting** (per prompt, `MSVResult`): ``tokens_decoded`` counts chain-of-thought tokens sampled while each
sequence was live (up to and including its EOS, its last budget token, or the stop step); ``token_budget`` is
N × max_new_tokens. What full decoding would have used is known only when the prompt did not stop early
(``tokens_without_early_stop``); otherwise it is reported as bounds: the tokens already decoded, and that plus the
budget left to the sequences that were cut. Note that `generate` keeps computing stopped rows until the whole batch
is done (it cannot shrink its batch); the counts describe the work a system that drops stopped rows would do.
Wall time of a ``generate`` call is split into elicitation (forks, forwards, detokenisation), verifier, equivalence
checking and chain of thought (the rest, which includes the per-step delimiter detection).

**Cost.** Elicitation is synchronous: the decoding loop waits while the rows that fired at a step are elicited,
batched together. Delimiters that fire for all rows at once (every K tokens) batch as well as the chain of thought;
text delimiters usually fire for one or two rows at a time, whose answer tokens then cost about as much as a whole
decode step each (the price of the paper's semantics, where an answer is available at τ + L).

Supported: decoder-only models with a dynamic KV cache (`DynamicCache`; tested on Llama, Qwen2, Qwen3, GPT-2,
Mistral, Phi-3, GPT-NeoX, Gemma-2, OPT, Falcon, BLOOM, OLMo-2), sampling or greedy search (not beam search or
assisted decoding). Static caches and encoder-decoders raise a clear error. Branches are exact (equal to
recomputing the branch from scratch) except on sliding-window layers, where masked positions (a dropped delimiter,
padding inside a batched prompt segment) still count towards the window, so such a branch sees up to that many
fewer of its oldest tokens.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.cache_utils import Cache, DynamicLayer

from ..answers import ELICITATION_PROMPT, MAX_ANSWER_TOKENS, extract_boxed, find_box_end
from ..modeling_msv import MSVCache, check_compatible

# ----------------------------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class MSVAnswer:
    """One elicited answer a_k⁽ⁿ⁾.

    Args:
        text: the content of the box, or `None` for "no answer" (box not closed within the cap, or empty).
        raw_text: the decoded answer tokens (the greedy continuation after the elicitation prompt).
        token_ids: the answer tokens, up to and including the one that closes the box (L of them).
        prompt: index of the prompt (group) in the batch.
        sequence: n, the sequence within the prompt's group, in [0, N).
        step: k, 0-based index of this answer among its sequence's answers.
        tau: τ, the decode step at which the branch was taken (0 = first generated token).
        length: L, the number of answer tokens.
        trigger: why it was elicited: ``"delimiter"``, ``"every_k"``, ``"eos"`` (sequence ended) or ``"budget"``
            (sequence reached the token budget, or generation ended for another reason).
        terminal: whether this is the sequence's terminal answer.
        cot_tokens: how many generated chain-of-thought tokens precede the branch point; the answer's context is
            prompt + generated[:cot_tokens] + `elicitation_ids` + token_ids.
        elicitation_ids: tokens fed after the kept chain of thought: text of the delimiter's first token that
            precedes the delimiter (re-encoded), then the elicitation prompt.
        class_id: equivalence class within the prompt's group (-1 when no checker was used).
        score: the verifier's P(correct), `None` without verifier or if the answer never became available
            (elicited, but the prompt stopped before τ + L).
        hidden_states: `(L, d)` last-layer hidden states of the answer tokens (kept with
            ``capture_hidden_states=True``, on CPU; otherwise `None` after scoring).
        token_logprobs: `L` floats, log p(answer token i | context, tokens < i) under the LM (what the Token-Probs
            baseline averages).
    """

    text: str | None
    raw_text: str
    token_ids: list[int]
    prompt: int
    sequence: int
    step: int
    tau: int
    length: int
    trigger: str
    terminal: bool
    cot_tokens: int
    elicitation_ids: list[int]
    class_id: int = -1
    score: float | None = None
    hidden_states: torch.Tensor | None = field(default=None, repr=False)
    token_logprobs: list[float] | None = field(default=None, repr=False)

    @property
    def end(self) -> int:
        """τ + L: the step at which the answer becomes available."""
        return self.tau + self.length


@dataclass
class MSVResult:
    """Everything one prompt's N parallel sequences produced.

    Args:
        prompt: index of the prompt in the batch.
        answers: every elicited answer, in order of (τ, sequence).
        chosen: the selected answer (the one that triggered the stop, else the best-scored final answer); `None`
            without verifier.
        confidence: the chosen answer's score.
        stopped_early: the threshold was reached while at least one sequence was still decoding.
        stop_step: t*, the step at which the threshold was reached; otherwise the step at which the last sequence
            ended (`None` if nothing was generated).
        threshold: λ used (`None`: never stop).
        sequences: the generated token ids of each sequence up to where it ended (EOS included, padding excluded).
        finish_reasons: per sequence, ``"eos"``, ``"budget"`` or ``"stopped"`` (cut by the early stop).
        tokens_decoded: chain-of-thought tokens sampled while the sequences were live.
        token_budget: N × max_new_tokens.
        tokens_without_early_stop: what full decoding used; known only if the prompt did not stop early.
        tokens_without_early_stop_bounds: (lower, upper) bounds on it: tokens decoded, and tokens decoded plus the
            budget left to the sequences that were cut.
        elicitation_tokens: tokens the LM processed to elicit this prompt's answers (fed prefix and prompt tokens,
            and the answer tokens).
        answer_tokens: Σ L over this prompt's answers.
        timings: wall seconds of the whole ``generate`` call, shared by all prompts of the batch: ``"total"``,
            ``"cot"`` (chain-of-thought decoding and bookkeeping), ``"elicitation"``, ``"verifier"``,
            ``"equivalence"``.
    """

    prompt: int
    answers: list[MSVAnswer]
    chosen: MSVAnswer | None
    confidence: float | None
    stopped_early: bool
    stop_step: int | None
    threshold: float | None
    sequences: list[list[int]]
    finish_reasons: list[str]
    tokens_decoded: int
    token_budget: int
    tokens_without_early_stop: int | None
    tokens_without_early_stop_bounds: tuple[int, int]
    elicitation_tokens: int
    answer_tokens: int
    timings: dict[str, float]

    @property
    def num_sequences(self) -> int:
        return len(self.sequences)


# ----------------------------------------------------------------------------------------------------------------
# Delimiter detection
# ----------------------------------------------------------------------------------------------------------------


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


class DelimiterMatcher:
    """Finds new occurrences of text delimiters at the end of a token sequence, independent of tokenisation.

    A delimiter such as ``"Wait"`` may be one token, split over several (``"Wa"`` + ``"it"``) or merged with what
    precedes it (``" Wait"``, ``"\\n\\nWait"``), so matching is done on decoded text: an occurrence counts when it
    ends inside the newest token, which makes every occurrence count exactly once, at the token that completes it.
    Matching is case-sensitive substring matching.

    Decoding every row at every step would dominate the per-step cost, so a per-vocabulary table first rules out
    tokens that cannot complete an occurrence: the newest token must contain the delimiter's last character (or be
    a token whose text is only known in context, such as a partial UTF-8 byte).
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
        texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False)
        self._candidate = [
            (not text) or ("\ufffd" in text) or any(c in text for c in last_chars) for text in texts
        ]

    def could_complete(self, token_id: int) -> bool:
        """Cheap pre-filter: whether `token_id` can be the last token of an occurrence."""
        return token_id >= len(self._candidate) or self._candidate[token_id]

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def match(self, generated: Sequence[int]) -> DelimiterMatch | None:
        """The occurrence (earliest-starting, if several) that ends inside the last token of `generated`.

        Args:
            generated: the generated token ids of one sequence (prompt excluded, so a delimiter that starts in
                the prompt does not count).
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


# ----------------------------------------------------------------------------------------------------------------
# Cache forking
# ----------------------------------------------------------------------------------------------------------------


def fork_cache(cache: Cache, rows: torch.Tensor) -> Cache:
    """A new cache holding copies of the `rows` of `cache`; `cache` itself is never modified.

    Args:
        cache: a transformers `Cache` whose layers are `DynamicLayer`s (the default `DynamicCache`, including
            sliding-window layers), as used by ``generate``.
        rows: `(n,)` long, batch rows to copy (in the order wanted in the fork).

    Returns:
        A cache of batch size n. Shallow copies of the layers share the original tensors until
        ``batch_select_indices`` gathers the rows into new tensors; later updates of the fork concatenate into
        new tensors too, so the original cache stays untouched.
    """
    for layer in cache.layers:
        if not isinstance(layer, DynamicLayer):
            raise NotImplementedError(
                f"MSV generation forks the KV cache and supports dynamic cache layers only; this model's cache has "
                f"a {type(layer).__name__} (use the default DynamicCache, e.g. no cache_implementation='static').")
    fork = copy.copy(cache)
    fork.layers = [copy.copy(layer) for layer in cache.layers]
    batch = next((layer.keys.shape[0] for layer in cache.layers if layer.is_initialized), None)
    if batch is None or len(rows) != batch or not torch.equal(rows.cpu(), torch.arange(batch)):
        fork.batch_select_indices(rows)
    # else: every row branches (every-K elicitation): the shallow copies already form an independent cache.
    return fork


# ----------------------------------------------------------------------------------------------------------------
# Stopping criterion
# ----------------------------------------------------------------------------------------------------------------


class MSVEarlyStop(StoppingCriteria):
    """Stopping criterion that runs MSV elicitation and scoring and stops a prompt's N sequences at t*.

    Pass it to ``model.generate(..., stopping_criteria=[MSVEarlyStop(λ)])`` after `prepare_generation`; the
    session's ``generate`` wrapper binds it to the current call.

    Args:
        threshold: λ. A prompt stops at the first step where the best available answer score is ≥ λ. `None` or
            a value > 1 never stops (answers are still elicited and scored); 0 stops at the first answer. Ignored
            in terminal mode, where all answers arrive at the end.

    Returns (when called): `(batch,)` bool tensor, True for every row of a prompt that has stopped.
    """

    def __init__(self, threshold: float | None = None):
        self.threshold = threshold
        self._run: _Run | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor | None = None, **kwargs):
        if self._run is None:
            raise RuntimeError(
                "MSVEarlyStop is not attached to a generation session: call "
                "`hf_msv.prepare_generation(model, tokenizer, ...)` before `model.generate(...)`.")
        return self._run.step(input_ids)


# ----------------------------------------------------------------------------------------------------------------
# Per-call state
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class _Branch:
    """A row that fires at the current step and how its branch context is built."""

    row: int
    trigger: str
    drop: int = 0  # trailing cached chain-of-thought tokens hidden from the branch (a delimiter's earlier tokens)
    feed_newest: bool = False  # whether the newest sampled token (not yet in the cache) belongs to the context
    prefix_ids: list[int] = field(default_factory=list)


@dataclass
class _Group:
    """State of one prompt's N sequences."""

    classes: object | None
    answers: list[MSVAnswer] = field(default_factory=list)
    pending: list[MSVAnswer] = field(default_factory=list)  # elicited, waiting for τ + L (or terminal scoring)
    live: int = 0
    finished: bool = False
    decided: bool = False
    stopped_early: bool = False
    stop_step: int | None = None
    chosen: MSVAnswer | None = None


_LIVE, _EOS, _BUDGET, _STOPPED = "live", "eos", "budget", "stopped"


class _Run:
    """State of one ``generate`` call: rows, answers, the recorded LM cache, the verifier cache and the timers."""

    def __init__(self, session: MSVSession, num_sequences: int, eos_ids: set[int], max_new_tokens: int | None,
                 max_length: int | None, threshold: float | None):
        self.session = session
        self.N = num_sequences
        self.eos_ids = eos_ids
        self.max_new_tokens, self.max_length = max_new_tokens, max_length
        self.threshold = threshold
        self.prompt_length: int | None = None
        self.last_step = -1
        # Recorded by the forward pre-hook at the latest decode forward.
        self.cache: Cache | None = None
        self.attention_mask: torch.Tensor | None = None
        self.position_ids: torch.Tensor | None = None
        self.msv_cache = MSVCache() if session.verifier is not None and session.mode == "streaming" else None
        self.timings = dict.fromkeys(("elicitation", "verifier", "equivalence"), 0.0)

    # -- hook ------------------------------------------------------------------------------------------------

    def record(self, kwargs: dict):
        self.cache = kwargs.get("past_key_values")
        self.attention_mask = kwargs.get("attention_mask")
        self.position_ids = kwargs.get("position_ids")

    # -- per step --------------------------------------------------------------------------------------------

    def _start(self, input_ids: torch.LongTensor):
        rows = input_ids.shape[0]
        if rows % self.N:
            raise ValueError(f"batch of {rows} rows is not a multiple of num_return_sequences={self.N}.")
        self.prompt_length = input_ids.shape[1] - 1
        self.budget = (self.max_new_tokens if self.max_new_tokens is not None
                       else max(0, (self.max_length or 0) - self.prompt_length))
        self.status = [_LIVE] * rows
        self.end_step = [-1] * rows
        self.history: list[list[int]] = [[] for _ in range(rows)]
        self.num_answers = [0] * rows
        self.last_answer: list[MSVAnswer | None] = [None] * rows
        self.elicitation_tokens = [0] * rows
        self.groups = [_Group(classes=self.session._new_classes(), live=self.N) for _ in range(rows // self.N)]
        self.done = torch.zeros(rows, dtype=torch.bool, device=input_ids.device)
        if self.cache is None:
            raise RuntimeError("MSV generation needs the KV cache: call generate with use_cache=True.")
        if self.attention_mask is not None and self.attention_mask.dim() != 2:
            raise NotImplementedError("MSV generation needs a 2D attention mask (dynamic cache).")

    def step(self, input_ids: torch.LongTensor) -> torch.BoolTensor:
        """Called by `MSVEarlyStop` right after token t has been sampled for every row."""
        if self.prompt_length is None:
            self._start(input_ids)
        t = input_ids.shape[1] - self.prompt_length - 1
        self.last_step = t
        newest = input_ids[:, -1].tolist()
        session = self.session
        streaming = session.mode == "streaming"
        matcher, every_k = session.matcher, session.every_k_tokens
        branches = []
        for row, token in enumerate(newest):
            if self.status[row] != _LIVE:
                continue
            history = self.history[row]
            history.append(token)
            if token in self.eos_ids:
                self._end_row(row, t, _EOS)
                branches.append(_Branch(row, "eos"))
            elif streaming:
                branch = None
                if matcher is not None and matcher.could_complete(token):
                    found = matcher.match(history)
                    if found is not None:
                        branch = session._delimiter_branch(row, found)
                if branch is None and every_k and len(history) % every_k == 0:
                    branch = _Branch(row, "every_k", feed_newest=True)
                if branch is not None:
                    branches.append(branch)
        if branches:
            self._elicit(branches, t)
        self._score(t)
        return self.done

    def _end_row(self, row: int, t: int, status: str):
        self.status[row] = status
        self.end_step[row] = t
        group = self.groups[row // self.N]
        group.live -= 1
        group.finished = group.live == 0

    def finalize(self) -> list[MSVResult]:
        """After the decoding loop: terminal answers of rows still live, last scores, results."""
        if self.prompt_length is None:  # generate produced no token
            return []
        t = self.last_step
        branches = []
        for row, status in enumerate(self.status):
            if status != _LIVE:
                continue
            self._end_row(row, t, _BUDGET)
            previous = self.last_answer[row]
            if previous is not None and previous.tau == t:
                # A delimiter fired at the very last token: that answer already saw the whole sequence (up to the
                # delimiter), so it is the terminal answer; eliciting again would duplicate it.
                previous.terminal = True
            else:
                branches.append(_Branch(row, "budget", feed_newest=True))
        if branches:
            self._elicit(branches, t)
        self._score(t)
        return self._results()

    # -- elicitation -----------------------------------------------------------------------------------------

    @torch.no_grad()
    def _elicit(self, branches: list[_Branch], t: int):
        """Elicit one answer per branch fired at step t, assign its equivalence class and queue it for scoring."""
        session = self.session
        start = time.perf_counter()
        fork, mask, position, segments, logits = self._branch(branches)
        answer_ids, hidden, logprobs = self._decode_answers(fork, mask, position, logits)
        del fork, logits

        answers = []
        for bi, b in enumerate(branches):
            ids = answer_ids[bi]
            raw = session._decode(ids)
            row = b.row
            terminal = b.trigger in ("eos", "budget")
            kept = len(self.history[row]) - (0 if b.feed_newest else 1) - b.drop
            answer = MSVAnswer(
                text=extract_boxed(raw), raw_text=raw, token_ids=ids, prompt=row // self.N, sequence=row % self.N,
                step=self.num_answers[row], tau=t, length=len(ids), trigger=b.trigger, terminal=terminal,
                cot_tokens=kept, elicitation_ids=b.prefix_ids + session.prompt_ids,
                hidden_states=torch.stack(hidden[bi]), token_logprobs=logprobs[bi])
            self.num_answers[row] += 1
            self.last_answer[row] = answer
            self.elicitation_tokens[row] += len(segments[bi]) + len(ids)
            answers.append(answer)
        self.timings["elicitation"] += time.perf_counter() - start

        start = time.perf_counter()
        for answer in answers:
            group = self.groups[answer.prompt]
            if group.classes is not None:
                answer.class_id = group.classes.add(answer.text)
            group.answers.append(answer)
            if not group.decided:
                group.pending.append(answer)
        self.timings["equivalence"] += time.perf_counter() - start

    def _branch(self, branches: list[_Branch]):
        """Fork the fired rows and feed their elicitation segments in one forward.

        Returns the fork, the attention mask `(n, S + W)`, the next position `(n,)`, the fed segments and the
        last-position logits `(n, V)`.
        """
        session = self.session
        device = self.done.device
        n = len(branches)
        rows = torch.tensor([b.row for b in branches], device=device)
        fork = fork_cache(self.cache, rows)
        context = self.cache.get_seq_length()
        if self.attention_mask is not None:
            context_mask = self.attention_mask[rows].to(torch.long)
        else:
            context_mask = torch.ones(n, context, dtype=torch.long, device=device)
        # Position of the newest sampled token, whose key/value is not in the cache yet.
        if self.position_ids is not None and self.position_ids.dim() == 2:
            newest_position = self.position_ids[rows, -1] + 1
        else:
            newest_position = context_mask.sum(-1)
        segments = []
        for i, b in enumerate(branches):
            if b.drop:  # hide the delimiter's earlier tokens: a per-row crop
                context_mask[i, context - b.drop:] = 0
            newest = [self.history[b.row][-1]] if b.feed_newest else []
            segments.append(newest + b.prefix_ids + session.prompt_ids)
        # Segments of different lengths are left-padded inside the segment; the padding is masked out and new
        # tokens are numbered from the first hidden position, so each row reads as its own contiguous sequence.
        width = max(len(segment) for segment in segments)
        input_ids = torch.full((n, width), session.pad_token_id, dtype=torch.long, device=device)
        segment_mask = torch.zeros(n, width, dtype=torch.long, device=device)
        positions = torch.zeros(n, width, dtype=torch.long, device=device)
        first = (newest_position - torch.tensor([b.drop for b in branches], device=device)).tolist()
        for i, segment in enumerate(segments):
            pad = width - len(segment)
            input_ids[i, pad:] = torch.tensor(segment, device=device)
            segment_mask[i, pad:] = 1
            positions[i, pad:] = torch.arange(first[i], first[i] + len(segment), device=device)
            positions[i, :pad] = first[i]  # masked; any valid position
        mask = torch.cat([context_mask, segment_mask], dim=1)
        out = session._forward(input_ids, mask, positions, fork, hidden=False)
        return fork, mask, positions[:, -1] + 1, segments, out.logits[:, -1]

    def _decode_answers(self, fork: Cache, mask: torch.Tensor, position: torch.Tensor, logits: torch.Tensor):
        """Greedy answer decoding, batched over the branches, until each box closes (or EOS, or the cap).

        Returns per branch the answer token ids, their last-layer hidden states (list of `(d,)`) and their
        log-probabilities under the LM (list of floats).
        """
        session = self.session
        cap = session.max_answer_tokens
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
                if token in self.eos_ids or len(ids) >= cap or find_box_end(session._decode(ids)) is not None:
                    closing.append(bi)
            # Every answer token is fed, the closing one included: its hidden state is the output at its position.
            mask = torch.cat([mask, mask.new_ones(len(batch), 1)], dim=1)
            out = session._forward(tokens[:, None], mask, position[:, None], fork, hidden=True)
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
                keep = torch.tensor(live, device=mask.device)
                fork.batch_select_indices(keep)
                mask, tokens, position, logits = mask[keep], tokens[keep], position[keep], logits[keep]
                batch = [batch[p] for p in live]
        return answer_ids, hidden, logprobs

    # -- scoring ---------------------------------------------------------------------------------------------

    @torch.no_grad()
    def _score(self, t: int):
        """Score what has become available by step t and apply the stopping rule."""
        session = self.session
        verifier = session.verifier
        if verifier is None:
            for group in self.groups:
                if not session.capture_hidden_states:
                    for answer in group.pending:
                        answer.hidden_states = None
                group.pending = []
            return
        streaming = session.mode == "streaming"
        ready: list[MSVAnswer] = []
        for group in self.groups:
            if group.decided or not group.pending:
                continue
            if group.finished:
                ready += group.pending
                group.pending = []
            elif streaming:
                ready += [a for a in group.pending if a.end <= t]
                group.pending = [a for a in group.pending if a.end > t]
        if not ready:
            return
        start = time.perf_counter()
        # End-time order per group keeps every call causal for the online cache (the verifier sorts internally).
        ready.sort(key=lambda a: (a.prompt, a.end, a.sequence))
        M = verifier.config.num_sequences
        subgroups = -(-self.N // M)
        lengths = torch.tensor([a.length for a in ready])
        device = ready[0].hidden_states.device

        def column(values):
            return torch.tensor(values, dtype=torch.long, device=device)

        out = verifier(
            hidden_states=torch.cat([a.hidden_states for a in ready]),
            token_answer=torch.repeat_interleave(torch.arange(len(ready)), lengths).to(device),
            answer_group=column([a.prompt * subgroups + a.sequence // M for a in ready]),
            answer_sequence=column([a.sequence % M for a in ready]),
            answer_step=column([a.step for a in ready]),
            answer_end=column([a.end for a in ready]),
            answer_class=column([a.class_id for a in ready]),
            past_key_values=self.msv_cache,
            use_cache=self.msv_cache is not None,
        )
        for answer, score in zip(ready, out.probabilities.tolist()):
            answer.score = score
            if not session.capture_hidden_states:
                answer.hidden_states = None
        self.timings["verifier"] += time.perf_counter() - start

        for prompt in sorted({a.prompt for a in ready}):
            self._decide(prompt, [a for a in ready if a.prompt == prompt], t)

    def _decide(self, prompt: int, scored: list[MSVAnswer], t: int):
        group = self.groups[prompt]
        if self.session.mode == "streaming" and self.threshold is not None:
            for answer in scored:  # in end order
                if answer.score >= self.threshold:
                    t_star = answer.end
                    available = [a for a in group.answers if a.score is not None and a.end <= t_star]
                    group.decided, group.stop_step = True, t_star
                    group.chosen = max(available, key=lambda a: a.score)
                    group.stopped_early = not group.finished
                    if group.stopped_early:
                        for row in range(prompt * self.N, (prompt + 1) * self.N):
                            if self.status[row] == _LIVE:
                                self._end_row(row, t, _STOPPED)
                        self.done[prompt * self.N:(prompt + 1) * self.N] = True
                    if not self.session.capture_hidden_states:
                        for a in group.pending:
                            a.hidden_states = None
                    group.pending = []
                    return
        if group.finished and not group.pending:
            # No answer reached λ: the best among the final answers of the sequences.
            final: dict[int, MSVAnswer] = {}
            for answer in group.answers:
                if answer.score is not None:
                    final[answer.sequence] = answer
            group.decided = True
            group.stop_step = max(self.end_step[r] for r in range(prompt * self.N, (prompt + 1) * self.N))
            group.chosen = max(final.values(), key=lambda a: a.score) if final else None

    # -- results ---------------------------------------------------------------------------------------------

    def _results(self) -> list[MSVResult]:
        timings = dict(self.timings)
        results = []
        for p, group in enumerate(self.groups):
            rows = range(p * self.N, (p + 1) * self.N)
            decoded = sum(self.end_step[r] + 1 for r in rows)
            cut = [r for r in rows if self.status[r] == _STOPPED]
            upper = decoded + sum(max(0, self.budget - (self.end_step[r] + 1)) for r in cut)
            for answer in group.answers:
                if answer.hidden_states is not None:
                    answer.hidden_states = answer.hidden_states.cpu() if self.session.capture_hidden_states else None
            answers = sorted(group.answers, key=lambda a: (a.tau, a.sequence, a.step))
            stop_step = group.stop_step
            if stop_step is None:
                stop_step = max(self.end_step[r] for r in rows)
            results.append(MSVResult(
                prompt=p, answers=answers, chosen=group.chosen,
                confidence=group.chosen.score if group.chosen is not None else None,
                stopped_early=group.stopped_early, stop_step=stop_step, threshold=self.threshold,
                sequences=[list(self.history[r]) for r in rows], finish_reasons=[self.status[r] for r in rows],
                tokens_decoded=decoded, token_budget=self.N * self.budget,
                tokens_without_early_stop=None if group.stopped_early else decoded,
                tokens_without_early_stop_bounds=(decoded, upper),
                elicitation_tokens=sum(self.elicitation_tokens[r] for r in rows),
                answer_tokens=sum(a.length for a in group.answers), timings=timings))
        return results


# ----------------------------------------------------------------------------------------------------------------
# Session
# ----------------------------------------------------------------------------------------------------------------


class MSVSession:
    """Hooks attached to one LM by `prepare_generation`; see the module docstring for the design.

    Attributes:
        results: `MSVResult`s of the ``generate`` calls since the last `pop_results` (one per prompt, in order).
    """

    def __init__(self, model, tokenizer, verifier=None, *, mode: str | None = None,
                 delimiters: str | Sequence[str] | None = None, every_k_tokens: int | None = None,
                 elicitation_prompt: str | None = None, max_answer_tokens: int | None = None,
                 checker="symbolic", num_sequences: int | None = None, keep_delimiter: bool = False,
                 capture_hidden_states: bool = False):
        if getattr(model.config, "is_encoder_decoder", False):
            raise NotImplementedError("MSV generation supports decoder-only LMs.")
        vconfig = verifier.config if verifier is not None else None
        if verifier is not None:
            check_compatible(verifier, model)
        mode = mode or (vconfig.mode if vconfig is not None else "streaming")
        if mode not in ("streaming", "terminal"):
            raise ValueError(f"mode must be 'streaming' or 'terminal', got {mode!r}.")
        if vconfig is not None and vconfig.mode != mode:
            raise ValueError(f"the verifier was built for {vconfig.mode!r} answers but mode={mode!r}.")
        if delimiters is None and every_k_tokens is None:
            if vconfig is not None and (vconfig.delimiters or vconfig.every_k_tokens):
                delimiters, every_k_tokens = vconfig.delimiters, vconfig.every_k_tokens
            else:
                delimiters = ["Wait"]
        if isinstance(delimiters, str):
            delimiters = [delimiters]
        if every_k_tokens is not None and every_k_tokens < 1:
            raise ValueError(f"every_k_tokens must be a positive integer, got {every_k_tokens}.")
        if elicitation_prompt is None:
            elicitation_prompt = vconfig.elicitation_prompt if vconfig is not None else ELICITATION_PROMPT
        if max_answer_tokens is None:
            max_answer_tokens = vconfig.max_answer_tokens if vconfig is not None else MAX_ANSWER_TOKENS
        if max_answer_tokens < 1:
            raise ValueError("max_answer_tokens must be at least 1.")
        if verifier is not None and checker is None:
            raise ValueError("a verifier needs equivalence classes: pass a checker (e.g. 'symbolic').")

        self.model, self.tokenizer, self.verifier = model, tokenizer, verifier
        self.mode = mode
        self.delimiters = list(delimiters or [])
        self.every_k_tokens = every_k_tokens
        self.elicitation_prompt = elicitation_prompt
        self.max_answer_tokens = max_answer_tokens
        self.num_sequences = num_sequences
        self.keep_delimiter = keep_delimiter
        self.capture_hidden_states = capture_hidden_states
        if isinstance(checker, str):
            from ..equivalence import get_checker

            checker = get_checker(checker)
        self.checker = checker
        self.prompt_ids = tokenizer(elicitation_prompt, add_special_tokens=False)["input_ids"]
        if not self.prompt_ids:
            raise ValueError("the elicitation prompt must encode to at least one token.")
        self.matcher = DelimiterMatcher(tokenizer, self.delimiters) if self.delimiters and mode == "streaming" else None
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id = pad if pad is not None else 0
        parameters = inspect.signature(model.forward).parameters
        self._accepts_position_ids = "position_ids" in parameters
        self._accepts_logits_to_keep = "logits_to_keep" in parameters
        self.results: list[MSVResult] = []
        self._run: _Run | None = None
        self._in_elicitation = False
        self._attach()

    # -- attach / detach ---------------------------------------------------------------------------------------

    def _attach(self):
        model = self.model
        if "generate" in vars(model):
            raise RuntimeError("this model already has an MSV generation session (or a patched generate); "
                               "detach it first.")
        self._hook = model.register_forward_pre_hook(self._pre_hook, with_kwargs=True)
        self._original_generate = model.generate

        @functools.wraps(self._original_generate)
        def generate(*args, **kwargs):
            return self._generate(*args, **kwargs)

        model.generate = generate
        model._msv_session = self

    def detach(self):
        """Remove the hook and restore ``model.generate``."""
        if self._hook is None:
            return
        self._hook.remove()
        self._hook = None
        vars(self.model).pop("generate", None)
        vars(self.model).pop("_msv_session", None)

    def __enter__(self) -> MSVSession:
        return self

    def __exit__(self, *exc):
        self.detach()

    def pop_results(self) -> list[MSVResult]:
        """Return and clear the accumulated results."""
        results, self.results = self.results, []
        return results

    # -- hook and generate wrapper -----------------------------------------------------------------------------

    def _pre_hook(self, module, args, kwargs):
        # Elicitation forwards go through the same module; they must not replace the recorded main-loop state.
        if self._run is not None and not self._in_elicitation:
            self._run.record(kwargs)

    def _generate(self, *args, **kwargs):
        criteria = list(kwargs.pop("stopping_criteria", None) or [])
        # The effective generation config, as generate will build it: N, EOS ids and the token budget.
        config = copy.deepcopy(kwargs.get("generation_config") or self.model.generation_config)
        if "num_return_sequences" not in kwargs and self.num_sequences is not None and (
                kwargs.get("generation_config") is None):
            kwargs["num_return_sequences"] = self.num_sequences
        config.update(**{k: v for k, v in kwargs.items() if k != "generation_config" and hasattr(config, k)})
        if (config.num_beams or 1) > 1 or kwargs.get("assistant_model") is not None:
            raise NotImplementedError("MSV generation supports sampling and greedy search, not beam search or "
                                      "assisted decoding.")
        eos = config.eos_token_id
        if eos is None:
            eos_ids = set()
        elif torch.is_tensor(eos):
            eos_ids = set(eos.flatten().tolist())
        else:
            eos_ids = {eos} if isinstance(eos, int) else set(eos)

        ours = [c for c in criteria if isinstance(c, MSVEarlyStop)]
        if len(ours) > 1:
            raise ValueError("pass at most one MSVEarlyStop.")
        if not ours:
            ours = [MSVEarlyStop(None)]
            criteria.append(ours[0])
        criterion = ours[0]
        threshold = criterion.threshold
        if threshold is not None and self.verifier is None:
            raise ValueError("MSVEarlyStop(threshold) needs a verifier: pass verifier=... to prepare_generation.")
        run = _Run(self, num_sequences=config.num_return_sequences or 1, eos_ids=eos_ids,
                   max_new_tokens=config.max_new_tokens, max_length=config.max_length, threshold=threshold)
        if self.model.training:
            warnings.warn("MSV generation with a model in training mode: call model.eval() (dropout would make "
                          "answers random).", stacklevel=2)
        criterion._run, self._run = run, run
        start = time.perf_counter()
        try:
            output = self._original_generate(*args, stopping_criteria=StoppingCriteriaList(criteria), **kwargs)
            results = run.finalize()
        finally:
            criterion._run, self._run = None, None
        total = time.perf_counter() - start
        timings = dict(run.timings, total=total)
        timings["cot"] = total - sum(run.timings.values())
        for result in results:
            result.timings = timings
        self.results.extend(results)
        return output

    # -- helpers used by _Run ----------------------------------------------------------------------------------

    def _new_classes(self):
        if self.checker is None:
            return None
        from ..equivalence import EquivalenceClasses

        return EquivalenceClasses(self.checker)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _delimiter_branch(self, row: int, found: DelimiterMatch) -> _Branch:
        if self.keep_delimiter:
            return _Branch(row, "delimiter", feed_newest=True)
        prefix = self.tokenizer(found.prefix, add_special_tokens=False)["input_ids"] if found.prefix else []
        return _Branch(row, "delimiter", drop=found.num_tokens - 1, prefix_ids=prefix)

    def _forward(self, input_ids, attention_mask, position_ids, cache, hidden: bool):
        kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
        if self._accepts_position_ids:
            kwargs["position_ids"] = position_ids
        if self._accepts_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        if hidden:
            kwargs["output_hidden_states"] = True
        self._in_elicitation = True
        try:
            with _rng_guard(self.model):
                return self.model(**kwargs)
        finally:
            self._in_elicitation = False

    # -- convenience -------------------------------------------------------------------------------------------

    def generate(self, prompts: Sequence[str | list[dict]], *, threshold: float | None = None,
                 num_sequences: int | None = None, max_new_tokens: int = 4096, do_sample: bool = True,
                 **generate_kwargs) -> list[MSVResult]:
        """Tokenise `prompts` (strings, or chat messages formatted with the tokenizer's chat template), sample
        `num_sequences` per prompt with early stopping at `threshold`, and return one `MSVResult` per prompt."""
        tokenizer = self.tokenizer
        chat = [isinstance(p, (list, tuple)) for p in prompts]
        if any(chat) and not all(chat):
            raise ValueError("pass either strings or chat message lists, not both.")
        if all(chat) and prompts:
            texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
            special = False
        else:
            texts, special = list(prompts), True
        padding_side = tokenizer.padding_side
        tokenizer.padding_side = "left"
        try:
            inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=special)
        finally:
            tokenizer.padding_side = padding_side
        inputs = inputs.to(self.model.device)
        if tokenizer.pad_token_id is None:
            generate_kwargs.setdefault("pad_token_id", tokenizer.eos_token_id)
        n = num_sequences or self.num_sequences or 1
        before = len(self.results)
        self.model.generate(**inputs, do_sample=do_sample, num_return_sequences=n, max_new_tokens=max_new_tokens,
                            stopping_criteria=[MSVEarlyStop(threshold)], **generate_kwargs)
        results = self.results[before:]
        del self.results[before:]
        return results


def _rng_guard(model):
    """Keep elicitation forwards from consuming the sampling RNG (only dropout would; greedy decoding does not)."""
    if not model.training:
        return contextlib.nullcontext()
    device = next(model.parameters()).device
    devices = [device.index or 0] if device.type == "cuda" else []
    return torch.random.fork_rng(devices=devices)


def prepare_generation(model, tokenizer, verifier=None, *, mode: str | None = None,
                       delimiters: str | Sequence[str] | None = None, every_k_tokens: int | None = None,
                       elicitation_prompt: str | None = None, max_answer_tokens: int | None = None,
                       checker="symbolic", num_sequences: int | None = None, keep_delimiter: bool = False,
                       capture_hidden_states: bool = False) -> MSVSession:
    """Attach MSV elicitation and scoring to `model`, so that ``model.generate(...,
    stopping_criteria=[MSVEarlyStop(λ)])`` elicits, scores and stops early.

    Args:
        model: a decoder-only transformers LM (any architecture with the default dynamic KV cache).
        tokenizer: its tokenizer (delimiter matching, elicitation prompt, answer text).
        verifier: an `MSVVerifier` whose ``config.hidden_size`` equals the LM's hidden size; `None` collects
            answers (and hidden states) without scoring.
        mode: ``"streaming"`` (answers at delimiters and at the end) or ``"terminal"`` (only at the end).
            Defaults to the verifier's mode, else streaming.
        delimiters: text delimiters, e.g. ``["Wait"]`` or ``["\\n\\n"]``; matched on decoded text. Defaults to the
            verifier's ``config.delimiters`` / ``config.every_k_tokens``, else ``["Wait"]``. ``[]`` elicits only at
            the end (or every K tokens).
        every_k_tokens: also elicit after every K generated tokens (delimiter-free variant of the paper).
        elicitation_prompt: appended to a branch to elicit its answer (default: verifier's, else
            ``"### Final Answer ### \\boxed"``).
        max_answer_tokens: cap on answer tokens (default: verifier's, else 40); an unclosed box is "no answer".
        checker: equivalence checker name for `hf_msv.equivalence.get_checker` or a checker object; `None`
            (only without verifier) skips class assignment.
        num_sequences: N used when ``generate`` is called without ``num_return_sequences``.
        keep_delimiter: keep the delimiter in the branch context instead of branching just before it.
        capture_hidden_states: keep every answer's `(L, d)` hidden states (on CPU) in the results.

    Returns:
        The `MSVSession`; read ``session.results`` / ``session.pop_results()`` after ``generate``, and call
        ``session.detach()`` (or use it as a context manager) to restore the model.
    """
    return MSVSession(model, tokenizer, verifier, mode=mode, delimiters=delimiters, every_k_tokens=every_k_tokens,
                      elicitation_prompt=elicitation_prompt, max_answer_tokens=max_answer_tokens, checker=checker,
                      num_sequences=num_sequences, keep_delimiter=keep_delimiter,
                      capture_hidden_states=capture_hidden_states)


def msv_generate(model, tokenizer, prompts: Iterable[str | list[dict]], *, verifier=None,
                 threshold: float | None = None, num_sequences: int = 16, max_new_tokens: int = 4096,
                 do_sample: bool = True, generate_kwargs: dict | None = None, **session_kwargs) -> list[MSVResult]:
    """Sample `num_sequences` chains of thought per prompt with MSV early stopping; one `MSVResult` per prompt.

    Args:
        prompts: strings (used as they are) or chat message lists (formatted with the tokenizer's chat template).
        threshold: λ for `MSVEarlyStop` (`None`: never stop).
        generate_kwargs: extra arguments for ``model.generate`` (temperature, top_p, ...).
        **session_kwargs: any argument of `prepare_generation` (delimiters, mode, checker, ...).
    """
    with prepare_generation(model, tokenizer, verifier, **session_kwargs) as session:
        return session.generate(list(prompts), threshold=threshold, num_sequences=num_sequences,
                                max_new_tokens=max_new_tokens, do_sample=do_sample, **(generate_kwargs or {}))


__all__ = [
    "DelimiterMatch",
    "DelimiterMatcher",
    "MSVAnswer",
    "MSVEarlyStop",
    "MSVResult",
    "MSVSession",
    "fork_cache",
    "msv_generate",
    "prepare_generation",
]
