"""The reproduction's summary entries, distilled from `hf_msv.evaluation.evaluate_study` results (pure functions).

Results hold, per N (as a string), ``terminal`` / ``streaming`` metrics per method, each a seed statistic
``{"mean", "std", "values"}``; these functions keep the numbers the claims and ``testbed.md`` use. They read the
results as a `hf_msv.evaluation.results.StudyResults` (a results dict, e.g. loaded JSON, is read into one first),
and return the summary's typed entries (`hf_msv.reproduction.results`), built as the JSON the summary holds and
read through the typed model, so ``to_json()`` is what is written to disk and read back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..evaluation.results import MethodMetrics, SeedStat, StudyResults, as_study_results
from .results import DelimiterRow, GroupingStudy, MainStudySummary, SizeRow

__all__ = [
    "stat_mean",
    "best_method",
    "best_bon_baseline",
    "main_summary",
    "autc_row",
    "grouping_summary",
    "size_row",
    "VOTE_TOLERANCE",
    "vote_check_rows",
]

# How far below the vote's evaluation AUROC an MSV fit may be and still count as "at the vote".
VOTE_TOLERANCE = 0.005
# The vote each setting compares against: self-consistency on terminal answers, each sequence's latest answer when
# streaming (what the MSV's γ feature is); both computed with the evaluation's own equivalence classes.
_VOTES = {"terminal": "Self-consistency", "streaming": "Latest-answer vote"}


def stat_mean(stat: SeedStat | Mapping | None) -> float:
    """The mean of a seed statistic (a `SeedStat` or its dict; nan when missing or undefined)."""
    mean = stat.mean if isinstance(stat, SeedStat) else (stat.get("mean") if stat else None)
    return math.nan if mean is None else float(mean)


def _metric(metrics: MethodMetrics | Mapping, name: str):
    """One metric's seed statistic of a method's metrics (typed, or a {metric: statistic} dict)."""
    return metrics.stat(name) if isinstance(metrics, MethodMetrics) else metrics[name]


def best_method(methods: Mapping, names, key: str, lower: bool) -> tuple[str | None, float]:
    """Among `names` present in `methods` (method -> `MethodMetrics` or its dict), the one with the lowest (or
    highest) mean `key`.

    Args:
        methods: method -> its metrics.
        names: the candidates.
        key: the metric.
        lower: whether lower is better.

    Returns:
        ``(method, mean)``, or ``(None, nan)`` when no candidate has the metric.
    """
    means = [(name, stat_mean(_metric(methods[name], key))) for name in names if name in methods]
    means = [(name, mean) for name, mean in means if not math.isnan(mean)]
    if not means:
        return None, math.nan
    return (min if lower else max)(means, key=lambda pair: pair[1])


def best_bon_baseline(terminal: Mapping, msv: str | None) -> tuple[str | None, float]:
    """The method other than `msv` with the highest best-of-N accuracy (the C2 comparison)."""
    return best_method(terminal, [m for m in terminal if m != msv], "bon_accuracy", lower=False)


def _stats(r: MethodMetrics, names) -> dict:
    """{name: seed statistic dict} of `names` (each required: a missing metric is a KeyError)."""
    return {x: r.metrics[x].to_dict() for x in names}


def main_summary(res: StudyResults | Mapping, num_sequences) -> MainStudySummary:
    """Per N: MSV_N and every baseline's terminal Brier / AUROC / best-of-N accuracy (and ECE/Brier of best-of-N),
    streaming AUROC / Brier, and the early-stop token fraction.

    Args:
        res: the main study's results (a `StudyResults` or its dict).
        num_sequences: the N values to summarise.

    Returns:
        The `MainStudySummary`: str(N) -> that N's `MainRow`, plus the study's ``data`` and ``figures``.
    """
    res = as_study_results(res)
    out = {}
    for n in num_sequences:
        k = str(n)
        roster = res.methods[k]
        msv = roster.msv
        term, stream, es = res.terminal[k], res.streaming[k], res.early_stop.get(k)
        lam = res.lambda_selection.get(k, {})
        out[k] = {
            "msv": msv,
            "multi_sequence": list(roster.multi_sequence),
            "terminal": {
                m: _stats(r, ("brier", "auroc", "ece", "nll", "bon_accuracy", "bon_ece", "bon_brier"))
                for m, r in term.items()
            },
            "streaming": {
                m: _stats(
                    r,
                    (
                        "auroc",
                        "brier",
                        "ece",
                        "nll",
                        "autc_tokens",
                        "autc_tokens_norm",
                        "autc_latency_norm",
                        "full_accuracy",
                        "peak_accuracy",
                    ),
                )
                for m, r in stream.items()
            },
            "early_stop_token_fraction": None if es is None else es.token_fraction,
            "early_stop_token_fraction_per_seed": None if es is None else es.token_fraction_per_seed,
            "early_stop_latency_fraction": None if es is None else es.latency_fraction,
            "early_stop_best_baseline": None if es is None else es.best_baseline,
            "early_stop_best_baseline_peak_accuracy": None if es is None else es.best_baseline_peak_accuracy,
            "early_stop_msv_peak_accuracy": None if es is None else es.msv_peak_accuracy,
            "lambda_selection": {m: {rule: r.to_dict() for rule, r in rules.items()} for m, rules in lam.items()},
            "verifier_online_s_per_answer": res.costs.verifier_online_s_per_answer.get(k, {}),
            "lm_costs": res.costs.lm.get(k),
        }
        # results of the training-seed protocol (older results have neither): intervals over problems of MSV_N −
        # each baseline, and the early-stop comparisons on every axis against the single-sequence / all baselines
        if res.intervals.get(k):
            out[k]["intervals"] = res.intervals_dict(k)
        if res.by_difficulty.get(k):
            out[k]["by_difficulty"] = res.by_difficulty[k]
        if es is not None and es.comparisons is not None:
            out[k]["early_stop_comparisons"] = {name: c.to_dict() for name, c in es.comparisons.items()}
            out[k]["streaming"] = {
                m: _stats(r, (*out[k]["streaming"][m], "autc_steps_norm")) for m, r in stream.items()
            }
    out["data"] = res.data
    out["figures"] = [f.to_dict() for f in res.figures]
    return MainStudySummary.from_json(out)


def autc_row(res: StudyResults | Mapping, n: int, methods) -> DelimiterRow:
    """Streaming AUTC over tokens (raw and normalised) and over t* (normalised, when the results have it) of
    `methods` at `n`; the multi-sequence MSV is "MSV_N".

    Args:
        res: a study's results (a `StudyResults` or its dict).
        n: N.
        methods: the methods wanted (those evaluated are kept).

    Returns:
        The `DelimiterRow`: method -> its AUTC statistics (answers per sequence not set).
    """
    stream = as_study_results(res).streaming[str(n)]
    keys = ("autc_tokens", "autc_tokens_norm", "autc_steps_norm")  # t* only in results of the seed protocol
    row = {
        ("MSV_N" if m.startswith("MSV_") and m != "MSV_1" else m): _stats(
            stream[m], [k for k in keys if k in stream[m]]
        )
        for m in methods
        if m in stream
    }
    return DelimiterRow.from_json(row)


def _per_metric(stream: dict[str, MethodMetrics], name: str) -> dict[str, dict]:
    """{method: its `name` statistic as a dict} of one N's streaming metrics."""
    return {m: r.metrics[name].to_dict() for m, r in stream.items()}


