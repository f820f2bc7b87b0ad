"""``hf-msv evaluate``: every baseline, metric, figure and λ rule of the paper over collected shards and trained
verifiers, with mean ± std over seeds.

    from hf_msv.evaluation import evaluate_study
    results = evaluate_study("data/eval", {"Probe": "verifiers/probe", "MSV_1": "verifiers/msv1",
                                           "MSV_16": "verifiers/msv16"}, "reports/eval",
                             num_sequences_list=[1, 4, 16], seeds=5, val_dir="data/val")

Protocol
========

* **Groups and seeds.** Each problem of the evaluation shards has S collected sequences. For N in
  ``num_sequences_list`` and seed s, every problem contributes one group: the N sequences of
  ``np.random.default_rng([s, problem index]).permutation(S)[:N]`` (renumbered 0..N-1 in draw order). A seed is a
  different random subset; every number is reported as mean ± sample std over seeds (`hf_msv.metrics.mean_std`).
* **Settings.** *Terminal*: the group's N terminal answers. *Streaming*: every answer of the group (intermediate
  ones elicited at delimiters, and the terminal ones), in time order τ + L.
* **Methods.** Verifier-free: Self-consistency (terminal), Token Probs (geometric mean of the answer-token
  probabilities), DeepConf (lowest-group trace confidence of the chain of thought up to the answer, Platt-scaled on
  the validation split). Trained single-sequence verifiers (the Probe, MSV₁; config ``num_sequences == 1`` or a
  Probe) score every answer independently of the group. Aggregations ``X+WV``: weighted voting over the group's
  terminal answers (terminal setting) and streaming weighted voting with threshold R = 16 (streaming setting;
  `hf_msv.baselines.streaming_weighted_voting`), for Token Probs, DeepConf and every single-sequence verifier.
  Multi-sequence MSV_M: scored on the group jointly; groups of N > M sequences are split into ⌈N/M⌉ sub-groups of M
  (`hf_msv.modeling_msv.split_into_groups`, appendix "Scaling with MSV_M"). At each N the *primary* MSV is the one
  with M = N (else the largest M < N, grouped).
* **Which verifier in which setting.** A verifier entry may be one checkpoint or ``{"terminal": path, "streaming":
  path}``. The terminal setting uses a terminal-mode checkpoint when given, else the streaming checkpoint's scores
  of the terminal answers (each seeing every answer of the group up to its end); the streaming setting needs a
  streaming checkpoint.
* **Metrics** (`hf_msv.metrics`): AUROC, Brier, ECE (10 bins), NLL over answers pooled over problems; best-of-N
  accuracy, ECE and Brier over the (p†, y†) pairs of the picks among terminal answers; Brier per token position
  (bins of τ).
* **Early stopping** (`hf_msv.early_stop`): the stopping rule replayed over each group's recorded answer stream with
  λ swept over 0..1 (+∞ = full decoding); accuracy vs chain-of-thought tokens and vs latency; AUTC;
  ``early_stop_token_fraction`` of the primary MSV against the baseline with the highest peak accuracy.
  Latency = t*·decode_step_s + (answers seen)·(elicit_s + verify_s): ``decode_step_s`` and ``elicit_s`` come from
  ``lm_costs`` (else the shard's collection info ``latency`` entry, else 0 with a warning); ``verify_s`` is
  *measured* per verifier and N by scoring a few groups online (KV-cached MSV, one call per arrival time), i.e. the
  streaming cost, not the offline batched one. Verifier-free methods cost 0.
* **λ rules** (needs ``val_dir``): per N and seed, a common accuracy target (``target_accuracy``, default 0.95 × the
  best method's full-decoding validation accuracy) is met (1) *by validation*: the cheapest λ on the validation
  curve reaching it (`select_lambda_validation`), and (2) *risk-controlled* by Learn-then-Test
  (`select_lambda_ltt`, δ = ``ltt_delta``). Both report the accuracy, tokens and latency they achieve on the
  evaluation split.

Outputs in ``output_dir``: ``{report_name}.md`` (tables, every figure referenced), ``{report_name}.json`` (every
number, per-seed values included; NaN → null) and PNG figures (reliability diagrams, best-of-N vs N, trade-off
curves vs tokens and latency, Brier per token position).
"""

from __future__ import annotations

import argparse
import json
import math
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..baselines import fit_platt, platt, self_consistency, streaming_weighted_voting, weighted_voting
from .early_stop import (
    DEFAULT_LAMBDAS,
    LatencyCosts,
    TradeoffCurve,
    autc,
    early_stop_token_fraction,
    select_lambda_ltt,
    select_lambda_validation,
    tradeoff_curve,
)
from ..metrics import AnswerGroup, best_of_n_metrics, best_of_n_pairs, calibration_metrics, mean_std, reliability_bins
from ..data.shards import CollectedProblem, list_shards, read_shard
from ..utils import json_safe

__all__ = [
    "SETTINGS", "VerifierEntry", "load_verifier", "load_split", "draw_sequences", "select_answers",
    "answer_group", "score_problems", "measure_verifier_cost", "evaluate_study", "add_evaluate_arguments",
    "evaluate_from_args", "parse_verifier_specs", "lm_costs_from_info", "main",
]

SETTINGS = ("terminal", "streaming")
TOKEN_PROBS, DEEPCONF, SELF_CONSISTENCY = "Token Probs", "DeepConf", "Self-consistency"
_NO_ANSWER_TOKEN_PROB = 0.5  # Token Probs of an answer none of whose token log-probs is known (uninformative)


# ----------------------------------------------------------------------------------------------------------------
# Verifiers
# ----------------------------------------------------------------------------------------------------------------


def load_verifier(path_or_model):
    """A saved MSV or Probe checkpoint (``model_type`` "msv" / "msv_probe") in eval mode; models pass through."""
    if isinstance(path_or_model, torch.nn.Module):
        return path_or_model.eval()
    path = Path(path_or_model)
    model_type = json.loads((path / "config.json").read_text()).get("model_type")
    if model_type == "msv_probe":
        from ..modeling_probe import ProbeVerifier

        return ProbeVerifier.from_pretrained(path).eval()
    if model_type == "msv":
        from ..modeling_msv import MSVVerifier

        return MSVVerifier.from_pretrained(path).eval()
    raise ValueError(f"{path} holds a {model_type!r} model, not an MSV or Probe verifier")


@dataclass(eq=False)
class VerifierEntry:
    """One named verifier: its checkpoints by mode and what it is (Probe, MSV₁ = single-sequence; MSV_M)."""

    name: str
    models: dict = field(default_factory=dict)  # mode -> model
    kind: str = "msv"  # "msv" | "probe"
    num_sequences: int = 1  # M (1 for the Probe)

    @property
    def single_sequence(self) -> bool:
        return self.kind == "probe" or self.num_sequences == 1

    def model_for(self, setting: str):
        """(model, mode it runs in) for a setting, or (None, None) when this verifier does not take part."""
        if setting in self.models:
            return self.models[setting], setting
        if setting == "terminal" and "streaming" in self.models:
            return self.models["streaming"], "streaming"
        return None, None


