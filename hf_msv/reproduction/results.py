"""Typed results of `hf-msv reproduce`: dataclasses over the combined summary it writes (``testbed.json``).

    results = ReproductionResults.from_json(json.loads(Path("docs/results/testbed.json").read_text()))
    results.main.per_n["16"].terminal["MSV_16"].mean("brier")
    results.grouping.per_n["128"].early_stop.best_baseline

``ReproductionResults.from_json(d).to_json() == d``, keys in the same order, for every summary the reproduction
writes: `render_testbed` and `compute_claims` read attributes, so a renamed key fails when the summary is read, in one
place. Every record is a `hf_msv.evaluation.records.Record`, as the evaluation's are: keys a record does not model
are kept as they came (``extra``); keys it models but the summary lacks read as None and are not written back.
Per-N (per-size) sections are keyed by ``str(N)``, as in the JSON. The per-method numbers reuse the evaluation's
types (`SeedStat`, `MethodMetrics`, `Interval`, `EarlyStopComparison`, `LambdaRuleRecord`, `Figure`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, ClassVar, TypeVar

from ..evaluation.records import Record, coded, list_of, mapping_of, record, rest
from ..evaluation.results import EarlyStopComparison, Figure, Interval, LambdaRuleRecord, MethodMetrics, SeedStat

__all__ = [
    "LEGACY_PARTS_KEY",
    "ReportPart",
    "ReuseRecord",
    "FitCounts",
    "LMCost",
    "SummarySettings",
    "MainRow",
    "MainStudySummary",
    "CheckerRow",
    "CheckerStudy",
    "MaskStudy",
    "DelimiterRow",
    "DelimiterStudy",
    "GroupingEarlyStop",
    "GroupingRow",
    "GroupingStudy",
    "SizeRow",
    "TrainingSizeStudy",
    "VoteCheckRow",
    "Claim",
    "ReproductionResults",
    "as_reproduction_results",
    "unmodelled_keys",
    "required",
]

_T = TypeVar("_T")

LEGACY_PARTS_KEY = "sittings"  # the key of `ReproductionResults.parts` in reports written before it had that name


@dataclass
class _Summary(Record):
    """A record of the summary: every field optional (a key the summary lacks reads as None), and a record built
    in code writes only the fields it sets."""

    WRITE_NONE: ClassVar[bool] = False


def required(value: _T | None, what: str) -> _T:
    """`value`, a summary entry the caller needs: a ValueError naming `what` when the summary lacks it.

    Args:
        value: the entry (None when the summary has no such key).
        what: the entry, for the message (e.g. ``"the main study"``).

    Returns:
        `value`.
    """
    if value is None:
        raise ValueError(f"the reproduction summary has no {what}")
    return value


_STATS = mapping_of(record(SeedStat))
_METHODS = mapping_of(record(MethodMetrics))
_FIGURES = list_of(record(Figure))


# ----------------------------------------------------------------------------------------------------------------
# The run: settings, parts, reuse, costs
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class FitCounts(_Summary):
    """How many verifier fits a run trained and how many it reused from its work directory."""

    trained: int | None = None
    reused: int | None = None


@dataclass
class ReuseRecord(_Summary):
    """What a run reused from its work directory and what it redid although present, each with why."""

    reused: list[str] | None = None
    redone: list[str] | None = None


@dataclass
class ReportPart(_Summary):
    """One run that wrote (part of) the report (``--continue-report`` adds one): its studies, device, stage times,
    fit counts, reuse, commit, and the collections its re-made main collection differs in."""

    studies: list[str] | None = None
    device: str | None = None
    timing_s: dict[str, float] | None = None
    verifiers: FitCounts | None = coded(record(FitCounts))
    reuse: ReuseRecord | None = coded(record(ReuseRecord))
    git_commit: str | None = None
    collections: Any = None
    collections_differ_from_main: list[str] | None = None


@dataclass
class LMCost(_Summary):
    """The LM's measured costs at one N (s per shared decode step, per elicited answer, per verification)."""

    decode_step_s: float | None = None
    elicit_s: float | None = None
    verify_s: float | None = None


@dataclass
class SummarySettings(_Summary):
    """The `ReproduceConfig` the summary was produced with, as JSON (lists for tuples; ``task`` absent in v1-only
    summaries, ``seeds`` in summaries of random N-subsets). The settings the report names are fields; the rest
    stay in ``extra``."""

    task: str | None = None
    train_problems: int | None = None
    val_problems: int | None = None
    eval_problems: int | None = None
    num_samples: int | None = None
    num_sequences: list[int] | None = None
    training_seeds: int | None = None
    seeds: int | None = None
    max_new_tokens: int | None = None
    reference_checker: str | None = None
    delimiter_sizes: list[int] | None = None
    delimiter_samples: int | None = None
    quick: bool | None = None

    def items(self):
        """Every setting as read, ``(name, value)`` in the summary's order."""
        return self.to_json().items()


