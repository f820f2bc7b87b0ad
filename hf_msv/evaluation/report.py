"""The evaluation report: markdown tables and PNG figures of `evaluate_study` results (a `StudyResults`, or the
results dict it reads from)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..metrics import format_mean_std, reliability_bins, seed_stat
from .methods import DEEPCONF, SELF_CONSISTENCY, STOP_HEAD_SUFFIX, TOKEN_PROBS
from .results import (
    Budgets,
    EarlyStopComparison,
    EarlyStopSummary,
    Figure,
    Interval,
    LambdaRuleRecord,
    SeedStat,
    StopReliability,
    StudyConfig,
    StudyResults,
    ValidationBudget,
    as_study_results,
)

if TYPE_CHECKING:
    from .early_stop import TradeoffCurve

__all__ = [
    "REPORT_EXTRA_HINT",
    "ReliabilityPairs",
    "require_report_extras",
    "render_report",
    "write_figures",
    "markdown_table",
    "format_lambda",
]

_TERMINAL_COLUMNS = (
    ("auroc", "AUROC ↑"),
    ("brier", "Brier ↓"),
    ("ece", "ECE ↓"),
    ("nll", "NLL ↓"),
    ("bon_accuracy", "BoN acc ↑"),
    ("bon_ece", "BoN ECE ↓"),
    ("bon_brier", "BoN Brier ↓"),
)
_STREAMING_COLUMNS = (
    ("auroc", "AUROC ↑"),
    ("brier", "Brier ↓"),
    ("ece", "ECE ↓"),
    ("nll", "NLL ↓"),
    ("full_accuracy", "acc (full) ↑"),
    ("peak_accuracy", "peak acc ↑"),
    ("autc_steps_norm", "AUTC t* (norm) ↑"),
    ("autc_latency_norm", "AUTC latency (norm) ↑"),
    ("autc_tokens_norm", "AUTC tokens (norm) ↑"),
)
# MSV − baseline intervals shown per setting: (key, header, digits)
_INTERVAL_COLUMNS = {
    "terminal": (
        ("brier", "Δ Brier", 4),
        ("brier_ratio", "Brier ratio", 3),
        ("bon_accuracy", "Δ BoN acc", 3),
        ("bon_ece", "Δ BoN ECE", 3),
    ),
    "streaming": (("brier", "Δ Brier", 4), ("brier_ratio", "Brier ratio", 3)),
}


# ----------------------------------------------------------------------------------------------------------------
# Markdown
# ----------------------------------------------------------------------------------------------------------------


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table (cells already formatted)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def format_lambda(stat: SeedStat | Mapping | None) -> str:
    """λ over seeds: mean ± std of the finite ones, and how many seeds chose ∞ (never stop).

    Args:
        stat: the λ's seed statistic (a `SeedStat` or its dict), None when missing.

    Returns:
        The formatted cell.
    """
    stored = stat.values if isinstance(stat, SeedStat) else (stat or {}).get("values", [])
    values = [math.inf if v is None else v for v in stored]
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "∞" if values else "—"
    text = format_mean_std(seed_stat(finite), 2)
    return text + (f" (∞ ×{len(values) - len(finite)})" if len(finite) < len(values) else "")


def _data_section(results: StudyResults) -> list[str]:
    d = results.data
    e = d["eval"]
    cfg = results.config
    return [
        f"Evaluation: {e['problems']} problems × {e['sequences_per_problem']} sequences, {e['answers']} answers "
        f"({e['answers_per_sequence']:.2f} per sequence), terminal accuracy {e['terminal_accuracy']:.3f}, "
        f"mean chain of thought {e['mean_sequence_tokens']:.1f} tokens."
        + (f" Validation: {d['val']['problems']} problems." if "val" in d else " No validation split."),
        "",
        f"Collection: `{json.dumps(d.get('collect', {}))}`",
        "",
        f"N ∈ {cfg.num_sequences_list}; groups: {cfg.groups}; mean ± std over {cfg.training_seeds} "
        "training seed(s) (verifier checkpoints; ± 0.000 with one). Intervals: paired bootstrap 95 % over "
        f"problems ({cfg.bootstrap} resamples). Equivalence classes: "
        + (f"re-derived with `{cfg.checker}`." if cfg.checker else "as collected.")
        + f" DeepConf: {cfg.deepconf_calibration}. Calibrated vote baselines: "
        f"{cfg.vote_calibration}; stacked baseline's Probe feature: {cfg.stacked_probe}.",
        "",
        "AUTC (norm), a curve summary, on an axis x ∈ {t* (token position), latency, tokens summed over the N "
        "sequences}: (1/B) ∫_0^B acc(b) db, B = the full-decoding budget on x: a mean accuracy in [0, 1], whose "
        "scale does not depend on N. Peak acc: the best point of the evaluation curve, a curve summary (no λ is "
        "chosen at it).",
        "",
    ]


def _format_interval(iv: Interval | None, digits: int = 3) -> str:
    """ "est [low, high]" of a bootstrap interval ("—" when missing; ∞ for an unbounded end)."""
    if iv is None or iv.estimate is None:
        return "—"
    f = lambda x: "∞" if x is None or (isinstance(x, float) and math.isinf(x)) else f"{x:.{digits}f}"
    return f"{f(iv.estimate)} [{f(iv.low)}, {f(iv.high)}]"


def _format_estimate(iv: Interval | None) -> str:
    """An interval's estimate, with its bounds when it was bootstrapped ("—" when missing)."""
    return _format_interval(iv, 2) if iv is not None and iv.bootstrapped else _format_interval(iv, 2).split(" [")[0]


