"""Evaluation: verifier scores over collected shards, baselines, metrics, early-stop replay, λ rules and reports.

Modules: `verifiers` (loading checkpoints), `scoring` (verifier and baseline scores, online cost, LM costs),
`prm` (the PRM baseline: a process reward model scoring answers from their chain-of-thought text), `methods` (the
compared methods on one group draw), `early_stop` (the stop-rule replay, trade-off curves, λ rules),
`intervals` (paired bootstrap intervals over problems), `study` (`evaluate_study`), `results` (its results as
dataclasses: `StudyResults`), `records` (`Record`, their one JSON conversion, the reproduction's too), `report`
(markdown and figures), `config` + `cli` (``hf-msv evaluate``). See ``docs/evaluation.md``.
"""

from ..data import answer_group, draw_sequences, load_split, select_answers
from .cli import main
from .config import EvaluateConfig, MethodConfig
from .intervals import ProblemCurves, ProblemNumbers, fraction_interval, metric_intervals
from .methods import SETTINGS, evaluation_groups
from .prm import PRMScorer, build_prm_text, load_lm_tokenizer, score_with_prm, split_steps
from .report import format_lambda, markdown_table, render_report, write_figures
from .results import (
    EarlyStopComparison,
    EarlyStopSummary,
    Interval,
    LambdaRuleRecord,
    MethodMetrics,
    MethodRoster,
    SeedStat,
    StudyConfig,
    StudyResults,
    as_study_results,
)
from .scoring import deepconf_scores, lm_costs_from_info, measure_verifier_cost, score_problems, token_prob_scores
from .study import default_num_sequences, difficulty_from_problems, evaluate_study, split_statistics
from .verifiers import VerifierEntry, load_verifier, load_verifier_seeds, load_verifiers, parse_verifier_specs

__all__ = [
    "SETTINGS",
    "EvaluateConfig",
    "MethodConfig",
    "default_num_sequences",
    "VerifierEntry",
    "load_verifier",
    "load_verifiers",
    "load_verifier_seeds",
    "evaluation_groups",
    "ProblemNumbers",
    "ProblemCurves",
    "metric_intervals",
    "fraction_interval",
    "parse_verifier_specs",
    "load_split",
    "draw_sequences",
    "select_answers",
    "answer_group",
    "score_problems",
    "measure_verifier_cost",
    "token_prob_scores",
    "deepconf_scores",
    "lm_costs_from_info",
    "PRMScorer",
    "split_steps",
    "build_prm_text",
    "load_lm_tokenizer",
    "score_with_prm",
    "evaluate_study",
    "StudyResults",
    "StudyConfig",
    "as_study_results",
    "SeedStat",
    "MethodMetrics",
    "MethodRoster",
    "Interval",
    "EarlyStopSummary",
    "EarlyStopComparison",
    "LambdaRuleRecord",
    "split_statistics",
    "difficulty_from_problems",
    "render_report",
    "write_figures",
    "markdown_table",
    "format_lambda",
    "main",
]
