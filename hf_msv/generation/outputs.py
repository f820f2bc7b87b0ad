"""What MSV generation returns: one `MSVAnswer` per elicited answer and one `MSVResult` per prompt."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["ClassValue", "MSVAnswer", "MSVResult", "answer_sort_key"]


@dataclass(frozen=True)
class ClassValue:
    """One class's row of a snapshot (`hf_msv.class_events`): its representative `answer` (what a stop on it
    outputs), the `statistic` the stop fires on and the `confidence` that picks and is reported."""

    answer: MSVAnswer
    statistic: float
    confidence: float


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
        end: the step at which the answer became available: its last token was fed in the same forward as
            chain-of-thought token `end` (τ + P + L for a branch fed P segment tokens, one per step; see
            `hf_msv.generation.forking`).
        trigger: why it was elicited: ``"delimiter"``, ``"every_k"``, ``"eos"`` (sequence ended) or ``"budget"``
            (sequence reached the token budget, or generation ended for another reason).
        terminal: whether this is the sequence's terminal answer.
        cot_tokens: how many generated chain-of-thought tokens precede the branch point; the answer's context is
            prompt + generated[:cot_tokens] + `elicitation_ids` + token_ids.
        elicitation_ids: tokens fed after the kept chain of thought: text of the delimiter's first token that
            precedes the delimiter (re-encoded), then the elicitation prompt.
        class_id: equivalence class within the prompt's group (-1 when no checker was used).
        score: the verifier's P(correct), or the stopping statistic it is read through (`StopRuleScorer`); `None`
            without verifier (answers still decoding when their prompt stops are abandoned, never returned).
        confidence: P(correct) of the answer's class when the score is a stopping statistic with a confidence of
            its own (`hf_msv.StopHead.confidence`): it picks the output at the stop and is reported; `None`: the
            score.
        verifier_score: the score of the scorer a derived score is read from (the verifier's P(correct) under
            `StopRuleScorer`, what a replay of the stream scores with); `None`: `score` is the verifier's own.
        hidden_states: `(L, d)` last-layer hidden states of the answer tokens (kept with
            ``capture_hidden_states=True``, on CPU unless ``offload_hidden_states=False``; otherwise `None` after
            scoring).
        token_logprobs: `L` floats, log p(answer token i | context, tokens < i) under the LM (what the Token-Probs
            baseline averages).
        class_values: with a class-level stopping statistic (`StopRuleScorer`), the snapshot of every class at this
            answer's arrival (`ClassValue`s), set on the last answer of each arrival time (empty on the others);
            `None`: the stop reads this answer's own score.
    """

    text: str | None
    raw_text: str
    token_ids: list[int]
    prompt: int
    sequence: int
    step: int
    tau: int
    length: int
    end: int
    trigger: str
    terminal: bool
    cot_tokens: int
    elicitation_ids: list[int]
    class_id: int = -1
    score: float | None = None
    confidence: float | None = None
    verifier_score: float | None = None
    hidden_states: torch.Tensor | None = field(default=None, repr=False)
    token_logprobs: list[float] | None = field(default=None, repr=False)
    class_values: list[ClassValue] | None = field(default=None, repr=False, compare=False)

    @property
    def reported_confidence(self) -> float | None:
        """What a stop on this answer reports: its `confidence` when it has one, else its `score`."""
        return self.score if self.confidence is None else self.confidence


@dataclass
class MSVResult:
    """Everything one prompt's N parallel sequences produced.

    Args:
        prompt: index of the prompt in the batch.
        answers: every elicited answer, in order of (τ, sequence) (`answer_sort_key`); the early-stopping rule
            breaks ties by this order, so an `AnswerGroup` built in it replays to the same decision.
        chosen: the selected answer (the best available when the threshold was reached, else the best-scored
            terminal answer; ties to the answer available first, then the earlier one in `answers`); `None`
            without verifier.
        confidence: the chosen answer's confidence (`MSVAnswer.confidence`, else its score).
        stopped_early: the threshold was reached while at least one sequence was still decoding.
        stop_step: t*, the step at which the threshold was reached; otherwise the step at which the last answer
            became available (max `MSVAnswer.end`), and without verifier the step at which the last sequence ended.
        threshold: λ used (`None`: never stop).
        sequences: the generated token ids of each sequence up to where it ended (EOS included, padding excluded).
        finish_reasons: per sequence, ``"eos"``, ``"budget"``, ``"stopped"`` (cut by the early stop) or
            ``"pruned"`` (cut alone by the pruning rule while the group went on).
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
            ``"equivalence"``. Elicitation shares the decoding forwards: it is charged the branch rows' share of
            each forward (its cost on a device where cost scales with rows) plus its own bookkeeping.
        compute: what the whole ``generate`` call computed, shared by all prompts of the batch:
            ``"forward_calls"`` (LM forwards, prefill included) and ``"rows_computed"`` (Σ batch rows over them);
            from `hf_msv.vllm` also ``"elicitation_prefill_tokens"`` (elicitation prompt tokens not served from
            the prefix cache) and ``"elicitation_answer_tokens_fed"``. From `hf_msv.vllm.AsyncVLLMController`,
            timings and compute are this prompt's own (its share of the engine steps it was in flight for), and
            timings add ``"queued"`` (submission to admission).
        cot_confidence: per sequence, DeepConf's token confidence of each chain-of-thought token (−mean of its
            top-k log-probs), when the engine recorded them (`hf_msv.vllm.VLLMController` with
            ``confidence_top_k``); `None` otherwise (``generate`` records them with
            `hf_msv.collect.confidence.ConfidenceRecorder`).
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
    compute: dict[str, int] = field(default_factory=dict)
    cot_confidence: list[list[float]] | None = None

    @property
    def num_sequences(self) -> int:
        return len(self.sequences)

    @property
    def pruned(self) -> list[tuple[int, int]]:
        """(sequence, tokens it decoded) of each pruned chain: which chains the rule pruned, and when."""
        return [(n, len(s)) for n, (s, f) in enumerate(zip(self.sequences, self.finish_reasons)) if f == "pruned"]


def answer_sort_key(answer: MSVAnswer) -> tuple[int, int, int]:
    """The order of `MSVResult.answers`: by τ, then sequence (then step, for completeness)."""
    return answer.tau, answer.sequence, answer.step
