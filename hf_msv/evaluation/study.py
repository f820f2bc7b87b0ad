"""`evaluate_study`: every baseline, metric, figure and λ rule of the paper over collected shards and trained
verifiers, with mean ± std over seeds (``hf-msv evaluate``).

    from hf_msv.evaluation import evaluate_study
    results = evaluate_study("data/eval", {"Probe": "verifiers/probe", "MSV_1": "verifiers/msv1",
                                           "MSV_16": "verifiers/msv16"}, "reports/eval",
                             num_sequences_list=[1, 4, 16], seeds=5, val_dir="data/val")

Protocol
========

* **Groups and seeds.** Each problem of the evaluation shards has S collected sequences. For N in
  ``num_sequences_list`` and seed s, every problem contributes one group: the N sequences of
  ``np.random.default_rng([s, problem index]).permutation(S)[:N]`` (renumbered 0..N-1 in draw order). A seed is a
  different random subset; every number is reported as mean ± sample std over seeds (`hf_msv.metrics.seed_stat`).
  Groups are drawn by `hf_msv.data.draw_sequences`, read through `hf_msv.data.ShardDataset` and packed for the
  verifiers by `hf_msv.data.collate_groups`: the reader and packer of training.
* **Settings.** *Terminal*: the group's N terminal answers. *Streaming*: every answer of the group (intermediate
  ones elicited at delimiters, and the terminal ones), in time order τ + L.
* **Methods.** Verifier-free: Self-consistency (terminal), Token Probs (geometric mean of the answer-token
  probabilities), DeepConf (lowest-group trace confidence of the chain of thought up to the answer, Platt-scaled on
  the validation split). Trained single-sequence verifiers (the Probe, MSV₁; config ``num_sequences == 1`` or a
  Probe) score every answer independently of the group. Optional *PRM* baseline (``prm``: a Qwen2.5-Math-PRM-style
  process reward model, `hf_msv.evaluation.prm`): each answer scored from the question and the chain of thought up
  to it, decoded from the shards' CoT token ids with the LM's tokenizer. Aggregations ``X+WV``: weighted voting
  over the group's terminal answers (terminal setting) and streaming weighted voting with threshold R = 16 (streaming setting;
  `hf_msv.baselines.streaming_weighted_voting`), for Token Probs, DeepConf, the PRM and every single-sequence
  verifier.
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
* **Early stopping** (`hf_msv.evaluation.early_stop`): the stopping rule replayed over each group's recorded answer
  stream with λ swept over 0..1 (+∞ = full decoding); accuracy vs chain-of-thought tokens and vs latency; AUTC;
  ``early_stop_token_fraction`` of the primary MSV against the baseline with the highest peak accuracy.
  Latency = t*·decode_step_s + (answers seen)·(elicit_s + verify_s): ``decode_step_s`` and ``elicit_s`` come from
  ``lm_costs`` (else the shard's collection info ``latency`` entry, else 0 with a warning); ``verify_s`` is
  *measured* per verifier and N by scoring a few groups online (KV-cached MSV, one call per arrival time), i.e. the
  streaming cost, not the offline batched one; the PRM's is its measured (batched) scoring time per answer.
  Verifier-free methods cost 0.
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

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..data import AnswerGroup, CollectedProblem, ShardDataset, draw_sequences
from ..metrics import best_of_n_metrics, best_of_n_pairs, calibration_metrics, seed_stat
from ..utils import json_safe
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
from .methods import (
    PRM,
    SETTINGS,
    SplitScores,
    add_prm_scores,
    draw_scores,
    fit_deepconf,
    method_label,
    method_plan,
    prepare_split,
)
from .prm import PRMScorer, load_lm_tokenizer, require_cot_token_ids
from .report import render_report, write_figures
from .scoring import lm_cost_for, lm_costs_from_info, measure_verifier_cost
from .verifiers import VerifierEntry, load_verifiers

__all__ = ["evaluate_study"]


@dataclass
class _Study:
    """What every (N, seed) draw of one study shares: the splits, verifiers and protocol settings."""

    split: SplitScores
    val: SplitScores | None
    entries: list[VerifierEntry]
    wv_threshold: int
    max_tokens: int
    lambdas: Sequence[float]
    target_accuracy: float | None
    target_fraction: float
    ltt_delta: float
    cost_groups: int
    edges: np.ndarray = field(default_factory=lambda: np.zeros(0))


@dataclass
class _PerN:
    """Accumulators of one N over seeds."""

    lm: LatencyCosts
    plans: dict
    verify_s: dict = field(default_factory=dict)  # method label -> online seconds per answer
    per_seed: dict = field(default_factory=lambda: {s: {} for s in SETTINGS})  # setting -> method -> metric -> []
    curves: dict = field(default_factory=dict)  # method -> [TradeoffCurve per seed]
    positions: dict = field(default_factory=dict)  # method -> [Brier per position bin, per seed]
    lam_sel: dict = field(default_factory=dict)  # method -> rule -> [per-seed dicts]
    offline: dict = field(default_factory=dict)  # method label -> offline seconds per answer
    reliability: dict = field(default_factory=dict)  # method -> [answer p, answer y, BoN p, BoN y] per seed

    def costs_for(self, method: str) -> LatencyCosts:
        base = method[:-3] if method.endswith("+WV") else method
        return LatencyCosts(self.lm.decode_step_s, self.lm.elicit_s, self.verify_s.get(base, 0.0))


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
    prm: PRMScorer | str | None = None,
    prm_kwargs: dict | None = None,
    lm_tokenizer=None,
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
        prm: the PRM baseline, a `PRMScorer` or a PRM to load with `PRMScorer.from_pretrained(prm, **prm_kwargs)`
            (after checking that the shards keep CoT token ids). None: no PRM.
        lm_tokenizer: decodes the chains of thought for the PRM (a tokenizer, path or Hub id); default: the LM
            tokenizer named in the shards' collection info.
    Returns the results dict also written to ``{output_dir}/{report_name}.json``.
    """
    from tqdm.auto import tqdm

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    ns = sorted({int(n) for n in num_sequences_list})
    entries = load_verifiers(verifiers)
    dataset = ShardDataset(eval_dir, checker=checker, checker_kwargs=checker_kwargs)
    if ns[-1] > dataset.num_sequences:  # the dataset's default N is the fewest sequences any problem has
        raise ValueError(f"N={ns[-1]} requested but some evaluation problems have only {dataset.num_sequences} "
                         "sequences")
    val_data = None if val_dir is None else ShardDataset(val_dir, checker=checker, checker_kwargs=checker_kwargs)
    prm_scorer, lm_tok = _load_prm(prm, prm_kwargs, lm_tokenizer, dataset, val_data)
    splits = [prepare_split(d, entries, deepconf_window, deepconf_stat, max_tokens) if d is not None else None
              for d in (dataset, val_data)]
    split, val = splits
    if prm_scorer is not None:
        for s in filter(None, splits):
            add_prm_scores(s, prm_scorer, lm_tok, progress)
    fit_deepconf(split, val)
    lm_costs, cost_source = _resolve_lm_costs(lm_costs, split.info)
    study = _Study(split, val, entries, wv_threshold, max_tokens, lambdas, target_accuracy, target_fraction,
                   ltt_delta, cost_groups, _position_edges(split.problems, position_bins))

    results: dict = {
        "title": title,
        "config": {"eval_dir": str(eval_dir), "val_dir": None if val_dir is None else str(val_dir),
                   "verifiers": {e.name: {"kind": e.kind, "num_sequences": e.num_sequences,
                                          "modes": sorted(e.models)} for e in entries},
                   "num_sequences_list": ns, "seeds": seeds, "checker": None if checker is None else str(checker),
                   "checker_kwargs": checker_kwargs or {}, "wv_threshold": wv_threshold,
                   "deepconf_window": deepconf_window, "deepconf_stat": deepconf_stat,
                   "target_accuracy": target_accuracy, "target_fraction": target_fraction, "ltt_delta": ltt_delta,
                   "deepconf_calibration": "platt on validation" if val else "platt, 2-fold cross-fit on eval",
                   "prm": None if prm_scorer is None else {
                       "model": prm_scorer.name, "aggregate": prm_scorer.aggregate,
                       "step_separator": prm_scorer.step_separator,
                       "lm_tokenizer": getattr(lm_tok, "name_or_path", "")}},
        "data": _data_summary(split.problems, split.info, val),
        "costs": {"source": cost_source, "lm": {}, "verifier_online_s_per_answer": {},
                  "verifier_offline_s_per_answer": {}, "prm": _prm_cost(split, val)},
        "methods": {}, "terminal": {}, "streaming": {}, "early_stop": {}, "lambda_selection": {},
        "brier_by_position": {}, "figures": [],
    }
    reliability, curves = {}, {}  # for the figures: N -> method -> pooled pairs; str(N) -> method -> mean curve
    bar = tqdm(total=len(ns) * seeds, desc="evaluate", unit="draw", disable=not progress, dynamic_ncols=True)
    for n in ns:
        acc = _PerN(lm_cost_for(lm_costs, n), {s: method_plan(entries, n, s, split) for s in SETTINGS})
        acc.verify_s = _online_costs(study, n, acc.plans)
        if split.prm_cost:
            acc.verify_s[PRM] = split.prm_cost["seconds"] / max(split.prm_cost["answers"], 1)
        for seed in range(seeds):
            _evaluate_draw(study, n, seed, acc)
            bar.update(1)
        _summarise_n(results, n, acc, study.edges)
        reliability[n] = acc.reliability
        curves[str(n)] = {m: _mean_curve(c) for m, c in acc.curves.items()}
    bar.close()

    if figures:
        results["figures"] = write_figures(results, reliability, curves, output_dir, report_name)
    results = json_safe(results)
    (output_dir / f"{report_name}.json").write_text(json.dumps(results, indent=1))
    (output_dir / f"{report_name}.md").write_text(render_report(results))
    return results