# ----------------------------------------------------------------------------------------------------------------
# The main study
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class MainRow(_Summary):
    """One N of the main study's summary (`main_summary`): the MSV, per-method terminal / streaming metrics, the
    early-stop fractions against the best baseline, the λ rules, verifier and LM costs; with the training-seed
    protocol, the bootstrap intervals (setting -> baseline -> metric -> `Interval`) and the early-stop comparisons
    per baseline pool."""

    msv: str | None = None
    multi_sequence: list[str] | None = None
    terminal: dict[str, MethodMetrics] | None = coded(_METHODS)
    streaming: dict[str, MethodMetrics] | None = coded(_METHODS)
    early_stop_token_fraction: float | None = None
    early_stop_token_fraction_per_seed: list | None = None
    early_stop_latency_fraction: float | None = None
    early_stop_best_baseline: str | None = None
    early_stop_best_baseline_peak_accuracy: float | None = None
    early_stop_msv_peak_accuracy: float | None = None
    lambda_selection: dict[str, dict[str, LambdaRuleRecord]] | None = coded(
        mapping_of(mapping_of(record(LambdaRuleRecord)))
    )
    verifier_online_s_per_answer: dict[str, float] | None = None
    lm_costs: LMCost | None = coded(record(LMCost))
    intervals: dict[str, dict[str, dict[str, Interval]]] | None = coded(
        mapping_of(mapping_of(mapping_of(record(Interval))))
    )
    by_difficulty: Any = None
    early_stop_comparisons: dict[str, EarlyStopComparison] | None = coded(mapping_of(record(EarlyStopComparison)))

    def interval(self, setting: str, baseline: str | None, metric: str) -> Interval | None:
        """The bootstrap interval of the MSV − `baseline` on `metric` (None without one: older summaries).

        Args:
            setting: ``"terminal"`` or ``"streaming"``.
            baseline: the compared method.
            metric: e.g. ``"brier"``, ``"brier_ratio"``.

        Returns:
            The interval or None.
        """
        return (self.intervals or {}).get(setting, {}).get(baseline or "", {}).get(metric)


@dataclass
class MainStudySummary(_Summary):
    """The main study's summary: one `MainRow` per N (``str(N)``), the study's ``data`` and its figures."""

    per_n: dict[str, MainRow] = rest(record(MainRow))
    data: dict | None = None
    figures: list[Figure] | None = coded(_FIGURES)

    def row(self, n) -> MainRow:
        """The `MainRow` of `n` (an int or its string)."""
        return self.per_n[str(n)]


# ----------------------------------------------------------------------------------------------------------------
# The optional studies
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class CheckerRow(_Summary):
    """One checker of the checker study: best-of-N per method and its agreement with the reference."""

    methods: dict[str, SeedStat | None] = rest(record(SeedStat))
    agreement: float | None = None


@dataclass
class CheckerStudy(_Summary):
    """Best-of-N under each equivalence checker at N = ``n`` (checker -> `CheckerRow`)."""

    n: int | None = None
    rows: dict[str, CheckerRow] | None = coded(mapping_of(record(CheckerRow)))


@dataclass
class MaskStudy(_Summary):
    """The streaming MSV_n with each attention mask removed (row name -> its metrics)."""

    n: int | None = None
    rows: dict[str, MethodMetrics] | None = coded(_METHODS)


@dataclass
class DelimiterRow(_Summary):
    """One elicitation (the Wait delimiter, every K tokens): AUTC per verifier and answers per sequence."""

    methods: dict[str, MethodMetrics] = rest(record(MethodMetrics))
    answers_per_sequence: float | None = None


@dataclass
class DelimiterStudy(_Summary):
    """Delimiter sensitivity at N = ``n`` (elicitation name -> `DelimiterRow`)."""

    n: int | None = None
    rows: dict[str, DelimiterRow] | None = coded(mapping_of(record(DelimiterRow)))
    mean_sequence_tokens: float | None = None


@dataclass
class GroupingEarlyStop(_Summary):
    """The grouped MSV's early stopping against the best baseline at one N."""

    best_baseline: str | None = None
    token_fraction: float | None = None
    latency_fraction: float | None = None


@dataclass
class GroupingRow(_Summary):
    """One N of the grouping study (`grouping_summary`): per method, AUTC over latency and tokens, peak accuracy,
    full-budget latency and verifier cost; the early stopping."""

    msv: str | None = None
    autc_latency_norm: dict[str, SeedStat] | None = coded(_STATS)
    autc_tokens_norm: dict[str, SeedStat] | None = coded(_STATS)
    peak_accuracy: dict[str, SeedStat] | None = coded(_STATS)
    verifier_online_s_per_answer: dict[str, float] | None = None
    full_latency: dict[str, SeedStat] | None = coded(_STATS)
    early_stop: GroupingEarlyStop | None = coded(record(GroupingEarlyStop))


@dataclass
class GroupingStudy(_Summary):
    """Large N with grouping: the group size ``m``, one `GroupingRow` per N, the trade-off figures."""

    m: int | None = None
    per_n: dict[str, GroupingRow] | None = coded(mapping_of(record(GroupingRow)))
    figures: list[Figure] | None = coded(_FIGURES)


