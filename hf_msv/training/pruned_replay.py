"""The exact replay of per-chain pruning (`hf_msv.pruning.prune_chains`) beside the group stop
(`hf_msv.generation.decide_stop`) on recorded groups, its token accounting, and the joint calibration of the
pruning rule and λ by Learn-then-Test (`fit_pruning`). See ``docs/pruning.md``.

**Why a fixpoint.** The MSV scores a group's answers jointly: an answer attends to every answer available at its
end time, of every chain. When a chain is pruned at c its answers with end > c never become available, which
changes the later scores of the other chains' answers, the class snapshots and so every later decision. The
replay is therefore computed as live generation would produce it: score the group, walk its arrival times to the
first prune, drop the pruned chains' later answers, re-score (answers with end ≤ c keep their scores: the verifier
is causal), and go on from c; at most N re-scorings per group, batched over groups.

**Tokens.** A chain cut at c (by a prune or by the group's stop) decoded min(c, seq_len) chain-of-thought tokens
(`hf_msv.schedules.Schedule.cot_tokens`); an answer elicited at τ whose branch feeds end − τ tokens (its segment
and prompt tokens and its answer tokens) processed clip(c − τ, 0, end − τ) of them (`Schedule.elicitation_tokens`):
all of them when it became available before the cut, part of them when the cut fell while it was elicited.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..data import VERIFIER_INPUTS, ShardDataset, collate_groups, subgroup_items
from ..generation.stopping import decide_stop
from ..lambda_rule import LAMBDAS, JointChoice, choose_jointly, lambda_index
from ..metrics import ece
from ..pruning import PRUNE_OFF, PruneRule, chain_status, prune_chains
from ..schedules import NEVER, Schedule
from ..stop_rules import STOP_TIME_FEATURES, ConfidenceMap, StopHead, stop_events, stop_time_features
from .confidence_map import choose_confidence_map

__all__ = [
    "PRUNE_CANDIDATES",
    "MSVGroupScorer",
    "PrunedReplay",
    "PrunedStream",
    "PruningFit",
    "ReplayGroup",
    "fit_pruning",
    "fit_shipped_pruning",
    "deployed_stops",
    "fit_stop_confidence",
    "group_stop_time_features",
    "store_confidence_map",
    "store_pruning",
    "store_stop_head",
    "load_replay_groups",
    "oracle_decision",
    "replay_pruning",
    "replay_sweep",
    "sweep_group",
    "sweep_groups",
]

# The rules certified jointly with λ (`fit_pruning`), fixed on the stop head's own problems (docs/pruning.md):
# the stop alone first (the reference's family member), then the steady clause at the windows and warm-ups that
# kept the stop's loss there. Each rule added costs the test a share of δ (Bonferroni).
PRUNE_CANDIDATES = (
    PRUNE_OFF,
    PruneRule(steady=2, min_answers=4),
    PruneRule(steady=3, min_answers=4),
    PruneRule(steady=3),
)

# A prune decision: (t, kept answers' (sequence, step, end, klass), snapshot rows (klass, confidence), status) -> (N,)
Decision = Callable[..., np.ndarray]


@dataclass(frozen=True, eq=False)
class ReplayGroup:
    """One recorded group of N chains; per-answer arrays (A,) in stored order.

    Args:
        sequence, step, end, start, klass: the answers' chain, step, end time, τ (elicitation start), class.
        correct: bool, graded correct.
        terminal: bool, the answer its chain ended with.
        seq_len: (N,) chain-of-thought tokens of each chain (τ of its terminal answer).
        problem_id: the problem.
        item: the `hf_msv.data.read_group` item (hidden states) the MSV scores; `None` for hand-built groups.
    """

    sequence: np.ndarray
    step: np.ndarray
    end: np.ndarray
    start: np.ndarray
    klass: np.ndarray
    correct: np.ndarray
    terminal: np.ndarray
    seq_len: np.ndarray
    problem_id: str = ""
    item: dict | None = None

    @property
    def num_chains(self) -> int:
        return int(self.seq_len.size)

    @classmethod
    def from_item(cls, item: dict, num_chains: int) -> ReplayGroup:
        """The group of a `ShardDataset` item (streaming)."""
        get = lambda key: item[key].numpy()
        terminal = get("answer_terminal").astype(bool)
        seq_len = np.zeros(num_chains, np.int64)
        seq_len[get("answer_sequence")[terminal]] = get("answer_tau")[terminal]
        return cls(
            sequence=get("answer_sequence").astype(np.int64),
            step=get("answer_step").astype(np.int64),
            end=get("answer_end").astype(np.int64),
            start=get("answer_tau").astype(np.int64),
            klass=get("answer_class").astype(np.int64),
            correct=get("labels") > 0.5,
            terminal=terminal,
            seq_len=seq_len,
            problem_id=str(item["problem_id"]),
            item=item,
        )


def load_replay_groups(directory, num_chains: int, max_problems: int | None = None) -> list[ReplayGroup]:
    """Every group of N chains of the streaming shards in `directory` (`ShardDataset`'s items, as validation reads
    them; the first `max_problems` problems when given), with their hidden states."""
    dataset = ShardDataset(directory, num_sequences=num_chains, mode="streaming", max_problems=max_problems)
    return replay_groups_of(dataset)


def replay_groups_of(dataset: ShardDataset, problems=None) -> list[ReplayGroup]:
    """The groups of a streaming `ShardDataset` (of its problems in `problems` when given), with their hidden
    states."""
    wanted = None if problems is None else set(map(str, problems))
    items = (dataset[j] for j in range(len(dataset)))
    return [
        ReplayGroup.from_item(item, dataset.num_sequences)
        for item in items
        if wanted is None or str(item["problem_id"]) in wanted
    ]


class MSVGroupScorer:
    """Scores subsets of recorded groups with a streaming MSV, packed as evaluation and validation pack them.

    Args:
        model: a streaming `MSVVerifier`; groups of N > its ``num_sequences`` M are scored in subgroups of M, as live
            generation scores them.
        max_tokens: answer tokens per forward call.

    Call: ``scorer(groups, keeps)`` -> per group (A,) float64 probabilities, nan for the answers not kept.
    """

    def __init__(self, model, max_tokens: int = 65536):
        self.model = model.eval()
        self.max_tokens = max_tokens

    @torch.no_grad()
    def __call__(self, groups: Sequence[ReplayGroup], keeps: Sequence[np.ndarray]) -> list[np.ndarray]:
        out = [np.full(g.sequence.size, np.nan) for g in groups]
        pending, where, tokens = [], [], 0
        for i, (group, keep) in enumerate(zip(groups, keeps)):
            if group.item is None:
                raise ValueError("MSVGroupScorer needs groups read with their hidden states (ReplayGroup.item)")
            if not keep.any():
                continue
            for _, part in subgroup_items(group.item, int(self.model.config.num_sequences), keep):
                pending.append(part)
                where.append(i)
                tokens += len(part["hidden_states"])
                if tokens >= self.max_tokens:
                    self._flush(pending, where, groups, out)
                    pending, where, tokens = [], [], 0
        self._flush(pending, where, groups, out)
        return out

    def _flush(self, pending, where, groups, out) -> None:
        if not pending:
            return
        batch = collate_groups(pending, "streaming")
        device = next(self.model.parameters()).device
        inputs = {k: batch[k].to(device) if torch.is_tensor(batch[k]) else batch[k] for k in VERIFIER_INPUTS}
        probs = self.model(**inputs).probabilities.double().cpu().numpy()
        group_of, stored = batch["answer_group"].numpy(), batch["answer_index"].numpy()
        for b, i in enumerate(where):
            mine = group_of == b
            position = np.searchsorted(groups[i].item["answer_index"].numpy(), stored[mine])
            out[i][position] = probs[mine]


@dataclass(frozen=True)
class PrunedStream:
    """One group's stream under a pruning rule, with no group stop (the stop is applied to it by `sweep_group`).

    Args:
        cut: (N,) each chain's prune step (`NEVER`: not pruned).
        keep: (A,) bool, the answer became available (end ≤ its chain's cut).
        scores: (A,) the verifier's probabilities on the kept answers (nan elsewhere).
        final: (A,) bool, the chain's final answer: its terminal answer, or a pruned chain's held answer.
        rescorings: how many times the group was re-scored.
    """

    cut: np.ndarray
    keep: np.ndarray
    scores: np.ndarray
    final: np.ndarray
    rescorings: int = 0


def _final(group: ReplayGroup, keep: np.ndarray, cut: np.ndarray) -> np.ndarray:
    """(A,) the final answer of each chain: terminal, or a pruned chain's latest kept answer."""
    final = group.terminal & keep
    for n in np.flatnonzero(cut < group.seq_len):
        mine = np.flatnonzero(keep & (group.sequence == n))
        if mine.size:
            final[mine[np.argmax(group.step[mine])]] = True
    return final


def rule_decision(rule: PruneRule) -> Decision:
    """The `Decision` of a `PruneRule`: `prune_chains`."""

    def decide(t, sequence, step, end, klass, row_klass, row_confidence, status):
        return prune_chains(rule, t, sequence, step, end, klass, row_klass, row_confidence, status)

    return decide


def _first_prune(group, keep, scores, cut, head, decide, after, hold=True) -> tuple[int, np.ndarray] | None:
    """The first arrival time t > `after` at which `decide` prunes some chain, and the (N,) chains; None if never.
    Without `hold`, the chains pruned so far (all at or before `after`) leave the snapshots."""
    k = np.flatnonzero(keep & (hold | (cut[group.sequence] == NEVER)))
    seq, step, end, klass = group.sequence[k], group.step[k], group.end[k], group.klass[k]
    times = np.unique(end[end > after])
    for first in range(0, times.size, _CHUNK):  # snapshots in chunks: the first prune usually comes early
        chunk = times[first : first + _CHUNK]
        ev = stop_events(head, klass, seq, step, end, group.num_chains, scores[k], times=chunk)
        bounds = np.searchsorted(ev.time, chunk, side="left"), np.searchsorted(ev.time, chunk, side="right")
        for t, lo, hi in zip(chunk, *bounds):
            status = chain_status(int(t), group.seq_len, cut)
            pruned = decide(int(t), seq, step, end, klass, ev.klass[lo:hi], ev.confidence[lo:hi], status)
            if pruned.any():
                return int(t), pruned
    return None


_CHUNK = 8


def replay_pruning(
    rule: PruneRule | Decision,
    head: StopHead,
    groups: Sequence[ReplayGroup],
    scorer: Callable[[Sequence[ReplayGroup], Sequence[np.ndarray]], list[np.ndarray]],
    scores: Sequence[np.ndarray] | None = None,
    hold: bool = True,
) -> list[PrunedStream]:
    """Replay a pruning rule causally and exactly on `groups` (module docstring): the fixpoint of scoring and
    pruning, batched over the groups that changed.

    Args:
        rule: a `PruneRule`, or a `Decision` with `prune_chains`' arguments after the rule (e.g. `oracle_decision`).
        head: the stop head whose snapshot confidences the rule reads.
        groups: the recorded groups.
        scorer: scores subsets of groups (`MSVGroupScorer`).
        scores: the groups' scores with every answer (computed when `None`): shared by every rule.
        hold: a pruned chain's held answer keeps counting in the class snapshots (`hf_msv.pruning`); `False`: the
            chain leaves the snapshots after its cut (the verifier still reads its answers). Pass the same to
            `sweep_group`.

    Returns:
        One `PrunedStream` per group.
    """
    decide = rule_decision(rule) if isinstance(rule, PruneRule) else rule
    keep = [np.ones(g.sequence.size, bool) for g in groups]
    cut = [np.full(g.num_chains, NEVER, np.int64) for g in groups]
    current = list(scores) if scores is not None else scorer(groups, keep)
    current = [np.asarray(s, np.float64).copy() for s in current]
    rescored = [0] * len(groups)
    after = [-1] * len(groups)
    pending = [] if isinstance(rule, PruneRule) and rule.off else list(range(len(groups)))
    while pending:
        changed = []
        for g in pending:
            found = _first_prune(groups[g], keep[g], current[g], cut[g], head, decide, after[g], hold)
            if found is None:
                continue
            t, pruned = found
            cut[g][pruned] = t
            keep[g] &= groups[g].end <= cut[g][groups[g].sequence]
            after[g] = t
            changed.append(g)
        if changed:
            new = scorer([groups[g] for g in changed], [keep[g] for g in changed])
            for g, s in zip(changed, new):
                current[g] = np.where(keep[g], s, np.nan)
                rescored[g] += 1
        pending = changed
    return [
        PrunedStream(c, k, np.where(k, s, np.nan), _final(g, k, c), r)
        for g, c, k, s, r in zip(groups, cut, keep, current, rescored)
    ]


@dataclass(frozen=True)
class GroupSweep:
    """The group stop over Λ thresholds on one pruned stream; every array (Λ,) (cuts: (Λ, N))."""

    cuts: np.ndarray
    stopped: np.ndarray
    stop_step: np.ndarray
    chosen: np.ndarray
    confidence: np.ndarray
    correct: np.ndarray
    cot_tokens: np.ndarray
    elicitation_tokens: np.ndarray

    def schedule(self, j: int, prune_cut: np.ndarray, seq_len: np.ndarray) -> Schedule:
        """The `Schedule` of threshold j."""
        stop = int(self.stop_step[j])
        pruned = (prune_cut < seq_len) & ((prune_cut < stop) | ~self.stopped[j])
        return Schedule(
            self.cuts[j], pruned, stop, bool(self.stopped[j]), int(self.chosen[j]), float(self.confidence[j])
        )


def _snapshots(group: ReplayGroup, stream: PrunedStream, head: StopHead, hold: bool):
    """(E,) time, answer (a group index), statistic and confidence of the class snapshots of a pruned stream; without
    `hold`, a pruned chain leaves the snapshots after its cut (computed between consecutive cuts)."""
    pruned_at = np.unique(stream.cut[stream.cut < NEVER])
    bounds = [-1, *pruned_at.tolist()] if not hold else [-1]
    parts = []
    times = np.unique(group.end[stream.keep])
    for i, low in enumerate(bounds):
        high = bounds[i + 1] if i + 1 < len(bounds) else np.iinfo(np.int64).max
        wanted = times[(times > low) & (times <= high)]
        if not wanted.size:
            continue
        k = np.flatnonzero(stream.keep & (hold | (stream.cut[group.sequence] > low)))
        ev = stop_events(
            head, group.klass[k], group.sequence[k], group.step[k], group.end[k], group.num_chains, stream.scores[k],
            times=wanted,
        )  # fmt: skip
        parts.append((ev.time, k[ev.answer], ev.statistic, ev.confidence))
    return tuple(np.concatenate(column) for column in zip(*parts))


def sweep_group(
    group: ReplayGroup, stream: PrunedStream, head: StopHead, lambdas=LAMBDAS, confidence_map=None, hold: bool = True
) -> GroupSweep:
    """The group stop (`decide_stop` on the class snapshots of the kept answers) for every λ on a pruned stream,
    and what each λ decodes.

    Args:
        group: the recorded group.
        stream: its `PrunedStream` (`replay_pruning`; `PRUNE_OFF` gives the stop-only replay).
        head: the stop head (statistic and confidence).
        lambdas: (Λ,) thresholds.
        confidence_map: a `ConfidenceMap` applied to what the stop reports (`None`: the head's confidence).
        hold: as `replay_pruning`.

    Returns:
        The `GroupSweep`.

    Raises:
        ValueError: a head whose support floor holds only below a switch λ, swept below it (`replay_sweep` replays
            each side).
    """
    lam = np.asarray(lambdas, np.float64).reshape(-1)
    _one_side(head, lam)
    time, answer, statistic, confidence = _snapshots(group, stream, head, hold)
    d = decide_stop(time, statistic, stream.final[answer], lam, confidence, snapshots=True)
    chosen = np.where(d.chosen >= 0, answer[np.maximum(d.chosen, 0)], -1)
    reported = np.where(d.chosen >= 0, confidence[np.maximum(d.chosen, 0)], np.nan)
    if confidence_map is not None:
        features = None
        if confidence_map.needs_features:  # a λ that outputs nothing reports nan whatever its features
            # Neighbouring λ stop at the same time on the same answer: one snapshot per distinct stop.
            pairs = list(zip(d.stop_step.tolist(), chosen.tolist()))
            at = {(t, a): group_stop_time_features(group, stream, t, a, hold) for t, a in set(pairs) if a >= 0}
            blank = np.zeros(len(STOP_TIME_FEATURES))
            features = [at.get(pair, blank) for pair in pairs]
        reported = confidence_map(reported, features)
    cuts = np.where(d.stopped[:, None], np.minimum(stream.cut[None, :], d.stop_step[:, None]), stream.cut[None, :])
    cot = np.minimum(cuts, group.seq_len[None, :]).sum(1)
    span = group.end - group.start
    elicit = np.clip(cuts[:, group.sequence] - group.start[None, :], 0, span[None, :]).sum(1)
    correct = np.where(chosen >= 0, group.correct[np.maximum(chosen, 0)], False)
    return GroupSweep(cuts, d.stopped, d.stop_step, chosen, reported, correct, cot, elicit)


def _one_side(head: StopHead, lam: np.ndarray) -> None:
    """A head whose floor switches at a λ reads as its side at and above the switch (`StopHead.at`): a sweep that
    reaches below it needs the floored side's own replay (`replay_sweep`)."""
    if head.switches and bool(np.any(lam < head.floor_below)):
        raise ValueError(
            f"the stop head's support floor holds below λ = {head.floor_below:g}: sweep λ below it with "
            "replay_sweep(...), or resolve the head of one λ with head.at(λ)"
        )


def group_stop_time_features(group: ReplayGroup, stream: PrunedStream, time: int, answer: int, hold: bool = True):
    """(F,) `hf_msv.stop_rules.STOP_TIME_FEATURES` of a stop at `time` outputting `answer` (a group index) on a
    pruned stream: the answers it kept, as the stop saw them (without `hold`, a chain pruned before `time` is gone)."""
    k = np.flatnonzero(stream.keep & (hold | (stream.cut[group.sequence] >= time)))
    return stop_time_features(
        stream.scores[k], group.klass[k], group.sequence[k], group.step[k], group.end[k], group.num_chains, time,
        int(np.flatnonzero(k == answer)[0]),
    )  # fmt: skip


@dataclass(frozen=True)
class PrunedReplay:
    """One rule's replay over G groups and Λ thresholds: (G, Λ) ``correct``, ``cot`` and ``elicitation`` tokens,
    ``stopped``, reported ``confidence``; (G,) ``problem``; ``pruned`` (G, Λ) chains pruned before the stop."""

    correct: np.ndarray
    cot: np.ndarray
    elicitation: np.ndarray
    stopped: np.ndarray
    confidence: np.ndarray
    pruned: np.ndarray
    problem: np.ndarray

    @property
    def tokens(self) -> np.ndarray:
        """(G, Λ) all tokens processed: chain of thought and elicitation."""
        return self.cot + self.elicitation

    def at(self, j: int) -> dict:
        """Summary at threshold index j: accuracy, tokens (means per group), stops and their calibration."""
        hit = self.stopped[:, j]
        conf, right = self.confidence[hit, j], self.correct[hit, j]
        return {
            "accuracy": float(self.correct[:, j].mean()),
            "cot_tokens": float(self.cot[:, j].mean()),
            "all_tokens": float(self.tokens[:, j].mean()),
            "pruned_chains": float(self.pruned[:, j].mean()),
            "stopped": float(hit.mean()),
            "accuracy_at_stop": float(right.mean()) if hit.any() else math.nan,
            "confidence_at_stop": float(conf.mean()) if hit.any() else math.nan,
            "ece_at_stop": ece(conf, right) if hit.any() else math.nan,
        }


def sweep_groups(
    groups: Sequence[ReplayGroup],
    streams: Sequence[PrunedStream],
    head: StopHead,
    lambdas=LAMBDAS,
    confidence_map=None,
    hold: bool = True,
) -> PrunedReplay:
    """`sweep_group` over every group, stacked into a `PrunedReplay`."""
    parts = [sweep_group(g, s, head, lambdas, confidence_map, hold) for g, s in zip(groups, streams)]
    pruned = [
        ((s.cut[None, :] < g.seq_len[None, :]) & ((s.cut[None, :] < p.stop_step[:, None]) | ~p.stopped[:, None])).sum(
            1
        )
        for g, s, p in zip(groups, streams, parts)
    ]
    return PrunedReplay(
        correct=np.stack([p.correct for p in parts]),
        cot=np.stack([p.cot_tokens for p in parts]).astype(np.float64),
        elicitation=np.stack([p.elicitation_tokens for p in parts]).astype(np.float64),
        stopped=np.stack([p.stopped for p in parts]),
        confidence=np.stack([p.confidence for p in parts]),
        pruned=np.stack(pruned),
        problem=np.asarray([g.problem_id for g in groups], dtype=object),
    )


def oracle_decision(group: ReplayGroup, target_class: int) -> Decision:
    """A pruner that knows the answer full decoding outputs (class `target_class`): at t it prunes every decoding
    chain none of whose later answers holds that class (decoding it further can only vote elsewhere). The ceiling
    of pruning on the recorded group."""
    later_target = {}
    for n in range(group.num_chains):
        mine = (group.sequence == n) & (group.klass == target_class)
        later_target[n] = int(group.end[mine].max()) if mine.any() else -1  # last end of a target answer

    def decide(t, sequence, step, end, klass, row_klass, row_confidence, status):
        out = np.zeros(status.size, bool)
        for n in np.flatnonzero(status == 0):
            mine = np.flatnonzero((sequence == n) & (end <= t))
            out[n] = mine.size > 0 and later_target[n] <= t
        return out

    return decide


@dataclass(frozen=True)
class PruningFit:
    """The jointly certified pruning rule and λ (`fit_pruning`).

    Args:
        rule: the certified `PruneRule` (`PRUNE_OFF` when the stop alone is cheapest or nothing is certified).
        choice: the `JointChoice` (λ, the setting, its calibration figures).
        rules: the candidate rules, in the order of ``choice``'s setting indices.
        confidence_map: the stop-time confidence recalibrated on the calibration stops at the choice.
        summary: per candidate, the calibration summary at its cheapest certified λ (None where none).
    """

    rule: PruneRule
    choice: JointChoice
    rules: tuple[PruneRule, ...]
    confidence_map: ConfidenceMap | None
    summary: tuple[dict | None, ...]

    def config_entry(self) -> dict:
        """``config.early_stopping["pruning"]``: the rule, its jointly certified λ, and the confidence map."""
        return {
            "rule": self.rule.to_dict(),
            "lambda": self.choice.choice.to_dict(),
            "joint": self.choice.to_dict(),
            "confidence_map": None if self.confidence_map is None else self.confidence_map.to_dict(),
        }


def replay_sweep(
    rule: PruneRule | Decision,
    head: StopHead,
    groups: Sequence[ReplayGroup],
    scorer,
    scores=None,
    lambdas=LAMBDAS,
    confidence_map=None,
    hold: bool = True,
) -> PrunedReplay:
    """`replay_pruning` then `sweep_groups`, each λ with the stop head in effect at it (`StopHead.at`): a head whose
    support floor holds only below a λ is replayed once per side, as live runs at those λ decode.

    Args:
        rule, head, groups, scorer, scores, hold: as `replay_pruning`.
        lambdas: (Λ,) thresholds.
        confidence_map: as `sweep_group`.

    Returns:
        The `PrunedReplay` over `lambdas`, in their order.
    """
    lam = np.asarray(lambdas, np.float64).reshape(-1)
    sides: dict[StopHead, list[int]] = {}
    for j, value in enumerate(lam.tolist()):
        sides.setdefault(head.at(value), []).append(j)
    # A rule that reads no confidence prunes alike on both sides: its (costly) fixpoint is computed once.
    shared = None
    if len(sides) > 1 and isinstance(rule, PruneRule) and not rule.reads_confidence:
        shared = replay_pruning(rule, next(iter(sides)), groups, scorer, scores, hold)
    parts = {
        side: sweep_groups(groups, shared if shared is not None else replay_pruning(rule, side, groups, scorer, scores,
                           hold), side, lam[js], confidence_map, hold)
        for side, js in sides.items()
    }  # fmt: skip
    if len(parts) == 1:
        return next(iter(parts.values()))
    first = next(iter(parts.values()))
    merged = {}
    for name in ("correct", "cot", "elicitation", "stopped", "confidence", "pruned"):
        out = np.empty((len(groups), lam.size), getattr(first, name).dtype)
        for side, js in sides.items():
            out[:, js] = getattr(parts[side], name)
        merged[name] = out
    return PrunedReplay(**merged, problem=first.problem)


def fit_pruning(
    rules: Sequence[PruneRule],
    head: StopHead,
    groups: Sequence[ReplayGroup],
    scorer,
    epsilon: float,
    delta: float,
    lambdas=LAMBDAS,
    scores=None,
    replays: Sequence[PrunedReplay] | None = None,
    loss: str = "paired",
) -> tuple[PruningFit, list[PrunedReplay]]:
    """Certify a pruning rule and λ jointly on calibration `groups` (problems the stop head was not fitted on):
    every candidate rule (`PRUNE_OFF` should be one) is replayed exactly, and `hf_msv.lambda_rule.choose_jointly`
    tests the (rule, λ) pairs against full decoding (no pruning, λ = ∞) at ε with the family-wise risk δ, and picks
    the certified pair that processes the fewest tokens. The stop-time confidence is then recalibrated on the
    calibration stops of the choice (`fit_stop_confidence`; none under 20 stops).

    Args:
        rules: the candidate rules, fixed before looking at the calibration groups.
        head: the stop head.
        groups: the calibration groups.
        scorer: scores group subsets (`MSVGroupScorer`).
        epsilon, delta: the guarantee's tolerance and risk.
        lambdas: (Λ,) the λ grid (with ∞).
        scores: the groups' full scores (computed when `None`).
        replays: the candidates' replays on `groups` when already computed (e.g. to certify at several ε).
        loss: the guarantee's loss (`choose_jointly`): ``"paired"``, the λ rule's, or ``"net"``, the accuracy drop.

    Returns:
        ``(fit, replays)``: the `PruningFit` and each candidate's `PrunedReplay` on the calibration groups.
    """
    if replays is None:
        scores = scorer(groups, [np.ones(g.sequence.size, bool) for g in groups]) if scores is None else scores
        replays = [replay_sweep(r, head, groups, scorer, scores, lambdas) for r in rules]
    replays = list(replays)
    off = [i for i, r in enumerate(rules) if r.off]
    if not off:
        raise ValueError("the candidates need PRUNE_OFF: the loss is measured against full decoding without pruning")
    full = int(np.flatnonzero(np.isinf(np.asarray(lambdas, np.float64)))[0])
    reference = replays[off[0]]
    choice = choose_jointly(
        lambdas,
        np.stack([r.correct for r in replays]),
        np.stack([r.tokens for r in replays]),
        reference.correct[:, full],
        reference.tokens[:, full],
        reference.problem,
        epsilon=epsilon,
        delta=delta,
        loss=loss,
    )
    rule = rules[choice.setting] if choice.choice.reached else PRUNE_OFF
    j = lambda_index(choice.choice.lam, lambdas)
    chosen = replays[choice.setting if choice.choice.reached else off[0]]
    cmap = None
    if chosen.stopped[:, j].sum() >= 20:  # the map chosen and fitted on the pair's calibration stops
        cmap, _ = fit_stop_confidence(head, choice.choice.lam, groups, scorer, rule, scores=scores)
    summary = tuple(
        None if lam is None else replays[i].at(lambda_index(lam, lambdas)) | {"lam": lam}
        for i, lam in enumerate(choice.cheapest)
    )
    return PruningFit(rule, choice, tuple(rules), cmap, summary), replays


def deployed_stops(
    head: StopHead, lam: float, groups: Sequence[ReplayGroup], scorer, rule: PruneRule = PRUNE_OFF, scores=None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The stops of `rule` with the stop at λ on `groups` (arguments as `fit_stop_confidence`).

    Returns:
        ``(confidence, correct, features)``: (S,) what each stop reports (unmapped), (S,) bool whether its answer
        is right, (S, F) its `hf_msv.stop_rules.STOP_TIME_FEATURES`.
    """
    conf, right, features = [], [], []
    head = head.at(lam)  # the head a run at λ reads
    for group, stream in zip(groups, replay_pruning(rule, head, groups, scorer, scores)):
        sweep = sweep_group(group, stream, head, np.array([lam]))
        if sweep.stopped[0]:
            conf.append(float(sweep.confidence[0]))
            right.append(bool(sweep.correct[0]))
            features.append(group_stop_time_features(group, stream, int(sweep.stop_step[0]), int(sweep.chosen[0])))
    return np.array(conf), np.array(right), np.array(features).reshape(len(conf), len(STOP_TIME_FEATURES))


def fit_stop_confidence(
    head: StopHead,
    lam: float,
    groups: Sequence[ReplayGroup],
    scorer,
    rule: PruneRule = PRUNE_OFF,
    candidates=None,
    scores=None,
) -> tuple[ConfidenceMap, dict]:
    """Recalibrate what the stop reports at λ: the `ConfidenceMap` `choose_confidence_map` chooses among
    `candidates` on the stops of the calibration `groups` (problems the head was not fitted on), fitted on them.

    Args:
        head: the stop head.
        lam: the deployed λ.
        groups: calibration groups.
        scorer: scores group subsets (`MSVGroupScorer`).
        rule: the pruning rule deployed with λ (`PRUNE_OFF`: the stop alone).
        candidates: ``{name: (columns, isotonic)}`` (default `CONFIDENCE_MAPS`; one entry fits that map).
        scores: the groups' full scores (computed when `None`).

    Returns:
        ``(map, evidence)``: the `ConfidenceMap` and {"lambda", "stops", "accuracy", "confidence" (reported), "ece"
        (reported), "chosen", "crossfit"} (`MapChoice.to_dict`).
    """
    conf, right, features = deployed_stops(head, lam, groups, scorer, rule, scores)
    cmap, choice = choose_confidence_map(conf, right, features, candidates)
    evidence = {
        "lambda": lam,
        "accuracy": float(right.mean()),
        "confidence": float(conf.mean()),
        "ece": ece(conf, right),
        **choice.to_dict(),
    }
    return cmap, evidence


def store_confidence_map(destination, cmap: ConfidenceMap, evidence: dict, pair: bool = False) -> None:
    """Write the stop's `ConfidenceMap` and its evidence into a saved verifier's ``early_stopping``: next to λ (the
    stop alone's), or with `pair` next to the certified pruning pair (``early_stopping["pruning"]``)."""
    import json
    from pathlib import Path

    path = Path(destination) / "config.json"
    config = json.loads(path.read_text())
    entry = config["early_stopping"]
    if pair and "pruning" not in entry:
        raise ValueError(f"{path} carries no pruning pair to store a confidence map beside")
    (entry["pruning"] if pair else entry)["confidence_map"] = cmap.to_dict() | {"evidence": evidence}
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _store_early_stopping(destination, key: str, value: dict, prefix: str, line: Callable[[], str | None]) -> None:
    """Set ``early_stopping[key]`` in the config of the verifier saved in `destination`, and replace the model card's
    line starting with `prefix` by ``line()`` (`None`: no line) when there is a card."""
    import json
    from pathlib import Path

    path = Path(destination) / "config.json"
    config = json.loads(path.read_text())
    if not config.get("early_stopping"):
        raise ValueError(f"{path} carries no early-stopping rule to store {key!r} beside")
    config["early_stopping"][key] = value
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    card = Path(destination) / "README.md"
    if card.is_file():
        lines = [x for x in card.read_text().splitlines() if not x.startswith(prefix)]
        text = line()
        card.write_text("\n".join(lines).rstrip() + "\n" + ("" if text is None else text + "\n"))


def store_pruning(destination, entry: dict) -> None:
    """Write a certified pruning entry (`PruningFit.config_entry`) into the config of the verifier saved in
    `destination`, next to its λ (``early_stopping["pruning"]``), and its line into the model card when there is one
    (`hf_msv.hub.pruning_card_line`); nothing else changes.

    Args:
        destination: a saved verifier's directory (its ``config.json`` must carry ``early_stopping``).
        entry: the entry.
    """
    from ..hub import PRUNING_CARD_PREFIX, pruning_card_line

    _store_early_stopping(destination, "pruning", entry, PRUNING_CARD_PREFIX, lambda: pruning_card_line(entry))


def store_stop_head(destination, head: StopHead) -> None:
    """Write a stop head (e.g. the saved one with a support floor below a switch λ, `StopHead.floor_below`) into the
    config of the verifier saved in `destination` (``early_stopping["stop_head"]``), and its floor's line into the
    model card when there is one (`hf_msv.hub.floor_card_line`); nothing else changes.

    Args:
        destination: a saved verifier's directory (its ``config.json`` must carry ``early_stopping``).
        head: the head.
    """
    from ..hub import FLOOR_CARD_PREFIX, floor_card_line

    line = (lambda: floor_card_line(head)) if head.min_share > 0 else (lambda: None)
    _store_early_stopping(destination, "stop_head", head.to_dict(), FLOOR_CARD_PREFIX, line)


def fit_shipped_pruning(
    calibration_dir, destination, epsilon: float = 0.01, delta: float = 0.1, rules=PRUNE_CANDIDATES, loss="paired"
) -> PruningFit:
    """Certify a pruning rule and λ jointly for the verifier saved in `destination` (the shipped MSV_16:
    ``hf_msv/testbed/verifier``) on the calibration shards `calibration_dir` (problems its stop head was not fitted
    on; for the shipped verifier the 2,560 problems its λ is certified on), and store them in its config
    (`store_pruning`). The stop head and the weights are kept.

    Args:
        calibration_dir: streaming shards with hidden states, read in groups of the stop head's N (an MSV_M reads
            N > M chains in subgroups of M).
        destination: the verifier's directory.
        epsilon, delta: the guarantee's tolerance and family-wise risk.
        rules: the candidate rules (with `PRUNE_OFF`).
        loss: the guarantee's loss (`fit_pruning`).

    Returns:
        The `PruningFit`; nothing is stored when it certifies no pruning (the stop alone keeps its own λ).
    """
    from ..modeling_msv import MSVVerifier

    verifier = MSVVerifier.from_pretrained(destination).eval()
    head = StopHead.of(verifier.config)
    if head is None:
        raise ValueError(f"{destination} carries no stop head: fit its stopping rule first")
    groups = load_replay_groups(calibration_dir, head.num_chains)  # the N its stop head was fitted at
    fit, _ = fit_pruning(rules, head, groups, MSVGroupScorer(verifier), epsilon, delta, loss=loss)
    if not fit.rule.off:
        store_pruning(destination, fit.config_entry())
    return fit
