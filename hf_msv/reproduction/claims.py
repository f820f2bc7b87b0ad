"""The paper's claims tested on the reproduction's numbers (`compute_claims`): pure functions from the summary (a
`ReproductionResults`, or its dict) to verdicts ``{"id", "claim", "paper", "held", "sentence", "numbers"}``
(``held``: True, False, or None when not testable), in report order. A main-study verdict is "held" only if its
paired bootstrap 95 % interval clears the target; summaries without intervals get point verdicts.
See ``docs/reproduction.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from ..evaluation.results import EarlyStopComparison, Interval, MethodMetrics, SeedStat
from .config import ReproduceConfig
from .paper import PAPER
from .results import (
    CheckerRow,
    GroupingStudy,
    MainRow,
    MainStudySummary,
    ReproductionResults,
    SizeRow,
    as_reproduction_results,
    required,
)
from .summary import best_bon_baseline, best_method, stat_mean

__all__ = [
    "SINGLE_SEQUENCE",
    "VOTE_BASELINES",
    "compute_claims",
    "config_of",
    "make_claim",
    "main_claims",
    "checker_claims",
    "mask_claims",
    "delimiter_claims",
    "grouping_claims",
    "training_size_claims",
]

# The single-sequence verifiers (and trace-confidence baselines) MSV_N must beat on calibration (C1, C4).
SINGLE_SEQUENCE = ("Token Probs", "DeepConf", "Probe", "MSV_1")
# The baselines built on the vote that MSV_N's Brier is also held against (when the summary has them).
VOTE_BASELINES = ("Self-consistency (calibrated)", "Stacked (vote + Probe)")


def _end(interval: Interval, which: str) -> float:
    """An interval end (``"low"`` or ``"high"``), with null (JSON for an infinite end) read as +∞."""
    value = getattr(interval, which)
    return math.inf if value is None else float(value)


def _bound_text(value: float, digits: int) -> str:
    return "∞" if math.isinf(value) else f"{value:.{digits}f}"


def _ci(interval: Interval, scale: float = 1.0, digits: int = 3, transform=None) -> str:
    """ "[low, high]" of an interval, scaled or transformed (e.g. ratio -> reduction, which swaps the ends)."""
    low, high = _end(interval, "low") * scale, _end(interval, "high") * scale
    if transform is not None:
        low, high = sorted((transform(low), transform(high)))
    return f"[{_bound_text(low, digits)}, {_bound_text(high, digits)}]"


def _fraction_text(fraction: float | None) -> str:
    """A budget fraction, ∞ (null) when the MSV never reaches the peak."""
    return "∞" if fraction is None else f"{fraction:.2f}"


def _interval_numbers(interval: Interval | None) -> dict:
    """The ``interval`` entry of a claim's numbers (none without an interval: older summaries)."""
    return {} if interval is None else {"interval": interval.to_dict()}


def make_claim(cid: str, text: str, paper: str, held: bool | None, sentence: str, **numbers) -> dict[str, Any]:
    """One claim; `sentence` is prefixed with the verdict `held` stands for.

    Args:
        cid: the claim's id (its prefix names the report section).
        text: the claim.
        paper: the paper's evidence.
        held: True, False, or None (not testable).
        sentence: the verdict sentence, without its verdict.
        **numbers: the numbers the verdict was reached on.

    Returns:
        ``{"id", "claim", "paper", "held", "sentence", "numbers"}``.
    """
    verdict = "Held" if held else ("Not testable" if held is None else "Did not hold")
    return {
        "id": cid,
        "claim": text,
        "paper": paper,
        "held": held,
        "sentence": f"{verdict}: {sentence}",
        "numbers": numbers,
    }


def _headline_ns(ns: list[int]) -> list[int]:
    """The N the paper's headline tables report (16 and 64), or the largest N > 1 of a smaller run."""
    return [n for n in (16, 64) if n in ns] or ns[-1:]


def _msv_mean(methods: dict[str, MethodMetrics], msv: str | None, metric: str) -> float:
    """The MSV's seed mean of `metric` (nan when the MSV was not evaluated)."""
    return stat_mean(methods[msv].stat(metric)) if msv in methods else math.nan