def grouping_summary(res: StudyResults | Mapping, grouping_ns, grouping_m: int) -> GroupingStudy:
    """Per N of the grouping study: each method's accuracy-latency / accuracy-token AUTC, peak accuracy, verifier
    cost and full-budget latency, and the early-stop comparison; plus the trade-off figures.

    Args:
        res: the grouping study's results (a `StudyResults` or its dict).
        grouping_ns: the N values of the study.
        grouping_m: the group size M.

    Returns:
        The `GroupingStudy`: ``m``, a `GroupingRow` per str(N), the trade-off figures.
    """
    res = as_study_results(res)
    out = {"m": grouping_m, "per_n": {}}
    for n in grouping_ns:
        k = str(n)
        stream = res.streaming[k]
        es = res.early_stop[k]
        out["per_n"][k] = {
            "msv": res.msv(k),
            "autc_latency_norm": _per_metric(stream, "autc_latency_norm"),
            "autc_tokens_norm": _per_metric(stream, "autc_tokens_norm"),
            "peak_accuracy": _per_metric(stream, "peak_accuracy"),
            "verifier_online_s_per_answer": res.costs.verifier_online_s_per_answer.get(k, {}),
            "full_latency": _per_metric(stream, "full_latency"),
            "early_stop": {
                "best_baseline": es.best_baseline,
                "token_fraction": es.token_fraction,
                "latency_fraction": es.latency_fraction,
            },
        }
    out["figures"] = [f.to_dict() for f in res.figures if "tradeoff" in f.file]
    return GroupingStudy.from_json(out)