def _load_prm(prm, prm_kwargs: dict | None, lm_tokenizer, dataset: ShardDataset, val: ShardDataset | None):
    """(PRMScorer, LM tokenizer) of the PRM baseline, or (None, None) without one. The shards are checked for CoT
    token ids first, so old shards fail before a large PRM is loaded."""
    if prm is None:
        return None, None
    require_cot_token_ids(dataset, "evaluation")
    if val is not None:
        require_cot_token_ids(val, "validation")
    lm_tok = load_lm_tokenizer(dataset.info, lm_tokenizer)
    scorer = prm if isinstance(prm, PRMScorer) else PRMScorer.from_pretrained(prm, **(prm_kwargs or {}))
    return scorer, lm_tok


def _prm_cost(split: SplitScores, val: SplitScores | None) -> dict | None:
    """What the PRM cost per split: answers, tokens forwarded (per answer too), seconds (per answer too)."""
    if split.prm_cost is None:
        return None
    out = {}
    for name, s in (("eval", split), ("val", val)):
        if s is not None and s.prm_cost is not None:
            c, a = s.prm_cost, max(s.prm_cost["answers"], 1)
            out[name] = dict(c, tokens_per_answer=c["tokens"] / a, seconds_per_answer=c["seconds"] / a)
    return out