def _entries(verifiers: Mapping) -> list[VerifierEntry]:
    out = []
    for name, spec in verifiers.items():
        specs = spec if isinstance(spec, Mapping) else {None: spec}
        entry = VerifierEntry(name)
        for declared, target in specs.items():
            model = load_verifier(target)
            mode = model.config.mode
            if declared is not None and declared != mode:
                raise ValueError(f"verifier {name!r}: the {declared!r} checkpoint was trained in {mode!r} mode")
            if mode in entry.models:
                raise ValueError(f"verifier {name!r} has two {mode} checkpoints")
            kind = "probe" if model.config.model_type == "msv_probe" else "msv"
            m = 1 if kind == "probe" else int(model.config.num_sequences)
            if entry.models and (kind, m) != (entry.kind, entry.num_sequences):
                raise ValueError(f"verifier {name!r} mixes checkpoints of different kinds or sizes")
            entry.models[mode], entry.kind, entry.num_sequences = model, kind, m
        out.append(entry)
    return out


def _primary_msv(entries: list[VerifierEntry], n: int) -> tuple[VerifierEntry | None, bool]:
    """(MSV used as MSV_N at this N, whether it runs grouped): M = N first, else the largest M < N."""
    multi = [e for e in entries if not e.single_sequence]
    exact = [e for e in multi if e.num_sequences == n]
    if exact:
        return exact[0], False
    below = [e for e in multi if e.num_sequences < n]
    if below:
        return max(below, key=lambda e: e.num_sequences), True
    return None, False


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


def load_split(paths, checker=None, checker_kwargs: dict | None = None,
               hidden: bool = True) -> tuple[list[CollectedProblem], dict]:
    """Every problem of the shards under `paths` (hidden states kept in their 16-bit dtype) and the collection info.

    ``checker`` (a name for `hf_msv.equivalence.get_checker` or a checker) re-derives each problem's equivalence
    classes from its answer texts in elicitation order, exactly as `hf_msv.shards.ShardDataset` does at training;
    correctness labels always stay the stored (collection checker's) ones.
    """
    files = list_shards(paths)
    if not files:
        raise FileNotFoundError(f"no shards found in {paths}")
    problems, info = [], {}
    for f in files:
        part, part_info = read_shard(f, hidden=hidden)
        problems += part
        info = info or part_info
    ids = [p.problem_id for p in problems]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate problem ids in {paths}")
    if checker is not None:
        from ..equivalence import assign_classes, get_checker

        checker = get_checker(checker, **(checker_kwargs or {})) if isinstance(checker, str) else checker
        for p in problems:
            p.answer_class = np.asarray(assign_classes(p.answer_text, checker), dtype=np.int64)
    return problems, info


def draw_sequences(num_collected: int, num_sequences: int, seed: int, problem_index: int) -> np.ndarray:
    """The N sequence ids (in draw order) of one problem's group for one seed."""
    if num_sequences > num_collected:
        raise ValueError(f"N={num_sequences} but only {num_collected} sequences were collected")
    return np.random.default_rng([seed, problem_index]).permutation(num_collected)[:num_sequences]


def select_answers(problem: CollectedProblem, sequences: np.ndarray, setting: str) -> tuple[np.ndarray, np.ndarray]:
    """(rows (A_g,), renumbered sequence ids (A_g,)) of the answers of `sequences` in a setting, stored order."""
    slot = np.full(problem.num_sequences, -1, dtype=np.int64)
    slot[np.asarray(sequences)] = np.arange(len(sequences))
    keep = slot[problem.answer_sequence] >= 0
    if setting == "terminal":
        keep &= problem.answer_terminal
    rows = np.flatnonzero(keep)
    return rows, slot[problem.answer_sequence[rows]]


def answer_group(problem: CollectedProblem, sequences: np.ndarray, setting: str,
                 scores: Mapping[str, np.ndarray] | None = None) -> AnswerGroup:
    """The `AnswerGroup` of one problem's group (`sequences`) in a setting; `scores` are per stored answer (A,)."""
    rows, seq = select_answers(problem, sequences, setting)
    seq_len = np.zeros(len(sequences), dtype=np.int64)
    term = problem.answer_terminal[rows]
    seq_len[seq[term]] = problem.answer_tau[rows][term]
    return AnswerGroup(sequence=seq, end=problem.answer_end[rows], klass=problem.answer_class[rows],
                       correct=problem.answer_correct[rows], is_terminal=term, seq_len=seq_len,
                       start=problem.answer_tau[rows],
                       scores={k: np.asarray(v)[rows] for k, v in (scores or {}).items()},
                       problem_id=problem.problem_id)


# ----------------------------------------------------------------------------------------------------------------
# Scoring
# ----------------------------------------------------------------------------------------------------------------


def _group_inputs(problem: CollectedProblem, rows: np.ndarray, seq: np.ndarray, mode: str) -> dict:
    starts, lengths = problem.answer_token_start[rows], problem.answer_length[rows]
    offsets = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    token_rows = np.arange(int(lengths.sum()), dtype=np.int64) + offsets
    step = problem.answer_step[rows] if mode == "streaming" else np.zeros(len(rows), dtype=np.int64)
    return {"hidden": problem.hidden_states[torch.from_numpy(token_rows)], "length": lengths, "sequence": seq,
            "step": step, "end": problem.answer_end[rows], "class": problem.answer_class[rows]}


def _forward(model, groups: list[dict], group_size: int | None) -> list[np.ndarray]:
    """Probabilities of the answers of `groups` (inputs of `_group_inputs`) scored in one packed call."""
    from ..modeling_msv import split_into_groups

    cat = lambda key: torch.from_numpy(np.concatenate([g[key] for g in groups]).astype(np.int64))  # noqa: E731
    counts = [len(g["length"]) for g in groups]
    answer_group = torch.repeat_interleave(torch.arange(len(groups)), torch.tensor(counts))
    sequence = cat("sequence")
    if group_size is not None and len(sequence) and int(sequence.max()) >= group_size:
        answer_group, sequence = split_into_groups(answer_group, sequence, group_size)
    lengths = cat("length")
    token_answer = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    out = model(hidden_states=torch.cat([g["hidden"] for g in groups]), token_answer=token_answer,
                answer_group=answer_group, answer_sequence=sequence, answer_step=cat("step"),
                answer_end=cat("end"), answer_class=cat("class"))
    probs = out.probabilities.float().cpu().numpy().astype(np.float64)
    return np.split(probs, np.cumsum(counts)[:-1])