def size_row(res: StudyResults | Mapping, n: int) -> SizeRow:
    """One training-set size: the Probe's and MSV_n's calibration, best-of-n against the best baseline (the C2
    gap) and MSV_n's early-stop token fraction (C3).

    Args:
        res: the study's results at that size (a `StudyResults` or its dict).
        n: N.

    Returns:
        The `SizeRow`.
    """
    results = as_study_results(res)
    key = str(n)
    terminal, streaming = results.terminal[key], results.streaming[key]
    early_stop = results.early_stop.get(key)
    msv = results.msv(key)
    baseline, baseline_accuracy = best_bon_baseline(terminal, msv)
    row = {
        "msv": msv,
        "terminal": {
            method: _stats(terminal[method], ("brier", "auroc", "bon_accuracy"))
            for method in ("Probe", msv, "Self-consistency", "Probe+WV")
            if method in terminal
        },
        "streaming": {
            method: _stats(streaming[method], ("brier", "auroc", "peak_accuracy"))
            for method in ("Probe", msv, "Probe+WV")
            if method in streaming
        },
        "bon_best_baseline": baseline,
        "bon_best_baseline_value": baseline_accuracy,
        "bon_gain": stat_mean(terminal[msv].stat("bon_accuracy")) - baseline_accuracy if msv in terminal else math.nan,
        "early_stop_best_baseline": None if early_stop is None else early_stop.best_baseline,
        "early_stop_token_fraction": None if early_stop is None else early_stop.token_fraction,
    }
    return SizeRow.from_json(row)


def vote_check_rows(res: StudyResults | Mapping, study: str) -> list[dict[str, Any]]:
    """Every MSV fit of one evaluation against the vote it is fed (γ), per N and setting: AUROC mean over training
    seeds, the vote's, their difference and whether it is within `VOTE_TOLERANCE` (AUROC does not split into
    per-problem terms, so there is no paired interval here: the spread over training seeds is the ± of `auroc`)."""
    res = as_study_results(res)
    rows = []
    for k, methods in res.methods.items():
        for setting, vote in _VOTES.items():
            per = res.setting(setting).get(k, {})
            if vote not in per:
                continue
            v = stat_mean(per[vote].stat("auroc"))
            for m in methods.multi_sequence:
                if m not in per:
                    continue
                auroc = per[m].stat("auroc")
                a = stat_mean(auroc)
                rows.append(
                    {
                        "study": study,
                        "n": int(k),
                        "setting": setting,
                        "method": m,
                        "vote": vote,
                        "auroc": None if auroc is None else auroc.to_dict(),
                        "vote_auroc": v,
                        "difference": a - v,
                        "at_vote": bool(a - v >= -VOTE_TOLERANCE),
                    }
                )
    return rows
