"""Typed results of `evaluate_study`: dataclasses over the JSON it writes (``{report_name}.json``).

    results = StudyResults.from_dict(json.loads(Path("reports/eval/report.json").read_text()))
    results.terminal["16"]["MSV_16"].mean("brier")       # the seed mean of a metric
    results.early_stop["16"].comparisons["all"].steps.fraction

``StudyResults.from_dict(d).to_dict() == d``, keys in the same order, for every results dict `evaluate_study` writes:
a renamed key then fails when a report is read, in one place, rather than deep in a table. Keys a section does not
model are kept as they came (``extra``), so older or newer results still round-trip. Per-N sections are keyed by
``str(N)``, as in the JSON.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

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


def _extra(d: Mapping, known: Iterable[str]) -> dict:
    """The entries of `d` whose keys are not in `known` (kept so that `to_dict` gives back what `from_dict` read)."""
    known = set(known)
    return {k: v for k, v in d.items() if k not in known}


def _put(out: dict, key: str, value) -> None:
    """Set `key` unless `value` is the `_MISSING` marker of a key the read dict did not have."""
    if value is not _MISSING:
        out[key] = value


class _Missing:
    """Marks an optional key that was absent (distinct from a JSON null, which is kept as None)."""

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


_MISSING: Any = _Missing()


# ----------------------------------------------------------------------------------------------------------------
# Numbers
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class SeedStat:
    """A number over training seeds (`hf_msv.metrics.seed_stat`): its mean, std and per-seed values; mean and std
    are None where the JSON has null (undefined: e.g. every seed nan)."""

    mean: float | None
    std: float | None
    values: list
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping) -> SeedStat:
        """Read ``{"mean", "std", "values"}``.

        Args:
            d: a seed statistic as `seed_stat` writes it.

        Returns:
            The `SeedStat`.
        """
        return cls(d.get("mean"), d.get("std"), list(d.get("values", [])), _extra(d, ("mean", "std", "values")))

    def to_dict(self) -> dict:
        """The seed statistic as written to JSON.

        Returns:
            ``{"mean", "std", "values"}`` (and any extra keys read).
        """
        return {"mean": self.mean, "std": self.std, "values": list(self.values), **self.extra}


def _stat(d) -> SeedStat | None:
    return None if d is None else SeedStat.from_dict(d)


def _stat_dict(s: SeedStat | None):
    return None if s is None else s.to_dict()


@dataclass
class MethodMetrics:
    """One method's metrics in one setting at one N: metric name (``"brier"``, ``"bon_accuracy"``,
    ``"autc_tokens_norm"``, ...) -> `SeedStat`, in report order. The metric names differ between the terminal and
    streaming settings, so they are keys rather than fields."""

    metrics: dict[str, SeedStat]

    @classmethod
    def from_dict(cls, d: Mapping) -> MethodMetrics:
        """Read {metric: seed statistic}.

        Args:
            d: one method's entry of ``results[setting][N]``.

        Returns:
            The `MethodMetrics`.
        """
        return cls({k: SeedStat.from_dict(v) for k, v in d.items()})

    def to_dict(self) -> dict:
        """{metric: seed statistic} as written to JSON.

        Returns:
            The dict.
        """
        return {k: v.to_dict() for k, v in self.metrics.items()}

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
class MethodRoster:
    """Which methods were evaluated at one N (``results["methods"][N]``): per setting, the primary MSV (None without
    one), whether the groups were grouped, and the single-sequence / multi-sequence / aggregation families."""

    terminal: list[str]
    streaming: list[str]
    msv: str | None
    grouped: bool
    single_sequence: list[str]
    multi_sequence: list[str]
    aggregations: list[str]
    extra: dict = field(default_factory=dict)

    _KEYS = ("terminal", "streaming", "msv", "grouped", "single_sequence", "multi_sequence", "aggregations")

    @classmethod
    def from_dict(cls, d: Mapping) -> MethodRoster:
        """Read one N's ``methods`` entry.

        Args:
            d: the entry.

        Returns:
            The `MethodRoster`.
        """
        return cls(
            list(d["terminal"]),
            list(d["streaming"]),
            d["msv"],
            d["grouped"],
            list(d["single_sequence"]),
            list(d["multi_sequence"]),
            list(d["aggregations"]),
            _extra(d, cls._KEYS),
        )

    def to_dict(self) -> dict:
        """The entry as written to JSON.

        Returns:
            The dict.
        """
        return {
            "terminal": list(self.terminal),
            "streaming": list(self.streaming),
            "msv": self.msv,
            "grouped": self.grouped,
            "single_sequence": list(self.single_sequence),
            "multi_sequence": list(self.multi_sequence),
            "aggregations": list(self.aggregations),
            **self.extra,
        }


@dataclass
class Interval:
    """A bootstrap interval over problems (`hf_msv.metrics.bootstrap_interval`): estimate and 95 % bounds, None for
    null in the JSON (an unbounded end, or not bootstrapped)."""

    estimate: float | None
    low: float | None = _MISSING
    high: float | None = _MISSING
    n_boot: int | None = _MISSING
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping) -> Interval:
        """Read ``{"estimate", "low", "high", "n_boot"}`` (bounds absent when not bootstrapped).

        Args:
            d: the interval.

        Returns:
            The `Interval`.
        """
        return cls(
            d.get("estimate"),
            d.get("low", _MISSING),
            d.get("high", _MISSING),
            d.get("n_boot", _MISSING),
            _extra(d, ("estimate", "low", "high", "n_boot")),
        )

    def to_dict(self) -> dict:
        """The interval as written to JSON.

        Returns:
            The dict, without the bounds it was read without.
        """
        out = {"estimate": self.estimate}
        _put(out, "low", self.low)
        _put(out, "high", self.high)
        _put(out, "n_boot", self.n_boot)
        return out | self.extra

    @property
    def bootstrapped(self) -> bool:
        """Whether the interval has bounds (a point estimate alone otherwise)."""
        return self.low is not _MISSING and self.low is not None


def _interval(d) -> Interval | None:
    return None if d is None else Interval.from_dict(d)


def _interval_dict(iv: Interval | None):
    return None if iv is None else iv.to_dict()


# ----------------------------------------------------------------------------------------------------------------
# Early stopping
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class AxisFraction:
    """The budget fraction the primary MSV needs to reach a baseline's peak accuracy on one axis (t*, latency,
    tokens): on seed-mean curves, per training seed, and its interval over problems (None without bootstrap).
    None fractions are ∞ (JSON null): the MSV never reaches the peak."""

    fraction: float | None
    per_seed: list
    interval: Interval | None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping) -> AxisFraction:
        """Read ``{"fraction", "per_seed", "interval"}``.

        Args:
            d: one axis of a comparison.

        Returns:
            The `AxisFraction`.
        """
        return cls(
            d.get("fraction"),
            list(d.get("per_seed", [])),
            _interval(d.get("interval")),
            _extra(d, ("fraction", "per_seed", "interval")),
        )

    def to_dict(self) -> dict:
        """The axis as written to JSON.

        Returns:
            The dict.
        """
        return {
            "fraction": self.fraction,
            "per_seed": list(self.per_seed),
            "interval": _interval_dict(self.interval),
            **self.extra,
        }


@dataclass
class EarlyStopComparison:
    """The primary MSV against one baseline (the one of highest peak accuracy in a pool): both peak accuracies and
    the budget fraction on each axis (``steps`` is t*, the token position)."""

    baseline: str
    baseline_peak_accuracy: float | None
    msv_peak_accuracy: float | None
    axes: dict[str, AxisFraction]
    extra: dict = field(default_factory=dict)

    _KEYS = ("baseline", "baseline_peak_accuracy", "msv_peak_accuracy")

    @classmethod
    def from_dict(cls, d: Mapping) -> EarlyStopComparison:
        """Read a comparison: its three scalars, then one entry per axis (every dict-valued key).

        Args:
            d: the comparison.

        Returns:
            The `EarlyStopComparison`.
        """
        rest = _extra(d, cls._KEYS)
        axes = {k: AxisFraction.from_dict(v) for k, v in rest.items() if isinstance(v, Mapping)}
        return cls(
            d["baseline"],
            d.get("baseline_peak_accuracy"),
            d.get("msv_peak_accuracy"),
            axes,
            {k: v for k, v in rest.items() if k not in axes},
        )

    def to_dict(self) -> dict:
        """The comparison as written to JSON.

        Returns:
            The dict.
        """
        return {
            "baseline": self.baseline,
            "baseline_peak_accuracy": self.baseline_peak_accuracy,
            "msv_peak_accuracy": self.msv_peak_accuracy,
            **{k: v.to_dict() for k, v in self.axes.items()},
            **self.extra,
        }

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
class FullDecodingTarget:
    """A curve summary: the budget at which the `Budgets` reference's evaluation curve first reaches the
    full-decoding accuracy of the most accurate baseline (read off the curve, like the paper's t*, not a λ chosen in
    advance): that baseline, its accuracy, and the fraction of full decoding's t* (``steps``) and tokens, each an
    `Interval` over problems."""

    baseline: str
    accuracy: float | None
    axes: dict[str, Interval | None]
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping) -> FullDecodingTarget:
        """Read ``{"baseline", "accuracy", "steps", "tokens"}``.

        Args:
            d: the ``full_decoding_target`` entry.

        Returns:
            The `FullDecodingTarget`.
        """
        rest = _extra(d, ("baseline", "accuracy"))
        axes = {k: _interval(v) for k, v in rest.items() if v is None or isinstance(v, Mapping)}
        return cls(d["baseline"], d.get("accuracy"), axes, {k: v for k, v in rest.items() if k not in axes})

    def to_dict(self) -> dict:
        """The entry as written to JSON.

        Returns:
            The dict.
        """
        return {
            "baseline": self.baseline,
            "accuracy": self.accuracy,
            **{k: _interval_dict(v) for k, v in self.axes.items()},
            **self.extra,
        }

    @property
    def steps(self) -> Interval | None:
        """The fraction of full decoding's t*."""
        return self.axes.get("steps")

    @property
    def tokens(self) -> Interval | None:
        """The fraction of full decoding's tokens."""
        return self.axes.get("tokens")