@torch.no_grad()
def score_problems(model, problems: Sequence[CollectedProblem], sequences: Sequence[np.ndarray] | None = None,
                   mode: str | None = None, max_tokens: int = 32768) -> tuple[list[np.ndarray], float, int]:
    """Score each problem's group with `model` (offline, packed): ``(scores, seconds, answers scored)``.

    Args:
        sequences: per problem, the group's sequence ids (default: all collected sequences).
        mode: "terminal" scores the terminal answers only (steps set to 0, as at training); "streaming" scores every
            answer. Default: the model's own mode.
        max_tokens: answer tokens packed into one forward call.
    Returns per problem an (A,) array over its *stored* answers, nan where not scored. An MSV_M scoring groups of
    more than M sequences splits them into sub-groups of M.
    """
    mode = mode or model.config.mode
    group_size = None if model.config.model_type == "msv_probe" else int(model.config.num_sequences)
    out = [np.full(p.num_answers, np.nan) for p in problems]
    pending, where, tokens = [], [], 0
    seconds, answers = 0.0, 0

    def flush():
        nonlocal pending, where, tokens, seconds, answers
        if not pending:
            return
        start = time.perf_counter()
        probs = _forward(model, pending, group_size)
        seconds += time.perf_counter() - start
        for (i, rows), p in zip(where, probs):
            out[i][rows] = p
            answers += len(rows)
        pending, where, tokens = [], [], 0

    for i, problem in enumerate(problems):
        seqs = np.arange(problem.num_sequences) if sequences is None else np.asarray(sequences[i])
        rows, seq = select_answers(problem, seqs, mode)
        if not len(rows):
            continue
        inputs = _group_inputs(problem, rows, seq, mode)
        pending.append(inputs)
        where.append((i, rows))
        tokens += len(inputs["hidden"])
        if tokens >= max_tokens:
            flush()
    flush()
    return out, seconds, answers


@torch.no_grad()
def measure_verifier_cost(model, problems: Sequence[CollectedProblem], sequences: Sequence[np.ndarray],
                          max_groups: int = 4, repeats: int = 1) -> float:
    """Seconds per answer of scoring groups *online*, as during streaming decoding: per group, one verifier call per
    distinct arrival time τ + L with the answers that arrived (a streaming MSV with its KV cache, `MSVCache`; the
    Probe statelessly). Measured on the first `max_groups` groups; the best of `repeats` runs (least disturbed)."""
    if model.config.model_type != "msv_probe" and model.config.mode != "streaming":
        raise ValueError("online cost is measured for streaming verifiers (terminal ones score once, at the end)")
    from ..modeling_msv import MSVCache, split_into_groups

    streaming = model.config.mode == "streaming"
    group_size = None if model.config.model_type == "msv_probe" else int(model.config.num_sequences)
    best = math.inf
    for _ in range(max(1, repeats)):
        seconds, answers = 0.0, 0
        for problem, seqs in list(zip(problems, sequences))[:max_groups]:
            rows, seq = select_answers(problem, np.asarray(seqs), "streaming")
            if not len(rows):
                continue
            g = _group_inputs(problem, rows, seq, "streaming")
            sub = np.zeros(len(rows), dtype=np.int64)
            s = torch.from_numpy(seq)
            if group_size is not None and len(s) and int(s.max()) >= group_size:
                sub_t, s = split_into_groups(torch.from_numpy(sub), s, group_size)
                sub = sub_t.numpy()
            order = np.lexsort((g["step"], seq, g["end"]))
            starts = np.concatenate([[0], np.cumsum(g["length"])[:-1]])
            cache = MSVCache() if (streaming and group_size is not None) else None
            start = time.perf_counter()
            for t in np.unique(g["end"]):
                idx = order[g["end"][order] == t]
                tok = np.concatenate([np.arange(starts[a], starts[a] + g["length"][a]) for a in idx])
                lengths = torch.from_numpy(g["length"][idx].astype(np.int64))
                kwargs = dict(hidden_states=g["hidden"][torch.from_numpy(tok)],
                              token_answer=torch.repeat_interleave(torch.arange(len(idx)), lengths),
                              answer_group=torch.from_numpy(sub[idx]), answer_sequence=s[torch.from_numpy(idx)],
                              answer_step=torch.from_numpy(g["step"][idx].astype(np.int64)),
                              answer_end=torch.from_numpy(g["end"][idx].astype(np.int64)),
                              answer_class=torch.from_numpy(g["class"][idx].astype(np.int64)))
                if cache is not None:
                    kwargs |= dict(past_key_values=cache, use_cache=True)
                model(**kwargs)
            seconds += time.perf_counter() - start
            answers += len(rows)
        if answers:
            best = min(best, seconds / answers)
    return best if math.isfinite(best) else 0.0


def lm_costs_from_info(info: Mapping) -> dict | None:
    """LM costs recorded in a shard's collection info, if any: ``info["latency"]`` = ``{"decode_step_s": float,
    "elicit_s": float}`` and/or ``{"by_num_sequences": {N: {...}}}``. Returns {N or None: LatencyCosts} or None."""
    lat = info.get("latency") if isinstance(info, Mapping) else None
    if not isinstance(lat, Mapping):
        return None
    out = {}
    if "decode_step_s" in lat or "elicit_s" in lat:
        out[None] = LatencyCosts(float(lat.get("decode_step_s", 0.0)), float(lat.get("elicit_s", 0.0)))
    for n, c in (lat.get("by_num_sequences") or {}).items():
        out[int(n)] = LatencyCosts(float(c.get("decode_step_s", 0.0)), float(c.get("elicit_s", 0.0)))
    return out or None


def _lm_cost_for(costs: Mapping | None, n: int) -> LatencyCosts:
    if not costs:
        return LatencyCosts()
    if n in costs:
        return costs[n]
    if None in costs:
        return costs[None]
    # nearest measured N (costs per step grow slowly with N on batched hardware)
    k = min((k for k in costs if k is not None), key=lambda k: abs(math.log(k) - math.log(n)))
    return costs[k]


# ----------------------------------------------------------------------------------------------------------------
# Per-split precomputation: everything that does not depend on the group draw
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class _Split:
    problems: list
    info: dict
    # (setting, method) -> per problem (A,) scores over stored answers (nan where not defined)
    single: dict = field(default_factory=dict)
    deepconf_raw: list = field(default_factory=list)


def _prepare(problems: list[CollectedProblem], info: dict, entries: list[VerifierEntry], deepconf_window: int,
             deepconf_stat: str, max_tokens: int) -> _Split:
    split = _Split(problems, info)
    tp = []
    for p in problems:
        s = p.token_prob_scores()
        tp.append(np.where(np.isnan(s), _NO_ANSWER_TOKEN_PROB, np.clip(s, 0.0, 1.0)))
    split.deepconf_raw = [p.deepconf_scores(deepconf_window, deepconf_stat) if p.cot_confidence else
                          np.zeros(p.num_answers) for p in problems]
    for setting in SETTINGS:
        split.single[(setting, TOKEN_PROBS)] = tp
        for e in entries:
            if not e.single_sequence:
                continue
            model, mode = e.model_for(setting)
            if model is None:
                continue
            scores, _, _ = score_problems(model, problems, mode=mode, max_tokens=max_tokens)
            split.single[(setting, e.name)] = scores
    return split