def _reduction(ratio: float) -> float:
    """A Brier ratio (MSV ÷ baseline) as the reduction it stands for."""
    return 1 - ratio


def _terminal_brier(main: MainStudySummary, n: int) -> dict:
    """C1: terminal Brier ≥ 20 % lower than the best single-sequence baseline at `n`."""
    row = main.row(n)
    msv, terminal = row.msv, required(row.terminal, f"terminal metrics at N={n}")
    baseline, baseline_brier = best_method(terminal, [name for name in SINGLE_SEQUENCE if name != msv], "brier", True)
    ours = _msv_mean(terminal, msv, "brier")
    reduction = 1 - ours / baseline_brier if baseline_brier and not math.isnan(ours) else math.nan
    paper = PAPER["terminal"].get(str(n), {}).get("MSV_N", {}).get("brier")
    paper_best = min(PAPER["terminal"]["1"][name]["brier"] for name in ("Probe", "MSV_1", "PRM"))
    interval = row.interval("terminal", baseline, "brier_ratio")
    if math.isnan(reduction):
        held = None
    else:
        held = bool(reduction >= 0.20 if interval is None else _end(interval, "high") <= 0.80)
    return make_claim(
        f"terminal_brier_N{n}",
        f"MSV_{n} terminal Brier ≥ 20 % lower than the best single-sequence baseline",
        f"AIME: MSV_N {paper} vs best single-sequence {paper_best} ({1 - paper / paper_best:.0%} lower)"
        if paper
        else "—",
        held,
        f"at N={n}, {msv} Brier {ours:.4f} vs {baseline} {baseline_brier:.4f} ("
        + (f"{reduction:.0%} lower" if reduction >= 0 else f"{-reduction:.0%} higher")
        + (
            "; needed ≥ 20 % lower)."
            if interval is None
            else f"; 95 % interval of the reduction {_ci(interval, transform=_reduction, digits=2)}, needed ≥ 0.20 "
            "throughout)."
        ),
        msv=ours,
        best_baseline=baseline,
        best_baseline_value=baseline_brier,
        reduction=reduction,
        **_interval_numbers(interval),
    )


def _brier_vs_votes(main: MainStudySummary, n: int) -> list[dict[str, Any]]:
    """MSV_N's terminal Brier below the vote baselines' (calibrated self-consistency, stacked), interval < 0; only
    for summaries that have them."""
    row = main.row(n)
    msv, terminal = row.msv, required(row.terminal, f"terminal metrics at N={n}")
    intervals = {baseline: row.interval("terminal", baseline, "brier") for baseline in VOTE_BASELINES}
    intervals = {b: interval for b, interval in intervals.items() if b in terminal and interval is not None}
    if not intervals or msv not in terminal:
        return []
    ours = _msv_mean(terminal, msv, "brier")
    return [
        make_claim(
            f"terminal_brier_vs_votes_N{n}",
            f"MSV_{n} terminal Brier below calibrated self-consistency's and the stacked [vote, Probe] baseline's",
            "— (not in the paper: the recalibrated vote is what MSV_N's Brier gain could be)",
            bool(all(_end(interval, "high") < 0 for interval in intervals.values())),
            f"at N={n}, {msv} Brier {ours:.4f}; "
            + "; ".join(
                f"vs {b} {stat_mean(terminal[b].stat('brier')):.4f} (difference {interval.estimate:+.4f}, 95 % "
                f"interval {_ci(interval, digits=4)})"
                for b, interval in intervals.items()
            )
            + " (needed: every interval below 0).",
            msv=ours,
            intervals={b: interval.to_dict() for b, interval in intervals.items()},
        )
    ]


