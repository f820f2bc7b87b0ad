"""``testbed.md``: the reproduction's summary rendered as markdown, each experiment with the paper's numbers beside
ours and the claims' verdict sentences (`render_testbed`; pure: a string from the summary, read as a
`ReproductionResults`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..evaluation import markdown_table
from ..evaluation.results import AxisFraction, EarlyStopComparison, Figure, MethodMetrics, SeedStat, StudyResults
from ..metrics import format_mean_std
from .config import STUDIES
from .paper import PAPER
from .results import (
    LEGACY_PARTS_KEY,
    MainRow,
    MainStudySummary,
    ReportPart,
    ReproductionResults,
    ReuseRecord,
    SizeRow,
    SummarySettings,
    as_reproduction_results,
    required,
)

__all__ = ["LEGACY_PARTS_KEY", "render_testbed", "report_parts"]


def report_parts(summary: dict) -> list[dict[str, Any]]:
    """The parts a report records: one per run that wrote it (``--continue-report`` adds one), oldest first."""
    return list(summary.get("parts", summary.get(LEGACY_PARTS_KEY)) or [])


# ----------------------------------------------------------------------------------------------------------------
# Formatting
# ----------------------------------------------------------------------------------------------------------------


def _paper_number(value, digits: int = 4) -> str:
    """A paper number (or any scalar), "—" when the paper has none."""
    return "—" if value is None else f"{value:.{digits}f}"


def _mean_std(stat: SeedStat | None, digits: int = 3) -> str:
    """ "mean ± std" of a seed statistic, "—" when missing (`format_mean_std`, the reports' one formatter)."""
    return format_mean_std(None if stat is None else stat.to_dict(), digits)


def _settings(summary: ReproductionResults) -> SummarySettings:
    """The run's settings (every summary has them)."""
    return required(summary.config, "config")


def _ns(summary: ReproductionResults) -> list[int]:
    """The N of the main study."""
    return required(_settings(summary).num_sequences, "config.num_sequences")


def _timing(summary: ReproductionResults) -> dict[str, float]:
    """The run's stage times in seconds (``"total"`` among them)."""
    return required(summary.timing_s, "timing_s")


def _main(summary: ReproductionResults) -> MainStudySummary:
    """The main study (every summary has it)."""
    return required(summary.main, "main study")


def _metrics(row: MainRow | SizeRow, setting: str) -> dict[str, MethodMetrics]:
    """The {method: metrics} table of `row` in `setting` (``"terminal"`` or ``"streaming"``)."""
    return required(getattr(row, setting), f"{setting} metrics")


def _stat(methods: dict[str, MethodMetrics] | None, method: str | None, metric: str) -> SeedStat | None:
    """`method`'s statistic of `metric` in a {method: metrics} table; None when either is missing."""
    metrics = (methods or {}).get(method or "")
    return None if metrics is None else metrics.stat(metric)


def _paper_key(method: str, msv: str | None, n: int) -> str:
    """The paper's name for `method`: its tables call the multi-sequence verifier "MSV_N"."""
    return "MSV_N" if method == msv and n > 1 else method


def _claims_for(summary: ReproductionResults, prefix: str) -> list[str]:
    """Bullet lines of the claims whose id starts with `prefix` (each section ends with its claims)."""
    return [
        f"* **{claim.claim}** — {claim.sentence} (paper: {claim.paper})"
        for claim in summary.claims or []
        if required(claim.id, "claim id").startswith(prefix)
    ]


def _captions(figures: list[Figure] | None) -> dict[str, str]:
    """{file: caption} of a study's figures."""
    return {figure.file: figure.caption for figure in figures or []}


def _embed_figures(captions: dict[str, str], keep) -> list[str]:
    """Markdown lines embedding each figure file (with its caption) that `keep(file)` selects."""
    return [
        line
        for file in captions
        if keep(file)
        for line in (f"![{captions[file]}]({file})", "", f"*{captions[file]}*", "")
    ]


def _bold_msv(method: str, msv: str | None) -> str:
    return f"**{method}**" if method == msv else method


def _task(settings: SummarySettings) -> str:
    """The summary's testbed task (summaries written before testbed v2 have none: v1)."""
    return required(settings.task, "config.task") if settings.has("task") else "v1"


# ----------------------------------------------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------------------------------------------


def _caveat(own: bool) -> str:
    if own:
        return (
            "**Read with care.** The paper's numbers are for DeepSeek-R1-Distill-Qwen-1.5B on competition math: "
            "what is compared is whether the *relative* claims (MSV_N vs baselines) hold on this LM and these "
            "problems. There is no PRM baseline; DeepConf (trace confidence, Platt-scaled on validation) is added."
        )
    return (
        "**Read with care.** The testbed LM is a ~1M-parameter character-level model on synthetic arithmetic word "
        "problems (`hf_msv.testbed`), not a 1.5B reasoning LM on competition math: absolute numbers are not "
        "comparable with the paper's; what is tested is whether the *relative* claims (MSV_N vs baselines) carry "
        "over. There is no PRM baseline (no 7B model on this CPU); DeepConf (trace confidence, Platt-scaled on "
        "validation) is added."
    )


def _header(summary: ReproductionResults) -> list[str]:
    """Title, caveats, setup (data, N, verifiers, LM costs, stage times, report links) and the claims table."""
    settings = _settings(summary)
    task = _task(settings)
    own = task == "own"  # `hf-msv reproduce --model`: the main study on the user's LM and problems
    tag = "" if task == "v1" else f" {task}"
    subject = f"MSV on {settings.extra.get('name', 'your LM')}" if own else f"MSV on the testbed{tag}"
    flag = f" --model {settings.extra.get('model')}" if own else (f" --task {task}" if tag else "")
    return [
        f"# {subject}: the paper's {'main study' if own else 'experiments'} reproduced"
        + (" (quick run)" if settings.quick else ""),
        "",
        # The module path below is part of the committed report's text (re-rendered byte for byte).
        "Generated by `hf-msv reproduce`"
        + (" --quick" if settings.quick else "")
        + flag
        + f" (`hf_msv/reproduction/`) {_duration(summary)}, with LM sampling and verifier training on "
        f"`{summary.device if summary.has('device') else 'cpu'}` and evaluation on CPU; every number and verdict "
        "below is computed from the run, next to the paper's (AIME column unless stated).",
        "",
        *_interim_lines(summary),
        _caveat(own),
        "",
        "## Setup",
        "",
        _data_line(summary),
        _protocol_line(settings),
        "* Verifiers: Probe and MSV_1/…/MSV_N trained per mode (terminal, streaming) with the library defaults "
        '(`recipe="auto"`, what `hf-msv train` uses; `hf_msv.reproduction.training_config`).',
        *_config_changes(settings),
        _lm_costs_line(summary),
        _stage_times_line(summary),
        *_parts_lines(summary),
        *_reuse_lines(summary),
        _reports_line(summary),
        "",
        "## Claims",
        "",
        markdown_table(
            ["claim", "ours", "paper"],
            [[str(claim.claim), str(claim.sentence), str(claim.paper)] for claim in summary.claims or []],
        ),
        "",
    ]


def _data_line(summary: ReproductionResults) -> str:
    """The setup's data line: split sizes, sampling, and the evaluation collection's answers and accuracy."""
    settings = _settings(summary)
    evaluation = required(_main(summary).data, "main study data")["eval"]
    return (
        f"* Data: {settings.train_problems} train / {settings.val_problems} validation / {settings.eval_problems} "
        f"evaluation problems × {settings.num_samples} samples (temperature 1, ≤ {settings.max_new_tokens} tokens, "
        f"`Wait` delimiter, answers ≤ 40 tokens, `{settings.reference_checker}` checker as the reference). "
        f"Evaluation: {evaluation['answers']} answers, {evaluation['answers_per_sequence']:.2f} per sequence, "
        f"terminal accuracy {evaluation['terminal_accuracy']:.3f}, mean chain of thought "
        f"{evaluation['mean_sequence_tokens']:.0f} tokens."
    )


def _lm_costs_line(summary: ReproductionResults) -> str:
    """The LM's measured costs per N (by the part that ran the main study, for a report in several parts)."""
    return (
        "* LM costs measured "
        + ("by the part that ran the main study, used by every part" if _continued(summary) else "here")
        + " (s per shared decode step / per elicited answer): "
        + ", ".join(
            f"N={n}: {cost.decode_step_s:.2e} / {cost.elicit_s:.2e}" for n, cost in (summary.lm_costs or {}).items()
        )
        + "."
    )


def _stage_times_line(summary: ReproductionResults) -> str:
    """Each stage's time, and how many fits were trained and reused when the run resumed its work directory."""
    verifiers = summary.verifiers
    return (
        "* Stage times (s): "
        + ", ".join(f"{stage} {seconds:.0f}" for stage, seconds in _timing(summary).items())
        + "."
        + (
            ""
            if verifiers is None or not verifiers.reused
            else f" Stages resume: this run trained {verifiers.trained} verifiers and reused "
            f"{verifiers.reused} (and any shards) from an earlier run in the same work directory."
        )
    )


def _reports_line(summary: ReproductionResults) -> str:
    """Links to the per-study reports, and the studies not run."""
    studies = required(summary.studies, "studies")
    missing = [study for study in STUDIES if study not in studies]
    return (
        "* Full per-study reports: "
        + ", ".join(f"[{name}]({path})" for name, path in required(summary.reports, "reports").items())
        + "."
        + (
            f" Not run this time: {', '.join(missing)} (`hf-msv reproduce {_continue_flag(summary)}--studies ...`)."
            if missing
            else ""
        )
    )


def _duration(summary: ReproductionResults) -> str:
    """How long the run took. A run that resumed a work directory, or a part that continued a committed report, only
    timed itself: saying "in 0.0 min" of a report whose artefacts took hours to make would mislead, so such a
    report says so."""
    minutes = _timing(summary)["total"] / 60
    if _continued(summary):
        parts = summary.report_parts()
        ran = ", ".join(parts[-1].studies or []) or "no new study"
        return (
            f"in {len(parts)} parts (each part after the first continued the committed report with "
            f"`--continue-report`; the last ran {ran} in {minutes:.1f} min, and the stage times below are its "
            "own)"
        )
    if summary.reuse is None or not summary.reuse.reused:
        return f"in {minutes:.1f} min"
    return (
        f"over several runs in one work directory (the last run reused the earlier ones' artefacts and "
        f"took {minutes:.1f} min; the stage times below are its own)"
    )


def _continued(summary: ReproductionResults) -> bool:
    """Whether the report was continued in several parts (`--continue-report`)."""
    return len(summary.report_parts()) > 1


def _continue_flag(summary: ReproductionResults) -> str:
    """``--continue-report `` for a report that records its parts (it can be continued), else nothing."""
    return "--continue-report " if summary.report_parts() else ""


def _part_text(index: int, part: ReportPart) -> str:
    """One part: its studies, device, minutes, fits trained, commit and collection differences."""
    return (
        f"{index}. {', '.join(part.studies or []) or 'no study'} on `{part.device or 'cpu'}`, "
        f"{required(part.timing_s, 'part timing')['total'] / 60:.0f} min"
        + (f", {part.verifiers.trained or 0} fits trained" if part.verifiers is not None else "")
        + (f", commit {part.git_commit[:10]}" if part.git_commit else "")
        + (
            " (its re-made main collection differs from the main study's in "
            + ", ".join(part.collections_differ_from_main)
            + ")"
            if part.collections_differ_from_main
            else ""
        )
    )


def _parts_lines(summary: ReproductionResults) -> list[str]:
    """Which part ran which studies, where, for how long (reports continued in several parts)."""
    if not _continued(summary):
        return []
    parts = summary.report_parts()
    # A first part recorded without a commit was a run resumed several times: its time is its last resumption's.
    untimed = (
        ""
        if parts[0].git_commit
        else (
            " (the first part's time and fits are its last resumption's: it resumed one work directory several times)"
        )
    )
    return ["* Parts: " + "; ".join(_part_text(index, part) for index, part in enumerate(parts, 1)) + untimed + "."]


def _interim_lines(summary: ReproductionResults) -> list[str]:
    """For a report written while the run goes on (`write_summary` before each study): which studies are pending."""
    if not summary.pending:
        return []
    return [
        f"**Interim report.** Written before the {summary.pending[0]} study of a run still in progress; not run yet: "
        f"{', '.join(summary.pending)}. Their sections and claims are missing below, and the run rewrites this "
        "file when it ends.",
        "",
    ]


def _config_changes(settings: SummarySettings) -> list[str]:
    """The settings of this run that differ from `ReproduceConfig`'s defaults (the quick ones for a quick run)."""
    from dataclasses import asdict

    from .config import ReproduceConfig

    task = _task(settings)
    defaults = asdict(ReproduceConfig.quick_config(task=task) if settings.quick else ReproduceConfig(task=task))
    changed = []
    for name, value in settings.items():
        value = tuple(value) if isinstance(value, list) else value
        if name in defaults and value != defaults[name]:
            changed.append(f"{name}={value}")
    return [f"* Settings changed from the defaults: {', '.join(changed)}."] if changed else []


def _protocol_line(settings: SummarySettings) -> str:
    """How groups and seeds were drawn: training seeds and a fixed partition, or (older runs) random subsets."""
    if not settings.has("training_seeds"):
        return (
            f"* N ∈ {settings.num_sequences}, {settings.seeds} seeds (random N-subsets of the collected sequences); "
            "mean ± std over seeds."
        )
    samples = settings.num_samples
    return (
        f"* N ∈ {settings.num_sequences}; groups: a fixed partition of each problem's {samples} samples "
        f"into ⌊{samples}/N⌋ groups of N; every verifier trained {settings.training_seeds} times "
        "(training seeds 0, 1, ...): mean ± std over training seeds. Claims use paired bootstrap 95 % intervals "
        'over problems (MSV_N vs the compared baseline on the same problems and groups): "held" only if the '
        "interval clears the target."
    )


def _reuse_record_lines(reuse: ReuseRecord | None) -> list[str]:
    """What one run reused from the work directory and what it redid, with why (runs that record it)."""
    if reuse is None or not reuse.to_json():
        return []
    return [
        "* Reused from an earlier run (same settings, data and code version unless said): "
        + ("; ".join(reuse.reused or []) or "nothing")
        + ".",
        "* Redone although present: " + ("; ".join(reuse.redone or []) or "nothing") + ".",
    ]


def _reuse_lines(summary: ReproductionResults) -> list[str]:
    """What this run reused and redid; for a report continued in several parts, each part's."""
    if not _continued(summary):
        return _reuse_record_lines(summary.reuse)
    return [
        line.replace("* ", f"* Part {index}: ", 1)
        for index, part in enumerate(summary.report_parts(), 1)
        for line in _reuse_record_lines(part.reuse)
    ]


def _calibration_section(row: MainRow, setting: str, n: int) -> list[str]:
    """The calibration table of one N for `setting` ("terminal" | "streaming"), paper values beside ours."""
    paper = PAPER[setting].get(str(n), {}) | (PAPER[setting]["1"] if n > 1 else {})
    rows = []
    for method, metrics in getattr(row, setting).items():
        paper_values = paper.get(_paper_key(method, row.msv, n), {})
        rows.append(
            [
                _bold_msv(method, row.msv),
                _mean_std(metrics.stat("brier"), 4),
                _paper_number(paper_values.get("brier")),
                _mean_std(metrics.stat("auroc"), 4),
                _paper_number(paper_values.get("auroc")),
                _mean_std(metrics.stat("ece"), 4),
                _mean_std(metrics.stat("nll"), 4),
            ]
        )
    return [
        f"### N = {n}",
        "",
        markdown_table(["method", "Brier ↓", "paper Brier", "AUROC ↑", "paper AUROC", "ECE ↓", "NLL ↓"], rows),
        "",
    ]


def _calibration(summary: ReproductionResults, setting: str, title: str, claim_prefix: str, figure: str) -> list[str]:
    """Section 1 (terminal) or 3 (streaming): one calibration table per N, the claims, the largest N's figures."""
    ns = _ns(summary)
    lines = [title, ""]
    for n in ns:
        lines += _calibration_section(_main(summary).row(n), setting, n)
    lines += _claims_for(summary, claim_prefix) + [""]
    return lines + _embed_figures(
        _captions(_main(summary).figures), lambda file: figure in file and file.endswith(f"N{ns[-1]}.png")
    )


def _best_of_n_methods(main: MainStudySummary, ns) -> list[str]:
    """The single-sequence methods and aggregations of every N, in first-seen order, plus MSV_1 and "MSV_N"."""
    methods = []
    for n in ns:
        row = main.row(n)
        multi = set(required(row.multi_sequence, f"multi-sequence methods at N={n}")) | {row.msv}
        methods += [
            method
            for method in _metrics(row, "terminal")
            if method not in methods and (method not in multi or method == "MSV_1")
        ]
    return methods + ["MSV_N"]


def _best_of_n_accuracy_row(main: MainStudySummary, ns, method: str) -> list[str]:
    """One method's best-of-N accuracy per N, the paper's beside it ("MSV_N" is each N's MSV)."""
    cells = [method]
    for n in ns:
        row = main.row(n)
        name = row.msv if method == "MSV_N" else method
        metrics = None if name is None else _metrics(row, "terminal").get(name)
        accuracies = PAPER["bon_accuracy"]
        paper = accuracies["1"]["base"] if n == 1 else accuracies.get(str(n), {}).get(method)
        if metrics is None:
            cells += ["—", "—"]
        else:
            cells += [_mean_std(metrics.stat("bon_accuracy")), _paper_number(paper, 3)]
    return cells


def _best_of_n_calibration(row: MainRow, n: int) -> list[str]:
    """The best-of-N calibration table of one N > 1."""
    rows = []
    for method, metrics in _metrics(row, "terminal").items():
        paper = PAPER["bon_calibration"].get(str(n), {}).get(_paper_key(method, row.msv, n), {})
        rows.append(
            [
                _bold_msv(method, row.msv),
                _mean_std(metrics.stat("bon_ece")),
                _paper_number(paper.get("ece")),
                _mean_std(metrics.stat("bon_brier")),
                _paper_number(paper.get("brier")),
            ]
        )
    return [
        f"### N = {n}",
        "",
        markdown_table(["method", "BoN ECE ↓", "paper", "BoN Brier ↓", "paper"], rows),
        "",
    ]


def _best_of_n(summary: ReproductionResults) -> list[str]:
    """Section 2: best-of-N accuracy per method and N, and the best-of-N calibration per N > 1."""
    main, ns = _main(summary), _ns(summary)
    rows = [_best_of_n_accuracy_row(main, ns, method) for method in _best_of_n_methods(main, ns)]
    lines = [
        "## 2. Best-of-N accuracy and calibration",
        "",
        markdown_table(["method"] + [column for n in ns for column in (f"N={n}", f"paper N={n}")], rows),
        "",
        "Best-of-N calibration (ECE / Brier of the picked answer's confidence):",
        "",
    ]
    for n in [n for n in ns if n > 1]:
        lines += _best_of_n_calibration(main.row(n), n)
    lines += _claims_for(summary, "best_of") + _claims_for(summary, "bon_ece") + [""]
    return lines + _embed_figures(
        _captions(main.figures),
        lambda file: "best_of_n" in file or ("reliability_bon" in file and file.endswith(f"N{ns[-1]}.png")),
    )


def _fraction_cell(fraction: float | None, baseline: str | None) -> str:
    """A budget fraction: ∞ when the MSV never reaches the baseline's peak, "—" without a baseline."""
    return "∞" if fraction is None and baseline else _paper_number(fraction, 2)


def _early_stopping_row(row: MainRow, n: int) -> list[str]:
    """One N of the early-stopping table (tokens axis, against the best baseline)."""
    baseline = row.early_stop_best_baseline
    return [
        str(n),
        required(row.msv, f"MSV at N={n}"),
        str(baseline),
        _paper_number(row.early_stop_best_baseline_peak_accuracy, 3),
        _paper_number(row.early_stop_msv_peak_accuracy, 3),
        _fraction_cell(row.early_stop_token_fraction, baseline),
        _fraction_cell(row.early_stop_latency_fraction, baseline),
        _mean_std(_stat(row.streaming, row.msv, "autc_tokens_norm")),
        _mean_std(_stat(row.streaming, baseline, "autc_tokens_norm")),
    ]


def _online_costs(row: MainRow, n: int) -> dict[str, float]:
    """Each verifier's online cost per answer at `n`."""
    return required(row.verifier_online_s_per_answer, f"verifier costs at N={n}")


def _verifier_costs_line(main: MainStudySummary, ns) -> str:
    """The verifiers' online cost per answer at each N, the paper's verifier times beside."""
    latency = PAPER["latency"]["verifier"]
    return (
        "Verifier cost measured online (s per answer; paper's Probe / MSV_N verifier time at N=64: "
        f"{latency['Probe']['64']} / {latency['MSV_N']['64']} s per "
        "problem): "
        + "; ".join(
            f"N={n}: " + ", ".join(f"{method} {cost:.1e}" for method, cost in _online_costs(main.row(n), n).items())
            for n in ns
        )
        + "."
    )


def _early_stopping(summary: ReproductionResults) -> list[str]:
    """Section 4: the early-stop token / latency fractions per N, the verifier costs and the trade-off figures."""
    main, ns = _main(summary), _ns(summary)
    lines = [
        "## 4. Early stopping: accuracy vs tokens and latency",
        "",
        markdown_table(
            [
                "N",
                "MSV",
                "best baseline",
                "its peak acc",
                "MSV peak acc",
                "token fraction",
                "latency fraction",
                "MSV AUTC (norm)",
                "baseline AUTC (norm)",
            ],
            [_early_stopping_row(main.row(n), n) for n in ns],
        ),
        "",
        "Token fraction = tokens the MSV needs to reach the best baseline's peak accuracy ÷ tokens that "
        "baseline needs (paper, MATH N=64: < 0.5; target here ≤ 0.40).",
        "",
    ]
    lines += _comparison_tables(main, ns)
    lines += _claims_for(summary, "early_stop") + [""]
    lines += [_verifier_costs_line(main, ns), ""]
    return lines + _embed_figures(_captions(main.figures), lambda file: "tradeoff" in file)


def _interval_end(value: float | None) -> str:
    return "∞" if value is None else f"{value:.2f}"


def _axis_cell(axis: AxisFraction) -> str:
    """A budget fraction on one axis with its [95 % interval] (∞ for an unbounded end or never reaching it)."""
    cell = _interval_end(axis.fraction)
    if axis.interval is not None:
        cell += f" [{_interval_end(axis.interval.low)}, {_interval_end(axis.interval.high)}]"
    return cell


def _comparison_row(row: MainRow, n: int, pool: str, comparison: EarlyStopComparison) -> list[str]:
    """One N and baseline pool of the early-stop comparison table."""
    return [
        str(n),
        required(row.msv, f"MSV at N={n}"),
        "single-sequence" if pool == "single_sequence" else "all",
        comparison.baseline,
        _paper_number(comparison.baseline_peak_accuracy, 3),
        *(_axis_cell(comparison.axes[axis]) for axis in ("steps", "latency", "tokens")),
        _mean_std(_stat(row.streaming, row.msv, "autc_steps_norm")),
        _mean_std(_stat(row.streaming, comparison.baseline, "autc_steps_norm")),
    ]


def _comparison_tables(main: MainStudySummary, ns) -> list[str]:
    """Early stopping on every axis against the best single-sequence baseline and the best of all (runs with the
    training-seed protocol): fraction of the baseline's budget the MSV needs to reach its peak, [95 % interval]."""
    rows = [
        _comparison_row(main.row(n), n, pool, comparison)
        for n in ns
        for pool, comparison in (main.row(n).early_stop_comparisons or {}).items()
    ]
    if not rows:
        return []
    return [
        "On the paper's axis — token position t*, the latency of parallel decoding — and on measured latency and "
        "summed tokens, against the best single-sequence baseline (the paper's comparison) and the best of all "
        "baselines (aggregations included); [95 % interval over problems]. AUTC (norm) = (1/B) ∫_0^B acc(b) db "
        "over t*, B = the full-decoding t* (a mean accuracy, independent of N's scale):",
        "",
        markdown_table(
            [
                "N",
                "MSV",
                "compared with",
                "baseline",
                "its peak acc",
                "t* fraction",
                "latency fraction",
                "token fraction",
                "MSV AUTC t* (norm)",
                "baseline AUTC t* (norm)",
            ],
            rows,
        ),
        "",
    ]


def _lambda_selection(summary: ReproductionResults) -> list[str]:
    """The λ chosen by each rule (validation, LTT) for the MSV, Probe, MSV_1 and Probe+WV, and how it fared."""
    rows = []
    for n in _ns(summary):
        row = _main(summary).row(n)
        for method, rules in required(row.lambda_selection, f"λ selection at N={n}").items():
            if method not in (row.msv, "Probe", "MSV_1", "Probe+WV"):
                continue
            for rule, record in rules.items():
                rows.append(
                    [
                        str(n),
                        method,
                        rule,
                        _mean_std(record.get("target")),
                        _mean_std(record.get("eval_accuracy")),
                        _mean_std(record.get("eval_tokens"), 1),
                        _mean_std(record.get("eval_latency"), 3),
                        "—" if rule == "validation" else _mean_std(record.get("certified"), 2),
                    ]
                )
    if not rows:
        return []
    return [
        "### λ selection: validation rule and risk-controlled (LTT, δ = 0.1)",
        "",
        markdown_table(
            ["N", "method", "rule", "target acc", "eval acc", "eval tokens", "eval latency (s)", "certified"], rows
        ),
        "",
    ]


def _checkers(summary: ReproductionResults) -> list[str]:
    """Section 5: best-of-N under each equivalence checker, with the checker's agreement with the reference."""
    n = required(summary.checkers, "checker study").n
    columns = [
        "Self-consistency",
        "Probe+WV",
        "MSV_1+WV",
        f"MSV_{n} (reference-trained)",
        f"MSV_{n} (trained with checker)",
    ]
    paper_columns = [
        "Self-consistency",
        "Probe+WV",
        "MSV_1+WV",
        "MSV_64 (reference-trained)",
        "MSV_64 (trained with checker)",
    ]
    rows = []
    for checker, row in required(required(summary.checkers, "checker study").rows, "checker rows").items():
        paper = PAPER["checkers"].get(checker, {})
        rows.append(
            [checker, _paper_number(row.agreement, 3), _paper_number(paper.get("agreement"), 3)]
            + [
                f"{_mean_std(row.methods.get(ours))} ({_paper_number(paper.get(theirs), 3)})"
                for ours, theirs in zip(columns, paper_columns)
            ]
        )
    return (
        [
            f"## 5. Robustness to the equivalence checker (best-of-{n}; paper: Omni-MATH, in parentheses)",
            "",
            f"MSV_{n} is trained (terminal, without logit averaging) with each checker's classes; correctness "
            'is always the reference checker\'s. Agreement = pairwise accuracy of "same class" vs the '
            "reference on pairs of terminal answers.",
            "",
            markdown_table(
                [
                    "checker",
                    "agreement",
                    "paper",
                    "Self-consistency",
                    "Probe+WV",
                    "MSV_1+WV",
                    f"MSV_{n} (ref-trained)",
                    f"MSV_{n} (trained w/ checker)",
                ],
                rows,
            ),
            "",
        ]
        + _claims_for(summary, "checker")
        + [""]
    )


def _masks(summary: ReproductionResults) -> list[str]:
    """Section 6: the streaming MSV with each attention mask removed."""
    n = required(summary.masks, "mask study").n
    rows = []
    for name, metrics in required(required(summary.masks, "mask study").rows, "mask rows").items():
        paper = PAPER["masks"].get("MSV_16" if name == f"MSV_{n}" else name, {})
        rows.append(
            [
                name,
                _mean_std(metrics.stat("brier"), 4),
                _paper_number(paper.get("brier"), 3),
                _mean_std(metrics.stat("auroc"), 4),
                _paper_number(paper.get("auroc"), 3),
                _mean_std(metrics.stat("nll"), 4),
                _paper_number(paper.get("nll"), 3),
            ]
        )
    return (
        [
            f"## 6. Attention-mask ablation (streaming MSV_{n}; paper: AIME MSV_16)",
            "",
            markdown_table(["model", "Brier ↓", "paper", "AUROC ↑", "paper", "NLL ↓", "paper"], rows),
            "",
        ]
        + _claims_for(summary, "masks")
        + [""]
    )


def _delimiters(summary: ReproductionResults) -> list[str]:
    """Section 7: AUTC with the Wait delimiter and with delimiter-free elicitation every K tokens."""
    delimiters, settings = required(summary.delimiters, "delimiter study"), _settings(summary)
    sizes = "/".join(map(str, required(settings.delimiter_sizes, "config.delimiter_sizes")))
    n = delimiters.n
    rows = []
    for elicitation, row in required(delimiters.rows, "delimiter rows").items():
        paper = PAPER["delimiters"].get("Wait" if elicitation == "Wait" else "every K tokens", {})
        rows.append(
            [elicitation, _paper_number(row.answers_per_sequence, 2)]
            + [
                f"{_mean_std(_stat(row.methods, method, 'autc_tokens'), 1)} ({_paper_number(paper.get(method), 1)})"
                for method in ("Probe", "MSV_1", "MSV_N")
            ]
        )
    return (
        [
            f"## 7. Delimiter sensitivity (AUTC at N={n}, accuracy × tokens; paper: AIME, N=16, in parentheses)",
            "",
            "The Wait row is the main collection; the every-K row is a separate, smaller collection "
            f"({sizes} problems × {settings.delimiter_samples} samples) "
            "with its own verifiers. Compare verifiers within a row.",
            "",
            markdown_table(["elicitation", "answers / sequence", "Probe", "MSV_1", f"MSV_{n}"], rows),
            "",
        ]
        + _claims_for(summary, "delimiters")
        + [""]
    )


def _grouping(summary: ReproductionResults) -> list[str]:
    """Section 8: grouped MSV_M at N > M against the baselines (AUTC, peak accuracy, verifier cost)."""
    grouping = required(summary.grouping, "grouping study")
    rows = []
    for n, row in required(grouping.per_n, "grouping rows").items():
        autc_latency = required(row.autc_latency_norm, f"latency AUTC at N={n}")
        autc_tokens = required(row.autc_tokens_norm, f"token AUTC at N={n}")
        peak = required(row.peak_accuracy, f"peak accuracy at N={n}")
        online = required(row.verifier_online_s_per_answer, f"verifier costs at N={n}")
        for method in autc_latency:
            rows.append(
                [
                    n,
                    _bold_msv(method, row.msv),
                    _mean_std(autc_latency[method]),
                    _mean_std(autc_tokens[method]),
                    _mean_std(peak[method]),
                    _paper_number(online.get(method), 6),
                ]
            )
    lines = [
        f"## 8. Large N with grouping (MSV_{grouping.m} on groups of {grouping.m})",
        "",
        markdown_table(
            ["N", "method", "AUTC latency (norm) ↑", "AUTC tokens (norm) ↑", "peak acc", "verifier s / answer"], rows
        ),
        "",
    ]
    lines += _claims_for(summary, "grouping") + [""]
    for figure in grouping.figures or []:
        lines += [f"![{figure.caption}]({figure.file})", "", f"*{figure.caption}*", ""]
    return lines


def _training_size_row(size: str, row: SizeRow) -> list[str]:
    """One training-set size: Probe and MSV Brier, best-of-N against the best baseline, the token fraction."""
    msv = required(row.msv, f"MSV with {size} training problems")
    fraction = row.early_stop_token_fraction
    return [
        size,
        f"{_mean_std(_metrics(row, 'terminal')['Probe'].stat('brier'), 4)} "
        f"({_paper_number(PAPER['training_size']['Probe'].get(size), 4)})",
        _mean_std(_metrics(row, "terminal")[msv].stat("brier"), 4),
        _mean_std(_metrics(row, "terminal")[msv].stat("bon_accuracy")),
        f"{_paper_number(row.bon_best_baseline_value, 3)} ({row.bon_best_baseline})",
        f"{100 * required(row.bon_gain, f'best-of-N gain with {size} training problems'):+.1f}",
        _mean_std(_metrics(row, "streaming")[msv].stat("brier"), 4),
        ("∞" if fraction is None else _paper_number(fraction, 2)) + f" ({row.early_stop_best_baseline})",
    ]


def _training_size(summary: ReproductionResults) -> list[str]:
    """Section 9: Probe and MSV_N calibration, best-of-N gap and early-stop fraction per training-set size."""
    n = required(summary.training_size, "training-size study").n
    rows = [
        _training_size_row(size, row)
        for size, row in required(required(summary.training_size, "training-size study").per_size, "sizes").items()
    ]
    return (
        [
            f"## 9. Training-set size (Probe and MSV_{n}, N={n}; paper: AIME Probe, in parentheses)",
            "",
            f"The first k training problems (nested subsets; sizes above {_settings(summary).train_problems} add "
            "problems collected for this study); validation and evaluation are the main study's.",
            "",
            markdown_table(
                [
                    "train problems",
                    "Probe Brier ↓",
                    f"MSV_{n} Brier ↓",
                    f"MSV_{n} best-of-{n}",
                    "best baseline",
                    "gain (pp)",
                    f"MSV_{n} streaming Brier ↓",
                    "token fraction",
                ],
                rows,
            ),
            "",
        ]
        + _claims_for(summary, "training_size")
        + [""]
    )


def _vote_check(summary: ReproductionResults) -> list[str]:
    """Every MSV fit of the run against the vote it is fed, with the same equivalence classes."""
    from .summary import VOTE_TOLERANCE

    rows = summary.vote_check
    if not rows:
        return []
    body = [
        [
            row.study,
            str(row.n),
            row.setting,
            row.method,
            _mean_std(row.auroc),
            f"{row.vote_auroc:.3f} ({row.vote})",
            f"{row.difference:+.3f}",
            "yes" if row.at_vote else "**no**",
        ]
        for row in rows
    ]
    below = [row for row in rows if not row.at_vote]
    return [
        "## 10. Every MSV fit against the vote it is fed",
        "",
        f"Evaluation AUROC of each MSV fit (mean ± std over training seeds) against the vote computed with the "
        f"same equivalence classes: self-consistency on terminal answers, each sequence's latest answer on "
        f'streaming ones (the γ input). "At the vote": no more than {VOTE_TOLERANCE} below it on the mean over '
        "training seeds. Studies that train only streaming checkpoints (masks, every-K, grouping) also score "
        "terminal answers with them, in streaming mode: each terminal answer is scored with what has been "
        "decoded when it arrives, while self-consistency counts every sequence's final answer; for those "
        "checkpoints the streaming row is the like-for-like comparison.",
        "",
        f"{len(rows) - len(below)} of {len(rows)} fits are at or above the vote"
        + (
            "."
            if not below
            else "; below it: "
            + ", ".join(f"{row.study} {row.method} ({row.setting}, N={row.n}, {row.difference:+.3f})" for row in below)
            + "."
        ),
        "",
        markdown_table(["study", "N", "answers", "MSV fit", "AUROC", "vote AUROC", "difference", "at the vote"], body),
        "",
    ]


# The optional studies' sections, in report order, each rendered when the summary has its entry.
_STUDY_SECTIONS = (
    ("checkers", _checkers),
    ("masks", _masks),
    ("delimiters", _delimiters),
    ("grouping", _grouping),
    ("training_size", _training_size),
)


def render_testbed(summary: ReproductionResults | Mapping, main_results: StudyResults | Mapping | None = None) -> str:
    """``testbed.md`` from a `reproduce` summary.

    Args:
        summary: the summary, typed or as its dict (``testbed.json``).
        main_results: the main study's `evaluate_study` results; not read (everything shown is in the summary).

    Returns:
        The markdown.
    """
    summary = as_reproduction_results(summary)
    lines = _header(summary)
    lines += _calibration(
        summary, "terminal", "## 1. Calibration on terminal answers", "terminal_brier", "reliability_answers"
    )
    lines += _best_of_n(summary)
    lines += _calibration(
        summary, "streaming", "## 3. Calibration on streaming answers", "streaming_brier", "brier_position"
    )
    lines += _early_stopping(summary)
    lines += _lambda_selection(summary)
    for key, section in _STUDY_SECTIONS:
        if getattr(summary, key) is not None:
            lines += section(summary)
    lines += _vote_check(summary)
    return "\n".join(lines)
