"""Typed results of `evaluate_study`: dataclasses over the JSON it writes (``{report_name}.json``).

    results = StudyResults.from_dict(json.loads(Path("reports/eval/report.json").read_text()))
    results.terminal["16"]["MSV_16"].mean("brier")       # the seed mean of a metric
    results.early_stop["16"].comparisons["all"].steps.fraction

``StudyResults.from_dict(d).to_dict() == d``, keys in the same order, for every results dict `evaluate_study` writes:
a renamed key then fails when a report is read, in one place, rather than deep in a table. Every section is a
`hf_msv.evaluation.records.Record`: keys a section does not model are kept as they came (``extra``), so older or
newer results still round-trip. Per-N sections are keyed by ``str(N)``, as in the JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .records import MISSING, Record, coded, list_of, mapping_of, record, rest

__all__ = [
    "SeedStat",
    "MethodMetrics",
    "MethodRoster",
    "Interval",
    "AxisFraction",
    "EarlyStopComparison",
    "FullDecodingTarget",
    "ValidationBudget",
    "InterpolatedAccuracy",
    "Budgets",
    "EarlyStopSummary",
    "LambdaRuleRecord",
    "StopReliability",
    "StudyConfig",
    "StudyCosts",
    "Figure",
    "StudyResults",
    "as_study_results",
]


# ----------------------------------------------------------------------------------------------------------------
# Numbers
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class SeedStat(Record):
    """A number over training seeds (`hf_msv.metrics.seed_stat`): its mean, std and per-seed values; mean and std
    are None where the JSON has null (undefined: e.g. every seed nan)."""

    mean: float | None = None
    std: float | None = None
    values: list = field(default_factory=list)


_SEED_STAT = record(SeedStat)


@dataclass
class MethodMetrics(Record):
    """One method's metrics in one setting at one N: metric name (``"brier"``, ``"bon_accuracy"``,
    ``"autc_tokens_norm"``, ...) -> `SeedStat`, in report order. The metric names differ between the terminal and
    streaming settings, so they are keys rather than fields."""

    metrics: dict[str, SeedStat] = rest(_SEED_STAT)

    def __contains__(self, metric: str) -> bool:
        return metric in self.metrics

    def stat(self, metric: str) -> SeedStat | None:
        """The `SeedStat` of `metric`, None when the method has no such metric.

        Args:
            metric: a metric name.

        Returns:
            The statistic or None.
        """
        return self.metrics.get(metric)

    def mean(self, metric: str) -> float | None:
        """The seed mean of `metric` (None when missing or undefined).

        Args:
            metric: a metric name.

        Returns:
            The mean or None.
        """
        s = self.metrics.get(metric)
        return None if s is None else s.mean


@dataclass
class MethodRoster(Record):
    """Which methods were evaluated at one N (``results["methods"][N]``): per setting, the primary MSV (None without
    one), whether the groups were grouped, and the single-sequence / multi-sequence / aggregation families."""

    terminal: list[str] = field(default_factory=list)
    streaming: list[str] = field(default_factory=list)
    msv: str | None = None
    grouped: bool = False
    single_sequence: list[str] = field(default_factory=list)
    multi_sequence: list[str] = field(default_factory=list)
    aggregations: list[str] = field(default_factory=list)


@dataclass
class Interval(Record):
    """A bootstrap interval over problems (`hf_msv.metrics.bootstrap_interval`): estimate and 95 % bounds, None for
    null in the JSON (an unbounded end, or not bootstrapped); the bounds are `MISSING` (not written) when the JSON
    has none."""

    estimate: float | None = None
    low: float | None = MISSING
    high: float | None = MISSING
    n_boot: int | None = MISSING

    @property
    def bootstrapped(self) -> bool:
        """Whether the interval has bounds (a point estimate alone otherwise)."""
        return self.low is not MISSING and self.low is not None


_INTERVAL = record(Interval)


# ----------------------------------------------------------------------------------------------------------------
# Early stopping
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class AxisFraction(Record):
    """The budget fraction the primary MSV needs to reach a baseline's peak accuracy on one axis (t*, latency,
    tokens): on seed-mean curves, per training seed, and its interval over problems (None without bootstrap).
    None fractions are ∞ (JSON null): the MSV never reaches the peak."""

    fraction: float | None = None
    per_seed: list = field(default_factory=list)
    interval: Interval | None = coded(_INTERVAL)


@dataclass
class EarlyStopComparison(Record):
    """The primary MSV against one baseline (the one of highest peak accuracy in a pool): both peak accuracies and
    the budget fraction on each axis (``steps`` is t*, the token position): every object-valued key."""

    baseline: str
    baseline_peak_accuracy: float | None = None
    msv_peak_accuracy: float | None = None
    axes: dict[str, AxisFraction] = rest(record(AxisFraction), accepts=lambda value: isinstance(value, Mapping))

    @property
    def steps(self) -> AxisFraction:
        """The fraction on t* (token position: the latency of parallel decoding)."""
        return self.axes["steps"]

    @property
    def tokens(self) -> AxisFraction:
        """The fraction on chain-of-thought tokens summed over the N sequences."""
        return self.axes["tokens"]

    @property
    def latency(self) -> AxisFraction:
        """The fraction on measured latency."""
        return self.axes["latency"]


@dataclass
class FullDecodingTarget(Record):
    """A curve summary: the budget at which the `Budgets` reference's evaluation curve first reaches the
    full-decoding accuracy of the most accurate baseline (read off the curve, like the paper's t*, not a λ chosen in
    advance): that baseline, its accuracy, and the fraction of full decoding's t* (``steps``) and tokens, each an
    `Interval` over problems."""

    baseline: str
    accuracy: float | None = None
    axes: dict[str, Interval | None] = rest(
        _INTERVAL, accepts=lambda value: value is None or isinstance(value, Mapping)
    )

    @property
    def steps(self) -> Interval | None:
        """The fraction of full decoding's t*."""
        return self.axes.get("steps")

    @property
    def tokens(self) -> Interval | None:
        """The fraction of full decoding's tokens."""
        return self.axes.get("tokens")