def _fit_deepconf(split: _Split, val: _Split | None) -> None:
    """Platt-scale the raw DeepConf confidences per setting: on validation when given, else 2-fold cross-fitting
    over the evaluation problems (each half calibrated on the other)."""
    def pairs(s: _Split, idx, setting):
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


# ----------------------------------------------------------------------------------------------------------------
# One (N, seed) draw: groups and every method's scores
# ----------------------------------------------------------------------------------------------------------------


def _method_plan(entries: list[VerifierEntry], n: int, setting: str, split: _Split) -> dict:
    """Methods of a setting at N: {"base": single-sequence scorers, "wv": {name+WV: name}, "msv": [entries],
    "primary": the MSV_N entry or None, "grouped": whether it runs grouped}."""
    base = [m for (s, m) in split.single if s == setting]
    base = [m for m in (TOKEN_PROBS, DEEPCONF) if m in base] + [m for m in base if m not in (TOKEN_PROBS, DEEPCONF)]
    wv = {f"{m}+WV": m for m in base} if n > 1 else {}
    primary, grouped = _primary_msv(entries, n)
    msv = [e for e in entries if not e.single_sequence and e.model_for(setting)[0] is not None
           and (e.num_sequences == n or (e is primary and grouped))]
    if primary is not None and not any(e is primary for e in msv):
        primary = None
    if primary is None and n == 1:  # at N = 1 the single-sequence MSV_1 is MSV_N
        primary = next((e for e in entries if e.kind == "msv" and e.num_sequences == 1
                        and e.model_for(setting)[0] is not None), None)
    return {"base": base, "wv": wv, "msv": msv, "primary": primary, "grouped": grouped and primary is not None}


def _label(entry: VerifierEntry, n: int) -> str:
    return entry.name if entry.num_sequences >= n or entry.single_sequence else f"{entry.name} (grouped)"


def _draw_scores(split: _Split, entries, n: int, seed: int, setting: str, wv_threshold: int, max_tokens: int,
                 plan: dict) -> tuple[list[AnswerGroup], dict]:
    """AnswerGroups (with every method's scores, in report order) of one draw in one setting, and
    {MSV label: offline scoring seconds per answer}."""
    problems = split.problems
    seqs = [draw_sequences(p.num_sequences, n, seed, i) for i, p in enumerate(problems)]
    msv_scores, offline = {}, {}
    for e in plan["msv"]:
        model, mode = e.model_for(setting)
        scores, seconds, count = score_problems(model, problems, seqs, mode=mode, max_tokens=max_tokens)
        offline[_label(e, n)] = seconds / max(count, 1)
        msv_scores[_label(e, n)] = scores
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


def _methods_in(groups: list[AnswerGroup]) -> list[str]:
    return list(groups[0].scores) if groups else []


# ----------------------------------------------------------------------------------------------------------------
# Aggregation helpers
# ----------------------------------------------------------------------------------------------------------------


def _stat(values) -> dict:
    v = [float(x) for x in values]
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m, s = mean_std(v)
    return {"mean": m, "std": s, "values": v}


def _pooled(groups: list[AnswerGroup], method: str) -> tuple[np.ndarray, np.ndarray]:
    return (np.concatenate([g.scores[method] for g in groups]), np.concatenate([g.correct for g in groups]))


def _position_edges(problems: list[CollectedProblem], bins: int = 8) -> np.ndarray:
    tau = np.concatenate([p.answer_tau for p in problems]) if problems else np.zeros(1)
    hi = float(np.quantile(tau, 0.98)) if tau.size else 1.0
    edges = np.linspace(0.0, max(hi, 1.0), bins + 1)
    edges[-1] = np.inf
    return edges


def _brier_by_position(groups: list[AnswerGroup], method: str, edges: np.ndarray) -> list[float]:
    p, y = _pooled(groups, method)
    tau = np.concatenate([g.start for g in groups])
    idx = np.clip(np.searchsorted(edges, tau, side="right") - 1, 0, len(edges) - 2)
    out = []
    for b in range(len(edges) - 1):
        m = idx == b
        out.append(float(np.mean((p[m] - y[m]) ** 2)) if m.any() else math.nan)
    return out


def _curve_dict(curves: list[TradeoffCurve]) -> dict:
    mean = lambda name: np.mean([getattr(c, name) for c in curves], axis=0).tolist()  # noqa: E731
    lam = curves[0].lambdas
    return {"lambdas": [None if math.isinf(x) else float(x) for x in lam], "accuracy": mean("accuracy"),
            "tokens": mean("tokens"), "steps": mean("steps"), "latency": mean("latency"),
            "stop_rate": mean("stop_rate")}


def _mean_curve(curves: list[TradeoffCurve]) -> TradeoffCurve:
    mean = lambda name: np.mean([getattr(c, name) for c in curves], axis=0)  # noqa: E731
    return TradeoffCurve(curves[0].lambdas, mean("accuracy"), mean("tokens"), mean("steps"), mean("latency"),
                         mean("stop_rate"))


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


# ----------------------------------------------------------------------------------------------------------------
# The study
# ----------------------------------------------------------------------------------------------------------------


