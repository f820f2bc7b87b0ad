"""`MSVTrainingConfig`: every setting of a training run (recipes ``"auto"``, the default, and ``"paper"``; the
MSV's architecture as `MSVConfig` keyword arguments, `architecture_fields`), and `TrainingPlan`, the concrete
numbers it resolves to once the data is known (`resolve_plan`). The recipes, the start at the vote and its
cross-validation are described in ``docs/training.md``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

from ..errors import UserError
from ..lambda_rule import CALIBRATION_FRACTION, DELTA, EPSILON, LAMBDA_RULES
from ..stop_rules import STOP_STATISTICS

__all__ = [
    "MSVTrainingConfig",
    "TrainingPlan",
    "RECIPES",
    "RUN_SET_FIELDS",
    "architecture_fields",
    "resolve_batch_size",
    "resolve_plan",
    "default_learning_rate",
]

RECIPES = ("auto", "paper")
PRUNING_LOSSES = ("net", "paired", "off")  # `stop_pruning`: `hf_msv.lambda_rule.choose_jointly`'s losses, or none

# The auto recipe's body learning rate at the reference width (chosen on testbed validation data, 96 problems × 16
# samples), scaled by sqrt(REFERENCE_WIDTH / d): at d = 1536 that gives 8.7e-5 (terminal) / 2.9e-5 (streaming),
# within 2x of the paper's 5e-5 for a 1536-wide verifier; 1/d scaling would put streaming 6x below it.
REFERENCE_WIDTH = 128
REFERENCE_LR = {"terminal": 3e-4, "streaming": 1e-4}
GAMMA_LR = 1e-2
SEQUENCES_PER_BATCH = 256
PASSES = 20  # default step budget: 20 passes over the training sequences ...
MIN_STEPS, MAX_STEPS = 300, 2000  # ... but at least 300 and at most 2000 optimizer steps
EVALUATIONS = 20  # validation runs per budget (at least every 10 and at most every 100 steps)
DEFAULT_VOTE_FOLDS = 4  # cross-validation folds over the training problems that decide whether to leave the vote
# `MSVConfig` fields a training run sets itself, from the data (width, provenance, elicitation), the fields of the
# same names (mode, N, the γ skip and the vote pathway: how training starts), `probe_hidden_size` (the vote
# pathway's head is Probe-shaped) and validation (the stopping rule); `architecture` may set every other field.
RUN_SET_FIELDS = (
    "hidden_size",
    "mode",
    "num_sequences",
    "gamma_skip",
    "vote_pathway",
    "vote_hidden_size",
    "base_model_name_or_path",
    "base_model_revision",
    "elicitation",
    "early_stopping",
)
# The architecture keys every training config records at the top level of its settings (`to_dict`), set or not, as
# earlier versions of the package did: the reuse keys and resume states they wrote still match.
RECORDED_ARCHITECTURE = (
    "masks",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "readout",
    "logit_averaging",
    "gamma_hidden_size",
    "attention_backend",
)


def architecture_fields() -> dict[str, dataclasses.Field]:
    """The `MSVConfig` fields `MSVTrainingConfig.architecture` may set, by name: all of its own fields but
    `RUN_SET_FIELDS`. ``hf-msv train`` makes one flag of each (`hf_msv.training.cli.architecture_arguments`)."""
    from ..configuration_msv import MSVConfig

    own = MSVConfig.__annotations__
    return {f.name: f for f in dataclasses.fields(MSVConfig) if f.name in own and f.name not in RUN_SET_FIELDS}


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class MSVTrainingConfig:
    """Everything that defines a training run (saved as ``training_config.json`` next to the checkpoint).

    Fields left at `None` are filled in by the `recipe` from the data (see `resolve_plan`); any field set explicitly
    wins. Every field is also an ``hf-msv train`` flag (``--learning-rate``, ``--recipe paper``, ...), and so is
    every key `architecture` may hold (``--num-hidden-layers 2``: `hf_msv.training.cli.architecture_arguments`).

    The MSV's architecture is `MSVConfig`'s, declared there once: `architecture` holds the keyword arguments this
    run gives it (``MSVTrainingConfig(architecture={"num_hidden_layers": 2})``), `build_verifier` adds the rest.

    The flags' help (``hf-msv train --help``) says more about each field.

    Args:
        recipe: ``"auto"`` (step budget, width-scaled learning rates, best checkpoint by validation BCE, early
            stopping) or ``"paper"`` (the paper's literal numbers).
        kind: ``"msv"`` (MSV_N) or ``"probe"`` (the single-answer Probe baseline).
        num_sequences: N, sequences per training group (at most the samples collected per problem; the Probe: 1).
        mode: ``"terminal"`` (terminal answers only) or ``"streaming"`` (every elicited answer, causal masks).
        architecture: `MSVConfig` keyword arguments of the MSV (a dict or a JSON object); `None`: its defaults.
        gamma_skip: start at calibrated voting (an affine γ skip fitted on the training answers, head zeroed);
            default: on (auto recipe), off (paper recipe).
        vote_margin_se: standard errors by which a trained checkpoint's BCE must beat the step-0 vote (0: any gain).
        vote_folds: K of the cross-validation that decides whether and how long to train past the vote; 0: choose
            on validation; default: 4 with the γ skip.
        vote_pathway: start at the weighted vote of a single-chain head's scores (docs/msv_vote_pathway.md);
            default: on (auto recipe, unless ``gamma_skip=False``), off (paper).
        probe_hidden_size: MLP width of the Probe and of the vote pathway's single-chain head.
        groups_per_problem: `None`: partition each problem's S samples into ⌊S/N⌋ groups per pass; k: k independent
            random N-subsets.
        max_train_problems: train on the first k training problems only (validation is never truncated).
        checker: re-derive equivalence classes with this checker for training and validation; `None`: the
            collection's classes.
        checker_kwargs: the checker's keyword arguments (a dict or a JSON object).
        num_workers: DataLoader workers.
        learning_rate: MSV body learning rate; `None`: the recipe's.
        mask_learning_rate: learning rate of the mask-mixture weights w.
        embedding_learning_rate: learning rate of the sequence embeddings e⁽ⁿ⁾.
        gamma_learning_rate: learning rate of the γ MLP; `None`: the recipe's.
        probe_learning_rate: the Probe's learning rate.
        weight_decay, adam_beta1, adam_beta2, adam_epsilon: AdamW's settings.
        warmup_ratio: fraction of the steps with linear warmup.
        max_grad_norm: gradient clipping norm.
        batch_size: global groups per optimizer step; `None`: the recipe's.
        num_epochs: train for this many passes, validating after each; `None`: the recipe's (auto: a step budget).
        max_steps: optimizer-step budget (with `num_epochs`, a cap); `None`: the recipe's.
        eval_steps: validate every this many steps; `None`: the recipe's.
        early_stopping_patience: evaluations without validation improvement before stopping (0: never); `None`: the
            recipe's.
        seed: seed of model init, group draws and shuffling.
        mixed_precision: accelerate's ``"no"``, ``"bf16"`` or ``"fp16"``.
        eval_batch_size: groups per validation forward.
        stop_epsilon: tolerance ε of the λ saved with a streaming MSV (Learn-then-Test on the calibration problems).
        stop_delta: risk level δ of that λ.
        stop_calibration_fraction: share of the validation problems held out to choose λ (the head fits the rest).
        stop_calibration_dir: shards of other problems to choose λ on instead (the head then fits all validation).
        lambda_rule: ``"guarantee"`` (λ = ∞ when nothing is certified) or ``"target"`` (`LAMBDA_RULES`).
        stop_pruning: the loss a pruning rule is certified with jointly with λ (``"net"``, ``"paired"``) or
            ``"off"`` (`PRUNING_LOSSES`).
        stop_statistic: what the saved stop head fires on: ``"no-loss"`` (P(stopping loses nothing against full
            decoding)) or ``"correctness"`` (P(correct)); both output and report the answer of highest P(correct).
        log_every: steps between progress-bar loss updates.
        progress: show a progress bar (main process).

    Raises:
        UserError: an unknown recipe, kind or mode, a non-positive `num_sequences` or `batch_size`, `vote_folds` of
            1 or below 0, `stop_epsilon`, `stop_delta` or `stop_calibration_fraction` outside (0, 1), an unknown
            `stop_statistic`, `stop_pruning` or `lambda_rule`,
            `checker_kwargs` that is not an object, or `architecture` keys that are not architecture fields of
            `MSVConfig`.
    """

    recipe: str = field(
        default="auto",
        metadata=_help(
            "auto: budget in optimizer steps, width-scaled learning rates, best checkpoint by validation BCE, early "
            "stopping (trains at any data size). paper: the paper's literal numbers (lr 5e-5, batch 64 groups, 1 "
            "epoch "
            "terminal / 2 streaming), which assume a 1536-wide verifier and much more data."
        ),
    )
    # -- model -----------------------------------------------------------------------------------------------------
    kind: str = field(default="msv", metadata=_help("msv (MSV_N) or probe (the single-answer Probe baseline)."))
    num_sequences: int = field(
        default=16,
        metadata=_help(
            "N, sequences per training group (paper: 1, 4, 16, 64); must not exceed the samples collected per "
            "problem. "
            "The Probe always uses 1."
        ),
    )
    mode: str = field(
        default="streaming",
        metadata=_help("terminal (terminal answers only) or streaming (every elicited answer, causal masks)."),
    )
    architecture: dict | str | None = field(
        default=None,
        metadata=_help(
            "the MSV's architecture: MSVConfig keyword arguments, a JSON object (e.g. '{\"num_hidden_layers\": 2, "
            '"masks": ["full", "equivalence"]}\'). Each key is also a flag of its own (--num-hidden-layers 2, '
            "--masks full equivalence, ...: the MSV architecture flags below), which wins over the JSON. Unset: "
            "MSVConfig's defaults (one Multi-Mask block, the four masks, an MLP of 4·d), with the base LM's attention "
            "heads (recorded at collection). The width, N and mode come from the data and --num-sequences / --mode, "
            "the γ skip and the vote pathway from --gamma-skip / --vote-pathway."
        ),
    )
    gamma_skip: bool | None = field(
        default=None,
        metadata=_help(
            "start at calibrated voting: an affine skip w·γ + b on each answer's logit, initialised from a Platt fit "
            "of "
            "γ on the training answers, with the head zeroed, so the step-0 verifier is calibrated self-consistency "
            "and training learns a residual on it; step 0 is validated and kept unless a trained checkpoint beats it "
            "(see --vote-margin-se). Default: on (auto recipe), off (paper recipe)."
        ),
    )
    vote_margin_se: float = field(
        default=1.0,
        metadata=_help(
            "with the γ skip, the verifier leaves the step-0 vote only if its BCE is lower by more than this many "
            "standard errors (clustered by problem; the one-standard-error rule), pooled over the cross-validation "
            "folds (--vote-folds) or, with --vote-folds 0, on validation. 0: any improvement."
        ),
    )
    vote_folds: int | None = field(
        default=None,
        metadata=_help(
            "with the γ skip, decide whether and for how many steps to train past the vote by K-fold cross-validation "
            "over the training problems: K verifiers train in lockstep on K-1 folds each, their held-out BCE is "
            "pooled "
            "over every training problem, training stops when it stops improving, and the verifier leaves the vote "
            "only "
            "if the pooled gain beats --vote-margin-se standard errors; it then trains on all problems for the chosen "
            "steps, and validation stays a held-out check. Default: 4 with the γ skip (fewer if there are fewer "
            "training problems); 0: choose the checkpoint on validation instead."
        ),
    )
    vote_pathway: bool | None = field(
        default=None,
        metadata=_help(
            "start at the weighted vote of single-chain scores (Probe+WV) rather than the plain vote: a Probe-shaped "
            "single-chain head, trained on the training chains first, scores every answer; its weighted vote share "
            "enters "
            "the verifier beside γ, and the verifier starts as exactly that vote calibrated "
            "(docs/msv_vote_pathway.md). "
            "The vote cross-validation then decides whether to train past it. Default: on (auto recipe, unless "
            "--gamma-skip false), off (paper)."
        ),
    )
    probe_hidden_size: int = field(
        default=1024,
        metadata=_help("the Probe's MLP width (paper: 1024), and that of the vote pathway's single-chain head."),
    )
    # -- data ------------------------------------------------------------------------------------------------------
    groups_per_problem: int | None = field(
        default=None,
        metadata=_help(
            "groups per problem per pass: default partitions each problem's S samples into ⌊S/N⌋ random N-subsets "
            "(every sample once per pass, new subsets every pass); k draws k independent random N-subsets."
        ),
    )
    max_train_problems: int | None = field(
        default=None,
        metadata=_help(
            "train on the first k problems of the training shards (shard order); validation is never truncated."
        ),
    )
    checker: str | None = field(
        default=None,
        metadata=_help(
            "re-derive equivalence classes with this checker (symbolic, exact, jaccard, embedding, random) for "
            "training AND validation; labels stay the collection's. Default: the collection's classes."
        ),
    )
    checker_kwargs: dict | str | None = field(
        default=None, metadata=_help("keyword arguments of the checker, a JSON object (e.g. '{\"threshold\": 0.85}').")
    )
    num_workers: int = field(default=0, metadata=_help("DataLoader workers (reading, collate and γ run there)."))
    # -- optimisation ----------------------------------------------------------------------------------------------
    learning_rate: float | None = field(
        default=None,
        metadata=_help(
            "MSV body learning rate (auto: 3e-4·sqrt(128/d) terminal, 1e-4·sqrt(128/d) streaming; paper: 5e-5)."
        ),
    )
    mask_learning_rate: float = field(default=1e-1, metadata=_help("learning rate of the mask-mixture weights w."))
    embedding_learning_rate: float = field(
        default=1e-3, metadata=_help("learning rate of the sequence embeddings e⁽ⁿ⁾.")
    )
    gamma_learning_rate: float | None = field(
        default=None,
        metadata=_help(
            "learning rate of the γ MLP (input fan-in 1, so not width-scaled; auto: 1e-2; paper: the body's)."
        ),
    )
    probe_learning_rate: float = field(default=1e-3, metadata=_help("the Probe's learning rate (paper: 1e-3)."))
    weight_decay: float = field(default=0.0, metadata=_help("AdamW weight decay."))
    adam_beta1: float = field(default=0.9, metadata=_help("AdamW β1."))
    adam_beta2: float = field(default=0.999, metadata=_help("AdamW β2."))
    adam_epsilon: float = field(default=1e-8, metadata=_help("AdamW ε."))
    warmup_ratio: float = field(
        default=0.0,
        metadata=_help("fraction of the steps with linear warmup (constant learning rate afterwards; HF default 0)."),
    )
    max_grad_norm: float = field(default=1.0, metadata=_help("gradient clipping norm."))
    batch_size: int | None = field(
        default=None,
        metadata=_help("global groups per optimizer step (auto: 256 // N sequences' worth, 4..64 groups; paper: 64)."),
    )
    num_epochs: int | None = field(
        default=None,
        metadata=_help(
            "train for this many passes over the data, validating after each (paper recipe: 1 terminal / 2 "
            "streaming). Default (auto): a step budget, see --max-steps."
        ),
    )
    max_steps: int | None = field(
        default=None,
        metadata=_help(
            "optimizer-step budget (auto: 20 passes over the training sequences, clamped to 300..2000 steps); with "
            "--num-epochs, a cap."
        ),
    )
    eval_steps: int | None = field(
        default=None,
        metadata=_help("validate every this many steps (auto: budget / 20, 10..100; with --num-epochs: every epoch)."),
    )
    early_stopping_patience: int | None = field(
        default=None,
        metadata=_help(
            "stop when validation BCE has not improved for this many evaluations (auto: 5; paper: never; 0 = never)."
        ),
    )
    seed: int = field(default=0, metadata=_help("model init, group draws and shuffling."))
    mixed_precision: str = field(default="no", metadata=_help("accelerate's no / bf16 / fp16."))
    eval_batch_size: int = field(default=64, metadata=_help("groups per validation forward."))
    # -- early stopping (streaming MSV) ----------------------------------------------------------------------------
    stop_epsilon: float = field(
        default=EPSILON,
        metadata=_help(
            "early-stopping tolerance ε: the λ saved with a streaming MSV loses at most ε of full-decoding accuracy "
            "with probability >= 1 - δ (Learn-then-Test over the calibration problems, which the stop head was not "
            "fitted on); when they are too few to certify it, λ = ∞ is saved (the verifier decodes in full) and "
            "stdout, the log and the card say how many problems ε needs (--lambda-rule target saves the target λ)."
        ),
    )
    stop_calibration_fraction: float = field(
        default=CALIBRATION_FRACTION,
        metadata=_help(
            "share of the validation problems held out to choose λ on (Learn-then-Test); the stop head is fitted on "
            "the others (a seeded split by problem, recorded in training_log.json)."
        ),
    )
    stop_calibration_dir: str | None = field(
        default=None,
        metadata=_help(
            "shards of other problems (groups of N) to choose λ on; the stop head is then fitted on all of --val-dir."
        ),
    )
    lambda_rule: str = field(
        default="guarantee",
        metadata=_help(
            "the λ saved with a streaming MSV: guarantee (certified at --stop-epsilon / --stop-delta, else λ = ∞: "
            "full decoding) or target (the cheapest λ reaching 0.95 x full-decoding accuracy on the calibration "
            "problems, without a guarantee)."
        ),
    )
    stop_delta: float = field(default=DELTA, metadata=_help("early-stopping risk level δ (see --stop-epsilon)."))
    stop_statistic: str = field(
        default="no-loss",
        metadata=_help(
            "what the saved stop head fires on: no-loss (P(stopping loses nothing against full decoding): it also "
            "stops where the chains settle on an answer the verifier doubts) or correctness (P(this class is "
            "correct)). Both output the available answer of highest P(correct) and report that P."
        ),
    )
    stop_pruning: str = field(
        default="net",
        metadata=_help(
            "certify a per-chain pruning rule jointly with λ on the calibration problems (docs/pruning.md), stored "
            "as the verifier's default beside the stop when one is certified: net (the loss is the net accuracy "
            "drop against full decoding), paired (the answers full decoding gets right that are lost, the λ rule's "
            "loss) or off."
        ),
    )
    log_every: int = field(default=10, metadata=_help("steps between progress-bar loss updates."))
    progress: bool = field(default=True, metadata=_help("show a progress bar (main process)."))

    def __post_init__(self):
        if self.recipe not in RECIPES:
            raise UserError(f"recipe must be one of {RECIPES}, got {self.recipe!r}")
        if self.kind not in ("msv", "probe"):
            raise UserError(f"kind must be 'msv' or 'probe', got {self.kind!r}")
        if self.mode not in ("terminal", "streaming"):
            raise UserError(f"mode must be 'terminal' or 'streaming', got {self.mode!r}")
        if self.num_sequences < 1 or (self.batch_size is not None and self.batch_size < 1):
            raise UserError("num_sequences and batch_size must be positive")
        if self.vote_folds is not None and (self.vote_folds < 0 or self.vote_folds == 1):
            raise UserError(f"vote_folds must be 0 (off) or at least 2, got {self.vote_folds}")
        if not (0 < self.stop_epsilon < 1 and 0 < self.stop_delta < 1):
            raise UserError(
                f"stop_epsilon and stop_delta must lie in (0, 1), got {self.stop_epsilon}, {self.stop_delta}"
            )
        if not 0 < self.stop_calibration_fraction < 1:
            raise UserError(f"stop_calibration_fraction must lie in (0, 1), got {self.stop_calibration_fraction}")
        if self.lambda_rule not in LAMBDA_RULES:
            raise UserError(f"lambda_rule must be one of {LAMBDA_RULES}, got {self.lambda_rule!r}")
        if self.stop_pruning not in PRUNING_LOSSES:
            raise UserError(f"stop_pruning must be one of {PRUNING_LOSSES}, got {self.stop_pruning!r}")
        if self.stop_statistic not in STOP_STATISTICS:
            raise UserError(f"stop_statistic must be one of {STOP_STATISTICS}, got {self.stop_statistic!r}")
        if isinstance(self.checker_kwargs, str):  # from the command line: a JSON object
            self.checker_kwargs = json.loads(self.checker_kwargs) if self.checker_kwargs.strip() else {}
        if self.checker_kwargs is None:
            self.checker_kwargs = {}
        if not isinstance(self.checker_kwargs, dict):
            raise UserError(f"checker_kwargs must be a JSON object, got {self.checker_kwargs!r}")
        self.architecture = _architecture(self.architecture)

    @property
    def checker_options(self) -> dict:
        """`checker_kwargs` as `__post_init__` left them: a dict (the command line's JSON object parsed)."""
        assert isinstance(self.checker_kwargs, dict)
        return self.checker_kwargs

    @property
    def architecture_options(self) -> dict:
        """`architecture` as `__post_init__` left it: a dict of `MSVConfig` keyword arguments."""
        assert isinstance(self.architecture, dict)
        return self.architecture

    @property
    def epochs(self) -> int | None:
        """Passes over the data when training by epochs: `num_epochs`, else the paper's 1 (terminal) / 2
        (streaming) under ``recipe="paper"``; `None` when the auto recipe budgets steps."""
        if self.num_epochs is not None:
            return self.num_epochs
        return (1 if self.mode == "terminal" else 2) if self.recipe == "paper" else None

    @property
    def uses_gamma_skip(self) -> bool:
        """Whether an MSV has the γ skip (`gamma_skip`; unset: on under the auto recipe, off under the paper's). The
        one place that default is decided: the verifier's `MSVConfig.gamma_skip`, the vote pathway's default and
        `anchored` follow it. The Probe never has it."""
        if self.kind != "msv":
            return False
        return self.recipe == "auto" if self.gamma_skip is None else bool(self.gamma_skip)

    @property
    def anchored(self) -> bool:
        """Whether an MSV starts at a calibrated vote: the weighted vote of its single-chain head
        (`uses_vote_pathway`) or plain voting (`uses_gamma_skip`); the Probe never does."""
        return self.uses_vote_pathway or self.uses_gamma_skip

    @property
    def uses_vote_pathway(self) -> bool:
        """Whether an MSV has the vote pathway and starts at calibrated Probe+WV (`vote_pathway`; unset: under the
        auto recipe, with the γ skip)."""
        if self.kind != "msv":
            return False
        if self.vote_pathway is not None:
            return bool(self.vote_pathway)
        # Switching the γ skip off asks for an unanchored start: no vote to start from either.
        return self.recipe == "auto" and self.uses_gamma_skip

    def to_dict(self) -> dict:
        """The run's settings as ``training_config.json`` records them and reuse keys and resume states compare
        them: every field, with the architecture's keys beside the others rather than nested
        (`RECORDED_ARCHITECTURE` always: unset ones at MSVConfig's defaults, the attention heads at None, the base
        LM's)."""
        settings = dataclasses.asdict(self)
        declared = architecture_fields()
        recorded = {name: declared[name].default for name in RECORDED_ARCHITECTURE} | {"num_attention_heads": None}
        return {k: v for k, v in settings.items() if k != "architecture"} | recorded | settings["architecture"]

    def folds(self, num_problems: int) -> int:
        """Cross-validation folds that decide whether to leave the vote (`vote_folds`): 0 unless anchored; by
        default 4, at most one per training problem.

        Args:
            num_problems: the number of training problems.

        Returns:
            The number of folds (0: no cross-validation).
        """
        if not self.anchored:
            return 0
        folds = DEFAULT_VOTE_FOLDS if self.vote_folds is None else self.vote_folds
        return min(folds, num_problems) if folds >= 2 and num_problems >= 2 else 0

    @property
    def group_size(self) -> int:
        """Sequences per training group: N for MSV, 1 for the Probe (it scores answers one by one)."""
        return 1 if self.kind == "probe" else self.num_sequences


def _architecture(value) -> dict:
    """`MSVTrainingConfig.architecture` checked: a dict (or its JSON, as the command line gives it) of
    `architecture_fields` only."""
    if isinstance(value, str):  # from the command line: a JSON object
        value = json.loads(value) if value.strip() else {}
    if not isinstance(value, (dict, type(None))):
        raise UserError(f"architecture must be a JSON object of MSVConfig fields, got {value!r}")
    value = dict(value or {})
    allowed = architecture_fields()
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        set_by_run = [k for k in unknown if k in RUN_SET_FIELDS]
        raise UserError(
            f"architecture: {unknown} are not MSVConfig fields a training run takes"
            + (
                f" ({set_by_run}: set from the data or by the training fields of the same names, "
                "vote_hidden_size by probe_hidden_size)"
                if set_by_run
                else ""
            )
            + f"; the architecture fields are {sorted(allowed)}"
        )
    return value


@dataclass
class TrainingPlan:
    """The concrete numbers of a run (``training_log.json["plan"]``): what `resolve_plan` made of the config.

    Args:
        learning_rate: the body learning rate (the Probe's for a Probe).
        gamma_learning_rate: the γ MLP's learning rate (`None`: the body's).
        batch_size: global groups per optimizer step.
        steps_per_pass: optimizer steps of one pass over the training data.
        max_steps: the optimizer-step budget.
        eval_steps: steps between validations.
        early_stopping_patience: evaluations without improvement before stopping (0: never).
        by_epoch: whether the run trains by epochs (else by a step budget).
    """

    learning_rate: float
    gamma_learning_rate: float | None
    batch_size: int
    steps_per_pass: int
    max_steps: int
    eval_steps: int
    early_stopping_patience: int
    by_epoch: bool


def default_learning_rate(config: MSVTrainingConfig, hidden_size: int) -> float:
    """The body learning rate of the recipe at width `hidden_size` (the Probe's is `probe_learning_rate`)."""
    if config.kind == "probe":
        return config.probe_learning_rate
    if config.learning_rate is not None:
        return config.learning_rate
    if config.recipe == "paper":
        return 5e-5
    return REFERENCE_LR[config.mode] * math.sqrt(REFERENCE_WIDTH / hidden_size)


def resolve_batch_size(config: MSVTrainingConfig) -> int:
    """Global groups per optimizer step: `batch_size`, else 64 (paper) or ~256 sequences in 4..64 groups (auto)."""
    if config.batch_size is not None:
        return config.batch_size
    if config.recipe == "paper":
        return 64
    return min(64, max(4, SEQUENCES_PER_BATCH // config.group_size))


def resolve_plan(config: MSVTrainingConfig, hidden_size: int, steps_per_pass: int) -> TrainingPlan:
    """Fill in the recipe's numbers for data of width `hidden_size` whose one pass takes `steps_per_pass` optimizer
    steps (``len(DataLoader)`` at `resolve_batch_size`).

    Args:
        config: the run's config.
        hidden_size: the width d of the hidden states.
        steps_per_pass: optimizer steps of one pass over the training data.

    Returns:
        The `TrainingPlan`.
    """
    epochs = config.epochs
    if epochs is not None:
        budget = steps_per_pass * epochs
        if config.max_steps is not None:
            budget = min(budget, config.max_steps)
        every = config.eval_steps or steps_per_pass
    else:
        budget = config.max_steps or min(MAX_STEPS, max(MIN_STEPS, PASSES * steps_per_pass))
        every = config.eval_steps or min(100, max(10, budget // EVALUATIONS))
    patience = config.early_stopping_patience
    if patience is None:
        patience = 0 if (config.recipe == "paper" or epochs is not None) else 5
    gamma_lr = config.gamma_learning_rate
    if gamma_lr is None and config.recipe == "auto":
        gamma_lr = GAMMA_LR
    return TrainingPlan(
        learning_rate=default_learning_rate(config, hidden_size),
        gamma_learning_rate=gamma_lr,
        batch_size=resolve_batch_size(config),
        steps_per_pass=steps_per_pass,
        max_steps=max(1, budget),
        eval_steps=max(1, every),
        early_stopping_patience=patience,
        by_epoch=epochs is not None,
    )