@dataclass
class ValidationBudget(Record):
    """One method at one budget, λ chosen on each training seed's validation groups (the most accurate λ within the
    budget there) and applied to the evaluation groups; every number a `SeedStat` over training seeds.

    Attributes:
        lam: the chosen λ (JSON key ``lambda``; values null for ∞: full decoding).
        val_accuracy / val_fraction: on validation, its accuracy and its tokens ÷ full decoding's.
        fits: 1 when some λ fit the budget on validation, 0 when none did (the cheapest λ was taken).
        eval_accuracy / eval_fraction: on evaluation, its accuracy and the token fraction it realised.
        interval: the reference − this method, paired over evaluation problems with each λ fixed (None for the
            reference itself, or without bootstrap).
    """

    lam: SeedStat = coded(_SEED_STAT, key="lambda")
    val_accuracy: SeedStat = coded(_SEED_STAT)
    val_fraction: SeedStat = coded(_SEED_STAT)
    fits: SeedStat = coded(_SEED_STAT)
    eval_accuracy: SeedStat = coded(_SEED_STAT)
    eval_fraction: SeedStat = coded(_SEED_STAT)
    interval: Interval | None = coded(_INTERVAL)


@dataclass
class InterpolatedAccuracy(Record):
    """One method's interpolated curve (upper hull of its evaluation operating points, what a randomised mix of two λ
    realises) read at one budget: a curve summary, not a budgeted accuracy.

    Attributes:
        accuracy: the hull of the training-seed-mean curve at the budget.
        interval: the reference − this method, both hulls recomputed on each resample of problems (None for the
            reference itself, or without bootstrap).
    """

    accuracy: float | None = None
    interval: Interval | None = coded(_INTERVAL)


@dataclass
class Budgets(Record):
    """Every streaming method at fixed fractions of full decoding's tokens (``results["early_stop"][N]["budgets"]``).

    Attributes:
        fractions: the budgets, fractions of full decoding's tokens.
        reference: the method the intervals compare with (the primary MSV, through its stop head when it has one).
        validation_chosen: method -> `ValidationBudget` per fraction; None without a validation split (no budget
            can then be chosen honestly, and none is reported).
        interpolated: method -> `InterpolatedAccuracy` per fraction.
        full_decoding_target: the curve summary `FullDecodingTarget` (None without a baseline).
    """

    fractions: list[float]
    reference: str
    validation_chosen: dict[str, list[ValidationBudget]] | None = coded(mapping_of(list_of(record(ValidationBudget))))
    interpolated: dict[str, list[InterpolatedAccuracy]] = coded(
        mapping_of(list_of(record(InterpolatedAccuracy))), default_factory=dict
    )
    full_decoding_target: FullDecodingTarget | None = coded(record(FullDecodingTarget))


