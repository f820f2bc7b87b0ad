"""``hf-msv evaluate``: flags from `EvaluateConfig`, then `evaluate_study`."""

from __future__ import annotations

import json
from pathlib import Path

from .config import EvaluateConfig
from .early_stop import LatencyCosts
from .report import require_report_extras
from .study import difficulty_from_problems, evaluate_study
from .verifiers import parse_verifier_specs

__all__ = ["evaluate_from_config", "main"]


def evaluate_from_config(config: EvaluateConfig) -> dict:
    """Run `evaluate_study` with the settings of `config`; returns its results. Raises ModuleNotFoundError (figures
    without matplotlib), ValueError or FileNotFoundError (bad inputs) before any work."""
    if config.figures:
        require_report_extras("or pass --no-figures")
    specs = parse_verifier_specs(config.verifier)
    difficulty = None
    if config.difficulty_field:
        from ..collect import load_problems

        difficulty = difficulty_from_problems(load_problems(config.problems), config.difficulty_field)
    costs = None
    if config.decode_step_s is not None or config.elicit_s is not None:
        costs = LatencyCosts(config.decode_step_s or 0.0, config.elicit_s or 0.0)
    return evaluate_study(config.eval_dir, specs, config.output_dir,
                          config.num_sequences, config.val_dir, bootstrap=config.bootstrap, checker=config.checker,
                          checker_kwargs=config.checker_kwargs_dict, lm_costs=costs,
                          wv_threshold=config.wv_threshold, deepconf_window=config.deepconf_window,
                          deepconf_stat=config.deepconf_stat, target_accuracy=config.target_accuracy,
                          target_fraction=config.target_fraction, ltt_epsilon=config.ltt_epsilon,
                          ltt_delta=config.ltt_delta,
                          figures=config.figures, title=config.title, report_name=config.report_name,
                          progress=config.progress, prm=config.prm, prm_kwargs=config.prm_kwargs,
                          lm_tokenizer=config.lm_tokenizer, difficulty=difficulty,
                          difficulty_name=config.difficulty_field or "difficulty")


def main(argv: list[str] | None = None) -> dict:
    """``hf-msv evaluate [flags]``: evaluate, then print the report's and JSON's paths."""
    from transformers import HfArgumentParser

    parser = HfArgumentParser(EvaluateConfig, description="Baselines, metrics, figures and λ rules over collected "
                                                          "shards and trained verifiers.")
    (config,) = parser.parse_args_into_dataclasses(argv)
    results = evaluate_from_config(config)
    out = Path(config.output_dir)
    print(json.dumps({"report": str(out / f"{config.report_name}.md"),
                      "json": str(out / f"{config.report_name}.json")}))
    return results


if __name__ == "__main__":
    main()