def _best_of_n(main: MainStudySummary, n: int) -> dict:
    """C2: MSV_N's best-of-N accuracy ≥ the best baseline's + 2 pp."""
    row = main.row(n)
    msv, terminal = row.msv, required(row.terminal, f"terminal metrics at N={n}")
    baseline, baseline_accuracy = best_bon_baseline(terminal, msv)
    ours = _msv_mean(terminal, msv, "bon_accuracy")
    gain = ours - baseline_accuracy
    paper = PAPER["bon_accuracy"].get(str(n), {})
    paper_best = max((value for name, value in paper.items() if name != "MSV_N"), default=None)
    interval = row.interval("terminal", baseline, "bon_accuracy")
    held = None if math.isnan(gain) else bool(gain >= 0.02 if interval is None else _end(interval, "low") >= 0.02)
    return make_claim(
        f"best_of_{n}",
        f"{msv} best-of-{n} accuracy ≥ best baseline + 2 pp",
        f"AIME: MSV_N {paper.get('MSV_N')} vs best baseline {paper_best:.4f}" if paper else "—",
        held,
        f"{msv} best-of-{n} {ours:.3f} vs {baseline} {baseline_accuracy:.3f} ({100 * gain:+.1f} pp; "
        + (
            "needed ≥ +2 pp)."
            if interval is None
            else f"95 % interval {_ci(interval, 100, 1)} pp, needed ≥ +2 pp throughout)."
        ),
        msv=ours,
        best_baseline=baseline,
        best_baseline_value=baseline_accuracy,
        gain=gain,
        **_interval_numbers(interval),
    )


def _early_stop(main: MainStudySummary, n: int) -> dict:
    """C3: MSV_N reaches the best baseline's peak accuracy with ≤ 0.40 of its tokens (None: it never does)."""
    row = main.row(n)
    fraction, baseline = row.early_stop_token_fraction, row.early_stop_best_baseline
    held = None if fraction is None and baseline is None else (fraction is not None and fraction <= 0.40)
    return make_claim(
        f"early_stop_N{n}",
        f"{row.msv} reaches the best baseline's peak accuracy with ≤ 0.40 of its tokens",
        PAPER["early_stop"]["token_fraction_statement"],
        held,
        f"at N={n}, {row.msv} needs "
        + (f"{fraction:.2f}× the tokens" if fraction is not None else "— (never reaches the peak; fraction ∞)")
        + f" of {baseline} to reach its peak accuracy "
        f"{(row.early_stop_best_baseline_peak_accuracy or math.nan):.3f} (needed ≤ 0.40).",
        fraction=fraction,
        best_baseline=baseline,
    )


_EARLY_STOP_POOLS = (
    ("single_sequence", "", "the best single-sequence baseline's"),
    ("all", "_all", "the best baseline's (aggregations included)"),
)


def _early_stop_against(row: MainRow, n: int, suffix: str, text: str, comparison: EarlyStopComparison) -> dict:
    """C3 on t* against one pool's best baseline: held if the fraction's 95 % interval is ≤ 0.40 (the point
    fraction without an interval)."""
    steps = comparison.steps
    fraction, interval = steps.fraction, steps.interval
    held = (
        bool(_end(interval, "high") <= 0.40) if interval is not None else (fraction is not None and fraction <= 0.40)
    )
    return make_claim(
        f"early_stop{suffix}_N{n}",
        text,
        PAPER["early_stop"]["token_fraction_statement"],
        held,
        f"at N={n}, {row.msv} needs {_fraction_text(fraction)}× the token position t* of {comparison.baseline} to "
        f"reach its peak accuracy {comparison.baseline_peak_accuracy:.3f}"
        + (f" (95 % interval {_ci(interval, digits=2)})" if interval is not None else "")
        + f"; {_fraction_text(comparison.latency.fraction)}× its latency, "
        f"{_fraction_text(comparison.tokens.fraction)}× its summed tokens "
        "(needed: t* fraction ≤ 0.40" + (" throughout the interval)." if interval is not None else ")."),
        fraction=fraction,
        interval=None if interval is None else interval.to_dict(),
        best_baseline=comparison.baseline,
        latency_fraction=comparison.latency.fraction,
        token_fraction=comparison.tokens.fraction,
    )