@dataclass
class EarlyStopSummary(Record):
    """One N's early stopping (``results["early_stop"][N]``): seed-mean trade-off curves per method (as JSON dicts:
    ``lambdas``, ``accuracy``, ``tokens``, ``steps``, ``latency``, ``stop_rate``); with a primary MSV, the
    `Budgets` and, when a baseline was found, the comparison with the best of all baselines on tokens / latency
    (top-level fields) and the `EarlyStopComparison` per baseline pool (``single_sequence``, ``all``). Fields the
    dict did not have are None. Results written before budgets were chosen on validation keep their
    ``matched_budget`` entry (best points of the evaluation curves) in ``extra``, read back but never reported."""

    curves: dict[str, dict] = field(default_factory=dict)
    budgets: Budgets | None = coded(record(Budgets))
    msv: str | None = None
    best_baseline: str | None = None
    best_baseline_peak_accuracy: float | None = None
    msv_peak_accuracy: float | None = None
    token_fraction: float | None = None
    token_fraction_per_seed: list | None = None
    latency_fraction: float | None = None
    latency_fraction_per_seed: list | None = None
    comparisons: dict[str, EarlyStopComparison] | None = coded(mapping_of(record(EarlyStopComparison)))


# ----------------------------------------------------------------------------------------------------------------
# λ rules
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class LambdaRuleRecord(Record):
    """One λ rule of one streaming method at one N (``results["lambda_selection"][N][method][rule]``): each
    outcome a `SeedStat` over training seeds — the chosen λ (its values null for ∞), validation accuracy / tokens,
    evaluation accuracy / tokens / latency at that λ, the rate certified (LTT) or reached (target rule), and over
    the groups that stopped: the stop rate, accuracy, mean confidence and ECE. Outcomes the record lacks are
    None."""

    stats: dict[str, SeedStat] = rest(_SEED_STAT)

    def get(self, outcome: str) -> SeedStat | None:
        """The statistic of `outcome` (e.g. ``"eval_accuracy"``), None when missing.

        Args:
            outcome: an outcome name.

        Returns:
            The statistic or None.
        """
        return self.stats.get(outcome)

    @property
    def lam(self) -> SeedStat | None:
        """The chosen λ over seeds."""
        return self.stats.get("lambda")


@dataclass
class StopReliability(Record):
    """Reliability of the confidence reported when a λ rule stops (``results["stop_reliability"][N][method][rule]``):
    the evaluation groups that stopped early, pooled over training seeds, in tenths of confidence (empty bins left
    out; `hf_msv.metrics.reliability_bins`).

    Attributes:
        confidence: mean reported confidence per bin.
        accuracy: accuracy of the stopped answers per bin.
        count: stops per bin.
    """

    confidence: list[float]
    accuracy: list[float]
    count: list[int]


# ----------------------------------------------------------------------------------------------------------------
# Costs, figures, the whole study
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class StudyConfig(Record):
    """The study's settings (``results["config"]``): inputs, verifiers, the N values, the protocol settings and how
    each calibrated baseline was fitted. A setting the results do not record (results written before it existed)
    is `MISSING` (falsy; `has` tells); a recorded null is None.

    Attributes:
        eval_dir / val_dir: the splits' shard directories (val_dir None without validation).
        verifiers: name -> ``{"kind", "num_sequences", "modes"}``.
        num_sequences_list: the N values, ascending.
        training_seeds: how many training seeds (checkpoints per verifier).
        groups: how the sequences are grouped at each N (a sentence).
        bootstrap: bootstrap resamples of the intervals (0: none).
        checker / checker_kwargs: the equivalence checker re-deriving the classes (None: as collected).
        wv_threshold, deepconf_window, deepconf_stat: baseline settings.
        target_accuracy, target_fraction, ltt_epsilon, ltt_delta: the λ rules' settings.
        deepconf_calibration, vote_calibration, stacked_probe: how the calibrated baselines were fitted.
        prm: the PRM baseline's ``{"model", "aggregate", "step_separator", "lm_tokenizer"}`` (None without one).
        difficulty: the name of the difficulty breakdown's value (only with one).
    """

    eval_dir: str | None = MISSING
    val_dir: str | None = MISSING
    verifiers: dict = MISSING
    num_sequences_list: list[int] = MISSING
    training_seeds: int = MISSING
    groups: str = MISSING
    bootstrap: int = MISSING
    checker: str | None = MISSING
    checker_kwargs: dict = MISSING
    wv_threshold: float = MISSING
    deepconf_window: int = MISSING
    deepconf_stat: str = MISSING
    target_accuracy: float | None = MISSING
    target_fraction: float | None = MISSING
    ltt_epsilon: float = MISSING
    ltt_delta: float = MISSING
    deepconf_calibration: str = MISSING
    vote_calibration: str = MISSING
    stacked_probe: str = MISSING
    prm: dict | None = MISSING
    difficulty: str = MISSING


@dataclass
class StudyCosts(Record):
    """What the methods cost (``results["costs"]``): where the LM costs came from, per N the LM's per-unit costs
    (``{"decode_step_s", "elicit_s", "verify_s"}``) and each verifier's online / offline seconds per answer, and
    the PRM's cost per split (None without a PRM)."""

    source: str
    lm: dict[str, dict]
    verifier_online_s_per_answer: dict[str, dict[str, float]]
    verifier_offline_s_per_answer: dict[str, dict[str, float]]
    prm: dict | None = None


