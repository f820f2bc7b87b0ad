"""`evaluate_study` (``hf-msv evaluate``): every baseline, metric, figure and λ rule of the paper over collected
shards and trained verifiers, with mean ± std over training seeds and paired bootstrap intervals over problems.

    from hf_msv.evaluation import EvaluateConfig, evaluate_study
    config = EvaluateConfig(eval_dir="data/eval", output_dir="reports/eval", val_dir="data/val",
                            num_sequences=[1, 4, 16])
    results = evaluate_study(config, {"Probe": "verifiers/probe", "MSV_1": "verifiers/msv1",
                                      "MSV_16": ["verifiers/msv16-seed0", "verifiers/msv16-seed1"]})

The protocol (groups, training seeds, methods, metrics, early stopping, λ rules) is described in
``docs/evaluation.md``.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from ..data import AnswerGroup, CollectedProblem, ShardDataset, collection_elicitation
from ..errors import UserError
from ..metrics import best_of_n_metrics, best_of_n_pairs, calibration_metrics, ece, reliability_bins, seed_stat
from ..utils import json_safe
from .config import EvaluateConfig
from .early_stop import (
    BUDGET_FRACTIONS,
    LAMBDAS,
    LatencyCosts,
    TradeoffCurve,
    autc,
    choose_on_groups,
    early_stop_token_fraction,
    interpolated_curve,
    replay_at,
    tradeoff_curve,
)
from .intervals import (
    AXES,
    ChosenBudget,
    ProblemCurves,
    ProblemNumbers,
    chosen_budget,
    chosen_budget_interval,
    fraction_interval,
    interpolated_interval,
    metric_intervals,
    problem_curves,
    problem_numbers,
    target_fraction_interval,
)
from .methods import (
    PRM,
    SETTINGS,
    STACKED,
    STOP_HEAD_SUFFIX,
    VOTE_BASELINES,
    MethodPlan,
    SplitScores,
    add_linear_probe,
    add_prm_scores,
    draw_scores,
    evaluation_groups,
    fit_deepconf,
    method_label,
    method_plan,
    prepare_split,
    with_verifiers,
)
from .prm import PRMScorer, load_lm_tokenizer, require_cot_token_ids
from .report import ReliabilityPairs, render_report, require_report_extras, write_figures
from .results import (
    Budgets,
    FullDecodingTarget,
    InterpolatedAccuracy,
    Interval,
    MethodRoster,
    SeedStat,
    StudyConfig,
    StudyResults,
    ValidationBudget,
)
from .scoring import lm_cost_for, lm_costs_from_info, measure_verifier_cost
from .verifiers import VerifierEntry, load_verifier_seeds, parse_verifier_specs

__all__ = ["default_num_sequences", "difficulty_from_problems", "evaluate_study", "split_statistics"]

# Fixed by the protocol (``docs/evaluation.md``), not settings: groups timed per N for the online verifier cost,
# and token-position bins of the Brier-by-position breakdown.
_COST_GROUPS, _POSITION_BINS = 4, 8


@dataclass
class _Study:
    """What every N of one training seed shares: the settings, the splits (scored by that seed's verifiers), its
    verifiers and the token-position bin edges."""

    config: EvaluateConfig
    split: SplitScores
    val: SplitScores | None
    entries: list[VerifierEntry]
    edges: np.ndarray


# One λ rule's outcome on one training seed (`_rule_record`), keys in report order; `_summarise_rule` makes each a
# seed statistic of the report's ``lambda_selection``.
_RuleOutcome = TypedDict(
    "_RuleOutcome",
    {
        "target": float,
        "lambda": float,
        "val_accuracy": float,
        "val_tokens": float,
        "eval_accuracy": float,
        "eval_tokens": float,
        "eval_latency": float,
        "certified": float,
        "reached": float,
        "problems_needed": float,
        "stop_rate": float,
        "stop_accuracy": float,
        "stop_confidence": float,
        "stop_ece": float,
    },
)

# The confidence reported at each early stop and whether the stopped answer was right, of one training seed.
_StopEvents = tuple[np.ndarray, np.ndarray]


def _per_setting() -> dict[str, dict]:
    return {s: {} for s in SETTINGS}


@dataclass
class _PerN:
    """Accumulators of one N over training seeds: every per-method list holds one entry per training seed.

    Attributes:
        lm: the LM's per-unit costs at N.
        plans: per training seed, setting -> its `MethodPlan`.
        verify_s / offline: method label -> online / offline verifier seconds per answer.
        per_seed: setting -> method -> metric -> its value per seed.
        numbers: setting -> method -> `ProblemNumbers` per seed (the intervals' inputs).
        problem_curves: method -> `ProblemCurves` per seed (streaming).
        curves / val_curves: method -> evaluation / validation `TradeoffCurve` per seed.
        positions: method -> Brier per token-position bin, per seed.
        lam_sel: method -> λ rule -> `_RuleOutcome` per seed.
        stop_events: method -> λ rule -> `_StopEvents` per seed.
        reliability: method -> its `ReliabilityPairs` (terminal).
    """

    lm: LatencyCosts
    plans: list[dict[str, MethodPlan]]
    verify_s: dict[str, float] = field(default_factory=dict)
    per_seed: dict[str, dict[str, dict[str, list[float]]]] = field(default_factory=_per_setting)
    numbers: dict[str, dict[str, list[ProblemNumbers]]] = field(default_factory=_per_setting)
    problem_curves: dict[str, list[ProblemCurves]] = field(default_factory=dict)
    curves: dict[str, list[TradeoffCurve]] = field(default_factory=dict)
    val_curves: dict[str, list[TradeoffCurve]] = field(default_factory=dict)
    positions: dict[str, list[list[float]]] = field(default_factory=dict)
    lam_sel: dict[str, dict[str, list[_RuleOutcome]]] = field(default_factory=dict)
    stop_events: dict[str, dict[str, list[_StopEvents]]] = field(default_factory=dict)
    offline: dict[str, float] = field(default_factory=dict)
    reliability: dict[str, ReliabilityPairs] = field(default_factory=dict)

    def costs_for(self, method: str) -> LatencyCosts:
        base = method[:-3] if method.endswith("+WV") else method
        return LatencyCosts(self.lm.decode_step_s, self.lm.elicit_s, self.verify_s.get(base, 0.0))


def evaluate_study(
    config: EvaluateConfig,
    verifiers: Mapping | None = None,
    *,
    lm_costs: LatencyCosts | Mapping | None = None,
    difficulty: Mapping | None = None,
    difficulty_name: str = "difficulty",
) -> StudyResults:
    """Evaluate every baseline and verifier on the shards of ``config.eval_dir`` (protocol: ``docs/evaluation.md``);
    write ``{report_name}.md`` / ``.json`` and figures into ``config.output_dir``, created only once every input is
    checked.

    Args:
        config: the settings, one field per ``hf-msv evaluate`` flag: the shards (``eval_dir``; ``val_dir`` fits the
            calibrated baselines and chooses the λ of the λ rules and of each budget, none chosen without it), the N
            values (``num_sequences``; None:
            `default_num_sequences` of the samples collected), the baselines, the λ rules and the report.
        verifiers: name -> checkpoint (directory or model), or name -> {"terminal": ..., "streaming": ...}, or a list
            of those, one per training seed (`load_verifier_seeds`); None: the ``config.verifier`` NAME=PATH specs.
        lm_costs: `LatencyCosts` or {N: LatencyCosts}; None: ``config.decode_step_s`` / ``config.elicit_s`` when
            set, else the shards' recorded ``latency``, else zeros.
        difficulty: problem id -> difficulty value (`difficulty_from_problems`), reported as `difficulty_name`;
            None: ``config.difficulty_field`` of ``config.problems`` when set.
    Returns:
        The `StudyResults`, also written to ``{output_dir}/{report_name}.json`` (its ``to_dict()``;
        `StudyResults.from_dict` reads the JSON back) and rendered to ``{report_name}.md``.
    Raises:
        ValueError or FileNotFoundError on bad inputs (an input given both in `config` and as an argument among
        them), ModuleNotFoundError for figures without matplotlib: before any work.
    """
    if config.figures:
        require_report_extras("or pass --no-figures")
    verifiers, lm_costs, difficulty, difficulty_name = _resolve_inputs(
        config, verifiers, lm_costs, difficulty, difficulty_name
    )
    dataset = ShardDataset(config.eval_dir, checker=config.checker, checker_kwargs=config.checker_kwargs_dict)
    ns = _checked_ns(config.num_sequences, dataset.num_sequences)
    val_data = (
        None
        if config.val_dir is None
        else ShardDataset(config.val_dir, checker=config.checker, checker_kwargs=config.checker_kwargs_dict)
    )
    if val_data is not None:
        _check_validation_ns(ns, val_data.num_sequences, config.val_dir)
    seed_entries = load_verifier_seeds(verifiers)
    prm_scorer, lm_tok = _load_prm(config, dataset, val_data)
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    split, val = _prepared_splits(dataset, val_data, seed_entries, config, prm_scorer, lm_tok)
    lm_costs, cost_source = _resolve_lm_costs(lm_costs, split.info)
    edges = _position_edges(split.problems, _POSITION_BINS)
    studies = [
        _Study(
            config,
            with_verifiers(split, entries),
            None if val is None else with_verifiers(val, entries),
            entries,
            edges,
        )
        for entries in seed_entries
    ]
    results = _empty_results(
        config.title,
        _study_config(config, ns, seed_entries, prm_scorer, lm_tok),
        _data_summary(split.problems, split.info, val),
        cost_source,
        _prm_cost(split, val),
    )
    if difficulty is not None:
        results["config"]["difficulty"] = difficulty_name
    levels = None if difficulty is None else [difficulty.get(p.problem_id) for p in split.problems]
    reliability, curves = _evaluate_every_n(results, studies, ns, lm_costs, levels)
    if not results["stop_reliability"]:  # no λ rule ran (no validation split): absent, as in results before it
        del results["stop_reliability"]
    if config.figures:
        results["figures"] = write_figures(results, reliability, curves, output_dir, config.report_name)
    # Through the typed model before anything is written, so a section built with a key the readers do not know
    # fails here rather than when a report is rendered.
    typed = StudyResults.from_dict({key: json_safe(value) for key, value in results.items()})
    (output_dir / f"{config.report_name}.json").write_text(json.dumps(typed.to_dict(), indent=1))
    (output_dir / f"{config.report_name}.md").write_text(render_report(typed))
    return typed


def _resolve_inputs(config: EvaluateConfig, verifiers, lm_costs, difficulty, difficulty_name: str):
    """(verifiers, LM costs, difficulty, its name): each given as an argument, else as `config` names it (the way
    ``hf-msv evaluate`` takes it). An input given both ways is refused rather than one silently ignored."""
    from_config = {
        "verifiers": bool(config.verifier),
        "lm_costs": config.decode_step_s is not None or config.elicit_s is not None,
        "difficulty": bool(config.difficulty_field),
    }
    fields = {"verifiers": "verifier", "lm_costs": "decode_step_s / elicit_s", "difficulty": "difficulty_field"}
    given = {"verifiers": verifiers, "lm_costs": lm_costs, "difficulty": difficulty}
    for name in given:
        if from_config[name] and given[name] is not None:
            raise UserError(
                f"evaluate_study got {name} both as an argument and as EvaluateConfig.{fields[name]}: "
                "give them one way"
            )
    if verifiers is None:
        verifiers = parse_verifier_specs(config.verifier)
    if from_config["lm_costs"]:
        lm_costs = LatencyCosts(config.decode_step_s or 0.0, config.elicit_s or 0.0)
    if config.difficulty_field:
        from ..collect import load_problems

        difficulty = difficulty_from_problems(load_problems(config.problems), config.difficulty_field)
        difficulty_name = config.difficulty_field
    return verifiers, lm_costs, difficulty, difficulty_name


def _prepared_splits(
    dataset: ShardDataset,
    val_data: ShardDataset | None,
    seed_entries: list,
    config: EvaluateConfig,
    prm_scorer,
    lm_tok,
):
    """(evaluation, validation) `SplitScores` with every score that does not depend on the verifiers: Token Probs,
    DeepConf (Platt-scaled), the PRM's, and the stacked baseline's linear probe when no Probe is given."""
    split = prepare_split(dataset, config.method_config, name="evaluation")
    val = None if val_data is None else prepare_split(val_data, config.method_config, name="validation")
    if prm_scorer is not None:
        for s in filter(None, (split, val)):
            add_prm_scores(s, prm_scorer, lm_tok, config.progress)
    fit_deepconf(split, val)
    if not any(e.kind == "probe" for e in seed_entries[0]):  # the stacked baseline's Probe feature
        add_linear_probe(split, val)
    return split, val


def _empty_results(title: str, config: dict, data: dict, cost_source: str, prm_cost) -> dict:
    """The results dict before any N is evaluated (its keys in report order)."""
    return {
        "title": title,
        "config": config,
        "data": data,
        "costs": {
            "source": cost_source,
            "lm": {},
            "verifier_online_s_per_answer": {},
            "verifier_offline_s_per_answer": {},
            "prm": prm_cost,
        },
        "methods": {},
        "terminal": {},
        "streaming": {},
        "early_stop": {},
        "lambda_selection": {},
        "stop_reliability": {},
        "intervals": {},
        "brier_by_position": {},
        "by_difficulty": {},
        "figures": [],
    }


def _checked_ns(num_sequences_list, available: int) -> list[int]:
    """The sorted N values to evaluate, checked against `available` (the fewest sequences any problem has) before
    any verifier is loaded."""
    ns = sorted({int(n) for n in (num_sequences_list or default_num_sequences(available))})
    if ns[-1] > available:
        grid = " ".join(map(str, default_num_sequences(available)))
        raise UserError(
            f"N={ns[-1]} requested but some evaluation problems have only {available} sequences: "
            f"ask for N <= {available} (e.g. --num-sequences {grid}, the default)"
        )
    return ns


def _check_validation_ns(ns: list[int], available: int, val_dir) -> None:
    """Refuse, before any work, an N above the sequences per problem of the validation split (the λ rules and the
    fitted baselines draw validation groups of N)."""
    if ns[-1] > available:
        fits = " ".join(str(n) for n in ns if n <= available) or "1"
        raise UserError(
            f"N={ns[-1]} requested but the validation split ({val_dir}) has only {available} sequences "
            f"per problem: evaluate at N <= {available} (e.g. --num-sequences {fits}), or collect the "
            f"validation problems with --num-samples {ns[-1]} or more"
        )


def _study_config(config: EvaluateConfig, ns: list[int], seed_entries: list, prm_scorer, lm_tok) -> dict:
    """The report's ``config`` entry: inputs, verifiers, the protocol settings of `config` and how each calibrated
    baseline was fitted."""
    entries, has_val = seed_entries[0], config.val_dir is not None
    probe = next((e.name for e in entries if e.kind == "probe"), None)
    return StudyConfig(
        eval_dir=str(config.eval_dir),
        val_dir=None if config.val_dir is None else str(config.val_dir),
        verifiers={
            e.name: {"kind": e.kind, "num_sequences": e.num_sequences, "modes": sorted(e.models)} for e in entries
        },
        num_sequences_list=ns,
        training_seeds=len(seed_entries),
        groups="fixed partition of the collected sequences into ⌊S/N⌋ groups of N per problem",
        bootstrap=config.bootstrap,
        checker=None if config.checker is None else str(config.checker),
        checker_kwargs=config.checker_kwargs_dict or {},
        wv_threshold=config.wv_threshold,
        deepconf_window=config.deepconf_window,
        deepconf_stat=config.deepconf_stat,
        target_accuracy=config.target_accuracy,
        target_fraction=config.target_fraction,
        ltt_epsilon=config.ltt_epsilon,
        ltt_delta=config.ltt_delta,
        deepconf_calibration="platt on validation" if has_val else "platt, 2-fold cross-fit on eval",
        vote_calibration="fitted on validation" if has_val else "2-fold cross-fit on eval",
        stacked_probe=probe
        or (
            "linear probe on mean-pooled answer states, fitted on "
            + ("validation (its validation scores 2-fold cross-fit)" if has_val else "eval (2-fold cross-fit)")
        ),
        prm=None
        if prm_scorer is None
        else {
            "model": prm_scorer.name,
            "aggregate": prm_scorer.aggregate,
            "step_separator": prm_scorer.step_separator,
            "lm_tokenizer": getattr(lm_tok, "name_or_path", ""),
        },
    ).to_dict()


def _evaluate_every_n(
    results: dict, studies: list[_Study], ns: list[int], lm_costs, levels
) -> tuple[dict[int, dict[str, ReliabilityPairs]], dict[str, dict[str, TradeoffCurve]]]:
    """Evaluate every training seed's study at each N into `results`; returns what the figures need:
    (N -> method -> pooled reliability pairs, str(N) -> method -> mean trade-off curve)."""
    from tqdm.auto import tqdm

    reliability: dict[int, dict[str, ReliabilityPairs]] = {}
    curves: dict[str, dict[str, TradeoffCurve]] = {}
    bar = tqdm(
        total=len(ns) * len(studies),
        desc="evaluate",
        unit="seed",
        disable=not studies[0].config.progress,
        dynamic_ncols=True,
    )
    for n in ns:
        per_n = _PerN(
            lm_cost_for(lm_costs, n),
            [{s: method_plan(st.entries, n, s, st.split) for s in SETTINGS} for st in studies],
        )
        per_n.verify_s = _online_costs(studies[0], n, per_n.plans[0])
        prm_cost = studies[0].split.prm_cost  # measured once, when the PRM scored the split
        if prm_cost:
            per_n.verify_s[PRM] = prm_cost["seconds"] / max(prm_cost["answers"], 1)
        for seed, study in enumerate(studies):
            _evaluate_draw(study, n, seed, per_n)
            bar.update(1)
        _summarise_n(results, n, per_n, studies[0].edges, studies[0].config.bootstrap)
        if levels is not None:
            results["by_difficulty"][str(n)] = _by_difficulty(per_n, levels)
        reliability[n] = per_n.reliability
        curves[str(n)] = {m: _mean_curve(c) for m, c in per_n.curves.items()}
    bar.close()
    return reliability, curves


def default_num_sequences(available: int) -> list[int]:
    """The N values evaluated by default: the paper's grid 1, 4, 16, 64, 256, ... up to `available` (the fewest
    sequences any problem has), and `available` itself when it is not on the grid (best-of-all-collected)."""
    ns = [4**k for k in range(16) if 4**k <= available]
    return ns + ([available] if available not in ns else [])


def _load_prm(config: EvaluateConfig, dataset: ShardDataset, val: ShardDataset | None):
    """(PRMScorer, LM tokenizer) of the PRM baseline of ``config.prm``, or (None, None) without one. The shards are
    checked for CoT token ids first, so old shards fail before a large PRM is loaded."""
    if config.prm is None:
        return None, None
    require_cot_token_ids(dataset, "evaluation")
    if val is not None:
        require_cot_token_ids(val, "validation")
    lm_tok = load_lm_tokenizer(dataset.info, config.lm_tokenizer)
    return PRMScorer.from_pretrained(config.prm, **config.prm_kwargs), lm_tok


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


def _resolve_lm_costs(lm_costs, info: dict) -> tuple[dict | None, str]:
    """({N or None: LatencyCosts}, where they came from): the argument, else the shards' info, else zeros."""
    if lm_costs is None:
        lm_costs = lm_costs_from_info(info)
        cost_source = "shard collection info" if lm_costs else "none (zeros)"
        if not lm_costs:
            warnings.warn(
                "no LM decode/elicitation costs given or recorded in the shards: latency counts verifier time only",
                RuntimeWarning,
                stacklevel=3,
            )
    else:
        cost_source = "argument"
    if isinstance(lm_costs, LatencyCosts):
        lm_costs = {None: lm_costs}
    return lm_costs, cost_source


def _online_costs(study: _Study, n: int, plans: dict[str, MethodPlan]) -> dict[str, float]:
    """Online verifier cost per answer of each streaming verifier taking part at N, measured once per N (first
    training seed) on the first group of the first problems."""
    problems = study.split.problems
    seqs0 = [evaluation_groups(study.split.dataset.num_sequences, n, i)[0] for i in range(len(problems))]
    verify_s = {}
    for e in study.entries:
        model, _ = e.model_for("streaming")
        if model is None or (not e.single_sequence and not any(e is x for x in plans["streaming"].msv)):
            continue
        verify_s[method_label(e, n)] = measure_verifier_cost(
            model, study.split.dataset, seqs0, max_groups=_COST_GROUPS, repeats=2
        )
    return verify_s


def _evaluate_draw(study: _Study, n: int, seed: int, per_n: _PerN) -> None:
    """Every method's metrics on the evaluation groups at N with training seed `seed`'s verifiers, both settings,
    into `per_n` (and the λ rules with validation)."""
    for setting in SETTINGS:
        draw = draw_scores(study.split, n, setting, per_n.plans[seed][setting], study.config.method_config, study.val)
        groups, num_problems = draw.groups, len(study.split.problems)
        per_n.offline.update(draw.offline)
        for method in _methods_in(groups):
            p, y = _pooled(groups, method)
            row = _quiet(calibration_metrics, p, y)
            bon = _quiet(best_of_n_metrics, groups, method)
            row |= {f"bon_{k}": v for k, v in bon.items()}
            per_n.numbers[setting].setdefault(method, []).append(
                problem_numbers(groups, draw.problem_of, num_problems, method)
            )
            if setting == "streaming":
                row |= _streaming_metrics(study, draw, method, per_n)
            for k, v in row.items():
                per_n.per_seed[setting].setdefault(method, {}).setdefault(k, []).append(v)
            if setting == "terminal":
                pairs = per_n.reliability.setdefault(method, ReliabilityPairs())
                bp, by = best_of_n_pairs(groups, method)
                for store, value in zip((pairs.answer_p, pairs.answer_y, pairs.bon_p, pairs.bon_y), (p, y, bp, by)):
                    store.append(value)
        if setting == "streaming" and study.val is not None:
            _lambda_rules(study, n, seed, per_n, groups)


def _streaming_metrics(study: _Study, draw, method: str, per_n: _PerN) -> dict:
    """Early-stopping metrics of one method on one training seed's groups (its per-problem curves, trade-off curve
    and Brier by position are kept in `per_n`)."""
    per_n.positions.setdefault(method, []).append(_brier_by_position(draw.groups, method, study.edges))
    pc = problem_curves(
        draw.groups, draw.problem_of, len(study.split.problems), method, LAMBDAS, per_n.costs_for(method)
    )
    per_n.problem_curves.setdefault(method, []).append(pc)
    c = pc.curve()
    per_n.curves.setdefault(method, []).append(c)
    full = int(np.argmax(c.lambdas))
    return {
        **{f"autc_{x}": autc(c, x) for x in AXES},
        **{f"autc_{x}_norm": autc(c, x, True) for x in AXES},
        "full_accuracy": float(c.accuracy[full]),
        "peak_accuracy": float(c.accuracy.max()),
        "full_tokens": float(c.tokens.max()),
        "full_steps": float(c.steps.max()),
        "full_latency": float(c.latency.max()),
    }


def _summarise_n(results: dict, n: int, per_n: _PerN, edges: np.ndarray, n_boot: int) -> None:
    """Write N's numbers (mean ± std over training seeds, intervals over problems) into `results`."""
    key = str(n)
    plans = per_n.plans[0]
    primary = plans["streaming"].primary or plans["terminal"].primary
    results["costs"]["lm"][key] = asdict(per_n.lm)
    results["costs"]["verifier_online_s_per_answer"][key] = dict(per_n.verify_s)
    results["costs"]["verifier_offline_s_per_answer"][key] = dict(per_n.offline)
    msv = None if primary is None else method_label(primary, n)
    multi = sorted({method_label(e, n) for s in SETTINGS for e in plans[s].msv})
    single = [m for m in plans["terminal"].base if m != msv]
    results["methods"][key] = MethodRoster(
        terminal=list(per_n.per_seed["terminal"]),
        streaming=list(per_n.per_seed["streaming"]),
        msv=msv,
        grouped=plans["streaming"].grouped or plans["terminal"].grouped,
        single_sequence=list(plans["terminal"].base),
        multi_sequence=multi,
        aggregations=[
            m for s in SETTINGS for m in (*VOTE_BASELINES[s], STACKED, *plans[s].wv) if m in per_n.per_seed[s]
        ],
    ).to_dict()
    for s in SETTINGS:
        results[s][key] = {m: {k: seed_stat(v) for k, v in d.items()} for m, d in per_n.per_seed[s].items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # empty bins stay nan
        results["brier_by_position"][key] = {
            "edges": edges.tolist(),
            **{m: np.nanmean(np.asarray(v, dtype=float), axis=0).tolist() for m, v in per_n.positions.items()},
        }
    results["early_stop"][key] = _early_stop_summary(per_n, msv, multi, single, n_boot)
    if n_boot and msv is not None:
        results["intervals"][key] = {
            s: {
                m: {k: iv.to_dict() for k, iv in metric_intervals(per_n.numbers[s][msv], nums, n_boot).items()}
                for m, nums in per_n.numbers[s].items()
                if m != msv and m not in multi
            }
            for s in SETTINGS
            if msv in per_n.numbers[s]
        }
    if per_n.lam_sel:
        results["lambda_selection"][key] = {
            m: {rule: _summarise_rule(vals) for rule, vals in d.items()} for m, d in per_n.lam_sel.items()
        }
    if per_n.stop_events:  # absent from results that predate it, so theirs read and write back unchanged
        bins = {
            m: {rule: _stop_reliability(events) for rule, events in d.items()} for m, d in per_n.stop_events.items()
        }
        results["stop_reliability"][key] = {
            m: {rule: b for rule, b in rules.items() if b is not None}
            for m, rules in bins.items()
            if any(b is not None for b in rules.values())
        }


# ----------------------------------------------------------------------------------------------------------------
# λ rules
# ----------------------------------------------------------------------------------------------------------------


def _lambda_rules(study: _Study, n: int, seed: int, per_n: _PerN, eval_groups: list[AnswerGroup]) -> None:
    """Both λ rules of `hf_msv.lambda_rule.choose_lambda` for every streaming method, chosen on the validation
    groups at N (same training seed) and applied to `eval_groups`: the target rule (``"validation"``) and the
    guarantee (``"ltt"``), with the stop-time calibration on the evaluation split; and the validation curve the
    budgets' λ are chosen on."""
    if study.val is None:
        raise ValueError("the λ rules are chosen on a validation split: the study has none")
    vgroups = draw_scores(
        study.val, n, "streaming", per_n.plans[seed]["streaming"], study.config.method_config, study.val
    ).groups
    for m in _methods_in(eval_groups):
        costs = per_n.costs_for(m)
        per_n.val_curves.setdefault(m, []).append(tradeoff_curve(vgroups, m, LAMBDAS, costs))
        for rule, kwargs in study.config.lambda_rules.items():
            choice = choose_on_groups(vgroups, m, LAMBDAS, costs, **kwargs)
            ev = replay_at(eval_groups, m, choice.lam, costs)
            confidence = np.array([g.confidence_of(m)[c] if c >= 0 else 0.0 for g, c in zip(eval_groups, ev.chosen)])
            record = _rule_record(choice, ev, confidence)
            per_n.lam_sel.setdefault(m, {}).setdefault(rule, []).append(record)
            events = (confidence[ev.stopped], ev.correct[ev.stopped])
            per_n.stop_events.setdefault(m, {}).setdefault(rule, []).append(events)


def _stop_reliability(events: list[_StopEvents]) -> dict | None:
    """Reliability bins (tenths) of the confidence reported at the stop, over the early stops of every training
    seed; empty bins are left out. None for a statistic that is not a probability (no calibration to show)."""
    confidence = np.concatenate([c for c, _ in events])
    correct = np.concatenate([y for _, y in events]).astype(float)
    if confidence.size and (confidence.min() < 0.0 or confidence.max() > 1.0):
        return None
    if not confidence.size:
        return {"confidence": [], "accuracy": [], "count": []}
    mean_confidence, accuracy, count = reliability_bins(confidence, correct)
    kept = count > 0
    return {
        "confidence": mean_confidence[kept].tolist(),
        "accuracy": accuracy[kept].tolist(),
        "count": count[kept].tolist(),
    }


def _rule_record(choice, ev, confidence: np.ndarray) -> _RuleOutcome:
    """One λ rule's outcome: its choice on validation, then on evaluation the accuracy, tokens and latency at the
    chosen λ and, over the groups that stopped, accuracy, mean confidence (`confidence`: the chosen answer's score
    per group) and ECE."""
    hit = ev.stopped
    return {
        "target": math.nan if choice.target is None else choice.target,
        "lambda": choice.lam,
        "val_accuracy": choice.accuracy,
        "val_tokens": choice.tokens,
        "eval_accuracy": float(ev.correct.mean()),
        "eval_tokens": float(ev.tokens.mean()),
        "eval_latency": float(ev.latency.mean()),
        "certified": float(choice.reached) if choice.rule == "guarantee" else math.nan,
        "reached": float(choice.reached),
        "problems_needed": choice.problems_needed or math.nan,
        "stop_rate": float(hit.mean()),
        "stop_accuracy": float(ev.correct[hit].mean()) if hit.any() else math.nan,
        "stop_confidence": float(confidence[hit].mean()) if hit.any() else math.nan,
        "stop_ece": ece(confidence[hit], ev.correct[hit]) if hit.any() else math.nan,
    }


def _by_difficulty(per_n: _PerN, levels: list) -> dict:
    """{value: {"problems": count, method: {"brier", "bon_accuracy"}}} over the problems of each difficulty value
    (terminal answers; mean over training seeds), values in sorted order."""
    out = {}
    known = sorted({v for v in levels if v is not None}, key=lambda v: (isinstance(v, str), v))
    for value in known:
        idx = np.array([lv == value for lv in levels])
        row: dict = {"problems": int(idx.sum())}
        for m, nums in per_n.numbers["terminal"].items():
            brier = np.mean([x.sq_err[idx].sum() / max(x.count[idx].sum(), 1) for x in nums])
            row[m] = {"brier": float(brier), "bon_accuracy": float(np.mean([x.bon_y[idx].mean() for x in nums]))}
        out[str(value)] = row
    return out


def difficulty_from_problems(problems, field_name: str) -> dict[str, Any]:
    """problem id -> difficulty of `hf_msv.data.Problem`s: ``problem.meta[field_name]`` (a list counts as its
    length, e.g. the testbed's ``ops``: its reasoning steps); problems without the field are left out."""
    out = {}
    for p in problems:
        if field_name in p.meta:
            v = p.meta[field_name]
            out[p.id] = len(v) if isinstance(v, (list, tuple)) else v
    if not out:
        raise UserError(f"no problem has the metadata field {field_name!r}")
    return out


def _summarise_rule(values: list[_RuleOutcome]) -> dict:
    """One λ rule's outcomes over training seeds: outcome -> seed statistic (None counts as nan)."""
    keys = values[0].keys()
    return {k: seed_stat([v[k] if v[k] is not None else math.nan for v in values]) for k in keys}


# ----------------------------------------------------------------------------------------------------------------
# Aggregation helpers
# ----------------------------------------------------------------------------------------------------------------


def _methods_in(groups: list[AnswerGroup]) -> list[str]:
    return list(groups[0].scores) if groups else []


def _pooled(groups: list[AnswerGroup], method: str) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([g.confidence_of(method) for g in groups]), np.concatenate([g.correct for g in groups])


def _start(group: AnswerGroup) -> np.ndarray:
    """(A,) τ of each answer of a streaming group (the step its delimiter fired at)."""
    if group.start is None:
        raise ValueError("a streaming group without its answers' start steps (AnswerGroup.start)")
    return group.start


def _position_edges(problems: list[CollectedProblem], bins: int = 8) -> np.ndarray:
    tau = np.concatenate([p.answer_tau for p in problems]) if problems else np.zeros(1)
    hi = float(np.quantile(tau, 0.98)) if tau.size else 1.0
    edges = np.linspace(0.0, max(hi, 1.0), bins + 1)
    edges[-1] = np.inf
    return edges


def _brier_by_position(groups: list[AnswerGroup], method: str, edges: np.ndarray) -> list[float]:
    p, y = _pooled(groups, method)
    tau = np.concatenate([_start(g) for g in groups])
    idx = np.clip(np.searchsorted(edges, tau, side="right") - 1, 0, len(edges) - 2)
    out = []
    for b in range(len(edges) - 1):
        m = idx == b
        out.append(float(np.mean((p[m] - y[m]) ** 2)) if m.any() else math.nan)
    return out


def _curve_dict(curves: list[TradeoffCurve]) -> dict:
    mean = lambda name: np.mean([getattr(c, name) for c in curves], axis=0).tolist()
    lam = curves[0].lambdas
    return {
        "lambdas": [None if math.isinf(x) else float(x) for x in lam],
        "accuracy": mean("accuracy"),
        "tokens": mean("tokens"),
        "steps": mean("steps"),
        "latency": mean("latency"),
        "stop_rate": mean("stop_rate"),
    }


def _mean_curve(curves: list[TradeoffCurve]) -> TradeoffCurve:
    mean = lambda name: np.mean([getattr(c, name) for c in curves], axis=0)
    return TradeoffCurve(
        curves[0].lambdas, mean("accuracy"), mean("tokens"), mean("steps"), mean("latency"), mean("stop_rate")
    )


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def split_statistics(problems: list[CollectedProblem]) -> dict[str, int | float]:
    """What a report says of a collected split: problems, sequences per problem, answers (per sequence), terminal
    and all-answer accuracy, mean chain-of-thought length in tokens. Exact counts, so two collections can be
    compared (`research/compare_main_collection.py`)."""
    correct = np.concatenate([p.answer_correct for p in problems])
    term = np.concatenate([p.answer_terminal for p in problems])
    return {
        "problems": len(problems),
        "sequences_per_problem": int(min(p.num_sequences for p in problems)),
        "answers": len(correct),
        "answers_per_sequence": float(len(correct) / sum(p.num_sequences for p in problems)),
        "terminal_accuracy": float(correct[term].mean()) if term.any() else math.nan,
        "answer_accuracy": float(correct.mean()) if len(correct) else math.nan,
        "mean_sequence_tokens": float(np.mean(np.concatenate([p.sequence_length for p in problems]))),
    }


def _data_summary(problems: list[CollectedProblem], info: dict, val: SplitScores | None) -> dict:
    """The report's ``data`` entry: each split's `split_statistics` and the evaluation shards' collection settings."""
    if "elicitation" in info:  # shards that record `ElicitationSettings`: the flat keys reports have always shown
        e = collection_elicitation(info)
        info = {
            "delimiters": list(e.delimiters),
            "every_k_tokens": e.every_k_tokens,
            "max_answer_tokens": e.max_answer_tokens,
            **info,
        }
    out = {
        "eval": split_statistics(problems),
        "collect": {
            k: info.get(k)
            for k in (
                "lm_name_or_path",
                "num_samples",
                "temperature",
                "max_new_tokens",
                "delimiters",
                "every_k_tokens",
                "checker",
                "max_answer_tokens",
            )
            if k in info
        },
    }
    if val is not None:
        out["val"] = split_statistics(val.problems)
    return out


def _best_peak(mean: dict, names: list[str], axis: str) -> str | None:
    """The method of highest peak accuracy among `names` (ties: the one needing the least budget on `axis`)."""
    names = [m for m in names if m in mean]
    if not names:
        return None
    return max(
        names,
        key=lambda m: (round(float(mean[m].accuracy.max()), 12), -float(mean[m].x(axis)[np.argmax(mean[m].accuracy)])),
    )


def _comparison(per_n: _PerN, mean: dict, msv: str, best: str, n_boot: int) -> dict:
    """MSV against one baseline on every axis: budget fraction to reach its peak (seed-mean curves), per training
    seed, and its paired bootstrap interval over problems."""
    out = {
        "baseline": best,
        "baseline_peak_accuracy": float(mean[best].accuracy.max()),
        "msv_peak_accuracy": float(mean[msv].accuracy.max()),
    }
    for axis in AXES:
        out[axis] = {
            "fraction": _quiet(early_stop_token_fraction, mean[msv], mean[best], axis),
            "per_seed": [
                _quiet(early_stop_token_fraction, a, b, axis) for a, b in zip(per_n.curves[msv], per_n.curves[best])
            ],
            "interval": fraction_interval(
                per_n.problem_curves[msv], per_n.problem_curves[best], axis, n_boot
            ).to_dict()
            if n_boot
            else None,
        }
    return out


def _budgets(per_n: _PerN, mean: dict, msv: str, baselines: list[str], n_boot: int) -> dict:
    """Every streaming method at 30 / 50 / 70 % of full decoding's tokens: with λ chosen on validation and scored on
    evaluation (none without a validation split), and on its interpolated curve; paired intervals over problems of
    the reference (the MSV through its stop head when it has one, else the MSV) minus each other method; and the
    `FullDecodingTarget` curve summary against the most accurate of `baselines`."""
    reference = msv + STOP_HEAD_SUFFIX if msv + STOP_HEAD_SUFFIX in mean else msv
    return Budgets(
        fractions=list(BUDGET_FRACTIONS),
        reference=reference,
        validation_chosen=_validation_chosen(per_n, reference, n_boot),
        interpolated=_interpolated(per_n, mean, reference, n_boot),
        full_decoding_target=_full_decoding_target(per_n, mean, reference, baselines, n_boot),
    ).to_dict()


def _validation_chosen(per_n: _PerN, reference: str, n_boot: int) -> dict[str, list[ValidationBudget]] | None:
    """Method -> `ValidationBudget` per budget fraction: λ chosen on each seed's validation curve, read on its
    evaluation curves at that λ only. None without validation curves: a budget is then never chosen on evaluation."""
    if reference not in per_n.val_curves:
        return None
    out: dict[str, list[ValidationBudget]] = {}
    for fraction in BUDGET_FRACTIONS:
        chosen = {m: chosen_budget(v, per_n.problem_curves[m], fraction) for m, v in per_n.val_curves.items()}
        for m, c in chosen.items():
            iv = chosen_budget_interval(chosen[reference], c, n_boot) if n_boot and m != reference else None
            out.setdefault(m, []).append(_validation_budget(c, iv))
    return out


def _validation_budget(c: ChosenBudget, interval: Interval | None) -> ValidationBudget:
    """The seed statistics of one `ChosenBudget`, with its interval against the reference."""
    stat = lambda values: SeedStat.from_dict(seed_stat(values))
    return ValidationBudget(
        lam=stat([ch.lam for ch in c.choices]),
        val_accuracy=stat([ch.accuracy for ch in c.choices]),
        val_fraction=stat([ch.used_fraction for ch in c.choices]),
        fits=stat([float(ch.fits) for ch in c.choices]),
        eval_accuracy=stat(c.eval_accuracy),
        eval_fraction=stat(c.eval_fraction),
        interval=interval,
    )


def _interpolated(per_n: _PerN, mean: dict, reference: str, n_boot: int) -> dict[str, list[InterpolatedAccuracy]]:
    """Method -> its interpolated curve (seed-mean evaluation curve) at each budget fraction, with the paired
    interval of the reference − the method."""
    ref = per_n.problem_curves[reference]
    return {
        m: [
            InterpolatedAccuracy(
                interpolated_curve(c).at(f),
                interpolated_interval(ref, per_n.problem_curves[m], f, n_boot) if n_boot and m != reference else None,
            )
            for f in BUDGET_FRACTIONS
        ]
        for m, c in mean.items()
    }


def _full_decoding_target(
    per_n: _PerN, mean: dict, reference: str, baselines: list[str], n_boot: int
) -> FullDecodingTarget | None:
    """The fraction of full decoding's t* and tokens at which the reference's evaluation curve first reaches the
    full-decoding accuracy of the most accurate of `baselines` (a curve summary; a target that is not the maximum of
    a noisy curve); None without a baseline."""
    pool = [m for m in baselines if m in mean and m != reference]
    if not pool:
        return None
    best = max(pool, key=lambda m: float(mean[m].accuracy[np.argmax(mean[m].lambdas)]))
    ref, base = per_n.problem_curves[reference], per_n.problem_curves[best]
    return FullDecodingTarget(
        best,
        float(mean[best].accuracy[np.argmax(mean[best].lambdas)]),
        {axis: target_fraction_interval(ref, base, axis, n_boot) for axis in ("steps", "tokens")},
    )


def _early_stop_summary(
    per_n: _PerN, msv: str | None, multi: Sequence[str], single: Sequence[str], n_boot: int
) -> dict:
    """Seed-mean curves, and how the primary MSV compares with the baseline of highest peak accuracy, among the
    single-sequence baselines (the paper's comparison) and among all of them (every method but the
    multi-sequence MSVs). The top-level ``best_baseline`` / ``token_fraction`` / ``latency_fraction`` keys are the
    comparison with all baselines on summed tokens and latency (as before the token-position axis was added)."""
    curves = per_n.curves
    out = {"curves": {m: _curve_dict(c) for m, c in curves.items()}}
    if msv is None or msv not in curves:
        return out
    mean = {m: _mean_curve(c) for m, c in curves.items()}
    # An MSV read through its stop head is the MSV itself, never a baseline.
    pools = {
        "single_sequence": list(single),
        "all": [m for m in curves if m != msv and m not in multi and not m.endswith(STOP_HEAD_SUFFIX)],
    }
    comps = {}
    for name, pool in pools.items():
        best = _best_peak(mean, pool, "steps")
        if best is not None:
            comps[name] = _comparison(per_n, mean, msv, best, n_boot)
    out["budgets"] = _budgets(per_n, mean, msv, pools["all"], n_boot)
    best = _best_peak(mean, pools["all"], "tokens")
    if "all" not in comps or best is None:  # the pool of all baselines is empty: no comparison
        return out
    out |= {
        "msv": msv,
        "best_baseline": best,
        "best_baseline_peak_accuracy": float(mean[best].accuracy.max()),
        "msv_peak_accuracy": float(mean[msv].accuracy.max()),
        "token_fraction": _quiet(early_stop_token_fraction, mean[msv], mean[best]),
        "token_fraction_per_seed": [
            _quiet(early_stop_token_fraction, a, b) for a, b in zip(curves[msv], curves[best])
        ],
        "latency_fraction": _quiet(early_stop_token_fraction, mean[msv], mean[best], "latency"),
        "latency_fraction_per_seed": [
            _quiet(early_stop_token_fraction, a, b, "latency") for a, b in zip(curves[msv], curves[best])
        ],
        "comparisons": comps,
    }
    return out
