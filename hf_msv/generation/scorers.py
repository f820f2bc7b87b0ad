"""Answer scorers: what turns a ``generate`` call's newly available answers into P(correct).

* `MSVScorer` — an `MSVVerifier` reading groups of M sequences (the online `MSVCache` in streaming mode).
* `ProbeScorer` — a `ProbeVerifier` scoring each answer alone.
* `WeightedVoteScorer` — a single-chain scorer (Probe, or MSV_1) whose scores are weighted-voted over a prompt's N
  sequences: the evaluation's "Probe+WV" / "MSV_1+WV", computed causally and online.
* `StopRuleScorer` — any of these, or a training-free rule, read through a stopping statistic over the prompt's N
  chains (`hf_msv.stop_rules`: the verifier's `StopHead`, k-of-N consensus, Adaptive-Consistency, probe stability).
* `as_scorer` — what `prepare_generation` accepts (a verifier or a scorer), as a scorer.

A scorer is a factory of per-call streams (`AnswerScorer.begin`); a stream holds one call's state. Design and the
equality with the evaluation's replay: ``docs/generation.md``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from ..baselines import WV_THRESHOLD, streaming_weighted_voting, weighted_voting
from ..modeling_msv import MSVCache, MSVVerifier
from ..modeling_probe import ProbeVerifier
from ..stop_rules import StopHead, stop_events, stop_statistic
from .outputs import ClassValue, MSVAnswer

__all__ = [
    "AnswerScorer",
    "MSVScorer",
    "ProbeScorer",
    "ScoringStream",
    "StopRuleScorer",
    "WeightedVoteScorer",
    "as_scorer",
    "forget_prompt",
]


class ScoringStream(Protocol):
    """The scoring state of one ``generate`` call, or of a server's lifetime (`hf_msv.vllm.AsyncVLLMController`).

    A stream that keeps per-prompt state may also define ``forget(prompt)``, which frees a decided prompt's state
    (`forget_prompt` calls it where it exists): a server's stream outlives its prompts."""

    def score(self, ready: Sequence[MSVAnswer]) -> list[float]:
        """P(correct) of each answer in `ready` (sorted by prompt, then end, then sequence).

        Every answer of a prompt with an end ≤ the largest end in `ready` is either in `ready` or was in an
        earlier call (the `ScoringQueue` releases answers in end order); in terminal mode a prompt's answers all
        come in one call."""
        ...


@runtime_checkable
class AnswerScorer(Protocol):
    """What the generation hook scores answers with.

    Attributes:
        config: the underlying verifier's config (``hidden_size``, ``mode``, ``elicitation``): the LM width check
            and the default elicitation settings read it.
    """

    @property
    def config(self) -> Any:
        """The verifier's config."""
        ...

    def begin(self, num_sequences: int, streaming: bool) -> ScoringStream:
        """A fresh stream for one call with N = `num_sequences` per prompt (`streaming`: answers arrive as they
        become available, else a prompt's terminal answers arrive together).

        Args:
            num_sequences: N, the sequences sampled per prompt.
            streaming: whether answers arrive as they become available.

        Returns:
            The `ScoringStream` of the call.
        """
        ...


def forget_prompt(stream: ScoringStream, prompt: int):
    """Free `stream`'s state of a decided `prompt`, none of whose answers it will score again; a stream without
    ``forget`` (stateless, or a user's) keeps it."""
    forget = getattr(stream, "forget", None)
    if forget is not None:
        forget(prompt)


def _states(answer: MSVAnswer) -> torch.Tensor:
    if answer.hidden_states is None:  # the session keeps every answer's states until it is scored
        raise RuntimeError(f"answer {answer.prompt}/{answer.sequence}/{answer.step} reached the scorer without states")
    return answer.hidden_states


def _packed(ready: Sequence[MSVAnswer], device) -> tuple[torch.Tensor, torch.Tensor]:
    """`(Σ L, d)` answer states on `device` and the `(Σ L,)` token → answer index."""
    lengths = torch.tensor([a.length for a in ready])
    hidden = torch.cat([_states(a) for a in ready]).to(device, non_blocking=True)
    return hidden, torch.repeat_interleave(torch.arange(len(ready)), lengths).to(device)