@dataclass
class Figure(Record):
    """One figure of the report: its PNG's file name (beside the report) and caption."""

    file: str
    caption: str


def _per_n(codec) -> Any:
    """A per-N section (``str(N)`` -> value through `codec`), ``{}`` when absent."""
    return coded(mapping_of(codec), default_factory=dict)


def _per_method_rule(cls: type[Record]):
    """The codec of method -> rule -> `cls`."""
    return mapping_of(mapping_of(record(cls)))


@dataclass
class StudyResults(Record):
    """Everything `evaluate_study` reports, section by section (per-N sections keyed by ``str(N)``).

    Attributes:
        title: the report's title.
        config: the study's settings, a `StudyConfig`.
        data: per split `split_statistics` and the collection settings, a JSON dict.
        costs: `StudyCosts`.
        methods: N -> `MethodRoster`.
        terminal: N -> method -> `MethodMetrics` on terminal answers.
        streaming: N -> method -> `MethodMetrics` on streaming answers.
        early_stop: N -> `EarlyStopSummary`.
        lambda_selection: N -> method -> rule -> `LambdaRuleRecord`.
        stop_reliability: N -> method -> rule -> `StopReliability` (empty in results written before it existed).
        intervals: N -> setting -> baseline -> metric -> `Interval` of the primary MSV − the baseline.
        brier_by_position: N -> ``{"edges": [...], method: [Brier per bin]}``, a JSON dict.
        by_difficulty: N -> difficulty value -> ``{"problems": count, method: {"brier", "bon_accuracy"}}``.
        figures: the `Figure` list.
    """

    title: str = ""
    config: StudyConfig = coded(record(StudyConfig))
    data: dict = field(default_factory=dict)
    costs: StudyCosts = coded(record(StudyCosts))
    methods: dict[str, MethodRoster] = _per_n(record(MethodRoster))
    terminal: dict[str, dict[str, MethodMetrics]] = _per_n(mapping_of(record(MethodMetrics)))
    streaming: dict[str, dict[str, MethodMetrics]] = _per_n(mapping_of(record(MethodMetrics)))
    early_stop: dict[str, EarlyStopSummary] = _per_n(record(EarlyStopSummary))
    lambda_selection: dict[str, dict[str, dict[str, LambdaRuleRecord]]] = _per_n(_per_method_rule(LambdaRuleRecord))
    stop_reliability: dict[str, dict[str, dict[str, StopReliability]]] = _per_n(_per_method_rule(StopReliability))
    intervals: dict[str, dict[str, dict[str, dict[str, Interval | None]]]] = _per_n(
        mapping_of(mapping_of(mapping_of(_INTERVAL)))
    )
    brier_by_position: dict[str, dict] = field(default_factory=dict)
    by_difficulty: dict[str, dict] = field(default_factory=dict)
    figures: list[Figure] = coded(list_of(record(Figure)), default_factory=list)

    @property
    def num_sequences(self) -> list[int]:
        """The N values evaluated, ascending (``config.num_sequences_list``)."""
        return list(self.config.num_sequences_list)

    def setting(self, name: str) -> dict[str, dict[str, MethodMetrics]]:
        """`terminal` or `streaming` by name.

        Args:
            name: ``"terminal"`` or ``"streaming"``.

        Returns:
            N -> method -> `MethodMetrics` of that setting.
        """
        if name not in ("terminal", "streaming"):
            raise KeyError(f"no setting {name!r}: terminal or streaming")
        return self.terminal if name == "terminal" else self.streaming

    def intervals_dict(self, n) -> dict[str, dict[str, dict[str, dict | None]]]:
        """The intervals at `n` as written to JSON: setting -> baseline -> metric -> interval dict.

        Args:
            n: N, an int or its string key.

        Returns:
            The dict (``{}`` when the study has no intervals at `n`).
        """
        return {
            s: {b: {k: None if iv is None else iv.to_dict() for k, iv in row.items()} for b, row in baselines.items()}
            for s, baselines in self.intervals.get(str(n), {}).items()
        }

    def msv(self, n) -> str | None:
        """The primary MSV's method label at `n` (None without one).

        Args:
            n: N, an int or its string key.

        Returns:
            The label or None.
        """
        return self.methods[str(n)].msv


def as_study_results(results: StudyResults | Mapping) -> StudyResults:
    """`results` as a `StudyResults`: as is, or read from a results dict (`StudyResults.from_dict`).

    Args:
        results: a `StudyResults` or the dict `evaluate_study` returns / writes.

    Returns:
        The `StudyResults`.
    """
    return results if isinstance(results, StudyResults) else StudyResults.from_dict(results)
