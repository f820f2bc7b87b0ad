"""The methods an evaluation compares and their scores on the evaluation groups (`draw_scores`): the verifier-free
baselines, the optional PRM, the single-sequence verifiers and their weighted voting (+WV), the vote baselines (raw
and Platt-calibrated), the stacked [vote share, Probe logit] baseline and the multi-sequence MSV_M (grouped when
N > M), on a fixed partition of each problem's sequences (`evaluation_groups`). See ``docs/evaluation.md``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from ..baselines import (
    fit_logistic,
    fit_platt,
    latest_answer_vote,
    logistic,
    logit,
    platt,
    self_consistency,
    streaming_weighted_voting,
    weighted_voting,
)
from ..data import (
    MODES,
    AnswerGroup,
    CollectedProblem,
    ShardDataset,
    answer_group,
    partition_sequences,
    select_answers,
)
from ..errors import UserError
from ..metrics import fold_by_problem
from ..stop_rules import StopHead, stop_events
from .config import MethodConfig
from .prm import PRMScorer, score_with_prm
from .scoring import deepconf_scores, score_problems, token_prob_scores
from .verifiers import VerifierEntry

__all__ = [
    "SETTINGS",
    "TOKEN_PROBS",
    "DEEPCONF",
    "PRM",
    "SELF_CONSISTENCY",
    "CALIBRATED_SC",
    "LATEST_VOTE",
    "CALIBRATED_LATEST_VOTE",
    "STACKED",
    "LINEAR_PROBE",
    "VOTE_BASELINES",
    "STOP_RULE_METHODS",
    "STOP_HEAD_SUFFIX",
    "SplitScores",
    "Draw",
    "prepare_split",
    "with_verifiers",
    "add_prm_scores",
    "add_linear_probe",
    "fit_deepconf",
    "primary_msv",
    "MethodPlan",
    "method_plan",
    "method_label",
    "evaluation_groups",
    "draw_scores",
]

SETTINGS = MODES  # ("terminal", "streaming"): which answers of a group are scored
TOKEN_PROBS, DEEPCONF, PRM, SELF_CONSISTENCY = "Token Probs", "DeepConf", "PRM", "Self-consistency"
CALIBRATED_SC, LATEST_VOTE = "Self-consistency (calibrated)", "Latest-answer vote"
CALIBRATED_LATEST_VOTE, STACKED = "Latest-answer vote (calibrated)", "Stacked (vote + Probe)"
CONSENSUS, ADAPTIVE_CONSISTENCY = "Consensus (k of N)", "Adaptive-Consistency"
PROBE_STABILITY = "Probe stability (last 3 agree)"
# The field's training-free stopping rules (streaming only): their statistic over the N chains, by rule name.
STOP_RULE_METHODS = {
    CONSENSUS: "consensus",
    ADAPTIVE_CONSISTENCY: "adaptive-consistency",
    PROBE_STABILITY: "probe-stability",
}
STOP_HEAD_SUFFIX = " + stop head"  # an MSV read through the stop head it was trained with
LINEAR_PROBE = "linear probe"  # the stacked baseline's Probe feature when no Probe checkpoint is given (not a row)
# Aggregations over the group's votes (no per-answer scorer of their own), by setting; with STACKED and the +WV rows
# these are the baselines that are not single-sequence.
VOTE_BASELINES = {"terminal": (SELF_CONSISTENCY, CALIBRATED_SC), "streaming": (LATEST_VOTE, CALIBRATED_LATEST_VOTE)}
_BASELINES = (TOKEN_PROBS, DEEPCONF, PRM)  # listed first among the single-sequence scorers, in this order
_NO_ANSWER_TOKEN_PROB = 0.5  # Token Probs of an answer none of whose token log-probs is known (uninformative)


@dataclass
class SplitScores:
    """One split and everything about it that does not depend on the group draw.

    Attributes: ``dataset`` (hidden states, read lazily per group), ``problems`` (the records without hidden
    states, in dataset order), ``single`` ((setting, method) -> per problem `(A,)` scores over its stored answers,
    nan where not defined), ``deepconf_raw`` (per problem `(A,)` raw DeepConf confidences), ``prm_cost`` (what
    scoring the split with the PRM took, `score_with_prm`; None without the PRM), ``name`` (what errors call it).
    """

    dataset: ShardDataset
    problems: list[CollectedProblem]
    single: dict = field(default_factory=dict)
    deepconf_raw: list = field(default_factory=list)
    prm_cost: dict | None = None
    name: str = "evaluation"

    @property
    def info(self) -> dict[str, Any]:
        return self.dataset.info


def prepare_split(dataset: ShardDataset, method_config: MethodConfig, name: str = "evaluation") -> SplitScores:
    """Token Probs and raw DeepConf scores of every answer of a split (they score answers independently of the
    group, so once for all groups and training seeds).

    Args:
        dataset: the split's shards.
        method_config: the DeepConf window and statistic.
        name: what errors call the split ("evaluation", "validation").
    Returns: the split's `SplitScores`, without verifier scores.
    """
    problems = dataset.read_problems()
    split = SplitScores(dataset, problems, name=name)
    tp = []
    for p in problems:
        s = token_prob_scores(p)
        tp.append(np.where(np.isnan(s), _NO_ANSWER_TOKEN_PROB, np.clip(s, 0.0, 1.0)))
    window, stat = method_config.deepconf_window, method_config.deepconf_stat
    split.deepconf_raw = [
        deepconf_scores(p, window, stat) if p.cot_confidence else np.zeros(p.num_answers) for p in problems
    ]
    for setting in SETTINGS:
        split.single[(setting, TOKEN_PROBS)] = tp
    return split


def with_verifiers(split: SplitScores, entries: list[VerifierEntry]) -> SplitScores:
    """A copy of `split` (sharing its dataset and records) with every single-sequence verifier of `entries` (one
    training seed's checkpoints) scored on every answer, per setting."""
    out = replace(split, single=dict(split.single))
    for setting in SETTINGS:
        for e in entries:
            model, mode = e.model_for(setting) if e.single_sequence else (None, None)
            if model is not None:
                out.single[(setting, e.name)] = score_problems(model, split.dataset, mode=mode)[0]
    return out


def _pooled_states(split: SplitScores) -> list[np.ndarray]:
    """Per problem `(A, d)` mean-pooled answer hidden states (all sequences, stored answer order)."""
    from ..training.guard import pooled_answer_states

    out = []
    for i, p in enumerate(split.problems):
        item = split.dataset.group(i, np.arange(p.num_sequences), "streaming")
        lengths = item["answer_length"]
        token_answer = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
        pooled = pooled_answer_states(item["hidden_states"], token_answer, len(lengths))
        x = np.zeros((p.num_answers, pooled.shape[1]), np.float32)
        x[item["answer_index"].numpy()] = pooled
        out.append(x)
    return out


def add_linear_probe(split: SplitScores, val: SplitScores | None) -> None:
    """The stacked baseline's Probe feature when no Probe checkpoint is given: a logistic regression on
    standardised mean-pooled answer states, as ``single[(setting, LINEAR_PROBE)]`` of both splits. Evaluation
    answers are scored by the regression fitted on every validation answer; validation answers (on which the
    stacked regression is then fitted) out of fold, by 2-fold cross-fitting over the validation problems, so the
    stacker does not learn to trust in-sample scores. Without validation: 2-fold cross-fitting over the evaluation
    problems."""
    ev = _pooled_states(split)
    if val is not None:
        vx, vy = _pooled_states(val), [p.answer_correct for p in val.problems]
        predict = _fit_linear_probe(vx, vy)
        targets = [(split, [predict(x) for x in ev]), (val, _cross_fit_linear_probe(vx, vy))]
    else:
        targets = [(split, _cross_fit_linear_probe(ev, [p.answer_correct for p in split.problems]))]
    for s, scores in targets:
        for setting in SETTINGS:
            s.single[(setting, LINEAR_PROBE)] = scores


def _fit_linear_probe(xs: list[np.ndarray], ys: list[np.ndarray]):
    """Logistic regression on standardised `(A, d)` states (one array per problem): a function `(A, d)` -> `(A,)`."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = np.concatenate(xs), np.concatenate(ys)
    if y.min() == y.max():
        return lambda z: np.full(len(z), float(y[0]))
    model = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=2000))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lbfgs convergence chatter on wide, collinear states
        model.fit(x, y)
    return lambda z: model.predict_proba(z)[:, 1]


def _cross_fit_linear_probe(xs: list[np.ndarray], ys: list[np.ndarray]) -> list[np.ndarray]:
    """Out-of-fold linear-probe scores per problem: the two folds of `fold_by_problem` (even / odd index) each
    scored by the regression fitted on the other (a single problem: in-sample, there is nothing else to fit on)."""
    out: dict[int, np.ndarray] = {}
    fold = fold_by_problem(np.arange(len(xs)), 2)
    for half in (0, 1):
        rest = np.flatnonzero(fold != half).tolist() or list(range(len(xs)))
        predict = _fit_linear_probe([xs[i] for i in rest], [ys[i] for i in rest])
        for i in np.flatnonzero(fold == half):
            out[int(i)] = predict(xs[i])
    return [out[i] for i in range(len(xs))]


def add_prm_scores(split: SplitScores, scorer: PRMScorer, lm_tokenizer, progress: bool = False) -> None:
    """The PRM's score of every answer of a split (`hf_msv.evaluation.prm`): it depends on the answer and its
    chain-of-thought prefix only, so both settings read the same scores; the cost goes to ``split.prm_cost``."""
    scores, split.prm_cost = score_with_prm(scorer, split.problems, lm_tokenizer, progress)
    for setting in SETTINGS:
        split.single[(setting, PRM)] = scores


def fit_deepconf(split: SplitScores, val: SplitScores | None) -> None:
    """Platt-scale the raw DeepConf confidences per setting: on validation when given, else 2-fold cross-fitting
    over the evaluation problems (each half calibrated on the other)."""

    def pairs(s: SplitScores, idx, setting):
        raw = [
            s.deepconf_raw[i][s.problems[i].answer_terminal] if setting == "terminal" else s.deepconf_raw[i]
            for i in idx
        ]
        lab = [
            s.problems[i].answer_correct[s.problems[i].answer_terminal]
            if setting == "terminal"
            else s.problems[i].answer_correct
            for i in idx
        ]
        return np.concatenate(raw) if raw else np.zeros(0), np.concatenate(lab) if lab else np.zeros(0, bool)

    for setting in SETTINGS:
        if val is not None:
            a, b = fit_platt(*pairs(val, range(len(val.problems)), setting))
            for s in (split, val):
                s.single[(setting, DEEPCONF)] = [platt(r, a, b) for r in s.deepconf_raw]
            continue
        idx = np.arange(len(split.problems))
        out = [None] * len(idx)
        for half in (0, 1):
            fit_idx, apply_idx = idx[idx % 2 != half], idx[idx % 2 == half]
            a, b = fit_platt(*pairs(split, fit_idx if len(fit_idx) else apply_idx, setting))
            for i in apply_idx:
                out[i] = platt(split.deepconf_raw[i], a, b)
        split.single[(setting, DEEPCONF)] = out


def primary_msv(entries: list[VerifierEntry], n: int) -> tuple[VerifierEntry | None, bool]:
    """(MSV used as MSV_N at this N, whether it runs grouped): M = N first, else the largest M < N."""
    multi = [e for e in entries if not e.single_sequence]
    exact = [e for e in multi if e.num_sequences == n]
    if exact:
        return exact[0], False
    below = [e for e in multi if e.num_sequences < n]
    if below:
        return max(below, key=lambda e: e.num_sequences), True
    return None, False


@dataclass(frozen=True)
class MethodPlan:
    """The methods of one setting at one N (`method_plan`).

    Attributes:
        base: the single-sequence scorers, report order.
        wv: weighted vote name -> the scorer it votes with (``"Probe+WV"`` -> ``"Probe"``; none at N = 1).
        msv: the multi-sequence verifiers scoring at N (exactly N, or the primary MSV_M run grouped).
        primary: the verifier reported as MSV_N (None without one).
        grouped: whether the primary MSV runs grouped (M < N).
        probe: the stacked baseline's Probe feature: the first Probe verifier, else the linear probe, else None.
    """

    base: list[str]
    wv: dict[str, str]
    msv: list[VerifierEntry]
    primary: VerifierEntry | None
    grouped: bool
    probe: str | None


def method_plan(entries: list[VerifierEntry], n: int, setting: str, split: SplitScores) -> MethodPlan:
    """The methods of `setting` at N (`MethodPlan`)."""
    base = [m for (s, m) in split.single if s == setting and m != LINEAR_PROBE]
    base = [m for m in _BASELINES if m in base] + [m for m in base if m not in _BASELINES]
    wv = {f"{m}+WV": m for m in base} if n > 1 else {}
    primary, grouped = primary_msv(entries, n)
    msv = [
        e
        for e in entries
        if not e.single_sequence
        and e.model_for(setting)[0] is not None
        and (e.num_sequences == n or (e is primary and grouped))
    ]
    if primary is not None and not any(e is primary for e in msv):
        primary = None
    if primary is None and n == 1:  # at N = 1 the single-sequence MSV_1 is MSV_N
        primary = next(
            (e for e in entries if e.kind == "msv" and e.num_sequences == 1 and e.model_for(setting)[0] is not None),
            None,
        )
    probe = next((e.name for e in entries if e.kind == "probe" and (setting, e.name) in split.single), None)
    if probe is None and (setting, LINEAR_PROBE) in split.single:
        probe = LINEAR_PROBE
    return MethodPlan(base, wv, msv, primary, grouped and primary is not None, probe)


def method_label(entry: VerifierEntry, n: int) -> str:
    """The report name of a verifier at N: its name, with " (grouped)" for an MSV_M scoring N > M sequences."""
    return entry.name if entry.num_sequences >= n or entry.single_sequence else f"{entry.name} (grouped)"


def evaluation_groups(num_collected: int, n: int, problem_index: int, split: str = "evaluation") -> list[np.ndarray]:
    """The fixed partition of one problem's sequences at N: ⌊num_collected/N⌋ `(N,)` arrays of sequence ids.
    Raises `ValueError` naming `split` when N > `num_collected`."""
    if n > num_collected:
        raise UserError(
            f"N={n} but the {split} split has only {num_collected} sequences per problem: evaluate at "
            f"N <= {num_collected} (--num-sequences), or collect that split with --num-samples {n} "
            "or more"
        )
    return [partition_sequences(num_collected, n, 0, 0, problem_index, j) for j in range(num_collected // n)]


@dataclass
class Draw:
    """The evaluation groups of one split at one N in one setting, with every method's scores (report order):
    ``groups`` (problem-major: problem i's groups are ``problem_of == i``), ``problem_of`` `(G,)` int, and
    ``offline`` ({MSV label: offline scoring seconds per answer})."""

    groups: list[AnswerGroup]
    problem_of: np.ndarray
    offline: dict


def _vote(g: AnswerGroup, step: np.ndarray, setting: str) -> np.ndarray:
    """`(A,)` the group's vote share: self-consistency (terminal), the latest-answer vote (streaming; `step` (A,) the
    answers' steps within their sequences)."""
    if setting == "terminal":
        return self_consistency(g.klass, g.is_terminal)
    return latest_answer_vote(g.klass, g.sequence, step, g.end)


def _msv_scores(split: SplitScores, n: int, setting: str, plan: MethodPlan, sequences: list):
    """Per MSV label, per problem `(A,)` scores of its partition's groups (each answer once), and the offline
    seconds per answer."""
    scores, offline = {}, {}
    for e in plan.msv:
        model, mode = e.model_for(setting)
        merged = [np.full(p.num_answers, np.nan) for p in split.problems]
        seconds = count = 0
        for j in range(len(sequences[0])):
            got, sec, cnt = score_problems(model, split.dataset, [s[j] for s in sequences], mode=mode)
            seconds, count = seconds + sec, count + cnt
            for i, x in enumerate(got):
                merged[i] = np.where(np.isnan(x), merged[i], x)
        scores[method_label(e, n)], offline[method_label(e, n)] = merged, seconds / max(count, 1)
    return scores, offline


def _feature_groups(split: SplitScores, n: int, setting: str, plan: MethodPlan):
    """Per problem, the (vote share, Probe score, labels) of its groups' answers, concatenated: what the fitted
    vote baselines learn from."""
    g_min = split.dataset.num_sequences
    out = []
    for i, p in enumerate(split.problems):
        votes, probes, labels = [], [], []
        for seqs in evaluation_groups(g_min, n, i, split.name):
            g = answer_group(p, seqs, setting)
            rows, _ = select_answers(p, seqs, setting)
            votes.append(_vote(g, p.answer_step[rows], setting))
            probes.append(split.single[(setting, plan.probe)][i][rows] if plan.probe else np.zeros(len(rows)))
            labels.append(g.correct)
        out.append(tuple(np.concatenate(x) for x in (votes, probes, labels)))
    return out


def _stack_features(vote: np.ndarray, probe: np.ndarray) -> np.ndarray:
    return np.stack([vote, logit(probe)], axis=1)


def _fit_vote_baselines(split: SplitScores, val: SplitScores | None, n: int, setting: str, plan: MethodPlan) -> list:
    """Per evaluation problem, a function (vote, probe) -> {method: (A,) probabilities} of the fitted vote
    baselines, fitted on validation (else cross-fitted over the evaluation problems)."""
    cal_name = CALIBRATED_SC if setting == "terminal" else CALIBRATED_LATEST_VOTE

    def fit(feats):
        v, pr, y = (np.concatenate([f[k] for f in feats]) for k in range(3))
        a, b = fit_platt(v, y)
        fitted = {cal_name: lambda vv, pp: platt(vv, a, b)}
        if plan.probe:
            coef, icpt = fit_logistic(_stack_features(v, pr), y)
            fitted[STACKED] = lambda vv, pp: logistic(_stack_features(vv, pp), coef, icpt)
        return fitted

    if val is not None and val.dataset.num_sequences >= n:
        fitted = fit(_feature_groups(val, n, setting, plan))
        return [fitted] * len(split.problems)
    feats = _feature_groups(split, n, setting, plan)
    idx = np.arange(len(feats))
    out: dict[int, dict[str, Callable]] = {}
    for half in (0, 1):
        rest = idx[idx % 2 != half]
        fitted = fit([feats[i] for i in (rest if len(rest) else idx)])
        for i in idx[idx % 2 == half]:
            out[int(i)] = fitted
    return [out[i] for i in range(len(feats))]


def draw_scores(
    split: SplitScores,
    n: int,
    setting: str,
    plan: MethodPlan,
    method_config: MethodConfig,
    val: SplitScores | None = None,
) -> Draw:
    """Every method's scores on the evaluation groups of `split` at N in one setting (report order).

    Args:
        split: the split with its verifiers' scores (`with_verifiers`).
        n, setting: the group size N and the setting ("terminal", "streaming").
        plan: the setting's methods at N (`method_plan`).
        method_config: how the methods score (R of streaming weighted voting).
        val: the validation split of the same training seed, on which the fitted vote baselines are fitted.
    Returns: the groups with every method's scores (`Draw`).
    """
    problems = split.problems
    sequences = [evaluation_groups(split.dataset.num_sequences, n, i, split.name) for i in range(len(problems))]
    msv_scores, offline = _msv_scores(split, n, setting, plan, sequences)
    fitted = _fit_vote_baselines(split, val, n, setting, plan) if n > 1 else [{}] * len(problems)
    groups, problem_of = [], []
    for i, p in enumerate(problems):
        for seqs in sequences[i]:
            g = answer_group(p, seqs, setting)
            rows, _ = select_answers(p, seqs, setting)
            base = {m: split.single[(setting, m)][i][rows] for m in plan.base}
            sc = {}
            if n > 1:
                vote = _vote(g, p.answer_step[rows], setting)
                probe = split.single[(setting, plan.probe)][i][rows] if plan.probe else None
                sc[VOTE_BASELINES[setting][0]] = vote
                sc |= {m: f(vote, probe) for m, f in fitted[i].items()}
            sc |= base
            for name, m in plan.wv.items():
                sc[name] = (
                    weighted_voting(base[m], g.klass, g.is_terminal)
                    if setting == "terminal"
                    else streaming_weighted_voting(base[m], g.klass, g.end, R=method_config.wv_threshold)
                )
            for label, scores in msv_scores.items():
                sc[label] = scores[i][rows]
            confidences, events = {}, {}
            if setting == "streaming" and n > 1:
                rule_scores, confidences, events = _stop_rule_scores(
                    g, p.answer_step[rows], n, {m: sc[m] for m in msv_scores}, plan
                )
                sc |= rule_scores
            groups.append(
                AnswerGroup(
                    g.sequence,
                    g.end,
                    g.klass,
                    g.correct,
                    g.is_terminal,
                    g.seq_len,
                    g.start,
                    {k: np.clip(v, 0.0, 1.0) for k, v in sc.items()},
                    g.problem_id,
                    confidences,
                    events,
                )
            )
            problem_of.append(i)
    return Draw(groups, np.asarray(problem_of, dtype=np.int64), offline)


def _stop_rule_scores(
    g: AnswerGroup, step: np.ndarray, n: int, msv: dict, plan: MethodPlan
) -> tuple[dict, dict, dict]:
    """The field's stopping rules' statistics on a streaming group, and each MSV's stop-head statistic and
    confidence where the verifier carries a head (``config.early_stopping``): what `StopRuleScorer` computes live.

    Returns:
        (scores, confidences, events): method -> (A,) statistic of each answer's class at its arrival, method ->
        (A,) confidence for the stop heads, and method -> its class snapshots (`StopEvents`, what the rule reads).
    """
    columns = (g.klass, g.sequence, step, g.end)
    rules: dict[str, str | StopHead] = dict(STOP_RULE_METHODS)
    for e in plan.msv:  # each has a streaming model: the plan holds the MSVs scoring this setting
        model = e.model_for("streaming")[0]
        head = None if model is None else StopHead.of(model.config)
        if head is not None and head.switches:
            # The λ sweep reads one head; its floor's side below the switch is `replay_sweep`'s (docs/pruning.md).
            warnings.warn(
                f"{method_label(e, n)}: the stop head's support floor holds only below λ = {head.floor_below:g}; the "
                "evaluation's stop-head curve reads the head without it (hf_msv.training.pruned_replay.replay_sweep "
                "replays both sides)",
                UserWarning,
                stacklevel=2,
            )
        label = method_label(e, n)
        if head and label in msv:
            rules[label + STOP_HEAD_SUFFIX] = head
    out, confidences, events = {}, {}, {}
    for name, rule in rules.items():
        scores = msv[name.removesuffix(STOP_HEAD_SUFFIX)] if isinstance(rule, StopHead) else None
        events[name] = stop_events(rule, *columns, n, scores)
        out[name], confidence = events[name].at_answers(g.klass, g.end)
        if isinstance(rule, StopHead):
            confidences[name] = confidence
    return out, confidences, events