@dataclass
class ValidationBudget:
    """One method at one budget, λ chosen on each training seed's validation groups (the most accurate λ within the
    budget there) and applied to the evaluation groups; every number a `SeedStat` over training seeds.

    Attributes:
        lam: the chosen λ (values null for ∞: full decoding).
        val_accuracy / val_fraction: on validation, its accuracy and its tokens ÷ full decoding's.
        fits: 1 when some λ fit the budget on validation, 0 when none did (the cheapest λ was taken).
        eval_accuracy / eval_fraction: on evaluation, its accuracy and the token fraction it realised.
        interval: the reference − this method, paired over evaluation problems with each λ fixed (None for the
            reference itself, or without bootstrap).
    """

    lam: SeedStat
    val_accuracy: SeedStat
    val_fraction: SeedStat
    fits: SeedStat
    eval_accuracy: SeedStat
    eval_fraction: SeedStat
    interval: Interval | None = None

    _STATS = ("val_accuracy", "val_fraction", "fits", "eval_accuracy", "eval_fraction")

    @classmethod
    def from_dict(cls, d: Mapping) -> ValidationBudget:
        """Read ``{"lambda", "val_accuracy", "val_fraction", "fits", "eval_accuracy", "eval_fraction", "interval"}``.

        Args:
            d: one budget of one method.

        Returns:
            The `ValidationBudget`.
        """
        stats = {k: SeedStat.from_dict(d[k]) for k in cls._STATS}
        return cls(lam=SeedStat.from_dict(d["lambda"]), interval=_interval(d.get("interval")), **stats)

    def to_dict(self) -> dict:
        """The budget as written to JSON.

        Returns:
            The dict.
        """
        stats = {k: getattr(self, k).to_dict() for k in self._STATS}
        return {"lambda": self.lam.to_dict(), **stats, "interval": _interval_dict(self.interval)}