_COMPARISON_NAMES = {
    "single_sequence": "the best single-sequence baseline (the paper's comparison)",
    "all": "the best of all baselines (aggregations included)",
}


def _fraction_cell(comparison: EarlyStopComparison, axis: str) -> str:
    """An early-stop fraction with its interval; null (JSON) reads as ∞: MSV never reaches the peak."""
    f = lambda x: "∞" if x is None or math.isinf(x) else f"{x:.2f}"
    entry = comparison.axes[axis]
    iv = entry.interval
    return f(entry.fraction) + (f" [{f(iv.low)}, {f(iv.high)}]" if iv else "")


def _early_stop_line(es: EarlyStopSummary) -> list[str]:
    if es.comparisons is None:
        return []
    rows = [
        [
            _COMPARISON_NAMES.get(name, name),
            f"{c.baseline} ({c.baseline_peak_accuracy:.3f})",
            f"{c.msv_peak_accuracy:.3f}",
        ]
        + [_fraction_cell(c, a) for a in ("steps", "latency", "tokens")]
        for name, c in es.comparisons.items()
    ]
    return [
        "Early stopping, a curve summary (read off the evaluation curves, no λ chosen): fraction of the "
        "baseline's budget the primary MSV needs to reach the baseline's peak accuracy, on the token position t* "
        "(the latency of parallel decoding, the paper's axis), on measured latency and on chain-of-thought tokens "
        "summed over the N sequences:",
        "",
        markdown_table(
            [
                "compared with",
                "baseline (peak acc)",
                f"{es.msv} peak acc",
                "t* fraction",
                "latency fraction",
                "token fraction",
            ],
            rows,
        ),
        "",
        "(< 1: the MSV matches the baseline's peak with less; ∞: it never does; 95 % interval over problems "
        "in brackets)",
        "",
    ]


def _budget_lines(es: EarlyStopSummary) -> list[str]:
    """The budgets of one N: chosen on validation (or why there are none), the interpolated curves and the
    full-decoding target."""
    b = es.budgets
    if b is None:
        return []
    return _validation_budget_lines(b) + _interpolated_lines(b) + _full_decoding_target_lines(b)


def _percent(fractions: list[float]) -> str:
    return " / ".join(f"{f:.0%}" for f in fractions)