def _resolve_lm_costs(lm_costs, info: dict) -> tuple[dict, str]:
    """({N or None: LatencyCosts}, where they came from): the argument, else the shards' info, else zeros."""
    if lm_costs is None:
        lm_costs = lm_costs_from_info(info)
        cost_source = "shard collection info" if lm_costs else "none (zeros)"
        if not lm_costs:
            warnings.warn("no LM decode/elicitation costs given or recorded in the shards: latency counts verifier "
                          "time only", RuntimeWarning, stacklevel=3)
    else:
        cost_source = "argument"
    if isinstance(lm_costs, LatencyCosts):
        lm_costs = {None: lm_costs}
    return lm_costs, cost_source


def _online_costs(study: _Study, n: int, plans: dict) -> dict[str, float]:
    """Online verifier cost per answer of each streaming verifier taking part at N, measured once per N on seed 0's
    first groups."""
    problems = study.split.problems
    seqs0 = [draw_sequences(p.num_sequences, n, 0, i) for i, p in enumerate(problems)]
    verify_s = {}
    for e in study.entries:
        model, _ = e.model_for("streaming")
        if model is None or (not e.single_sequence and not any(e is x for x in plans["streaming"]["msv"])):
            continue
        verify_s[method_label(e, n)] = measure_verifier_cost(model, study.split.dataset, seqs0,
                                                             max_groups=study.cost_groups, repeats=2)
    return verify_s