@dataclass
class InterpolatedAccuracy:
    """One method's interpolated curve (upper hull of its evaluation operating points, what a randomised mix of two λ
    realises) read at one budget: a curve summary, not a budgeted accuracy.

    Attributes:
        accuracy: the hull of the training-seed-mean curve at the budget.
        interval: the reference − this method, both hulls recomputed on each resample of problems (None for the
            reference itself, or without bootstrap).
    """

    accuracy: float | None
    interval: Interval | None = None

    @classmethod
    def from_dict(cls, d: Mapping) -> InterpolatedAccuracy:
        """Read ``{"accuracy", "interval"}``.

        Args:
            d: one budget of one method.

        Returns:
            The `InterpolatedAccuracy`.
        """
        return cls(d.get("accuracy"), _interval(d.get("interval")))

    def to_dict(self) -> dict:
        """The entry as written to JSON.

        Returns:
            The dict.
        """
        return {"accuracy": self.accuracy, "interval": _interval_dict(self.interval)}


@dataclass
class Budgets:
    """Every streaming method at fixed fractions of full decoding's tokens (``results["early_stop"][N]["budgets"]``).

    Attributes:
        fractions: the budgets, fractions of full decoding's tokens.
        reference: the method the intervals compare with (the primary MSV, through its stop head when it has one).
        validation_chosen: method -> `ValidationBudget` per fraction; None without a validation split (no budget
            can then be chosen honestly, and none is reported).
        interpolated: method -> `InterpolatedAccuracy` per fraction.
        full_decoding_target: the curve summary `FullDecodingTarget` (None without a baseline).
        extra: keys not modelled here, kept as read.
    """

    fractions: list[float]
    reference: str
    validation_chosen: dict[str, list[ValidationBudget]] | None
    interpolated: dict[str, list[InterpolatedAccuracy]]
    full_decoding_target: FullDecodingTarget | None = None
    extra: dict = field(default_factory=dict)

    _KEYS = ("fractions", "reference", "validation_chosen", "interpolated", "full_decoding_target")

    @classmethod
    def from_dict(cls, d: Mapping) -> Budgets:
        """Read the ``budgets`` entry.

        Args:
            d: the entry.

        Returns:
            The `Budgets`.
        """
        chosen, target = d.get("validation_chosen"), d.get("full_decoding_target")
        return cls(
            list(d["fractions"]),
            d["reference"],
            None if chosen is None else {m: [ValidationBudget.from_dict(b) for b in bs] for m, bs in chosen.items()},
            {m: [InterpolatedAccuracy.from_dict(b) for b in bs] for m, bs in d["interpolated"].items()},
            None if target is None else FullDecodingTarget.from_dict(target),
            _extra(d, cls._KEYS),
        )

    def to_dict(self) -> dict:
        """The entry as written to JSON.

        Returns:
            The dict.
        """
        chosen = self.validation_chosen
        return {
            "fractions": list(self.fractions),
            "reference": self.reference,
            "validation_chosen": None
            if chosen is None
            else {m: [b.to_dict() for b in bs] for m, bs in chosen.items()},
            "interpolated": {m: [b.to_dict() for b in bs] for m, bs in self.interpolated.items()},
            "full_decoding_target": None if self.full_decoding_target is None else self.full_decoding_target.to_dict(),
            **self.extra,
        }