def _chosen_cell(b: ValidationBudget) -> str:
    """Evaluation accuracy at the token fraction realised, † when no λ fit on validation, and the interval."""
    fits = b.fits.mean is not None and b.fits.mean >= 1.0
    return (
        f"{_seed_cell(b.eval_accuracy)} at {_seed_cell(b.eval_fraction, 2)}"
        + ("" if fits else " †")
        + ("" if b.interval is None else f" ({_format_interval(b.interval, 3)})")
    )


def _validation_budget_lines(b: Budgets) -> list[str]:
    if b.validation_chosen is None:
        return [
            f"Budgets: without a validation split no λ can be chosen for a budget of {_percent(b.fractions)} of "
            "full decoding's tokens without looking at the evaluation curves, so no budgeted accuracy is reported "
            "(evaluate with `--val-dir`); the interpolated curves below describe the evaluation curves.",
            "",
        ]
    rows = [[m] + [_chosen_cell(x) for x in budgets] for m, budgets in b.validation_chosen.items()]
    return [
        f"Budgets chosen on validation: for each method and a budget of {_percent(b.fractions)} of full decoding's "
        "tokens, λ is the most accurate on the validation groups within that budget there (ties: cheaper, then "
        "larger λ), per training seed, and is applied unchanged to the evaluation groups. Cell: evaluation accuracy "
        "at the token fraction it realised on evaluation (which may exceed the budget); in brackets "
        f"{b.reference} − the method, 95 % paired interval over evaluation problems with each λ fixed; †: no λ fit "
        "the budget on validation for some training seed (its cheapest λ was taken).",
        "",
        markdown_table(["method"] + [f"{f:.0%} of tokens" for f in b.fractions], rows),
        "",
    ]


def _interpolated_lines(b: Budgets) -> list[str]:
    cell = lambda x: _fmt_number(x.accuracy) + ("" if x.interval is None else f" ({_format_interval(x.interval)})")
    rows = [[m] + [cell(x) for x in points] for m, points in b.interpolated.items()]
    return [
        "Interpolated curves (a curve summary, not a budgeted accuracy: no λ is chosen): each method's upper "
        "concave hull of its (token fraction, accuracy) operating points on the evaluation split, what a "
        f"randomised mix of two λ realises, read at {_percent(b.fractions)} of full decoding's tokens; in brackets "
        f"{b.reference} − the method, 95 % paired interval over problems, both hulls recomputed on each resample:",
        "",
        markdown_table(["method"] + [f"{f:.0%} of tokens" for f in b.fractions], rows),
        "",
    ]


def _fmt_number(x: float | None, digits: int = 3) -> str:
    return "—" if x is None or math.isnan(x) else f"{x:.{digits}f}"


def _full_decoding_target_lines(b: Budgets) -> list[str]:
    target = b.full_decoding_target
    if not target:
        return []
    return [
        f"Curve summary: {b.reference}'s evaluation curve first reaches the full-decoding accuracy of the most "
        f"accurate baseline ({target.baseline}, {_fmt_number(target.accuracy)}) at "
        f"{_format_estimate(target.steps)} of full decoding's t* and {_format_estimate(target.tokens)} of its "
        "tokens (95 % interval over problems).",
        "",
    ]


def _interval_table(results: StudyResults, setting: str, n) -> list[str]:
    iv = results.intervals.get(str(n), {}).get(setting)
    if not iv:
        return []
    cols = _INTERVAL_COLUMNS[setting]
    msv = results.msv(n)
    rows = [[m] + [_format_interval(r.get(k), d) for k, _, d in cols] for m, r in iv.items()]
    return [
        f"{msv} − each baseline (ratio: {msv} ÷ baseline), estimate [95 % interval over problems]:",
        "",
        markdown_table(["baseline"] + [h for _, h, _ in cols], rows),
        "",
    ]


