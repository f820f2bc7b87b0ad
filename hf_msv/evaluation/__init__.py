"""Evaluation: baselines, metrics, early-stop replay, λ rules and reports over collected shards."""

from .study import (
    SETTINGS,
    VerifierEntry,
    load_verifier,
    load_split,
    draw_sequences,
    select_answers,
    answer_group,
    score_problems,
    measure_verifier_cost,
    evaluate_study,
    add_evaluate_arguments,
    evaluate_from_args,
    parse_verifier_specs,
    lm_costs_from_info,
    main,
)

__all__ = [
    "SETTINGS",
    "VerifierEntry",
    "load_verifier",
    "load_split",
    "draw_sequences",
    "select_answers",
    "answer_group",
    "score_problems",
    "measure_verifier_cost",
    "evaluate_study",
    "add_evaluate_arguments",
    "evaluate_from_args",
    "parse_verifier_specs",
    "lm_costs_from_info",
    "main",
]