def _early_stop_twice(main: MainStudySummary, n: int) -> list[dict[str, Any]]:
    """C3 on the paper's axis (token position t*), stated twice: against the best single-sequence baseline (the
    paper's sentence) and against the best of all baselines. Older summaries (no comparisons): the single
    tokens-axis claim `_early_stop`."""
    row = main.row(n)
    comparisons = row.early_stop_comparisons
    if not comparisons:
        return [_early_stop(main, n)]
    claims = []
    for pool, suffix, whose in _EARLY_STOP_POOLS:
        text = f"{row.msv} reaches {whose} peak accuracy with ≤ 0.40 of its token position t*"
        comparison = comparisons.get(pool)
        if comparison is None:
            claims.append(
                make_claim(
                    f"early_stop{suffix}_N{n}",
                    text,
                    PAPER["early_stop"]["token_fraction_statement"],
                    None,
                    f"at N={n}, no such baseline was evaluated.",
                )
            )
        else:
            claims.append(_early_stop_against(row, n, suffix, text, comparison))
    return claims


def _streaming_brier(main: MainStudySummary, n: int) -> dict:
    """C4: MSV_N's streaming Brier below every single-sequence baseline's (and their weighted-voting variants)."""
    row = main.row(n)
    msv, streaming = row.msv, required(row.streaming, f"streaming metrics at N={n}")
    names = [name for name in SINGLE_SEQUENCE + tuple(f"{single}+WV" for single in SINGLE_SEQUENCE) if name != msv]
    baseline, baseline_brier = best_method(streaming, names, "brier", True)
    ours = _msv_mean(streaming, msv, "brier")
    paper = PAPER["streaming"].get(str(n), {}).get("MSV_N", {}).get("brier")
    interval = row.interval("streaming", baseline, "brier")
    if math.isnan(ours) or baseline is None:
        held = None
    else:
        held = bool(ours < baseline_brier if interval is None else _end(interval, "high") < 0)
    return make_claim(
        f"streaming_brier_N{n}",
        f"{msv} streaming Brier below every single-sequence baseline (and its WV)",
        f"AIME: MSV_N {paper}, best baseline {min(values['brier'] for values in PAPER['streaming']['1'].values())}"
        if paper
        else "—",
        held,
        f"at N={n}, {msv} streaming Brier {ours:.4f} vs best baseline {baseline} {baseline_brier:.4f}"
        + ("." if interval is None else f" (difference 95 % interval {_ci(interval, digits=4)}, needed below 0)."),
        msv=ours,
        best_baseline=baseline,
        best_baseline_value=baseline_brier,
        **_interval_numbers(interval),
    )


def _bon_ece(main: MainStudySummary, n: int) -> dict:
    """C5: MSV_N's best-of-N confidence has a lower ECE than every baseline's."""
    row = main.row(n)
    msv, terminal = row.msv, required(row.terminal, f"terminal metrics at N={n}")
    baseline, baseline_ece = best_method(terminal, [name for name in terminal if name != msv], "bon_ece", True)
    ours = _msv_mean(terminal, msv, "bon_ece")
    paper = PAPER["bon_calibration"].get(str(n), {})
    interval = row.interval("terminal", baseline, "bon_ece")
    if math.isnan(ours) or baseline is None:
        held = None
    else:
        held = bool(ours < baseline_ece if interval is None else _end(interval, "high") < 0)
    paper_best = min((values["ece"] for name, values in paper.items() if name != "MSV_N"), default=None)
    return make_claim(
        f"bon_ece_N{n}",
        f"{msv} best-of-{n} confidence better calibrated (ECE) than every baseline's",
        f"AIME: MSV_N ECE {paper['MSV_N']['ece']} vs best baseline {paper_best}" if paper else "—",
        held,
        f"at N={n}, best-of-{n} ECE {ours:.3f} for {msv} vs {baseline_ece:.3f} for {baseline}"
        + ("." if interval is None else f" (difference 95 % interval {_ci(interval)}, needed below 0)."),
        msv=ours,
        best_baseline=baseline,
        best_baseline_value=baseline_ece,
        **_interval_numbers(interval),
    )