def _seed_cell(stat: SeedStat | None, digits: int = 3) -> str:
    """ "mean ± std" of a seed statistic ("—" when missing or undefined)."""
    return format_mean_std(None if stat is None else stat.to_dict(), digits)


def _setting_sections(results: StudyResults) -> list[str]:
    out = []
    for setting, heading, columns in (
        ("terminal", "Terminal answers: calibration and best-of-N", _TERMINAL_COLUMNS),
        ("streaming", "Streaming answers: calibration and early stopping", _STREAMING_COLUMNS),
    ):
        out += [f"## {heading}", ""]
        for n in results.num_sequences:
            msv = results.msv(n)
            rows = [
                [f"**{m}**" if m == msv else m] + [_seed_cell(r.stat(k)) for k, _ in columns]
                for m, r in results.setting(setting)[str(n)].items()
            ]
            out += [f"### N = {n}", "", markdown_table(["method"] + [c for _, c in columns], rows), ""]
            out += _interval_table(results, setting, n)
            if setting == "streaming":
                es = results.early_stop.get(str(n)) or EarlyStopSummary(curves={})
                out += _early_stop_line(es)
                out += _budget_lines(es)
    return out


def _lambda_section(results: StudyResults) -> list[str]:
    lam = results.lambda_selection
    if not lam:
        return []
    cfg = results.config
    if cfg.has("ltt_epsilon"):
        return _lambda_rules_section(lam, cfg) + _stop_reliability_lines(results)
    target = cfg.target_accuracy or str(cfg.target_fraction) + " × the best full-decoding validation accuracy"
    out = [
        "## λ selection (validation rule and risk-controlled LTT)",
        "",
        f"Target accuracy per N and training seed: {target}; "
        f"LTT with δ = {cfg.ltt_delta} (binomial p-values, fixed-sequence testing). "
        "Accuracy / tokens / latency achieved on the evaluation split. Last column: for the validation rule, the "
        "rate of seeds whose chosen λ reached the target on validation (when none does, the rule takes the most "
        "accurate λ that still stops early, never a silent ∞); for LTT, the rate certified.",
        "",
    ]
    header = [
        "method",
        "rule",
        "target",
        "λ",
        "val acc",
        "eval acc",
        "eval tokens",
        "eval latency (s)",
        "reached / certified (rate)",
    ]
    return out + _lambda_tables(
        lam,
        cfg,
        header,
        lambda m, rule, r: [
            m,
            rule,
            _fmt(r.get("target")),
            format_lambda(r.lam),
            _fmt(r.get("val_accuracy")),
            _fmt(r.get("eval_accuracy")),
            _fmt(r.get("eval_tokens"), 1),
            _fmt(r.get("eval_latency"), 3),
            _fmt(r.get("reached"), 2) if rule == "validation" else _fmt(r.get("certified"), 2),
        ],
    )


def _fmt(stat: SeedStat | None, digits: int = 3) -> str:
    return _seed_cell(stat, digits)


def _lambda_tables(
    lam: dict[str, dict[str, dict[str, LambdaRuleRecord]]], cfg: StudyConfig, header: list[str], row
) -> list[str]:
    """One table per N of the λ rules' records, a row per (method, rule) from `row(method, rule, record)`."""
    out = []
    for n in cfg.num_sequences_list:
        if str(n) in lam:
            rows = [row(m, rule, r) for m, rules in lam[str(n)].items() for rule, r in rules.items()]
            out += [f"### N = {n}", "", markdown_table(header, rows), ""]
    return out