@dataclass
class EarlyStopSummary:
    """One N's early stopping (``results["early_stop"][N]``): seed-mean trade-off curves per method (as JSON dicts:
    ``lambdas``, ``accuracy``, ``tokens``, ``steps``, ``latency``, ``stop_rate``); with a primary MSV, the
    `Budgets` and, when a baseline was found, the comparison with the best of all baselines on tokens / latency
    (top-level fields) and the `EarlyStopComparison` per baseline pool (``single_sequence``, ``all``). Fields the
    dict did not have are None. Results written before budgets were chosen on validation keep their
    ``matched_budget`` entry (best points of the evaluation curves) in ``extra``, read back but never reported."""

    curves: dict[str, dict]
    budgets: Budgets | None = None
    msv: str | None = None
    best_baseline: str | None = None
    best_baseline_peak_accuracy: float | None = None
    msv_peak_accuracy: float | None = None
    token_fraction: float | None = None
    token_fraction_per_seed: list | None = None
    latency_fraction: float | None = None
    latency_fraction_per_seed: list | None = None
    comparisons: dict[str, EarlyStopComparison] | None = None
    present: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict)

    _KEYS = (
        "curves",
        "budgets",
        "msv",
        "best_baseline",
        "best_baseline_peak_accuracy",
        "msv_peak_accuracy",
        "token_fraction",
        "token_fraction_per_seed",
        "latency_fraction",
        "latency_fraction_per_seed",
        "comparisons",
    )

    @classmethod
    def from_dict(cls, d: Mapping) -> EarlyStopSummary:
        """Read one N's ``early_stop`` entry (possibly ``{}``: no streaming method).

        Args:
            d: the entry.

        Returns:
            The `EarlyStopSummary`.
        """
        comps, budgets = d.get("comparisons"), d.get("budgets")
        return cls(
            curves=dict(d.get("curves", {})),
            budgets=None if budgets is None else Budgets.from_dict(budgets),
            msv=d.get("msv"),
            best_baseline=d.get("best_baseline"),
            best_baseline_peak_accuracy=d.get("best_baseline_peak_accuracy"),
            msv_peak_accuracy=d.get("msv_peak_accuracy"),
            token_fraction=d.get("token_fraction"),
            token_fraction_per_seed=d.get("token_fraction_per_seed"),
            latency_fraction=d.get("latency_fraction"),
            latency_fraction_per_seed=d.get("latency_fraction_per_seed"),
            comparisons=None if comps is None else {k: EarlyStopComparison.from_dict(v) for k, v in comps.items()},
            # the order the keys came in: `to_dict` writes them back in it (the study adds them in stages)
            present=tuple(k for k in d if k in cls._KEYS),
            extra=_extra(d, cls._KEYS),
        )

    def to_dict(self) -> dict:
        """The entry as written to JSON.

        Returns:
            The dict, with the keys it was read with (or built with), in their order.
        """
        values = {
            "curves": self.curves,
            "budgets": None if self.budgets is None else self.budgets.to_dict(),
            "msv": self.msv,
            "best_baseline": self.best_baseline,
            "best_baseline_peak_accuracy": self.best_baseline_peak_accuracy,
            "msv_peak_accuracy": self.msv_peak_accuracy,
            "token_fraction": self.token_fraction,
            "token_fraction_per_seed": self.token_fraction_per_seed,
            "latency_fraction": self.latency_fraction,
            "latency_fraction_per_seed": self.latency_fraction_per_seed,
            "comparisons": None if self.comparisons is None else {k: v.to_dict() for k, v in self.comparisons.items()},
        }
        return {k: values[k] for k in self.present} | self.extra