def main_claims(summary: ReproductionResults | Mapping, config: ReproduceConfig) -> list[dict[str, Any]]:
    """C1-C5 on the main study: terminal Brier, best-of-N, early stopping, streaming Brier, best-of-N ECE.

    Args:
        summary: the reproduction's summary (typed, or its dict).
        config: the settings the summary was produced with.

    Returns:
        The claims, in report order.
    """
    main = required(as_reproduction_results(summary).main, "main study")
    ns = [n for n in config.num_sequences if n > 1]
    headline = _headline_ns(ns)
    claims = [_terminal_brier(main, n) for n in headline]
    claims += [claim for n in headline for claim in _brier_vs_votes(main, n)]
    claims.append(_best_of_n(main, ns[-1] if ns else config.max_n))
    claims += [claim for n in headline for claim in _early_stop_twice(main, n)]
    claims += [_streaming_brier(main, n) for n in ns]
    claims += [_bon_ece(main, n) for n in headline]
    return claims


def _checker_drops(rows: dict[str, CheckerRow], method: str) -> dict[str, float]:
    """Per weak checker, how much `method`'s best-of-N accuracy drops from the reference checker's."""
    reference = rows["reference"].methods if "reference" in rows else {}
    return {
        checker: stat_mean(reference.get(method)) - stat_mean(row.methods.get(method))
        for checker, row in rows.items()
        if checker != "reference"
    }


def _checker_robustness(n: int, drops: dict[str, float], wv_drops: dict[str, float]) -> dict:
    """MSV_N trained with a weak checker loses ≤ 1.2 pp (not testable without a weak checker)."""
    if not drops:
        return make_claim("checker_robustness", "—", "—", None, "no weak checker")
    worst = max(drops, key=lambda checker: drops[checker])
    return make_claim(
        "checker_robustness",
        f"MSV_{n} trained with a weak checker loses ≤ 1.2 pp of best-of-{n} accuracy",
        "Omni-MATH: ≤ 0.4 pp (embedding), ≤ 1.2 pp (random); Probe+WV loses 2.0 / 7.5 pp",
        bool(all(drop <= 0.012 for drop in drops.values())),
        (
            f"largest drop {100 * drops[worst]:+.1f} pp ({worst}); Probe+WV drops "
            + ", ".join(f"{checker} {100 * drop:+.1f} pp" for checker, drop in wv_drops.items())
            + "."
        ),
        drops=drops,
        probe_wv_drops=wv_drops,
    )


def _logit_averaging(n: int, without: float, main_row: MainRow) -> dict:
    """Logit averaging raises MSV_N's best-of-N: the main study's (with) against the reference-checker run's."""
    terminal = required(main_row.terminal, f"terminal metrics at N={n}")
    msv = required(main_row.msv, f"MSV at N={n}")
    with_averaging = stat_mean(terminal[msv].stat("bon_accuracy"))
    baseline, baseline_accuracy = best_bon_baseline(terminal, msv)
    return make_claim(
        "best_of_logit_averaging",
        f"Logit averaging over equivalent answers raises MSV_{n}'s best-of-{n}",
        "Omni-MATH: MSV_64 0.356 with vs 0.348 without",
        bool(with_averaging > without),
        f"MSV_{n} best-of-{n} {with_averaging:.3f} with averaging (main) vs {without:.3f} without (checker study, "
        f"reference checker); without it MSV_{n} is {100 * (without - baseline_accuracy):+.1f} pp over {baseline} "
        f"{baseline_accuracy:.3f}.",
        with_averaging=with_averaging,
        without_averaging=without,
        gain_without=without - baseline_accuracy,
    )