def _lambda_rules_section(lam: dict[str, dict[str, dict[str, LambdaRuleRecord]]], cfg: StudyConfig) -> list[str]:
    """The λ rules of `hf_msv.lambda_rule.choose_lambda`, chosen on validation and applied to evaluation, with the
    confidence reported at the stop against the accuracy at the stop."""
    target = cfg.target_accuracy or str(cfg.target_fraction) + " × the method's own full-decoding accuracy"
    out = [
        "## λ selection: chosen on validation, applied to evaluation",
        "",
        f"Target rule (`validation`): the cheapest λ whose validation accuracy reaches {target}. Guarantee "
        f"(`ltt`): the cheapest λ that loses at most ε = {cfg.ltt_epsilon} of full-decoding accuracy with "
        f"probability ≥ {1 - cfg.ltt_delta:g} (Learn-then-Test on the paired loss over validation problems, "
        "fixed-sequence from the largest λ); `certified` is the rate of training seeds for which a λ that stops "
        "early was certified, else λ = ∞. Accuracy and tokens on the evaluation split; at the stop: over the "
        "evaluation groups that stopped early, their share, accuracy, mean reported confidence and ECE.",
        "",
    ]
    header = [
        "method",
        "rule",
        "λ",
        "val acc",
        "eval acc",
        "eval tokens",
        "stopped",
        "acc at stop",
        "confidence at stop",
        "ECE at stop",
        "reached / certified (rate)",
    ]
    return out + _lambda_tables(
        lam,
        cfg,
        header,
        lambda m, rule, r: [
            m,
            rule,
            format_lambda(r.lam),
            _fmt(r.get("val_accuracy")),
            _fmt(r.get("eval_accuracy")),
            _fmt(r.get("eval_tokens"), 1),
            _fmt(r.get("stop_rate"), 2),
            _fmt(r.get("stop_accuracy")),
            _fmt(r.get("stop_confidence")),
            _fmt(r.get("stop_ece")),
            _fmt(r.get("reached"), 2) if rule == "validation" else _fmt(r.get("certified"), 2),
        ],
    )


def _stop_reliability_reference(results: StudyResults, n: int) -> tuple[str, dict[str, StopReliability]] | None:
    """The method whose stop-time reliability a report shows at `n` — the primary MSV through its stop head when it
    has one, else the MSV — and its bins per λ rule; None without them."""
    msv = results.msv(n)
    per_method = results.stop_reliability.get(str(n), {})
    if msv is None:
        return None
    reference = msv + STOP_HEAD_SUFFIX if msv + STOP_HEAD_SUFFIX in per_method else msv
    return (reference, per_method[reference]) if per_method.get(reference) else None


def _tenth(confidence: float) -> float:
    """The lower edge of the tenth a bin's mean confidence lies in (1.0 is in the last one, as in
    `hf_msv.metrics.reliability_bins`)."""
    return min(int(confidence * 10), 9) / 10


def _stop_reliability_lines(results: StudyResults) -> list[str]:
    """A reliability table of the confidence reported at the stop, per N, for the reference method and each rule:
    what a user who acts on the stop's confidence can expect."""
    out = []
    for n in results.num_sequences:
        found = _stop_reliability_reference(results, n)
        if found is None:
            continue
        reference, rules = found
        rows = []
        for rule, bins in rules.items():
            for confidence, accuracy, count in zip(bins.confidence, bins.accuracy, bins.count):
                low = _tenth(confidence)
                rows.append([rule, f"[{low:.1f}, {low + 0.1:.1f}{']' if low == 0.9 else ')'}", str(count)])
                rows[-1] += [f"{confidence:.3f}", f"{accuracy:.3f}"]
        out += [
            f"Reliability at the stop, {reference}, N = {n}: the early stops of every training seed by the confidence "
            "they reported (a calibrated stop has accuracy ≈ confidence in each bin):",
            "",
            markdown_table(["rule", "confidence bin", "stops", "mean confidence", "accuracy"], rows),
            "",
        ]
    return out


