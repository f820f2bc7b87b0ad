"""The methods an evaluation compares and their scores on one group draw: the verifier-free baselines, the
optional PRM baseline, the single-sequence verifiers and their weighted voting (+WV), and the multi-sequence MSV_M
(grouped when N > M)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..baselines import fit_platt, platt, self_consistency, streaming_weighted_voting, weighted_voting
from ..data import MODES, AnswerGroup, CollectedProblem, ShardDataset, answer_group, draw_sequences, select_answers
from .prm import PRMScorer, score_with_prm
from .scoring import deepconf_scores, score_problems, token_prob_scores
from .verifiers import VerifierEntry

__all__ = ["SETTINGS", "TOKEN_PROBS", "DEEPCONF", "PRM", "SELF_CONSISTENCY", "SplitScores", "prepare_split",
           "add_prm_scores", "fit_deepconf", "primary_msv", "method_plan", "method_label", "draw_scores"]

SETTINGS = MODES  # ("terminal", "streaming"): which answers of a group are scored
TOKEN_PROBS, DEEPCONF, PRM, SELF_CONSISTENCY = "Token Probs", "DeepConf", "PRM", "Self-consistency"
_BASELINES = (TOKEN_PROBS, DEEPCONF, PRM)  # listed first among the single-sequence scorers, in this order
_NO_ANSWER_TOKEN_PROB = 0.5  # Token Probs of an answer none of whose token log-probs is known (uninformative)


@dataclass
class SplitScores:
    """One split and everything about it that does not depend on the group draw.

    Attributes: ``dataset`` (hidden states, read lazily per group), ``problems`` (the records without hidden
    states, in dataset order), ``single`` ((setting, method) -> per problem `(A,)` scores over its stored answers,
    nan where not defined), ``deepconf_raw`` (per problem `(A,)` raw DeepConf confidences), ``prm_cost`` (what
    scoring the split with the PRM took, `score_with_prm`; None without the PRM).
    """

    dataset: ShardDataset
    problems: list[CollectedProblem]
    single: dict = field(default_factory=dict)
    deepconf_raw: list = field(default_factory=list)
    prm_cost: dict | None = None

    @property
    def info(self) -> dict:
        return self.dataset.info


def prepare_split(dataset: ShardDataset, entries: list[VerifierEntry], deepconf_window: int, deepconf_stat: str,
                  max_tokens: int) -> SplitScores:
    """Token Probs, raw DeepConf and every single-sequence verifier's scores of every answer of a split (these
    score answers independently of the group, so once for all draws)."""
    problems = dataset.read_problems()
    split = SplitScores(dataset, problems)
    tp = []
    for p in problems:
        s = token_prob_scores(p)
        tp.append(np.where(np.isnan(s), _NO_ANSWER_TOKEN_PROB, np.clip(s, 0.0, 1.0)))
    split.deepconf_raw = [deepconf_scores(p, deepconf_window, deepconf_stat) if p.cot_confidence else
                          np.zeros(p.num_answers) for p in problems]
    for setting in SETTINGS:
        split.single[(setting, TOKEN_PROBS)] = tp
        for e in entries:
            if not e.single_sequence:
                continue
            model, mode = e.model_for(setting)
            if model is None:
                continue
            scores, _, _ = score_problems(model, dataset, mode=mode, max_tokens=max_tokens)
            split.single[(setting, e.name)] = scores
    return split


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
        raw = [s.deepconf_raw[i][s.problems[i].answer_terminal] if setting == "terminal" else s.deepconf_raw[i]
               for i in idx]
        lab = [s.problems[i].answer_correct[s.problems[i].answer_terminal] if setting == "terminal"
               else s.problems[i].answer_correct for i in idx]
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


def method_plan(entries: list[VerifierEntry], n: int, setting: str, split: SplitScores) -> dict:
    """Methods of a setting at N: {"base": single-sequence scorers, "wv": {name+WV: name}, "msv": [entries],
    "primary": the MSV_N entry or None, "grouped": whether it runs grouped}."""
    base = [m for (s, m) in split.single if s == setting]
    base = [m for m in _BASELINES if m in base] + [m for m in base if m not in _BASELINES]
    wv = {f"{m}+WV": m for m in base} if n > 1 else {}
    primary, grouped = primary_msv(entries, n)
    msv = [e for e in entries if not e.single_sequence and e.model_for(setting)[0] is not None
           and (e.num_sequences == n or (e is primary and grouped))]
    if primary is not None and not any(e is primary for e in msv):
        primary = None
    if primary is None and n == 1:  # at N = 1 the single-sequence MSV_1 is MSV_N
        primary = next((e for e in entries if e.kind == "msv" and e.num_sequences == 1
                        and e.model_for(setting)[0] is not None), None)
    return {"base": base, "wv": wv, "msv": msv, "primary": primary, "grouped": grouped and primary is not None}


def method_label(entry: VerifierEntry, n: int) -> str:
    """The report name of a verifier at N: its name, with " (grouped)" for an MSV_M scoring N > M sequences."""
    return entry.name if entry.num_sequences >= n or entry.single_sequence else f"{entry.name} (grouped)"


def draw_scores(split: SplitScores, n: int, seed: int, setting: str, wv_threshold: int, max_tokens: int,
                plan: dict) -> tuple[list[AnswerGroup], dict]:
    """AnswerGroups (with every method's scores, in report order) of one draw in one setting, and
    {MSV label: offline scoring seconds per answer}."""
    problems = split.problems
    seqs = [draw_sequences(p.num_sequences, n, seed, i) for i, p in enumerate(problems)]
    msv_scores, offline = {}, {}
    for e in plan["msv"]:
        model, mode = e.model_for(setting)
        scores, seconds, count = score_problems(model, split.dataset, seqs, mode=mode, max_tokens=max_tokens)
        offline[method_label(e, n)] = seconds / max(count, 1)
        msv_scores[method_label(e, n)] = scores
    groups = []
    for i, p in enumerate(problems):
        g = answer_group(p, seqs[i], setting)
        rows, _ = select_answers(p, seqs[i], setting)
        base = {m: split.single[(setting, m)][i][rows] for m in plan["base"]}
        sc = {}
        if setting == "terminal" and n > 1:
            sc[SELF_CONSISTENCY] = self_consistency(g.klass, g.is_terminal)
        for m in plan["base"]:
            sc[m] = base[m]
        for name, m in plan["wv"].items():
            sc[name] = (weighted_voting(base[m], g.klass, g.is_terminal) if setting == "terminal" else
                        streaming_weighted_voting(base[m], g.klass, g.end, R=wv_threshold))
        for label, scores in msv_scores.items():
            sc[label] = scores[i][rows]
        groups.append(AnswerGroup(g.sequence, g.end, g.klass, g.correct, g.is_terminal, g.seq_len, g.start,
                                  {k: np.clip(v, 0.0, 1.0) for k, v in sc.items()}, g.problem_id))
    return groups, offline