# ----------------------------------------------------------------------------------------------------------------
# λ rules
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class LambdaRuleRecord:
    """One λ rule of one streaming method at one N (``results["lambda_selection"][N][method][rule]``): each
    outcome a `SeedStat` over training seeds — the chosen λ (its values null for ∞), validation accuracy / tokens,
    evaluation accuracy / tokens / latency at that λ, the rate certified (LTT) or reached (target rule), and over
    the groups that stopped: the stop rate, accuracy, mean confidence and ECE. Outcomes the record lacks are
    None."""

    stats: dict[str, SeedStat]

    @classmethod
    def from_dict(cls, d: Mapping) -> LambdaRuleRecord:
        """Read {outcome: seed statistic}.

        Args:
            d: the record.

        Returns:
            The `LambdaRuleRecord`.
        """
        return cls({k: SeedStat.from_dict(v) for k, v in d.items()})

    def to_dict(self) -> dict:
        """The record as written to JSON.

        Returns:
            The dict.
        """
        return {k: v.to_dict() for k, v in self.stats.items()}

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


@dataclass(frozen=True)
class StopReliability:
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

    @classmethod
    def from_dict(cls, d: Mapping) -> StopReliability:
        """Read ``{"confidence", "accuracy", "count"}``.

        Args:
            d: the bins.

        Returns:
            The `StopReliability`.
        """
        return cls(list(d["confidence"]), list(d["accuracy"]), list(d["count"]))

    def to_dict(self) -> dict:
        """The bins as written to JSON.

        Returns:
            The dict.
        """
        return {"confidence": self.confidence, "accuracy": self.accuracy, "count": self.count}