def _difficulty_section(results: StudyResults) -> list[str]:
    by = results.by_difficulty
    if not by:
        return []
    name = results.config.difficulty if results.config.has("difficulty") else "difficulty"
    out = [
        f"## By {name}",
        "",
        f"Terminal answers, per value of {name}: best-of-N accuracy / Brier (mean over training seeds).",
        "",
    ]
    for n, levels in by.items():
        values = list(levels)
        methods = [m for m in levels[values[0]] if m != "problems"]
        rows = [
            [m] + [f"{levels[v][m]['bon_accuracy']:.3f} / {levels[v][m]['brier']:.4f}" for v in values]
            for m in methods
        ]
        out += [
            f"### N = {n}",
            "",
            markdown_table(["method"] + [f"{name} = {v} ({levels[v]['problems']} problems)" for v in values], rows),
            "",
        ]
    return out


def _costs_section(results: StudyResults) -> list[str]:
    c = results.costs
    out = [
        "## Costs",
        "",
        f"LM costs ({c.source}): "
        + ", ".join(
            f"N={n}: decode step {v['decode_step_s']:.2e} s, elicitation {v['elicit_s']:.2e} s/answer"
            for n, v in c.lm.items()
        )
        + ".",
        "",
        "Verifier cost measured online (s per answer): "
        + "; ".join(
            f"N={n}: " + ", ".join(f"{m} {s:.2e}" for m, s in v.items())
            for n, v in c.verifier_online_s_per_answer.items()
        )
        + ".",
        "",
    ]
    prm = c.prm or {}
    if "eval" in prm:
        e, cfg = prm["eval"], results.config.prm
        if not cfg:
            raise ValueError("the study's costs have a PRM but its config records none")
        out += [
            f"PRM (`{cfg['model']}`, aggregate {cfg['aggregate']}): one forward per answer over question + "
            f"chain-of-thought prefix + answer; evaluation split: {e['answers']} answers, {e['tokens']} tokens "
            f"({e['tokens_per_answer']:.1f} per answer), {e['seconds_per_answer']:.2e} s per answer.",
            "",
        ]
    return out


