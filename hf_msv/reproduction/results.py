"""Typed results of `hf-msv reproduce`: dataclasses over the combined summary it writes (``testbed.json``).

    results = ReproductionResults.from_json(json.loads(Path("docs/results/testbed.json").read_text()))
    results.main.per_n["16"].terminal["MSV_16"].mean("brier")
    results.grouping.per_n["128"].early_stop.best_baseline

``ReproductionResults.from_json(d).to_json() == d``, keys in the same order, for every summary the reproduction
writes: `render_testbed` and `compute_claims` read attributes, so a renamed key fails when the summary is read, in one
place. Keys a record does not model are kept as they came (``extra``); keys it models but the summary lacks read as
None and are not written back. Per-N (per-size) sections are keyed by ``str(N)``, as in the JSON. The per-method
numbers reuse the evaluation's types (`SeedStat`, `MethodMetrics`, `Interval`, `EarlyStopComparison`,
`LambdaRuleRecord`, `Figure`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

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
]

LEGACY_PARTS_KEY = "sittings"  # the key of `ReproductionResults.parts` in reports written before it had that name

# How a field's JSON value is read into its type and written back (None, a JSON null, is kept as None).
_Codec = tuple[Callable[[Any], Any], Callable[[Any], Any]]


def _typed(cls) -> _Codec:
    """The codec of one object of `cls` (``from_dict``/``to_dict`` of the evaluation's types, else JSON)."""
    if hasattr(cls, "from_json"):
        return cls.from_json, lambda value: value.to_json()
    return cls.from_dict, lambda value: value.to_dict()


def _mapping_of(codec: _Codec) -> _Codec:
    """The codec of a ``{key: value}`` mapping whose values use `codec`."""
    read, write = codec
    return (
        lambda data: {key: _apply(read, value) for key, value in data.items()},
        lambda values: {key: _apply(write, value) for key, value in values.items()},
    )


def _list_of(codec: _Codec) -> _Codec:
    """The codec of a list whose items use `codec`."""
    read, write = codec
    return (lambda data: [_apply(read, item) for item in data], lambda items: [_apply(write, item) for item in items])


def _apply(function, value):
    return None if value is None else function(value)


def _coded(codec: _Codec, default=None):
    """A dataclass field whose JSON value goes through `codec`."""
    return field(default=default, metadata={"codec": codec})


@dataclass
class _Record:
    """A JSON object read into fields named as its keys (a field's ``codec`` metadata types its value); ``present``
    keeps the keys read, in their order, and ``extra`` those no field models, so `to_json` writes back what
    `from_json` read. A record built in code (no ``present``) writes its set fields, in declaration order."""

    present: tuple[str, ...] = field(default=(), kw_only=True, repr=False)
    extra: dict = field(default_factory=dict, kw_only=True, repr=False)

    @classmethod
    def _modelled(cls) -> dict:
        return {item.name: item for item in fields(cls) if item.name not in ("present", "extra")}

    @classmethod
    def from_json(cls, data: Mapping):
        """Read the record.

        Args:
            data: the JSON object.

        Returns:
            The record (of the class it is called on).
        """
        modelled = cls._modelled()
        values = {}
        for key, value in data.items():
            if key in modelled:
                codec = modelled[key].metadata.get("codec")
                values[key] = value if codec is None else _apply(codec[0], value)
        extra = {key: value for key, value in data.items() if key not in modelled}
        return cls(**values, present=tuple(data), extra=extra)

    def to_json(self) -> dict:
        """The record as written to JSON.

        Returns:
            The dict, with the keys it was read with, in their order.
        """
        modelled = self._modelled()
        keys = self.present or (
            *(name for name in modelled if getattr(self, name) is not None),
            *self.extra,
        )
        out = {}
        for key in keys:
            if key not in modelled:
                out[key] = self.extra[key]
                continue
            codec = modelled[key].metadata.get("codec")
            value = getattr(self, key)
            out[key] = value if codec is None else _apply(codec[1], value)
        return out

    def has(self, key: str) -> bool:
        """Whether the summary had `key` (or, for a record built in code, whether it is set).

        Args:
            key: a JSON key.

        Returns:
            True or False.
        """
        return key in self.present if self.present else getattr(self, key, None) is not None


_STATS = _mapping_of(_typed(SeedStat))
_METHODS = _mapping_of(_typed(MethodMetrics))
_FIGURES = _list_of(_typed(Figure))


# ----------------------------------------------------------------------------------------------------------------
# The run: settings, parts, reuse, costs
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class FitCounts(_Record):
    """How many verifier fits a run trained and how many it reused from its work directory."""

    trained: int | None = None
    reused: int | None = None


@dataclass
class ReuseRecord(_Record):
    """What a run reused from its work directory and what it redid although present, each with why."""

    reused: list[str] | None = None
    redone: list[str] | None = None


@dataclass
class ReportPart(_Record):
    """One run that wrote (part of) the report (``--continue-report`` adds one): its studies, device, stage times,
    fit counts, reuse, commit, and the collections its re-made main collection differs in."""

    studies: list[str] | None = None
    device: str | None = None
    timing_s: dict[str, float] | None = None
    verifiers: FitCounts | None = _coded(_typed(FitCounts))
    reuse: ReuseRecord | None = _coded(_typed(ReuseRecord))
    git_commit: str | None = None
    collections: Any = None
    collections_differ_from_main: list[str] | None = None


@dataclass
class LMCost(_Record):
    """The LM's measured costs at one N (s per shared decode step, per elicited answer, per verification)."""

    decode_step_s: float | None = None
    elicit_s: float | None = None
    verify_s: float | None = None


@dataclass
class SummarySettings(_Record):
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
class MainRow(_Record):
    """One N of the main study's summary (`main_summary`): the MSV, per-method terminal / streaming metrics, the
    early-stop fractions against the best baseline, the λ rules, verifier and LM costs; with the training-seed
    protocol, the bootstrap intervals (setting -> baseline -> metric -> `Interval`) and the early-stop comparisons
    per baseline pool."""

    msv: str | None = None
    multi_sequence: list[str] | None = None
    terminal: dict[str, MethodMetrics] | None = _coded(_METHODS)
    streaming: dict[str, MethodMetrics] | None = _coded(_METHODS)
    early_stop_token_fraction: float | None = None
    early_stop_token_fraction_per_seed: list | None = None
    early_stop_latency_fraction: float | None = None
    early_stop_best_baseline: str | None = None
    early_stop_best_baseline_peak_accuracy: float | None = None
    early_stop_msv_peak_accuracy: float | None = None
    lambda_selection: dict[str, dict[str, LambdaRuleRecord]] | None = _coded(
        _mapping_of(_mapping_of(_typed(LambdaRuleRecord)))
    )
    verifier_online_s_per_answer: dict[str, float] | None = None
    lm_costs: LMCost | None = _coded(_typed(LMCost))
    intervals: dict[str, dict[str, dict[str, Interval]]] | None = _coded(
        _mapping_of(_mapping_of(_mapping_of(_typed(Interval))))
    )
    by_difficulty: Any = None
    early_stop_comparisons: dict[str, EarlyStopComparison] | None = _coded(_mapping_of(_typed(EarlyStopComparison)))

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
class MainStudySummary:
    """The main study's summary: one `MainRow` per N (``str(N)``), the study's ``data`` and its figures."""

    per_n: dict[str, MainRow]
    data: dict | None = None
    figures: list[Figure] | None = None
    order: tuple[str, ...] = field(default=(), repr=False)

    _OTHER_KEYS = ("data", "figures")

    @classmethod
    def from_json(cls, data: Mapping) -> MainStudySummary:
        """Read the ``main`` entry.

        Args:
            data: the entry.

        Returns:
            The `MainStudySummary`.
        """
        per_n = {key: MainRow.from_json(value) for key, value in data.items() if key not in cls._OTHER_KEYS}
        figures = data.get("figures")
        return cls(
            per_n,
            data.get("data"),
            None if figures is None else _FIGURES[0](figures),
            tuple(data),
        )

    def to_json(self) -> dict:
        """The entry as written to JSON.

        Returns:
            The dict, keys in the order read.
        """
        written: dict[str, Any] = {key: row.to_json() for key, row in self.per_n.items()}
        written["data"] = self.data
        written["figures"] = None if self.figures is None else _FIGURES[1](self.figures)
        order = self.order or (*self.per_n, *self._OTHER_KEYS)
        return {key: written[key] for key in order}

    def row(self, n) -> MainRow:
        """The `MainRow` of `n` (an int or its string)."""
        return self.per_n[str(n)]


# ----------------------------------------------------------------------------------------------------------------
# The optional studies
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class CheckerRow:
    """One checker of the checker study: its agreement with the reference and best-of-N per method."""

    agreement: float | None
    methods: dict[str, SeedStat | None]
    order: tuple[str, ...] = field(default=(), repr=False)

    @classmethod
    def from_json(cls, data: Mapping) -> CheckerRow:
        """Read ``{"agreement", method: seed statistic, ...}``."""
        methods = {key: _apply(SeedStat.from_dict, value) for key, value in data.items() if key != "agreement"}
        return cls(data.get("agreement"), methods, tuple(data))

    def to_json(self) -> dict:
        """The row as written to JSON."""
        written: dict[str, Any] = {key: _apply(SeedStat.to_dict, stat) for key, stat in self.methods.items()}
        if "agreement" in self.order or (not self.order and self.agreement is not None):
            written["agreement"] = self.agreement
        order = self.order or tuple(written)
        return {key: written[key] for key in order}


@dataclass
class CheckerStudy(_Record):
    """Best-of-N under each equivalence checker at N = ``n`` (checker -> `CheckerRow`)."""

    n: int | None = None
    rows: dict[str, CheckerRow] | None = _coded(_mapping_of(_typed(CheckerRow)))


@dataclass
class MaskStudy(_Record):
    """The streaming MSV_n with each attention mask removed (row name -> its metrics)."""

    n: int | None = None
    rows: dict[str, MethodMetrics] | None = _coded(_METHODS)


@dataclass
class DelimiterRow:
    """One elicitation (the Wait delimiter, every K tokens): answers per sequence and AUTC per verifier."""

    answers_per_sequence: float | None
    methods: dict[str, MethodMetrics]
    order: tuple[str, ...] = field(default=(), repr=False)

    @classmethod
    def from_json(cls, data: Mapping) -> DelimiterRow:
        """Read ``{method: metrics, ..., "answers_per_sequence"}``."""
        methods = {key: MethodMetrics.from_dict(value) for key, value in data.items() if key != "answers_per_sequence"}
        return cls(data.get("answers_per_sequence"), methods, tuple(data))

    def to_json(self) -> dict:
        """The row as written to JSON."""
        written: dict[str, Any] = {key: metrics.to_dict() for key, metrics in self.methods.items()}
        written["answers_per_sequence"] = self.answers_per_sequence
        order = self.order or tuple(written)
        return {key: written[key] for key in order}


@dataclass
class DelimiterStudy(_Record):
    """Delimiter sensitivity at N = ``n`` (elicitation name -> `DelimiterRow`)."""

    n: int | None = None
    rows: dict[str, DelimiterRow] | None = _coded(_mapping_of(_typed(DelimiterRow)))
    mean_sequence_tokens: float | None = None


@dataclass
class GroupingEarlyStop(_Record):
    """The grouped MSV's early stopping against the best baseline at one N."""

    best_baseline: str | None = None
    token_fraction: float | None = None
    latency_fraction: float | None = None


@dataclass
class GroupingRow(_Record):
    """One N of the grouping study (`grouping_summary`): per method, AUTC over latency and tokens, peak accuracy,
    full-budget latency and verifier cost; the early stopping."""

    msv: str | None = None
    autc_latency_norm: dict[str, SeedStat] | None = _coded(_STATS)
    autc_tokens_norm: dict[str, SeedStat] | None = _coded(_STATS)
    peak_accuracy: dict[str, SeedStat] | None = _coded(_STATS)
    verifier_online_s_per_answer: dict[str, float] | None = None
    full_latency: dict[str, SeedStat] | None = _coded(_STATS)
    early_stop: GroupingEarlyStop | None = _coded(_typed(GroupingEarlyStop))


@dataclass
class GroupingStudy(_Record):
    """Large N with grouping: the group size ``m``, one `GroupingRow` per N, the trade-off figures."""

    m: int | None = None
    per_n: dict[str, GroupingRow] | None = _coded(_mapping_of(_typed(GroupingRow)))
    figures: list[Figure] | None = _coded(_FIGURES)


@dataclass
class SizeRow(_Record):
    """One training-set size (`size_row`): Probe / MSV calibration, best-of-N against the best baseline, the
    early-stop fraction."""

    msv: str | None = None
    terminal: dict[str, MethodMetrics] | None = _coded(_METHODS)
    streaming: dict[str, MethodMetrics] | None = _coded(_METHODS)
    bon_best_baseline: str | None = None
    bon_best_baseline_value: float | None = None
    bon_gain: float | None = None
    early_stop_best_baseline: str | None = None
    early_stop_token_fraction: float | None = None


@dataclass
class TrainingSizeStudy(_Record):
    """The training-set-size study at N = ``n`` (``str(size)`` -> `SizeRow`)."""

    n: int | None = None
    per_size: dict[str, SizeRow] | None = _coded(_mapping_of(_typed(SizeRow)))


# ----------------------------------------------------------------------------------------------------------------
# Vote check, claims, the whole summary
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class VoteCheckRow(_Record):
    """One MSV fit against the vote it is fed (`vote_check_rows`)."""

    study: str | None = None
    n: int | None = None
    setting: str | None = None
    method: str | None = None
    vote: str | None = None
    auroc: SeedStat | None = _coded(_typed(SeedStat))
    vote_auroc: float | None = None
    difference: float | None = None
    at_vote: bool | None = None


@dataclass
class Claim(_Record):
    """One verdict of `compute_claims`: ``held`` True, False or None (not testable)."""

    id: str | None = None
    claim: str | None = None
    paper: str | None = None
    held: bool | None = None
    sentence: str | None = None
    numbers: dict | None = None


@dataclass
class ReproductionResults(_Record):
    """The combined summary of `hf-msv reproduce` (``testbed.json``): settings, run records, the main study and the
    optional studies' summaries (None when not run), the vote check and the claims."""

    config: SummarySettings | None = _coded(_typed(SummarySettings))
    studies: list[str] | None = None
    paper: dict | None = None
    reports: dict[str, str] | None = None
    verifiers: FitCounts | None = _coded(_typed(FitCounts))
    device: str | None = None
    parts: list[ReportPart] | None = _coded(_list_of(_typed(ReportPart)))
    lm_costs: dict[str, LMCost] | None = _coded(_mapping_of(_typed(LMCost)))
    main: MainStudySummary | None = _coded(_typed(MainStudySummary))
    checkers: CheckerStudy | None = _coded(_typed(CheckerStudy))
    masks: MaskStudy | None = _coded(_typed(MaskStudy))
    delimiters: DelimiterStudy | None = _coded(_typed(DelimiterStudy))
    grouping: GroupingStudy | None = _coded(_typed(GroupingStudy))
    training_size: TrainingSizeStudy | None = _coded(_typed(TrainingSizeStudy))
    timing_s: dict[str, float] | None = None
    reuse: ReuseRecord | None = _coded(_typed(ReuseRecord))
    pending: list[str] | None = None
    vote_check: list[VoteCheckRow] | None = _coded(_list_of(_typed(VoteCheckRow)))
    claims: list[Claim] | None = _coded(_list_of(_typed(Claim)))

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
        if item.name not in ("extra", "present", "order"):
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