# ----------------------------------------------------------------------------------------------------------------
# Costs, figures, the whole study
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class StudyConfig:
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
        order: the keys in the order read (`to_dict` writes them back in it).
        extra: keys not modelled here, kept as read.
    """

    eval_dir: str | None = _MISSING
    val_dir: str | None = _MISSING
    verifiers: dict = _MISSING
    num_sequences_list: list[int] = _MISSING
    training_seeds: int = _MISSING
    groups: str = _MISSING
    bootstrap: int = _MISSING
    checker: str | None = _MISSING
    checker_kwargs: dict = _MISSING
    wv_threshold: float = _MISSING
    deepconf_window: int = _MISSING
    deepconf_stat: str = _MISSING
    target_accuracy: float | None = _MISSING
    target_fraction: float | None = _MISSING
    ltt_epsilon: float = _MISSING
    ltt_delta: float = _MISSING
    deepconf_calibration: str = _MISSING
    vote_calibration: str = _MISSING
    stacked_probe: str = _MISSING
    prm: dict | None = _MISSING
    difficulty: str = _MISSING
    order: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict)

    @classmethod
    def _settings(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.name not in ("order", "extra"))

    @classmethod
    def from_dict(cls, d: Mapping) -> StudyConfig:
        """Read ``results["config"]``.

        Args:
            d: the config entry.

        Returns:
            The `StudyConfig`.
        """
        known = cls._settings()
        return cls(**{k: d[k] for k in known if k in d}, order=tuple(d), extra=_extra(d, known))

    def to_dict(self) -> dict:
        """The config entry as written to JSON.

        Returns:
            The dict: the keys read, in their order, then any setting given since.
        """
        known = self._settings()
        value = lambda k: getattr(self, k) if k in known else self.extra[k]  # noqa: E731
        keys = [k for k in self.order if k in self.extra or (k in known and self.has(k))]
        keys += [k for k in known if self.has(k) and k not in keys]
        keys += [k for k in self.extra if k not in keys]
        return {k: value(k) for k in keys}

    def has(self, setting: str) -> bool:
        """Whether the results record `setting` (even as null).

        Args:
            setting: a setting's name.

        Returns:
            True when recorded.
        """
        return setting in self.extra or getattr(self, setting, _MISSING) is not _MISSING


@dataclass
class StudyCosts:
    """What the methods cost (``results["costs"]``): where the LM costs came from, per N the LM's per-unit costs
    (``{"decode_step_s", "elicit_s", "verify_s"}``) and each verifier's online / offline seconds per answer, and
    the PRM's cost per split (None without a PRM)."""

    source: str
    lm: dict[str, dict]
    verifier_online_s_per_answer: dict[str, dict[str, float]]
    verifier_offline_s_per_answer: dict[str, dict[str, float]]
    prm: dict | None
    extra: dict = field(default_factory=dict)

    _KEYS = ("source", "lm", "verifier_online_s_per_answer", "verifier_offline_s_per_answer", "prm")

    @classmethod
    def from_dict(cls, d: Mapping) -> StudyCosts:
        """Read ``results["costs"]``.

        Args:
            d: the costs entry.

        Returns:
            The `StudyCosts`.
        """
        return cls(
            d["source"],
            dict(d["lm"]),
            dict(d["verifier_online_s_per_answer"]),
            dict(d["verifier_offline_s_per_answer"]),
            d.get("prm"),
            _extra(d, cls._KEYS),
        )

    def to_dict(self) -> dict:
        """The costs entry as written to JSON.

        Returns:
            The dict.
        """
        return {
            "source": self.source,
            "lm": self.lm,
            "verifier_online_s_per_answer": self.verifier_online_s_per_answer,
            "verifier_offline_s_per_answer": self.verifier_offline_s_per_answer,
            "prm": self.prm,
            **self.extra,
        }


@dataclass
class Figure:
    """One figure of the report: its PNG's file name (beside the report) and caption."""

    file: str
    caption: str

    @classmethod
    def from_dict(cls, d: Mapping) -> Figure:
        """Read ``{"file", "caption"}``.

        Args:
            d: the figure entry.

        Returns:
            The `Figure`.
        """
        return cls(d["file"], d["caption"])

    def to_dict(self) -> dict:
        """The figure entry as written to JSON.

        Returns:
            ``{"file", "caption"}``.
        """
        return {"file": self.file, "caption": self.caption}


def _per_n(d: Mapping | None, read) -> dict:
    return {k: read(v) for k, v in (d or {}).items()}