def render_report(results: StudyResults | Mapping) -> str:
    """The markdown report of `evaluate_study` results.

    Args:
        results: a `StudyResults`, or the results dict (as returned, or read back from its JSON).

    Returns:
        The markdown.
    """
    results = as_study_results(results)
    out = [f"# {results.title}", ""] + _data_section(results) + _setting_sections(results)
    out += _lambda_section(results) + _difficulty_section(results) + _costs_section(results)
    if results.figures:
        out += ["## Figures", ""]
        for f in results.figures:
            out += [f"![{f.caption}]({f.file})", "", f"*{f.caption}*", ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------------------------------------


REPORT_EXTRA_HINT = 'pip install "hf-msv[report]"'


def require_report_extras(alternative: str = "") -> None:
    """Raise `ModuleNotFoundError` (one line naming the extra to install, then `alternative` if given) when
    matplotlib, which draws the reports' figures, is missing; called before any work by the commands that draw
    them."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ModuleNotFoundError(
            f"the report figures need matplotlib, which is not installed: {REPORT_EXTRA_HINT}"
            + (f" ({alternative})" if alternative else ""),
            name="matplotlib",
        )


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _key_methods(methods: list[str], msv: str | None, limit: int = 6) -> list[str]:
    """Methods worth a panel: the primary MSV, trained single-sequence verifiers and their +WV, then the rest."""
    free = (SELF_CONSISTENCY, TOKEN_PROBS, DEEPCONF, f"{TOKEN_PROBS}+WV", f"{DEEPCONF}+WV")
    order = (
        ([msv] if msv in methods else [])
        + [m for m in methods if m != msv and m not in free]
        + [m for m in free if m in methods]
    )
    return order[:limit]


@dataclass
class ReliabilityPairs:
    """One method's terminal (confidence, correctness) pairs for the reliability diagrams: one array per training
    seed, of every terminal answer and of each group's best-of-N pick."""

    answer_p: list[np.ndarray] = field(default_factory=list)
    answer_y: list[np.ndarray] = field(default_factory=list)
    bon_p: list[np.ndarray] = field(default_factory=list)
    bon_y: list[np.ndarray] = field(default_factory=list)


def write_figures(
    results: StudyResults | Mapping,
    reliability: Mapping[int, Mapping[str, ReliabilityPairs]],
    curves: Mapping[str, Mapping[str, TradeoffCurve]],
    output_dir: Path,
    stem: str,
) -> list[dict[str, str]]:
    """Write the PNG figures of a study to ``{output_dir}/{stem}_*.png``.

    Args:
        results: the study's results so far (a `StudyResults` or its dict; figures not yet listed).
        reliability: N -> method -> its `ReliabilityPairs` (terminal setting).
        curves: str(N) -> method -> seed-mean `TradeoffCurve`.
        output_dir: where the PNGs go.
        stem: the file names' prefix (the report's name).

    Returns:
        ``[{"file", "caption"}]``, one per figure written (`Figure` dicts, for the results' ``figures``).
    """
    results = as_study_results(results)
    plt = _plt()
    figs = []

    def save(fig, name, caption):
        path = Path(output_dir) / f"{stem}_{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        figs.append(Figure(path.name, caption).to_dict())

    _reliability_figures(plt, save, results, reliability)
    _best_of_n_figure(plt, save, results)
    _tradeoff_figures(plt, save, results, curves)
    _stop_reliability_figures(plt, save, results)
    return figs


def _stop_reliability_figures(plt, save, results: StudyResults) -> None:
    """Per N: the reliability diagram of the confidence reported at the stop, one panel per λ rule (bar widths
    follow the stops in each bin)."""
    for n in results.num_sequences:
        found = _stop_reliability_reference(results, n)
        if found is None:
            continue
        reference, rules = found
        fig, axes = plt.subplots(1, len(rules), figsize=(2.8 * len(rules), 2.8), squeeze=False)
        for ax, (rule, bins) in zip(axes[0], rules.items()):
            lows = [_tenth(c) for c in bins.confidence]
            ax.bar([low + 0.05 for low in lows], bins.accuracy, width=0.1, edgecolor="k", alpha=0.7)
            ax.plot(bins.confidence, bins.accuracy, "ko", ms=3)
            for low, accuracy, count in zip(lows, bins.accuracy, bins.count):
                ax.annotate(str(count), (low + 0.05, accuracy), ha="center", va="bottom", fontsize=6)
            _reliability_axes(ax, f"{rule}, {sum(bins.count)} stops", "confidence at the stop", top=1.05)
        axes[0][0].set_ylabel("accuracy at the stop", fontsize=7)
        save(
            fig,
            f"stop_reliability_N{n}",
            f"Reliability of the confidence reported at the stop, {reference}, N={n}: early stops of every "
            "training seed (counts above the bars).",
        )


def _reliability_axes(ax, title: str, xlabel: str, top: float = 1.0) -> None:
    """A reliability panel's frame: the diagonal, [0, 1] on both axes, small labels."""
    ax.plot([0, 1], [0, 1], "r--", lw=1)
    ax.set_title(title, fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, top)
    ax.set_xlabel(xlabel, fontsize=7)
    ax.tick_params(labelsize=6)


def _reliability_figures(
    plt, save, results: StudyResults, reliability: Mapping[int, Mapping[str, ReliabilityPairs]]
) -> None:
    """Reliability diagrams (terminal answers; best-of-N picks) at the largest N and each N > 1 with an MSV."""
    ns = results.num_sequences
    for n in ns:
        msv = results.msv(n)
        if n != ns[-1] and msv is None:
            continue
        for kind, caption in (("answers", "terminal answers"), ("bon", "best-of-N picks")):
            data = reliability.get(n, {})
            methods = _key_methods(list(data), msv)
            if not methods or (kind == "bon" and n == 1):
                continue
            fig, axes = plt.subplots(1, len(methods), figsize=(2.6 * len(methods), 2.8), squeeze=False)
            for ax, m in zip(axes[0], methods):
                pairs = data[m]
                p = np.concatenate(pairs.answer_p if kind == "answers" else pairs.bon_p)
                y = np.concatenate(pairs.answer_y if kind == "answers" else pairs.bon_y).astype(float)
                _, acc, _ = reliability_bins(p, y, 10)
                centers = (np.arange(10) + 0.5) / 10
                ax.bar(centers, np.nan_to_num(acc), width=0.1, edgecolor="k", alpha=0.7, label="accuracy")
                _reliability_axes(ax, m, "confidence")
            axes[0][0].set_ylabel("accuracy", fontsize=7)
            save(
                fig,
                f"reliability_{kind}_N{n}",
                f"Reliability diagrams (10 bins) on {caption}, N={n}, all seeds pooled.",
            )


def _best_of_n_figure(plt, save, results: StudyResults) -> None:
    """Best-of-N accuracy vs N, every method, and the MSV_N line."""
    ns = results.num_sequences
    if not ns:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    methods = []
    for n in ns:
        methods += [m for m in results.terminal[str(n)] if m not in methods]
    for m in methods:
        xs, ys, es = [], [], []
        for n in ns:
            r = results.terminal[str(n)].get(m)
            if r is None:
                continue
            bon = r.metrics["bon_accuracy"]
            xs.append(n)
            ys.append(bon.mean)
            es.append(bon.std or 0.0)
        if xs:
            ax.errorbar(xs, ys, yerr=es, marker="o", ms=3, capsize=2, label=m)
    msv_pts = [
        (n, results.terminal[str(n)][msv].mean("bon_accuracy"))
        for n in ns
        if (msv := results.msv(n)) is not None and msv in results.terminal[str(n)]
    ]
    if msv_pts:
        ax.plot(*zip(*msv_pts), "k-", lw=2.5, alpha=0.5, label="MSV_N")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("N")
    ax.set_ylabel("best-of-N accuracy")
    ax.legend(fontsize=6, ncol=2)
    save(fig, "best_of_n", "Best-of-N accuracy vs N (terminal answers), mean ± std over seeds.")


def _tradeoff_figures(plt, save, results: StudyResults, curves: Mapping[str, Mapping[str, TradeoffCurve]]) -> None:
    """Per N: accuracy vs tokens and vs latency as λ sweeps, and Brier per token position."""
    for n in results.num_sequences:
        cs = curves.get(str(n), {})
        if not cs:
            continue
        msv = results.msv(n)
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
        for m, c in cs.items():
            style = dict(lw=2.2, color="k") if m == msv else dict(lw=1)
            for ax, axis in zip(axes, ("tokens", "latency")):
                order = np.argsort(c.x(axis))
                ax.plot(c.x(axis)[order], c.accuracy[order], label=m, **style)
        axes[0].set_xlabel("chain-of-thought tokens (N sequences)")  # t* is in the JSON curves ("steps")
        axes[1].set_xlabel("latency (s)")
        for ax in axes:
            ax.set_ylabel("accuracy")
        axes[1].legend(fontsize=6)
        save(
            fig,
            f"tradeoff_N{n}",
            f"Early stopping, N={n}: accuracy vs tokens (left) and vs latency (right) as λ "
            "sweeps 0..1 (+ full decoding), mean over seeds.",
        )
        bp = results.brier_by_position[str(n)]
        edges = np.asarray([np.inf if e is None else e for e in bp["edges"]], dtype=float)
        mids = [
            (edges[i] + (edges[i + 1] if np.isfinite(edges[i + 1]) else edges[i] + (edges[i] - edges[i - 1]))) / 2
            for i in range(len(edges) - 1)
        ]
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for m, v in bp.items():
            if m == "edges":
                continue
            ax.plot(
                mids, [np.nan if x is None else x for x in v], marker="o", ms=3, lw=2.2 if m == msv else 1, label=m
            )
        ax.set_xlabel("token position τ")
        ax.set_ylabel("Brier")
        ax.legend(fontsize=6)
        save(fig, f"brier_position_N{n}", f"Brier score per token-position bin (streaming answers), N={n}.")
