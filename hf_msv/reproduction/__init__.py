"""The paper's experiments re-run on the testbed (``hf-msv reproduce``).

* `paper` — the paper's numbers (data only), the weak checkers' settings and the attention masks;
* `config` — `ReproduceConfig` (sizes and settings), `ReproduceArguments` (the command's flags), `training_config`;
* `own_lm` — `reproduction_task`: what a run samples from (a testbed task, or your own LM and problem specs);
* `stages` — the building blocks: collect, train or reuse (`TrainingQueue`), measure LM costs, checker agreement;
* `context` — `ReproductionContext`, the state the stages share (train per seed, evaluate or restore);
* `studies` — one function per study, each returning its summary entry;
* `shipped` — `train_shipped_verifier`, the package's verifier and its λ;
* `pipeline` — `reproduce` (the studies in order; the report written before each and at the end, one part per
  run) and `main`;
* `summary` — the summary's study entries distilled from `evaluate_study` results (pure);
* `claims` — the paper's claims tested on the summary (pure);
* `results` — the summary typed (`ReproductionResults`, what `reproduce` returns);
* `report` — ``testbed.md`` rendered from the summary (pure).

See ``docs/reproduction.md``.
"""

from .claims import compute_claims
from .config import STUDIES, ReproduceArguments, ReproduceConfig, training_config
from .context import ReproductionContext
from .own_lm import OWN_LM_TASK, ReproductionTask, reproduction_task
from .paper import CHECKER_KWARGS, MASKS, PAPER
from .pipeline import main, parse_arguments, reproduce
from .report import render_testbed
from .results import ReproductionResults
from .shipped import SHIPPED_EPSILON, SHIPPED_LAMBDA_FILE, fit_shipped_stopping, train_shipped_verifier
from .stages import (
    ShardReuse,
    TrainingQueue,
    checker_agreement,
    collect_problems,
    collect_splits,
    measure_lm_costs,
    train_or_reuse,
)
from .studies import (
    checkers_study,
    delimiters_study,
    grouping_study,
    main_study,
    masks_study,
    train_main_verifiers,
    training_size_study,
)

__all__ = [
    "PAPER",
    "CHECKER_KWARGS",
    "MASKS",
    "STUDIES",
    "ReproduceConfig",
    "ReproduceArguments",
    "training_config",
    "OWN_LM_TASK",
    "ReproductionTask",
    "reproduction_task",
    "ReproductionContext",
    "ShardReuse",
    "collect_problems",
    "collect_splits",
    "train_or_reuse",
    "TrainingQueue",
    "measure_lm_costs",
    "checker_agreement",
    "train_main_verifiers",
    "fit_shipped_stopping",
    "SHIPPED_EPSILON",
    "SHIPPED_LAMBDA_FILE",
    "main_study",
    "checkers_study",
    "masks_study",
    "delimiters_study",
    "grouping_study",
    "training_size_study",
    "reproduce",
    "ReproductionResults",
    "train_shipped_verifier",
    "compute_claims",
    "render_testbed",
    "parse_arguments",
    "main",
]