def _evaluate_draw(study: _Study, n: int, seed: int, acc: _PerN) -> None:
    """Every method's metrics on one (N, seed) draw, both settings, into `acc` (and the λ rules with validation)."""
    for setting in SETTINGS:
        groups, offline = draw_scores(study.split, n, seed, setting, study.wv_threshold, study.max_tokens,
                                      acc.plans[setting])
        acc.offline.update(offline)
        for method in _methods_in(groups):
            p, y = _pooled(groups, method)
            row = _quiet(calibration_metrics, p, y)
            bon = _quiet(best_of_n_metrics, groups, method)
            row |= {f"bon_{k}": v for k, v in bon.items()}
            if setting == "streaming":
                row |= _streaming_metrics(study, groups, method, acc)
            for k, v in row.items():
                acc.per_seed[setting].setdefault(method, {}).setdefault(k, []).append(v)
            if setting == "terminal":
                rp = acc.reliability.setdefault(method, [[], [], [], []])
                bp, by = best_of_n_pairs(groups, method)
                for store, value in zip(rp, (p, y, bp, by)):
                    store.append(value)
        if setting == "streaming" and study.val is not None:
            _lambda_rules(study, n, seed, acc, groups)


def _streaming_metrics(study: _Study, groups: list[AnswerGroup], method: str, acc: _PerN) -> dict:
    """Early-stopping metrics of one method on one draw (and its curve and Brier by position, kept in `acc`)."""
    acc.positions.setdefault(method, []).append(_brier_by_position(groups, method, study.edges))
    c = tradeoff_curve(groups, method, study.lambdas, acc.costs_for(method))
    acc.curves.setdefault(method, []).append(c)
    return {"autc_tokens": autc(c, "tokens"), "autc_tokens_norm": autc(c, "tokens", True),
            "autc_latency": autc(c, "latency"), "autc_latency_norm": autc(c, "latency", True),
            "full_accuracy": float(c.accuracy[np.argmax(c.lambdas)]), "peak_accuracy": float(c.accuracy.max()),
            "full_tokens": float(c.tokens.max()), "full_latency": float(c.latency.max())}