def checker_claims(summary: ReproductionResults | Mapping) -> list[dict[str, Any]]:
    """Checker robustness (MSV trained with a weak checker loses ≤ 1.2 pp), logit averaging (with vs without, from
    the reference-checker run of the same study), and random checker: MSV degrades less than Probe+WV.

    Args:
        summary: the reproduction's summary (typed, or its dict), with the checker study.

    Returns:
        The claims.
    """
    results = as_reproduction_results(summary)
    checkers = required(results.checkers, "checker study")
    n, rows = required(checkers.n, "checker study's N"), required(checkers.rows, "checker study's rows")
    key = f"MSV_{n} (trained with checker)"
    drops = _checker_drops(rows, key)
    wv_drops = _checker_drops(rows, "Probe+WV")
    claims = [_checker_robustness(n, drops, wv_drops)]
    reference = rows["reference"].methods if "reference" in rows else {}
    main_row = required(results.main, "main study").per_n.get(str(n))
    if key in reference and main_row is not None and main_row.msv in (main_row.terminal or {}):
        claims.append(_logit_averaging(n, stat_mean(reference[key]), main_row))
    if "random" in drops:
        claims.append(
            make_claim(
                "checker_random_vs_wv",
                "With the random checker MSV degrades less than Probe+WV",
                "Omni-MATH: MSV_64 −1.2 pp vs Probe+WV −7.5 pp",
                bool(drops["random"] < wv_drops["random"]),
                f"random checker: MSV_{n} {100 * drops['random']:+.1f} pp vs Probe+WV "
                f"{100 * wv_drops['random']:+.1f} pp (drop relative to the reference checker).",
            )
        )
    return claims


def mask_claims(summary: ReproductionResults | Mapping) -> list[dict[str, Any]]:
    """Every attention mask contributes: removing any one raises the streaming Brier.

    Args:
        summary: the reproduction's summary (typed, or its dict), with the mask study.

    Returns:
        The claim, in a list.
    """
    masks = required(as_reproduction_results(summary).masks, "mask study")
    rows = required(masks.rows, "mask study's rows")
    full_name = f"MSV_{masks.n}"
    full = stat_mean(_stat_of(rows.get(full_name), "brier"))
    increases = {name: stat_mean(metrics.stat("brier")) - full for name, metrics in rows.items() if name != full_name}
    return [
        make_claim(
            "masks",
            "Every attention mask contributes: removing any one raises the streaming Brier",
            "AIME MSV_16: 0.038 → 0.040 / 0.045 / 0.048 / 0.050 (w/o full / equiv. / within-seq / within-ans)",
            None if not increases else bool(all(increase > 0 for increase in increases.values())),
            f"MSV_{masks.n} Brier {full:.4f}; "
            + ", ".join(f"{name} {increase:+.4f}" for name, increase in increases.items())
            + ".",
            brier_increase=increases,
        )
    ]


def _stat_of(metrics: MethodMetrics | None, metric: str) -> SeedStat | None:
    return None if metrics is None else metrics.stat(metric)


def delimiter_claims(summary: ReproductionResults | Mapping) -> list[dict[str, Any]]:
    """MSV_N has a larger AUTC (accuracy × tokens) than the Probe with every elicitation delimiter.

    Args:
        summary: the reproduction's summary (typed, or its dict), with the delimiter study.

    Returns:
        The claim, in a list.
    """
    delimiters = required(as_reproduction_results(summary).delimiters, "delimiter study")
    rows = required(delimiters.rows, "delimiter study's rows")
    compared = {name: row.methods for name, row in rows.items() if "MSV_N" in row.methods and "Probe" in row.methods}
    # the normalised AUTC over t* (the paper's axis) when every row has it; older runs: raw AUTC over summed tokens
    every_row_has_steps = compared and all("autc_steps_norm" in methods["MSV_N"] for methods in compared.values())
    key = "autc_steps_norm" if every_row_has_steps else "autc_tokens"
    means = {
        name: (stat_mean(methods["MSV_N"].stat(key)), stat_mean(methods["Probe"].stat(key)))
        for name, methods in compared.items()
    }
    digits = 3 if key == "autc_steps_norm" else 1
    return [
        make_claim(
            "delimiters",
            f"MSV_{delimiters.n} has a larger AUTC than the Probe for every delimiter",
            "AIME N=16: holds for Wait, Alternatively, But and every 200 tokens",
            None if not means else bool(all(msv > probe for msv, probe in means.values())),
            "; ".join(
                f"{name}: MSV_N {msv:.{digits}f} vs Probe {probe:.{digits}f}" for name, (msv, probe) in means.items()
            )
            + (" (normalised AUTC over t*)." if key == "autc_steps_norm" else " (AUTC, accuracy × tokens)."),
        )
    ]