class MSVScorer:
    """An `MSVVerifier` reading a prompt's N sequences as groups of M = ``config.num_sequences`` (paper,
    "Scaling with MSV_M"), with the online `MSVCache` in streaming mode (online scores equal the offline forward).

    Args:
        verifier: the `MSVVerifier`.

    Raises:
        TypeError: `verifier` is not an `MSVVerifier`.
    """

    def __init__(self, verifier: MSVVerifier):
        if not isinstance(verifier, MSVVerifier):
            raise TypeError(f"MSVScorer needs an MSVVerifier, got {type(verifier).__name__}.")
        self.verifier = verifier
        self.config = verifier.config

    def begin(self, num_sequences: int, streaming: bool) -> _MSVStream:
        """A fresh stream for one call (`AnswerScorer.begin`), with a new `MSVCache` in streaming mode.

        Args:
            num_sequences: N, the sequences sampled per prompt.
            streaming: whether answers arrive as they become available.

        Returns:
            The call's `ScoringStream`.
        """
        return _MSVStream(self.verifier, num_sequences, MSVCache() if streaming else None)


class _MSVStream:
    def __init__(self, verifier: MSVVerifier, num_sequences: int, cache: MSVCache | None):
        self.verifier, self.cache = verifier, cache
        self.M = verifier.config.num_sequences
        self.subgroups = -(-num_sequences // self.M)

    @torch.no_grad()
    def score(self, ready: Sequence[MSVAnswer]) -> list[float]:
        device = next(self.verifier.parameters()).device  # answer states may have been moved off the accelerator
        hidden, token_answer = _packed(ready, device)

        M = self.M
        # The five columns in one copy to the device.
        columns = [
            (a.prompt * self.subgroups + a.sequence // M, a.sequence % M, a.step, a.end, a.class_id) for a in ready
        ]
        packed = torch.tensor(columns, dtype=torch.long).reshape(len(ready), 5).T.contiguous()
        group, sequence, step, end, klass = packed.to(device)
        out = self.verifier(
            hidden_states=hidden,
            token_answer=token_answer,
            answer_group=group,
            answer_sequence=sequence,
            answer_step=step,
            answer_end=end,
            answer_class=klass,
            past_key_values=self.cache,
            use_cache=self.cache is not None,
        )
        return out.probabilities.tolist()

    def forget(self, prompt: int):
        if self.cache is not None:
            self.cache.drop([prompt * self.subgroups + j for j in range(self.subgroups)])


class ProbeScorer:
    """A `ProbeVerifier` scoring each answer alone (from its last token's hidden state).

    Args:
        probe: the `ProbeVerifier`.

    Raises:
        TypeError: `probe` is not a `ProbeVerifier`.
    """

    def __init__(self, probe: ProbeVerifier):
        if not isinstance(probe, ProbeVerifier):
            raise TypeError(f"ProbeScorer needs a ProbeVerifier, got {type(probe).__name__}.")
        self.probe = probe
        self.config = probe.config

    def begin(self, num_sequences: int, streaming: bool) -> ProbeScorer:
        """The scorer itself, which keeps no state (`AnswerScorer.begin`).

        Args:
            num_sequences: N (unused).
            streaming: unused.

        Returns:
            This `ProbeScorer`.
        """
        return self  # stateless: each answer is scored alone

    @torch.no_grad()
    def score(self, ready: Sequence[MSVAnswer]) -> list[float]:
        """P(correct) of each answer in `ready`, each from its own hidden states.

        Args:
            ready: answers with their hidden states.

        Returns:
            One probability per answer, in order.
        """
        device = self.probe.head.weight.device
        hidden, token_answer = _packed(ready, device)
        out = self.probe(
            hidden_states=hidden,
            token_answer=token_answer,
            answer_group=torch.zeros(len(ready), dtype=torch.long, device=device),
        )
        return out.probabilities.tolist()


class WeightedVoteScorer:
    """Weighted voting of single-chain scores within each prompt's N sequences (Li et al., 2022): "Probe+WV" with a
    `ProbeVerifier`, "MSV_1+WV" with an `MSVVerifier` of ``num_sequences == 1``.

    Each answer is scored once, when it becomes available, by the evaluation's rule: in streaming mode the answers
    of its prompt available by its end (end_b ≤ end_a, itself included) are weighted-voted when there are more than
    `wv_threshold` of them, else it keeps its own score (`hf_msv.baselines.streaming_weighted_voting`); in terminal
    mode over the prompt's terminal answers (`hf_msv.baselines.weighted_voting`). The stopping rule then takes the
    maximum over available answers, as the evaluation's replay does.

    Args:
        base: a `ProbeVerifier`, an `MSVVerifier` with ``config.num_sequences == 1``, or a `ProbeScorer` /
            `MSVScorer` of one of them.
        wv_threshold: R, at least 0 (default: the evaluation's, `WV_THRESHOLD`).

    Raises:
        ValueError: an MSV reading more than one sequence, or a negative or non-integer `wv_threshold`.
        TypeError: any other `base`.
    """

    def __init__(self, base, wv_threshold: int = WV_THRESHOLD):
        if isinstance(wv_threshold, bool) or not isinstance(wv_threshold, (int, np.integer)) or wv_threshold < 0:
            raise ValueError(f"wv_threshold must be an integer >= 0, got {wv_threshold!r}.")
        if isinstance(base, ProbeVerifier):
            base = ProbeScorer(base)
        elif isinstance(base, MSVVerifier):
            base = MSVScorer(base)
        if isinstance(base, MSVScorer) and base.config.num_sequences != 1:
            raise ValueError(
                "weighted voting aggregates single-chain scores: the MSV reads "
                f"{base.config.num_sequences} sequences at once (use MSVScorer, or an MSV_1 with num_sequences=1)."
            )
        if not isinstance(base, (ProbeScorer, MSVScorer)):
            raise TypeError(
                "WeightedVoteScorer needs a ProbeVerifier or an MSVVerifier with num_sequences=1 "
                f"(or a ProbeScorer / MSVScorer of one), got {type(base).__name__}."
            )
        self.base = base
        self.config = base.config
        self.wv_threshold = int(wv_threshold)

    def begin(self, num_sequences: int, streaming: bool) -> _VoteStream:
        """A fresh stream for one call (`AnswerScorer.begin`) voting over the base's scores.

        Args:
            num_sequences: N, the sequences sampled per prompt.
            streaming: whether answers arrive as they become available.

        Returns:
            The call's `ScoringStream`.
        """
        return _VoteStream(self.base.begin(num_sequences, streaming), streaming, self.wv_threshold)


class _PromptHistory:
    """A stream that scores each new answer from its prompt's answers scored so far (and those arriving with it):
    per prompt, it keeps every answer with its base score and hands the subclass `_prompt_scores` the history's
    columns and the indices of the new rows. A subclass that also returns confidences sets them on the answers
    (`MSVAnswer.confidence`: what the stop reports when it is not the score)."""

    def __init__(self, base: ScoringStream):
        self.base = base
        self.seen: dict[int, list[tuple[MSVAnswer, float]]] = {}

    def score(self, ready: Sequence[MSVAnswer]) -> list[float]:
        base = self.base.score(ready)
        out = [0.0] * len(ready)
        for prompt in dict.fromkeys(a.prompt for a in ready):
            index = [i for i, a in enumerate(ready) if a.prompt == prompt]
            seen = self.seen.setdefault(prompt, [])
            seen += [(ready[i], base[i]) for i in index]
            for i in index:
                ready[i].verifier_score = float(base[i])
            answers = [a for a, _ in seen]
            columns: dict[str, Any] = {
                name: np.asarray([getattr(a, name) for a in answers])
                for name in ("end", "class_id", "sequence", "step", "terminal")
            }
            columns["score"] = np.asarray([s for _, s in seen], dtype=np.float64)
            columns["answers"] = answers  # the snapshot rows point at them
            values, confidences = self._prompt_scores(columns, np.arange(len(seen) - len(index), len(seen)))
            for j, (i, v) in enumerate(zip(index, np.asarray(values).tolist())):
                out[i] = v
                if confidences is not None:
                    ready[i].confidence = float(confidences[j])
        return out

    def forget(self, prompt: int):
        self.seen.pop(prompt, None)
        forget_prompt(self.base, prompt)

    def _prompt_scores(self, columns: dict, new: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The new rows' scores and confidences (`None`: the score is the confidence)."""
        raise NotImplementedError


class _VoteStream(_PromptHistory):
    """Each new answer's weighted vote over its prompt's answers available by its end."""

    def __init__(self, base: ScoringStream, streaming: bool, wv_threshold: int):
        super().__init__(base)
        self.streaming, self.R = streaming, wv_threshold

    def _prompt_scores(self, columns: dict, new: np.ndarray) -> tuple[np.ndarray, None]:
        end, klass, score = columns["end"], columns["class_id"], columns["score"]
        if self.streaming:
            return streaming_weighted_voting(score, klass, end, R=self.R, rows=new), None
        return weighted_voting(score, klass, mask=columns["terminal"].astype(bool), rows=new), None


class StopRuleScorer:
    """Scores each answer with a stopping statistic over its prompt's N chains (`hf_msv.stop_rules`), computed
    causally when the answer becomes available, so that the stop rule (`decide_stop`) fires on the statistic.
    The head's confidence (`StopHead.confidence`, set on `MSVAnswer.confidence`; the statistic itself for a
    training-free rule) picks the output at the stop and is `MSVResult.confidence`. The evaluation's replay computes
    the same values from the recorded answers.

    Args:
        base: the verifier or scorer whose scores the rule reads (`as_scorer` of it); for a training-free rule its
            scores are not read, but its config still sets the elicitation settings.
        rule: a `StopHead` (read with the base's scores), or a key of `hf_msv.stop_rules.STOP_RULES`
            (``"consensus"``, ``"adaptive-consistency"``, ``"probe-stability"``).

    Raises:
        ValueError: an unknown rule name.
        TypeError: a `rule` that is neither a `StopHead` nor a string.
    """

    def __init__(self, base, rule: StopHead | str):
        if isinstance(rule, str):
            stop_statistic(rule, [], [], [], [], 1)  # an unknown name fails here, before any decoding
        elif not isinstance(rule, StopHead):
            raise TypeError(f"rule must be a StopHead or a rule name, got {type(rule).__name__}")
        self.base = as_scorer(base)
        self.config = self.base.config
        self.rule = rule

    def at(self, threshold: float | None) -> StopRuleScorer:
        """This scorer with the stop head in effect in a run at λ = `threshold` (`StopHead.at`: a support floor that
        holds only below a λ); itself when the head does not switch.

        Args:
            threshold: the run's λ (`None`: full decoding).
        """
        if not (isinstance(self.rule, StopHead) and self.rule.switches):
            return self
        return StopRuleScorer(self.base, self.rule.at(threshold))

    def begin(self, num_sequences: int, streaming: bool) -> _RuleStream:
        """A fresh stream for one call (`AnswerScorer.begin`) computing the rule over N chains.

        Args:
            num_sequences: N, the sequences sampled per prompt.
            streaming: whether answers arrive as they become available.

        Returns:
            The call's `ScoringStream`.
        """
        return _RuleStream(self.base.begin(num_sequences, streaming), self.rule, num_sequences)


class _RuleStream(_PromptHistory):
    """Each new answer's stopping statistic over its prompt's N chains, and at each new arrival time the snapshot
    of every class (`hf_msv.stop_rules.stop_events`), set on that time's last answer (`MSVAnswer.class_values`):
    any arrival can change every class's value, so the rule reads the refreshed rows."""

    def __init__(self, base: ScoringStream, rule: StopHead | str, num_sequences: int):
        super().__init__(base)
        self.rule, self.N = rule, num_sequences
        if isinstance(rule, StopHead) and rule.num_chains != num_sequences:
            # Its features are shares of N, but their distribution and the λ chosen with it belong to one N.
            warnings.warn(
                f"the verifier's stopping rule (stop head and λ) was fitted on groups of N = {rule.num_chains}, this "
                f"run samples N = {num_sequences}: refit it at this N (hf_msv.training.fit_stopping_rule(verifier, "
                f"val_dir, num_chains={num_sequences}) on validation shards of {num_sequences} chains) before "
                "trusting its stops",
                UserWarning,
                stacklevel=2,
            )

    def _prompt_scores(self, columns: dict, new: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        klass, end = columns["class_id"], columns["end"]
        times = np.unique(end[new])
        events = stop_events(
            self.rule, klass, columns["sequence"], columns["step"], end, self.N, columns["score"], times
        )
        answers = columns["answers"]
        carrier = {int(t): new[end[new] == t][-1] for t in times}  # the last new answer of each arrival time
        for i in new:
            answers[i].class_values = []
        for row in range(events.size):
            answers[carrier[int(events.time[row])]].class_values.append(
                ClassValue(answers[events.answer[row]], float(events.statistic[row]), float(events.confidence[row]))
            )
        statistic, confidence = events.at_answers(klass[new], end[new])
        return statistic, (confidence if isinstance(self.rule, StopHead) else None)


def as_scorer(verifier) -> AnswerScorer:
    """The scorer of what `prepare_generation` was given: an `MSVVerifier` → `MSVScorer` (read through its stop head,
    `StopRuleScorer`, when ``config.early_stopping`` has one), a `ProbeVerifier` →
    `WeightedVoteScorer` (Probe+WV, R = `WV_THRESHOLD`), an `AnswerScorer` as it is.

    Args:
        verifier: an `MSVVerifier`, a `ProbeVerifier` or an `AnswerScorer`.

    Returns:
        The `AnswerScorer`.

    Raises:
        TypeError: anything else.
    """
    if isinstance(verifier, MSVVerifier):
        head = StopHead.of(verifier.config)
        return StopRuleScorer(MSVScorer(verifier), head) if head else MSVScorer(verifier)
    if isinstance(verifier, ProbeVerifier):
        return WeightedVoteScorer(verifier)
    if isinstance(verifier, AnswerScorer) and not isinstance(verifier, type):
        return verifier
    raise TypeError(
        "verifier must be an MSVVerifier, a ProbeVerifier (scored with weighted voting) or a scorer "
        f"(MSVScorer, WeightedVoteScorer, ProbeScorer), got {type(verifier).__name__}."
    )
