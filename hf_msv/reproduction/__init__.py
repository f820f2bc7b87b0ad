"""The paper's experiments re-run on the testbed (``hf-msv reproduce``).

* `paper` — the paper's numbers (data only), the weak checkers' settings and the attention masks;
* `config` — `ReproduceConfig` (sizes and settings), `ReproduceArguments` (the command's flags), `training_config`;
* `pipeline` — the stages (collect, measure LM costs, train or reuse, `TrainingQueue`) and one function per study,
  `reproduce`, `train_shipped_verifier` and `main`;
* `summary` — the summary's study entries distilled from `evaluate_study` results (pure);
* `claims` — the paper's claims tested on the summary (pure);
* `report` — ``testbed.md`` rendered from the summary (pure).
"""

from .claims import compute_claims
from .config import STUDIES, ReproduceArguments, ReproduceConfig, training_config
from .paper import CHECKER_KWARGS, MASKS, PAPER
from .pipeline import (
    SHIPPED_LAMBDA_FILE,
    ReproductionContext,
    TrainingQueue,
    checker_agreement,
    checkers_study,
    collect_problems,
    collect_splits,
    delimiters_study,
    grouping_study,
    main,
    main_study,
    masks_study,
    measure_lm_costs,
    parse_arguments,
    reproduce,
    train_main_verifiers,
    train_or_reuse,
    shipped_lambda,
    train_shipped_verifier,
    training_size_study,
)
from .report import render_testbed

__all__ = [
    "PAPER",
    "CHECKER_KWARGS",
    "MASKS",
    "STUDIES",
    "ReproduceConfig",
    "ReproduceArguments",
    "training_config",
    "ReproductionContext",
    "collect_problems",
    "collect_splits",
    "train_or_reuse",
    "TrainingQueue",
    "measure_lm_costs",
    "checker_agreement",
    "train_main_verifiers",
    "shipped_lambda",
    "SHIPPED_LAMBDA_FILE",
    "main_study",
    "checkers_study",
    "masks_study",
    "delimiters_study",
    "grouping_study",
    "training_size_study",
    "reproduce",
    "train_shipped_verifier",
    "compute_claims",
    "render_testbed",
    "parse_arguments",
    "main",
]