def _grouping_comparisons(grouping: GroupingStudy) -> dict[str, tuple[str | None, float, str | None, float]]:
    """Per N > M: (MSV, its latency AUTC, the best baseline by latency AUTC, that baseline's AUTC)."""
    comparisons = {}
    per_n, m = required(grouping.per_n, "grouping study's rows"), required(grouping.m, "grouping study's M")
    for n in [n for n in per_n if int(n) > m]:
        row = per_n[n]
        msv = row.msv
        autc = required(row.autc_latency_norm, f"latency AUTC at N={n}")
        baselines = [method for method in autc if method != msv]
        best = max(baselines, key=lambda method: stat_mean(autc[method])) if baselines else None
        best_autc = stat_mean(autc.get(best)) if best else math.nan
        comparisons[n] = (msv, math.nan if msv is None else stat_mean(autc.get(msv)), best, best_autc)
    return comparisons


def _grouping_cost_claim(grouping: GroupingStudy) -> list[dict[str, Any]]:
    """With grouping the MSV's cost per answer stays flat (≤ 2× from the smallest to the largest N)."""
    costs: dict[int, float] = {}
    for n, row in required(grouping.per_n, "grouping study's rows").items():
        online = required(row.verifier_online_s_per_answer, f"verifier costs at N={n}")
        cost = None if row.msv is None else online.get(row.msv)
        if cost:
            costs[int(n)] = cost
    ns = sorted(costs)
    if len(ns) < 2:
        return []
    ratio = costs[ns[-1]] / costs[ns[0]]
    return [
        make_claim(
            "grouping_linear",
            "With grouping the MSV cost per answer stays flat as N grows (linear total)",
            "latency of MSV_64 scales linearly in N",
            bool(ratio <= 2.0),
            f"MSV cost per answer at N={ns[-1]} is {ratio:.2f}× that at N={ns[0]} (needed ≤ 2×).",
            ratio=ratio,
        )
    ]


def grouping_claims(summary: ReproductionResults | Mapping) -> list[dict[str, Any]]:
    """Grouped MSV_M matches or beats the best baseline's accuracy-latency AUTC at every N > M, and its cost per
    answer stays flat as N grows (≤ 2× from the smallest to the largest N).

    Args:
        summary: the reproduction's summary (typed, or its dict), with the grouping study.

    Returns:
        The claims.
    """
    grouping = required(as_reproduction_results(summary).grouping, "grouping study")
    comparisons = _grouping_comparisons(grouping)
    held = None if not comparisons else bool(all(ours >= best for _, ours, _, best in comparisons.values()))
    claims = [
        make_claim(
            "grouping",
            f"MSV_{grouping.m} (grouped) matches or beats the best baseline's accuracy-latency AUTC at "
            f"N > {grouping.m}",
            PAPER["grouping"]["statement"],
            held,
            "; ".join(
                f"N={n}: {msv} {ours:.3f} vs {best} {best_autc:.3f}"
                for n, (msv, ours, best, best_autc) in comparisons.items()
            )
            + " (normalised AUTC over latency)."
            if comparisons
            else "no N above M evaluated.",
        )
    ]
    return claims + _grouping_cost_claim(grouping)


def _size_sentence(size: str, row: SizeRow, n: int) -> str:
    """One training-set size's best-of-N gain and token fraction against their baselines."""
    fraction = row.early_stop_token_fraction
    gain = required(row.bon_gain, f"best-of-N gain with {size} training problems")
    return (
        f"{size} problems: best-of-{n} {100 * gain:+.1f} pp vs "
        f"{row.bon_best_baseline}, token fraction "
        + ("∞" if fraction is None else f"{fraction:.2f}")
        + f" vs {row.early_stop_best_baseline}"
    )


def _probe_brier(row: SizeRow, size: str) -> SeedStat | None:
    """The Probe's terminal Brier with `size` training problems."""
    return required(row.terminal, f"terminal metrics with {size} training problems")["Probe"].stat("brier")