def _summarise_n(results: dict, n: int, acc: _PerN, edges: np.ndarray) -> None:
    """Write N's seed-aggregated numbers into `results`."""
    key = str(n)
    plans = acc.plans
    primary = plans["streaming"]["primary"] or plans["terminal"]["primary"]
    results["costs"]["lm"][key] = asdict(acc.lm)
    results["costs"]["verifier_online_s_per_answer"][key] = dict(acc.verify_s)
    results["costs"]["verifier_offline_s_per_answer"][key] = dict(acc.offline)
    results["methods"][key] = {
        "terminal": list(acc.per_seed["terminal"]), "streaming": list(acc.per_seed["streaming"]),
        "msv": None if primary is None else method_label(primary, n),
        "grouped": bool(plans["streaming"]["grouped"] or plans["terminal"]["grouped"]),
        "single_sequence": list(plans["terminal"]["base"]),
        "multi_sequence": sorted({method_label(e, n) for s in SETTINGS for e in plans[s]["msv"]}),
    }
    for s in SETTINGS:
        results[s][key] = {m: {k: seed_stat(v) for k, v in d.items()} for m, d in acc.per_seed[s].items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # empty bins stay nan
        results["brier_by_position"][key] = {
            "edges": edges.tolist(), **{m: np.nanmean(np.asarray(v, dtype=float), axis=0).tolist()
                                        for m, v in acc.positions.items()}}
    results["early_stop"][key] = _early_stop_summary(acc.curves, results["methods"][key]["msv"],
                                                     results["methods"][key]["multi_sequence"])
    if acc.lam_sel:
        results["lambda_selection"][key] = {m: {rule: _summarise_rule(vals) for rule, vals in d.items()}
                                            for m, d in acc.lam_sel.items()}


# ----------------------------------------------------------------------------------------------------------------
# λ rules
# ----------------------------------------------------------------------------------------------------------------


def _lambda_rules(study: _Study, n: int, seed: int, acc: _PerN, eval_groups: list[AnswerGroup]) -> None:
    """Both λ rules of every streaming method on the same (N, seed) draw of validation, applied to `eval_groups`."""
    vgroups, _ = draw_scores(study.val, n, seed, "streaming", study.wv_threshold, study.max_tokens,
                             dict(acc.plans["streaming"]))
    methods = _methods_in(eval_groups)
    vcurves = {m: tradeoff_curve(vgroups, m, study.lambdas, acc.costs_for(m)) for m in methods}
    if study.target_accuracy is None:
        full = max(float(c.accuracy[np.argmax(c.lambdas)]) for c in vcurves.values())
        target = study.target_fraction * full
    else:
        target = float(study.target_accuracy)
    for m in methods:
        lam = _quiet(select_lambda_validation, vcurves[m], target_accuracy=target)
        ev = tradeoff_curve(eval_groups, m, [lam], acc.costs_for(m))
        vi = int(np.flatnonzero(vcurves[m].lambdas == lam)[0]) if np.any(vcurves[m].lambdas == lam) else -1
        acc.lam_sel.setdefault(m, {}).setdefault("validation", []).append(
            {"target": target, "lambda": lam, "val_accuracy": float(vcurves[m].accuracy[vi]),
             "val_tokens": float(vcurves[m].tokens[vi]), "eval_accuracy": float(ev.accuracy[0]),
             "eval_tokens": float(ev.tokens[0]), "eval_latency": float(ev.latency[0]), "certified": math.nan})
        ltt = select_lambda_ltt(vgroups, m, target, delta=study.ltt_delta, lambdas=study.lambdas,
                                eval_groups=eval_groups, eval_scores=m, costs=acc.costs_for(m))
        acc.lam_sel[m].setdefault("ltt", []).append(
            {"target": target, "lambda": ltt.lam, "val_accuracy": ltt.val_accuracy, "val_tokens": ltt.val_tokens,
             "eval_accuracy": ltt.eval_accuracy, "eval_tokens": ltt.eval_tokens, "eval_latency": ltt.eval_latency,
             "certified": float(ltt.certified)})


def _summarise_rule(values: list[dict]) -> dict:
    keys = values[0].keys()
    return {k: seed_stat([v[k] if v[k] is not None else math.nan for v in values]) for k in keys}


# ----------------------------------------------------------------------------------------------------------------
# Aggregation helpers
# ----------------------------------------------------------------------------------------------------------------


def _methods_in(groups: list[AnswerGroup]) -> list[str]:
    return list(groups[0].scores) if groups else []


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


def _data_summary(problems: list[CollectedProblem], info: dict, val: SplitScores | None) -> dict:
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