@dataclass
class SizeRow(_Summary):
    """One training-set size (`size_row`): Probe / MSV calibration, best-of-N against the best baseline, the
    early-stop fraction."""

    msv: str | None = None
    terminal: dict[str, MethodMetrics] | None = coded(_METHODS)
    streaming: dict[str, MethodMetrics] | None = coded(_METHODS)
    bon_best_baseline: str | None = None
    bon_best_baseline_value: float | None = None
    bon_gain: float | None = None
    early_stop_best_baseline: str | None = None
    early_stop_token_fraction: float | None = None


@dataclass
class TrainingSizeStudy(_Summary):
    """The training-set-size study at N = ``n`` (``str(size)`` -> `SizeRow`)."""

    n: int | None = None
    per_size: dict[str, SizeRow] | None = coded(mapping_of(record(SizeRow)))


# ----------------------------------------------------------------------------------------------------------------
# Vote check, claims, the whole summary
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class VoteCheckRow(_Summary):
    """One MSV fit against the vote it is fed (`vote_check_rows`)."""

    study: str | None = None
    n: int | None = None
    setting: str | None = None
    method: str | None = None
    vote: str | None = None
    auroc: SeedStat | None = coded(record(SeedStat))
    vote_auroc: float | None = None
    difference: float | None = None
    at_vote: bool | None = None


@dataclass
class Claim(_Summary):
    """One verdict of `compute_claims`: ``held`` True, False or None (not testable)."""

    id: str | None = None
    claim: str | None = None
    paper: str | None = None
    held: bool | None = None
    sentence: str | None = None
    numbers: dict | None = None


@dataclass
class ReproductionResults(_Summary):
    """The combined summary of `hf-msv reproduce` (``testbed.json``): settings, run records, the main study and the
    optional studies' summaries (None when not run), the vote check and the claims."""

    config: SummarySettings | None = coded(record(SummarySettings))
    studies: list[str] | None = None
    paper: dict | None = None
    reports: dict[str, str] | None = None
    verifiers: FitCounts | None = coded(record(FitCounts))
    device: str | None = None
    parts: list[ReportPart] | None = coded(list_of(record(ReportPart)))
    lm_costs: dict[str, LMCost] | None = coded(mapping_of(record(LMCost)))
    main: MainStudySummary | None = coded(record(MainStudySummary))
    checkers: CheckerStudy | None = coded(record(CheckerStudy))
    masks: MaskStudy | None = coded(record(MaskStudy))
    delimiters: DelimiterStudy | None = coded(record(DelimiterStudy))
    grouping: GroupingStudy | None = coded(record(GroupingStudy))
    training_size: TrainingSizeStudy | None = coded(record(TrainingSizeStudy))
    timing_s: dict[str, float] | None = None
    reuse: ReuseRecord | None = coded(record(ReuseRecord))
    pending: list[str] | None = None
    vote_check: list[VoteCheckRow] | None = coded(list_of(record(VoteCheckRow)))
    claims: list[Claim] | None = coded(list_of(record(Claim)))

    @classmethod
    def from_json(cls, data: Mapping) -> ReproductionResults:
        """Read the summary (a report that names its parts `LEGACY_PARTS_KEY` is read, and written back, as
        ``parts``).

        Args:
            data: the summary's JSON object.

        Returns:
            The `ReproductionResults`.
        """
        if LEGACY_PARTS_KEY in data and "parts" not in data:
            data = {("parts" if key == LEGACY_PARTS_KEY else key): value for key, value in data.items()}
        return super().from_json(data)

    def report_parts(self) -> list[ReportPart]:
        """The parts the report records, oldest first."""
        return list(self.parts or [])


def unmodelled_keys(value, path: str = "") -> list[str]:
    """The dotted paths of every key no field models (kept in an ``extra``), anywhere under `value`: a key the
    writer renamed shows up here rather than as a silently missing number.

    Args:
        value: a record (e.g. a `ReproductionResults`), or a dict or list of them.
        path: the path of `value` itself.

    Returns:
        The paths, e.g. ``["config.problems_per_batch"]``.
    """
    prefix = f"{path}." if path else ""
    if isinstance(value, Mapping):
        return [found for key, item in value.items() for found in unmodelled_keys(item, f"{prefix}{key}")]
    if isinstance(value, list):
        return [found for index, item in enumerate(value) for found in unmodelled_keys(item, f"{prefix}{index}")]
    if not is_dataclass(value):
        return []
    found = [f"{prefix}{key}" for key in getattr(value, "extra", {})]
    for item in fields(value):
        if item.name not in ("extra", "present"):
            found += unmodelled_keys(getattr(value, item.name), f"{prefix}{item.name}")
    return found


def as_reproduction_results(summary: ReproductionResults | Mapping) -> ReproductionResults:
    """`summary` as a `ReproductionResults` (a summary dict, e.g. loaded JSON, is read into one).

    Args:
        summary: the typed summary or its dict.

    Returns:
        The `ReproductionResults`.
    """
    return summary if isinstance(summary, ReproductionResults) else ReproductionResults.from_json(summary)