def training_size_claims(summary: ReproductionResults | Mapping, config: ReproduceConfig) -> list[dict[str, Any]]:
    """The Probe's Brier plateaus beyond the second-largest training size (the largest lowers it by < 5 %; the
    paper: beyond 224, its main size), and whether MSV_N meets the best-of-N and early-stop targets with the most
    training problems.

    Args:
        summary: the reproduction's summary (typed, or its dict), with the training-size study.
        config: the settings the summary was produced with (not read: the sizes are the summary's).

    Returns:
        The claims (none with fewer than two sizes).
    """
    study = required(as_reproduction_results(summary).training_size, "training-size study")
    per_size = required(study.per_size, "training-size study's rows")
    sizes = sorted(per_size, key=int)
    if len(sizes) < 2:
        return []
    n = required(study.n, "training-size study's N")
    base_size, top_size = sizes[-2], sizes[-1]
    base_brier = stat_mean(_probe_brier(per_size[base_size], base_size))
    top_brier = stat_mean(_probe_brier(per_size[top_size], top_size))
    paper = PAPER["training_size"]["Probe"]
    top = per_size[top_size]
    top_gain = required(top.bon_gain, f"best-of-N gain with {top_size} training problems")
    fraction = top.early_stop_token_fraction
    return [
        make_claim(
            "training_size_probe",
            f"The Probe's terminal Brier plateaus beyond {base_size} problems ({top_size} lower it by < 5 %)",
            "AIME: " + " / ".join(f"{brier}" for brier in paper.values()) + f" at {' / '.join(paper)} problems",
            bool(top_brier > 0.95 * base_brier),
            f"Probe Brier {base_brier:.4f} with {base_size} problems, {top_brier:.4f} with {top_size} "
            f"({1 - top_brier / base_brier:+.0%} lower).",
            brier=base_brier,
            brier_more=top_brier,
        ),
        make_claim(
            "training_size_msv",
            f"With {top_size} training problems MSV_{n} meets the best-of-N (+2 pp) and early-stop (≤ 0.40) targets",
            "— (not in the paper: tests whether the testbed's gaps are a lack of training data)",
            bool(top_gain >= 0.02 and fraction is not None and fraction <= 0.40),
            "; ".join(_size_sentence(size, row, n) for size, row in per_size.items()) + ".",
            gain=top_gain,
            fraction=fraction,
        ),
    ]


def config_of(summary: ReproductionResults | Mapping) -> ReproduceConfig:
    """The `ReproduceConfig` a summary was produced with (its ``config`` entry; JSON lists back to tuples). Keys of
    older runs that are no longer settings (``seeds``: random N-subsets, replaced by training seeds) are ignored; a
    summary without ``task`` was written when v1 was the only testbed.

    Args:
        summary: the summary (typed, or its dict).

    Returns:
        The config.
    """
    known = {setting.name for setting in fields(ReproduceConfig)}
    settings: dict[str, Any] = {"task": "v1"} | dict(
        required(as_reproduction_results(summary).config, "config").items()
    )
    kwargs: dict[str, Any] = {
        name: tuple(value) if isinstance(value, list) else value for name, value in settings.items() if name in known
    }
    return ReproduceConfig(**kwargs)


def compute_claims(
    summary: ReproductionResults | Mapping, config: ReproduceConfig | None = None
) -> list[dict[str, Any]]:
    """Every claim the summary can test, in report order.

    Args:
        summary: the summary (typed, or its dict, e.g. loaded ``testbed.json``).
        config: the settings it was produced with; default, the summary's own.

    Returns:
        The claims, each ``{"id", "claim", "paper", "held", "sentence", "numbers"}``.
    """
    results = as_reproduction_results(summary)
    config = config or config_of(results)
    claims = main_claims(results, config)
    if results.checkers is not None:
        claims += checker_claims(results)
    if results.masks is not None:
        claims += mask_claims(results)
    if results.delimiters is not None:
        claims += delimiter_claims(results)
    if results.grouping is not None:
        claims += grouping_claims(results)
    if results.training_size is not None:
        claims += training_size_claims(results, config)
    return claims