def evaluate_study(
    eval_dir,
    verifiers: Mapping,
    output_dir,
    num_sequences_list: Sequence[int] = (1, 4, 16, 64),
    seeds: int = 5,
    val_dir=None,
    *,
    checker=None,
    checker_kwargs: dict | None = None,
    lm_costs: LatencyCosts | Mapping | None = None,
    wv_threshold: int = 16,
    deepconf_window: int = 2048,
    deepconf_stat: str = "lowest_group",
    target_accuracy: float | None = None,
    target_fraction: float = 0.95,
    ltt_delta: float = 0.1,
    lambdas=DEFAULT_LAMBDAS,
    cost_groups: int = 4,
    position_bins: int = 8,
    max_tokens: int = 32768,
    figures: bool = True,
    title: str = "MSV evaluation",
    report_name: str = "report",
    progress: bool = True,
) -> dict:
    """Evaluate every baseline and verifier on the shards in `eval_dir` (protocol in the module docstring).

    Args:
        eval_dir: evaluation shards (a directory, a shard, or a list).
        verifiers: name -> checkpoint directory (or loaded model), or name -> {"terminal": ..., "streaming": ...}.
            Single-sequence verifiers (Probe, MSV₁) also get a "+WV" row.
        output_dir: where the report, JSON and figures go.
        num_sequences_list: the N values. seeds: random group draws per N.
        val_dir: validation shards: DeepConf's Platt scaling and both λ rules (skipped without it).
        checker, checker_kwargs: re-derive equivalence classes (eval and val) with this checker; labels unchanged.
        lm_costs: `LatencyCosts` (decode_step_s, elicit_s) or {N: LatencyCosts}; default: the shard info's
            ``latency`` entry, else zeros (latency then only counts verifier time) with a warning.
        wv_threshold: R of streaming weighted voting (paper: 16).
        deepconf_window, deepconf_stat: DeepConf group window (tokens) and statistic.
        target_accuracy, target_fraction: λ-rule target: given, or target_fraction × the best method's
            full-decoding accuracy on validation (per N and seed).
        ltt_delta: LTT risk level δ. lambdas: the λ grid (must contain ∞ for AUTC's full-decoding bound).
        cost_groups: groups scored online to measure each streaming verifier's cost per answer.
        position_bins: bins of τ for Brier per token position.
        max_tokens: answer tokens per packed verifier call.
        figures: write PNG figures. title, report_name: report heading and file stem.
    Returns the results dict also written to ``{output_dir}/{report_name}.json``.
    """
    from tqdm.auto import tqdm

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    ns = sorted({int(n) for n in num_sequences_list})
    entries = _entries(verifiers)
    problems, info = load_split(eval_dir, checker, checker_kwargs)
    collected = min(p.num_sequences for p in problems)
    if ns[-1] > collected:
        raise ValueError(f"N={ns[-1]} requested but some evaluation problems have only {collected} sequences")
    split = _prepare(problems, info, entries, deepconf_window, deepconf_stat, max_tokens)
    val = None
    if val_dir is not None:
        vproblems, vinfo = load_split(val_dir, checker, checker_kwargs)
        val = _prepare(vproblems, vinfo, entries, deepconf_window, deepconf_stat, max_tokens)
    _fit_deepconf(split, val)

    # LM costs
    if lm_costs is None:
        lm_costs = lm_costs_from_info(info)
        cost_source = "shard collection info" if lm_costs else "none (zeros)"
        if not lm_costs:
            warnings.warn("no LM decode/elicitation costs given or recorded in the shards: latency counts verifier "
                          "time only", RuntimeWarning, stacklevel=2)
    else:
        cost_source = "argument"
    if isinstance(lm_costs, LatencyCosts):
        lm_costs = {None: lm_costs}

    results: dict = {
        "title": title,
        "config": {"eval_dir": str(eval_dir), "val_dir": None if val_dir is None else str(val_dir),
                   "verifiers": {e.name: {"kind": e.kind, "num_sequences": e.num_sequences,
                                          "modes": sorted(e.models)} for e in entries},
                   "num_sequences_list": ns, "seeds": seeds, "checker": None if checker is None else str(checker),
                   "checker_kwargs": checker_kwargs or {}, "wv_threshold": wv_threshold,
                   "deepconf_window": deepconf_window, "deepconf_stat": deepconf_stat,
                   "target_accuracy": target_accuracy, "target_fraction": target_fraction, "ltt_delta": ltt_delta,
                   "deepconf_calibration": "platt on validation" if val else "platt, 2-fold cross-fit on eval"},
        "data": _data_summary(problems, info, val),
        "costs": {"source": cost_source, "lm": {}, "verifier_online_s_per_answer": {},
                  "verifier_offline_s_per_answer": {}},
        "methods": {}, "terminal": {}, "streaming": {}, "early_stop": {}, "lambda_selection": {},
        "brier_by_position": {}, "figures": [],
    }
    edges = _position_edges(problems, position_bins)
    reliability = {}  # N -> method -> [answer p, answer y, best-of-N p, best-of-N y] per seed (terminal)
    bar = tqdm(total=len(ns) * seeds, desc="evaluate", unit="draw", disable=not progress, dynamic_ncols=True)
    for n in ns:
        lm = _lm_cost_for(lm_costs, n)
        results["costs"]["lm"][str(n)] = asdict(lm)
        plans = {s: _method_plan(entries, n, s, split) for s in SETTINGS}
        primary = plans["streaming"]["primary"] or plans["terminal"]["primary"]
        per_seed = {s: {} for s in SETTINGS}  # setting -> method -> metric -> [values]
        curves: dict[str, list[TradeoffCurve]] = {}
        positions: dict[str, list[list[float]]] = {}
        lam_sel: dict[str, dict[str, list]] = {}
        verify_s: dict[str, float] = {}
        # Online verifier cost per answer, measured once per N on seed 0's first groups.
        seqs0 = [draw_sequences(p.num_sequences, n, 0, i) for i, p in enumerate(problems)]
        for e in entries:
            model, _ = e.model_for("streaming")
            if model is None or (not e.single_sequence and not any(e is x for x in plans["streaming"]["msv"])):
                continue
            verify_s[_label(e, n)] = measure_verifier_cost(model, problems, seqs0, max_groups=cost_groups,
                                                           repeats=2)
        results["costs"]["verifier_online_s_per_answer"][str(n)] = dict(verify_s)

        def costs_for(method: str) -> LatencyCosts:
            base = method[:-3] if method.endswith("+WV") else method
            return LatencyCosts(lm.decode_step_s, lm.elicit_s, verify_s.get(base, 0.0))

        for seed in range(seeds):
            for setting in SETTINGS:
                groups, offline = _draw_scores(split, entries, n, seed, setting, wv_threshold, max_tokens,
                                               plans[setting])
                results["costs"]["verifier_offline_s_per_answer"].setdefault(str(n), {}).update(offline)
                for method in _methods_in(groups):
                    p, y = _pooled(groups, method)
                    row = _quiet(calibration_metrics, p, y)
                    bon = _quiet(best_of_n_metrics, groups, method)
                    row |= {f"bon_{k}": v for k, v in bon.items()}
                    if setting == "streaming":
                        positions.setdefault(method, []).append(_brier_by_position(groups, method, edges))
                        c = tradeoff_curve(groups, method, lambdas, costs_for(method))
                        curves.setdefault(method, []).append(c)
                        row |= {"autc_tokens": autc(c, "tokens"), "autc_tokens_norm": autc(c, "tokens", True),
                                "autc_latency": autc(c, "latency"), "autc_latency_norm": autc(c, "latency", True),
                                "full_accuracy": float(c.accuracy[np.argmax(c.lambdas)]),
                                "peak_accuracy": float(c.accuracy.max()),
                                "full_tokens": float(c.tokens.max()), "full_latency": float(c.latency.max())}
                    for k, v in row.items():
                        per_seed[setting].setdefault(method, {}).setdefault(k, []).append(v)
                    if setting == "terminal":
                        rp = reliability.setdefault(n, {}).setdefault(method, [[], [], [], []])
                        bp, by = best_of_n_pairs(groups, method)
                        for store, value in zip(rp, (p, y, bp, by)):
                            store.append(value)
                if setting == "streaming" and val is not None:
                    _lambda_rules(val, entries, n, seed, wv_threshold, max_tokens, plans["streaming"], groups,
                                  lambdas, costs_for, target_accuracy, target_fraction, ltt_delta, lam_sel)
            bar.update(1)

        methods = {s: list(per_seed[s]) for s in SETTINGS}
        results["methods"][str(n)] = {
            "terminal": methods["terminal"], "streaming": methods["streaming"],
            "msv": None if primary is None else _label(primary, n),
            "grouped": bool(plans["streaming"]["grouped"] or plans["terminal"]["grouped"]),
            "single_sequence": list(plans["terminal"]["base"]),
            "multi_sequence": sorted({_label(e, n) for s in SETTINGS for e in plans[s]["msv"]}),
        }
        for s in SETTINGS:
            results[s][str(n)] = {m: {k: _stat(v) for k, v in d.items()} for m, d in per_seed[s].items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # empty bins stay nan
            results["brier_by_position"][str(n)] = {
                "edges": edges.tolist(), **{m: np.nanmean(np.asarray(v, dtype=float), axis=0).tolist()
                                            for m, v in positions.items()}}
        results["early_stop"][str(n)] = _early_stop_summary(curves, results["methods"][str(n)]["msv"],
                                                            results["methods"][str(n)]["multi_sequence"])
        if lam_sel:
            results["lambda_selection"][str(n)] = {m: {rule: _summarise_rule(vals) for rule, vals in d.items()}
                                                   for m, d in lam_sel.items()}
        results.setdefault("_curves", {})[str(n)] = {m: _mean_curve(c) for m, c in curves.items()}
    bar.close()

    curves_all = results.pop("_curves")
    if figures:
        results["figures"] = _figures(results, reliability, curves_all, output_dir, report_name)
    results = json_safe(results)
    (output_dir / f"{report_name}.json").write_text(json.dumps(results, indent=1))
    (output_dir / f"{report_name}.md").write_text(render_report(results))
    return results


def _data_summary(problems: list[CollectedProblem], info: dict, val: _Split | None) -> dict:
    def stats(ps):
        correct = np.concatenate([p.answer_correct for p in ps])
        term = np.concatenate([p.answer_terminal for p in ps])
        return {"problems": len(ps), "sequences_per_problem": int(min(p.num_sequences for p in ps)),
                "answers": int(len(correct)), "answers_per_sequence": float(len(correct) / sum(
                    p.num_sequences for p in ps)),
                "terminal_accuracy": float(correct[term].mean()) if term.any() else math.nan,
                "answer_accuracy": float(correct.mean()) if len(correct) else math.nan,
                "mean_sequence_tokens": float(np.mean(np.concatenate([p.sequence_length for p in ps])))}

    out = {"eval": stats(problems), "collect": {k: info.get(k) for k in (
        "lm_name_or_path", "num_samples", "temperature", "max_new_tokens", "delimiters", "every_k_tokens",
        "checker", "max_answer_tokens") if k in info}}
    if val is not None:
        out["val"] = stats(val.problems)
    return out


def _lambda_rules(val: _Split, entries, n, seed, wv_threshold, max_tokens, plan, eval_groups, lambdas, costs_for,
                  target_accuracy, target_fraction, ltt_delta, out) -> None:
    vplan = dict(plan)
    vgroups, _ = _draw_scores(val, entries, n, seed, "streaming", wv_threshold, max_tokens, vplan)
    methods = _methods_in(eval_groups)
    vcurves = {m: tradeoff_curve(vgroups, m, lambdas, costs_for(m)) for m in methods}
    if target_accuracy is None:
        full = max(float(c.accuracy[np.argmax(c.lambdas)]) for c in vcurves.values())
        target = target_fraction * full
    else:
        target = float(target_accuracy)
    for m in methods:
        lam = _quiet(select_lambda_validation, vcurves[m], target_accuracy=target)
        ev = tradeoff_curve(eval_groups, m, [lam], costs_for(m))
        vi = int(np.flatnonzero(vcurves[m].lambdas == lam)[0]) if np.any(vcurves[m].lambdas == lam) else -1
        out.setdefault(m, {}).setdefault("validation", []).append(
            {"target": target, "lambda": lam, "val_accuracy": float(vcurves[m].accuracy[vi]),
             "val_tokens": float(vcurves[m].tokens[vi]), "eval_accuracy": float(ev.accuracy[0]),
             "eval_tokens": float(ev.tokens[0]), "eval_latency": float(ev.latency[0]), "certified": math.nan})
        ltt = select_lambda_ltt(vgroups, m, target, delta=ltt_delta, lambdas=lambdas, eval_groups=eval_groups,
                                eval_scores=m, costs=costs_for(m))
        out[m].setdefault("ltt", []).append(
            {"target": target, "lambda": ltt.lam, "val_accuracy": ltt.val_accuracy, "val_tokens": ltt.val_tokens,
             "eval_accuracy": ltt.eval_accuracy, "eval_tokens": ltt.eval_tokens, "eval_latency": ltt.eval_latency,
             "certified": float(ltt.certified)})


def _summarise_rule(values: list[dict]) -> dict:
    keys = values[0].keys()
    return {k: _stat([v[k] if v[k] is not None else math.nan for v in values]) for k in keys}


def _early_stop_summary(curves: dict[str, list[TradeoffCurve]], msv: str | None, multi: Sequence[str]) -> dict:
    """Seed-mean curves, and how the primary MSV compares with the baseline of highest peak accuracy (every method
    but the multi-sequence MSVs is a baseline; ties in peak accuracy go to the one needing fewer tokens)."""
    out = {"curves": {m: _curve_dict(c) for m, c in curves.items()}}
    if msv is None or msv not in curves:
        return out
    baselines = [m for m in curves if m != msv and m not in multi]
    if not baselines:
        return out
    mean = {m: _mean_curve(c) for m, c in curves.items()}
    best = max(baselines, key=lambda m: (round(float(mean[m].accuracy.max()), 12),
                                         -float(mean[m].tokens[np.argmax(mean[m].accuracy)])))
    per_seed = [_quiet(early_stop_token_fraction, a, b) for a, b in zip(curves[msv], curves[best])]
    per_seed_lat = [_quiet(early_stop_token_fraction, a, b, "latency") for a, b in zip(curves[msv], curves[best])]
    out |= {"msv": msv, "best_baseline": best,
            "best_baseline_peak_accuracy": float(mean[best].accuracy.max()),
            "msv_peak_accuracy": float(mean[msv].accuracy.max()),
            "token_fraction": _quiet(early_stop_token_fraction, mean[msv], mean[best]),
            "token_fraction_per_seed": per_seed,
            "latency_fraction": _quiet(early_stop_token_fraction, mean[msv], mean[best], "latency"),
            "latency_fraction_per_seed": per_seed_lat}
    return out


# ----------------------------------------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _key_methods(methods: list[str], msv: str | None, limit: int = 6) -> list[str]:
    """Methods worth a panel: the primary MSV, trained single-sequence verifiers and their +WV, then the rest."""
    free = (SELF_CONSISTENCY, TOKEN_PROBS, DEEPCONF, f"{TOKEN_PROBS}+WV", f"{DEEPCONF}+WV")
    order = ([msv] if msv in methods else []) + [m for m in methods if m != msv and m not in free] + \
        [m for m in free if m in methods]
    return order[:limit]


def _figures(results: dict, reliability: dict, curves: dict, output_dir: Path, stem: str) -> list[dict]:
    plt = _plt()
    figs = []
    ns = results["config"]["num_sequences_list"]

    def save(fig, name, caption):
        path = output_dir / f"{stem}_{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        figs.append({"file": path.name, "caption": caption})

    # Reliability diagrams (terminal answers; best-of-N picks) at the largest N and each N > 1 with an MSV.
    for n in ns:
        msv = results["methods"][str(n)]["msv"]
        if n != ns[-1] and msv is None:
            continue
        for kind, idx, caption in (("answers", (0, 1), "terminal answers"), ("bon", (2, 3), "best-of-N picks")):
            data = reliability.get(n, {})
            methods = _key_methods(list(data), msv)
            if not methods or (kind == "bon" and n == 1):
                continue
            fig, axes = plt.subplots(1, len(methods), figsize=(2.6 * len(methods), 2.8), squeeze=False)
            for ax, m in zip(axes[0], methods):
                p = np.concatenate(data[m][idx[0]])
                y = np.concatenate(data[m][idx[1]]).astype(float)
                conf, acc, count = reliability_bins(p, y, 10)
                centers = (np.arange(10) + 0.5) / 10
                ax.bar(centers, np.nan_to_num(acc), width=0.1, edgecolor="k", alpha=0.7, label="accuracy")
                ax.plot([0, 1], [0, 1], "r--", lw=1)
                ax.set_title(m, fontsize=8)
                ax.set_xlim(0, 1)
                ax.set_ylim(0, 1)
                ax.set_xlabel("confidence", fontsize=7)
                ax.tick_params(labelsize=6)
            axes[0][0].set_ylabel("accuracy", fontsize=7)
            save(fig, f"reliability_{kind}_N{n}",
                 f"Reliability diagrams (10 bins) on {caption}, N={n}, all seeds pooled.")

    # Best-of-N accuracy vs N.
    if ns:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        methods = []
        for n in ns:
            methods += [m for m in results["terminal"][str(n)] if m not in methods]
        for m in methods:
            xs, ys, es = [], [], []
            for n in ns:
                r = results["terminal"][str(n)].get(m)
                if r is None:
                    continue
                xs.append(n)
                ys.append(r["bon_accuracy"]["mean"])
                es.append(r["bon_accuracy"]["std"] or 0.0)
            if xs:
                ax.errorbar(xs, ys, yerr=es, marker="o", ms=3, capsize=2, label=m)
        msv_pts = [(n, results["terminal"][str(n)][results["methods"][str(n)]["msv"]]["bon_accuracy"]["mean"])
                   for n in ns if results["methods"][str(n)]["msv"] in results["terminal"][str(n)]]
        if msv_pts:
            ax.plot(*zip(*msv_pts), "k-", lw=2.5, alpha=0.5, label="MSV_N")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("N")
        ax.set_ylabel("best-of-N accuracy")
        ax.legend(fontsize=6, ncol=2)
        save(fig, "best_of_n", "Best-of-N accuracy vs N (terminal answers), mean ± std over seeds.")

    # Trade-off curves and Brier per position per N.
    for n in ns:
        cs = curves.get(str(n), {})
        if not cs:
            continue
        msv = results["methods"][str(n)]["msv"]
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
        for m, c in cs.items():
            style = dict(lw=2.2, color="k") if m == msv else dict(lw=1)
            for ax, axis in zip(axes, ("tokens", "latency")):
                order = np.argsort(c.x(axis))
                ax.plot(c.x(axis)[order], c.accuracy[order], label=m, **style)
        axes[0].set_xlabel("chain-of-thought tokens (N sequences)")
        axes[1].set_xlabel("latency (s)")
        for ax in axes:
            ax.set_ylabel("accuracy")
        axes[1].legend(fontsize=6)
        save(fig, f"tradeoff_N{n}", f"Early stopping, N={n}: accuracy vs tokens (left) and vs latency (right) as λ "
             "sweeps 0..1 (+ full decoding), mean over seeds.")
        bp = results["brier_by_position"][str(n)]
        edges = np.asarray([np.inf if e is None else e for e in bp["edges"]], dtype=float)
        mids = [(edges[i] + (edges[i + 1] if np.isfinite(edges[i + 1]) else edges[i] + (edges[i] - edges[i - 1])))
                / 2 for i in range(len(edges) - 1)]
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for m, v in bp.items():
            if m == "edges":
                continue
            ax.plot(mids, [np.nan if x is None else x for x in v], marker="o", ms=3,
                    lw=2.2 if m == msv else 1, label=m)
        ax.set_xlabel("token position τ")
        ax.set_ylabel("Brier")
        ax.legend(fontsize=6)
        save(fig, f"brier_position_N{n}", f"Brier score per token-position bin (streaming answers), N={n}.")
    return figs


# ----------------------------------------------------------------------------------------------------------------
# Markdown
# ----------------------------------------------------------------------------------------------------------------


def _fmt_lambda(stat: dict | None) -> str:
    """λ over seeds: mean ± std of the finite ones, and how many seeds chose ∞ (never stop)."""
    values = [math.inf if v is None else v for v in (stat or {}).get("values", [])]
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "∞" if values else "—"
    text = _fmt(_stat(finite), 2)
    return text + (f" (∞ ×{len(values) - len(finite)})" if len(finite) < len(values) else "")


def _fmt(stat: dict | None, digits: int = 3) -> str:
    if not stat or stat.get("mean") is None:
        return "—"
    s = stat.get("std")
    return f"{stat['mean']:.{digits}f} ± {0.0 if s is None else s:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def render_report(results: dict) -> str:
    """The markdown report of an `evaluate_study` results dict."""
    out = [f"# {results['title']}", ""]
    d = results["data"]
    e = d["eval"]
    out += [f"Evaluation: {e['problems']} problems × {e['sequences_per_problem']} sequences, {e['answers']} answers "
            f"({e['answers_per_sequence']:.2f} per sequence), terminal accuracy {e['terminal_accuracy']:.3f}, "
            f"mean chain of thought {e['mean_sequence_tokens']:.1f} tokens."
            + (f" Validation: {d['val']['problems']} problems." if "val" in d else " No validation split."), "",
            f"Collection: `{json.dumps(d.get('collect', {}))}`", "",
            f"N ∈ {results['config']['num_sequences_list']}, {results['config']['seeds']} seeds (each a random "
            "subset of N collected sequences per problem); mean ± std over seeds. Equivalence classes: "
            + (f"re-derived with `{results['config']['checker']}`." if results['config']['checker'] else
               "as collected.") + f" DeepConf: {results['config']['deepconf_calibration']}.", ""]
    ns = results["config"]["num_sequences_list"]
    for setting, heading in (("terminal", "Terminal answers: calibration and best-of-N"),
                             ("streaming", "Streaming answers: calibration and early stopping")):
        out += [f"## {heading}", ""]
        for n in ns:
            rows = []
            res = results[setting][str(n)]
            msv = results["methods"][str(n)]["msv"]
            for m, r in res.items():
                name = f"**{m}**" if m == msv else m
                if setting == "terminal":
                    rows.append([name] + [_fmt(r.get(k)) for k in ("auroc", "brier", "ece", "nll", "bon_accuracy",
                                                                    "bon_ece", "bon_brier")])
                else:
                    rows.append([name] + [_fmt(r.get(k)) for k in ("auroc", "brier", "ece", "nll", "full_accuracy",
                                                                    "peak_accuracy", "autc_tokens_norm",
                                                                    "autc_latency_norm")])
            header = (["method", "AUROC ↑", "Brier ↓", "ECE ↓", "NLL ↓", "BoN acc ↑", "BoN ECE ↓", "BoN Brier ↓"]
                      if setting == "terminal" else
                      ["method", "AUROC ↑", "Brier ↓", "ECE ↓", "NLL ↓", "acc (full) ↑", "peak acc ↑",
                       "AUTC tokens (norm) ↑", "AUTC latency (norm) ↑"])
            out += [f"### N = {n}", "", _table(header, rows), ""]
            if setting == "streaming":
                es = results["early_stop"].get(str(n), {})
                if "token_fraction" in es:
                    tf = es["token_fraction"]
                    lf = es["latency_fraction"]
                    peak = f"the peak accuracy of the best baseline ({es['best_baseline']}, " \
                           f"{es['best_baseline_peak_accuracy']:.3f})"
                    if tf is None:
                        out += [f"Early stopping: {es['msv']} does not reach {peak} (its peak: "
                                f"{es['msv_peak_accuracy']:.3f}).", ""]
                    else:
                        out += [f"Early stopping: {es['msv']} reaches {peak} with {tf:.2f}× its tokens"
                                + (f" and {lf:.2f}× its latency." if lf is not None else "."), ""]
    lam = results.get("lambda_selection") or {}
    if lam:
        out += ["## λ selection (validation rule and risk-controlled LTT)", "",
                f"Target accuracy per N and seed: {results['config']['target_accuracy'] or str(results['config']['target_fraction']) + ' × the best full-decoding validation accuracy'}; "
                f"LTT with δ = {results['config']['ltt_delta']} (binomial p-values, fixed-sequence testing). "
                "Accuracy / tokens / latency achieved on the evaluation split.", ""]
        for n in ns:
            if str(n) not in lam:
                continue
            rows = []
            for m, rules in lam[str(n)].items():
                for rule, r in rules.items():
                    rows.append([m, rule, _fmt(r["target"]), _fmt_lambda(r["lambda"]), _fmt(r["val_accuracy"]),
                                 _fmt(r["eval_accuracy"]), _fmt(r["eval_tokens"], 1), _fmt(r["eval_latency"], 3),
                                 "—" if rule == "validation" else _fmt(r["certified"], 2)])
            out += [f"### N = {n}", "", _table(["method", "rule", "target", "λ", "val acc", "eval acc",
                                                 "eval tokens", "eval latency (s)", "certified (rate)"], rows), ""]
    c = results["costs"]
    out += ["## Costs", "", f"LM costs ({c['source']}): " + ", ".join(
        f"N={n}: decode step {v['decode_step_s']:.2e} s, elicitation {v['elicit_s']:.2e} s/answer"
        for n, v in c["lm"].items()) + ".", "",
        "Verifier cost measured online (s per answer): " + "; ".join(
            f"N={n}: " + ", ".join(f"{m} {s:.2e}" for m, s in v.items()) for n, v in
            c["verifier_online_s_per_answer"].items()) + ".", ""]
    if results.get("figures"):
        out += ["## Figures", ""]
        for f in results["figures"]:
            out += [f"![{f['caption']}]({f['file']})", "", f"*{f['caption']}*", ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------


def parse_verifier_specs(specs: Sequence[str]) -> dict:
    """``NAME=PATH`` items (repeat a NAME for its terminal and streaming checkpoints) -> the `verifiers` mapping."""
    out: dict = {}
    for spec in specs:
        if "=" not in spec:
            raise ValueError(f"--verifier takes NAME=PATH, got {spec!r}")
        name, path = spec.split("=", 1)
        mode = json.loads((Path(path) / "config.json").read_text()).get("mode", "streaming")
        out.setdefault(name, {})[mode] = path
    return out


def add_evaluate_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``hf-msv evaluate`` options."""
    parser.add_argument("--eval-dir", required=True, help="evaluation shards")
    parser.add_argument("--val-dir", default=None, help="validation shards (DeepConf calibration, λ rules)")
    parser.add_argument("--verifier", action="append", default=[], metavar="NAME=PATH",
                        help="a trained verifier; repeat NAME for its terminal and streaming checkpoints")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--num-sequences", type=int, nargs="+", default=[1, 4, 16, 64], help="N values")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--checker", default=None, help="re-derive equivalence classes with this checker")
    parser.add_argument("--checker-kwargs", type=json.loads, default=None)
    parser.add_argument("--decode-step-s", type=float, default=None, help="LM cost of one decode step (seconds)")
    parser.add_argument("--elicit-s", type=float, default=None, help="LM cost of eliciting one answer (seconds)")
    parser.add_argument("--wv-threshold", type=int, default=16, help="R of streaming weighted voting")
    parser.add_argument("--deepconf-window", type=int, default=2048)
    parser.add_argument("--deepconf-stat", default="lowest_group", choices=["lowest_group", "tail", "mean"])
    parser.add_argument("--target-accuracy", type=float, default=None)
    parser.add_argument("--target-fraction", type=float, default=0.95)
    parser.add_argument("--ltt-delta", type=float, default=0.1)
    parser.add_argument("--no-figures", action="store_true")
    parser.add_argument("--title", default="MSV evaluation")
    parser.add_argument("--report-name", default="report")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def evaluate_from_args(args: argparse.Namespace) -> dict:
    """Run `evaluate_study` from parsed `add_evaluate_arguments` options; prints the report path."""
    costs = None
    if args.decode_step_s is not None or args.elicit_s is not None:
        costs = LatencyCosts(args.decode_step_s or 0.0, args.elicit_s or 0.0)
    results = evaluate_study(args.eval_dir, parse_verifier_specs(args.verifier), args.output_dir,
                             args.num_sequences, args.seeds, args.val_dir, checker=args.checker,
                             checker_kwargs=args.checker_kwargs, lm_costs=costs, wv_threshold=args.wv_threshold,
                             deepconf_window=args.deepconf_window, deepconf_stat=args.deepconf_stat,
                             target_accuracy=args.target_accuracy, target_fraction=args.target_fraction,
                             ltt_delta=args.ltt_delta, figures=not args.no_figures, title=args.title,
                             report_name=args.report_name, progress=not args.no_progress)
    print(json.dumps({"report": str(Path(args.output_dir) / f"{args.report_name}.md"),
                      "json": str(Path(args.output_dir) / f"{args.report_name}.json")}))
    return results


def main(argv=None) -> None:
    parser = add_evaluate_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    evaluate_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    main()