@dataclass
class StudyResults:
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
        extra: top-level keys not modelled here, kept as read.
    """

    title: str
    config: StudyConfig
    data: dict
    costs: StudyCosts
    methods: dict[str, MethodRoster]
    terminal: dict[str, dict[str, MethodMetrics]]
    streaming: dict[str, dict[str, MethodMetrics]]
    early_stop: dict[str, EarlyStopSummary]
    lambda_selection: dict[str, dict[str, dict[str, LambdaRuleRecord]]]
    intervals: dict[str, dict[str, dict[str, dict[str, Interval | None]]]]
    brier_by_position: dict[str, dict]
    by_difficulty: dict[str, dict]
    figures: list[Figure]
    stop_reliability: dict[str, dict[str, dict[str, StopReliability]]] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    _KEYS = (
        "title",
        "config",
        "data",
        "costs",
        "methods",
        "terminal",
        "streaming",
        "early_stop",
        "lambda_selection",
        "stop_reliability",
        "intervals",
        "brier_by_position",
        "by_difficulty",
        "figures",
    )

    @classmethod
    def from_dict(cls, d: Mapping) -> StudyResults:
        """Read the results dict `evaluate_study` returns (or its JSON, loaded).

        Args:
            d: the results dict.

        Returns:
            The `StudyResults`; ``to_dict()`` gives `d` back.
        """
        metrics = lambda per_n: _per_n(per_n, lambda ms: {m: MethodMetrics.from_dict(r) for m, r in ms.items()})  # noqa: E731
        return cls(
            title=d["title"],
            config=StudyConfig.from_dict(d["config"]),
            data=dict(d["data"]),
            costs=StudyCosts.from_dict(d["costs"]),
            methods=_per_n(d["methods"], MethodRoster.from_dict),
            terminal=metrics(d["terminal"]),
            streaming=metrics(d["streaming"]),
            early_stop=_per_n(d.get("early_stop"), EarlyStopSummary.from_dict),
            lambda_selection=_per_n(
                d.get("lambda_selection"),
                lambda ms: {
                    m: {rule: LambdaRuleRecord.from_dict(r) for rule, r in rules.items()} for m, rules in ms.items()
                },
            ),
            intervals=_per_n(
                d.get("intervals"),
                lambda settings: {
                    s: {b: {k: _interval(iv) for k, iv in row.items()} for b, row in baselines.items()}
                    for s, baselines in settings.items()
                },
            ),
            brier_by_position=dict(d.get("brier_by_position", {})),
            by_difficulty=dict(d.get("by_difficulty", {})),
            figures=[Figure.from_dict(f) for f in d.get("figures", [])],
            stop_reliability=_per_n(
                d.get("stop_reliability"),
                lambda ms: {
                    m: {rule: StopReliability.from_dict(b) for rule, b in rules.items()} for m, rules in ms.items()
                },
            ),
            extra=_extra(d, cls._KEYS),
        )

    def to_dict(self) -> dict:
        """The results dict, as written to ``{report_name}.json``.

        Returns:
            The dict, keys in report order.
        """
        metrics = lambda per_n: {n: {m: r.to_dict() for m, r in ms.items()} for n, ms in per_n.items()}  # noqa: E731
        return {
            "title": self.title,
            "config": self.config.to_dict(),
            "data": self.data,
            "costs": self.costs.to_dict(),
            "methods": {n: r.to_dict() for n, r in self.methods.items()},
            "terminal": metrics(self.terminal),
            "streaming": metrics(self.streaming),
            "early_stop": {n: e.to_dict() for n, e in self.early_stop.items()},
            "lambda_selection": {
                n: {m: {rule: r.to_dict() for rule, r in rules.items()} for m, rules in ms.items()}
                for n, ms in self.lambda_selection.items()
            },
            **self._stop_reliability_dict(),
            "intervals": {n: self.intervals_dict(n) for n in self.intervals},
            "brier_by_position": self.brier_by_position,
            "by_difficulty": self.by_difficulty,
            "figures": [f.to_dict() for f in self.figures],
            **self.extra,
        }

    def _stop_reliability_dict(self) -> dict:
        if not self.stop_reliability:  # results written before it existed have no such key
            return {}
        return {
            "stop_reliability": {
                n: {m: {rule: b.to_dict() for rule, b in rules.items()} for m, rules in ms.items()}
                for n, ms in self.stop_reliability.items()
            }
        }

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

    def intervals_dict(self, n) -> dict:
        """The intervals at `n` as written to JSON: setting -> baseline -> metric -> interval dict.

        Args:
            n: N, an int or its string key.

        Returns:
            The dict (``{}`` when the study has no intervals at `n`).
        """
        return {
            s: {b: {k: _interval_dict(iv) for k, iv in row.items()} for b, row in baselines.items()}
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
