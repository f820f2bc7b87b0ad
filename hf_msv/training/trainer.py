"""Training verifiers on collected shards: MSV_N and the Probe baseline (`train_verifier`), with the vote
cross-validation (`cross_validate_vote`) and the guard's comparison on validation. See ``docs/training.md``.

    config = MSVTrainingConfig(num_sequences=16, mode="streaming")      # recipe="auto": trains at any data size
    result = train_verifier("data/train", "data/val", "verifiers/msv16", config)
    result.best_metrics["bce"], result.guard.passed, result.verifier

Runs unchanged under ``accelerate launch`` (the global batch is split over processes; validation is gathered).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from transformers import PreTrainedModel, get_constant_schedule_with_warmup

from ..data import VERIFIER_INPUTS, ShardDataset, collate_groups, collection_elicitation, subgroup_items
from ..errors import UserError
from ..hub import save_verifier  # one card builder for MSV and Probe checkpoints
from ..lambda_rule import CALIBRATION_FRACTION, DELTA, EPSILON, problems_needed
from ..metrics import bce_with_logits, fold_by_problem
from ..modeling_probe import ProbeConfig, ProbeVerifier
from ..utils import atomic_write_json
from .checkpoint import (
    STATE_FILE,
    Batches,
    discard_training_state,
    fingerprint,
    load_state,
    load_training_progress,
    rng_state,
    save_state,
    save_training_state,
    set_rng_state,
)
from .config import MSVTrainingConfig, TrainingPlan, resolve_batch_size, resolve_plan
from .guard import (
    GuardReport,
    ValidationPredictions,
    VoteDecision,
    bce_gain,
    build_guard_report,
    choose_vote_departure,
    linear_probe_scores,
    pooled_answer_states,
    training_vote_platt,
)
from .pruned_replay import PRUNE_CANDIDATES, MSVGroupScorer, PruningFit, fit_pruning, replay_groups_of
from .stopping_curve import EarlyStoppingFit, ProblemSplit, fit_early_stopping
from .vote_anchor import anchor_at_weighted_vote

if TYPE_CHECKING:
    from ..modeling_msv import MSVVerifier

__all__ = [
    "TrainingResult",
    "train_verifier",
    "evaluate_verifier",
    "validation_predictions",
    "build_verifier",
    "load_training_data",
    "cross_validate_vote",
    "resolve_trackers",
    "TRACKER_PACKAGES",
]

logger = logging.getLogger(__name__)


@dataclass
class TrainingResult:
    """Outcome of `train_verifier`.

    ``history`` has one entry per validation (entry 0 = before training); ``best_epoch`` is the index in it of the
    kept checkpoint (with per-epoch validation: its epoch; 0 = the step-0 verifier, kept only when it is anchored at
    calibrated voting (`MSVTrainingConfig.gamma_skip`), else nothing saved), ``best_step`` its optimizer step;
    ``guard`` the comparison with the baselines on validation; ``plan`` the concrete numbers the recipe chose (with
    ``vote_cv``, the length cross-validation chose: `cross_validate_vote`).

    Args:
        output_dir: where the checkpoint was saved.
        best_epoch: index in `history` of the kept checkpoint.
        best_metrics: its validation metrics.
        history: one metrics dict per validation.
        verifier: the best model, loaded.
        best_step: its optimizer step.
        guard: the `GuardReport`.
        plan: the `TrainingPlan`.
        vote_cv: the vote cross-validation's decision, if any.
    """

    output_dir: str
    best_epoch: int
    best_metrics: dict
    history: list[dict]
    verifier: PreTrainedModel | None = None
    best_step: int = 0
    guard: GuardReport | None = None
    plan: TrainingPlan | None = None
    vote_cv: VoteDecision | None = None


# ----------------------------------------------------------------------------------------------------------------
# Models and checkpoints
# ----------------------------------------------------------------------------------------------------------------


def _heads_for(hidden_size: int, wanted: int | None) -> int:
    """The base LM's head count if it divides the width, else the largest divisor below it."""
    wanted = wanted or 12
    for heads in range(min(wanted, hidden_size), 0, -1):
        if hidden_size % heads == 0:
            return heads
    return 1


def build_verifier(config: MSVTrainingConfig, hidden_size: int, info: dict) -> PreTrainedModel:
    """A freshly initialised MSV or Probe for hidden states of width `hidden_size` collected with `info` (the shard
    info: its LM and elicitation settings go into the verifier's config). An MSV's `MSVConfig` is
    ``config.architecture`` plus what the run sets (`RUN_SET_FIELDS`); its attention heads, unless the architecture
    sets them, are the base LM's (the largest divisor of the width below them).

    Args:
        config: the run's config.
        hidden_size: the width d of the hidden states.
        info: the shard info of the training data.

    Returns:
        The new `MSVVerifier` or `ProbeVerifier`.
    """
    elicitation = collection_elicitation(info).replace(mode=config.mode)
    if config.mode == "terminal":  # a terminal verifier reads the answers at the end only
        elicitation = replace(elicitation, delimiters=(), every_k_tokens=None)
    base_model = info.get("lm_name_or_path") or None
    if config.kind == "probe":
        return ProbeVerifier(
            ProbeConfig(
                hidden_size=hidden_size,
                intermediate_size=config.probe_hidden_size,
                mode=config.mode,
                base_model_name_or_path=base_model,
                elicitation=elicitation,
            )
        )
    from ..configuration_msv import MSVConfig
    from ..modeling_msv import MSVVerifier

    architecture = dict(config.architecture_options)
    heads = architecture.pop("num_attention_heads", None) or info.get("lm_num_attention_heads")
    msv_config = MSVConfig(
        **architecture,
        hidden_size=hidden_size,
        num_attention_heads=_heads_for(hidden_size, heads),
        mode=config.mode,
        num_sequences=config.num_sequences,
        gamma_skip=config.uses_gamma_skip,
        vote_pathway=config.uses_vote_pathway,
        vote_hidden_size=config.probe_hidden_size,
        base_model_name_or_path=base_model,
        elicitation=elicitation,
    )
    return MSVVerifier(msv_config)


def _parameter_groups(
    model, config: MSVTrainingConfig, learning_rate: float | None = None, gamma_learning_rate: float | None = None
) -> list[dict]:
    """Optimizer parameter groups; `learning_rate` is the body's (the Probe's) rate, default the config's.

    With `gamma_learning_rate`, the γ MLP (``gamma_mlp.*``, fan-in 1) gets its own group: at a width-scaled body
    rate its input layer barely moves, so the verifier fits the (memorisable) hidden states long before it uses the
    vote share it is given.
    """
    if config.kind == "probe":
        return [{"params": list(model.parameters()), "lr": learning_rate or config.probe_learning_rate}]
    # The vote pathway (single-chain head and its skip) trains at the Probe's rate: at the body's width-scaled rate
    # the head would barely move.
    groups = model.parameter_groups(
        learning_rate or config.learning_rate or 5e-5,
        config.mask_learning_rate,
        config.embedding_learning_rate,
        vote_lr=config.probe_learning_rate,
    )
    if gamma_learning_rate is None:
        return groups
    gamma = [p for name, p in model.named_parameters() if name.startswith("gamma_mlp.")]
    ids = {id(p) for p in gamma}
    groups = [dict(g, params=[p for p in g["params"] if id(p) not in ids]) for g in groups]
    return groups + [{"params": gamma, "lr": gamma_learning_rate}]


# ----------------------------------------------------------------------------------------------------------------
# Data, with every check that can fail made before training starts
# ----------------------------------------------------------------------------------------------------------------


def _provenance(dataset: ShardDataset) -> set[tuple]:
    """{(width, LM)} over every shard of `dataset` (LM = ``lm_name_or_path`` recorded at collection)."""
    return {(index.hidden_shape[1], index.info.get("lm_name_or_path")) for index in dataset.shards}


def load_training_data(train_dir, val_dir, config: MSVTrainingConfig) -> tuple[ShardDataset, ShardDataset]:
    """The training and validation `ShardDataset` of a run, checked: one LM and one width across every shard of
    both, a known checker, N within the samples collected, and validation answers to measure.

    Args:
        train_dir: the training shards (a directory or files).
        val_dir: the validation shards.
        config: the run's config.

    Returns:
        ``(train_set, val_set)``.

    Raises:
        ValueError: with the reason, before any training starts.
        FileNotFoundError: missing shards.
    """
    if config.checker is not None:
        from ..equivalence import get_checker

        get_checker(config.checker, **config.checker_options)  # unknown names / bad kwargs fail here
    kwargs: dict[str, Any] = dict(
        num_sequences=config.group_size,
        mode=config.mode,
        seed=config.seed,
        checker=config.checker,
        checker_kwargs=config.checker_kwargs,
    )
    sets = {}
    extra: dict[str, Any]
    for name, flag, paths, extra in (
        (
            "training",
            "--train-dir",
            train_dir,
            dict(groups_per_problem=config.groups_per_problem, max_problems=config.max_train_problems),
        ),
        ("validation", "--val-dir", val_dir, {}),
    ):
        try:
            # Validation groups: a fixed partition (epoch 0 of the seed), the same for every evaluation.
            sets[name] = ShardDataset(paths, **kwargs, **extra)
        except FileNotFoundError as error:
            raise FileNotFoundError(
                f"{name} data ({flag} {paths}): {error}; give a directory of shards written by "
                "`hf-msv collect --output-dir DIR`"
            ) from error
        except ValueError as error:
            raise UserError(f"{name} data ({flag} {paths}): {error}") from error
    train_set, val_set = sets["training"], sets["validation"]
    sources = _provenance(train_set) | _provenance(val_set)
    if len({width for width, _ in sources}) > 1 or len({lm for _, lm in sources if lm}) > 1:
        raise UserError(
            "the training and validation shards come from different LMs or widths: "
            + ", ".join(f"{lm or 'unknown LM'} (d={width})" for width, lm in sorted(sources, key=str))
            + "; a verifier reads the hidden states of one LM — collect every split with the same LM."
        )
    answers = val_set.stats()["terminal_answers" if config.mode == "terminal" else "answers"]
    if len(val_set) == 0 or answers == 0:
        raise UserError(f"the validation data ({val_dir}) has no {config.mode} answers to validate on")
    return train_set, val_set


def _describe_data(train: ShardDataset, val: ShardDataset, config: MSVTrainingConfig) -> str:
    info, s, v = train.info, train.stats(), val.stats()
    sampling = (
        f"{info.get('num_samples', '?')} samples per problem at temperature {info.get('temperature', '?')}, "
        f"up to {info.get('max_new_tokens', '?')} new tokens"
    )
    e = collection_elicitation(info)
    elicit = (
        f"answers elicited with `{e.prompt}` (≤ {e.max_answer_tokens} tokens) at delimiters "
        f"{list(e.delimiters)}"
        + (f", every {e.every_k_tokens} tokens" if e.every_k_tokens else "")
        + " and at the end"
    )
    classes = (
        f"re-derived with the `{config.checker}` checker"
        if config.checker
        else f"from the `{info.get('checker', '?')}` checker"
    )
    return (
        f"Hidden states of `{info.get('lm_name_or_path') or 'unknown LM'}` ({sampling}; {elicit}). "
        f"Training: {s['problems']} problems, {s['sequences']} sequences, {s['answers']} answers "
        f"({s['terminal_answers']} terminal, terminal accuracy {s['terminal_accuracy']:.1%}). "
        f"Validation: {v['problems']} problems, {v['answers']} answers. {config.mode.capitalize()} answers in "
        f"groups of {config.group_size} sequences; labels from the `{info.get('checker', '?')}` checker, "
        f"equivalence classes {classes}."
    )


# ----------------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------------


def _inputs(batch: dict) -> dict:
    return {k: batch[k] for k in VERIFIER_INPUTS}


@torch.no_grad()
def validation_predictions(
    model, dataset: ShardDataset, mode: str, batch_size: int = 64, accelerator=None, pooled: bool = False
) -> ValidationPredictions:
    """Logits, labels, γ and group structure of every answer of every group of `dataset` (split by index over
    processes, gathered), the single-chain head's logits of a vote-pathway MSV, and with `pooled` the mean-pooled
    answer states (for the guard's linear probe)."""
    from accelerate.utils import gather_object

    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    was_training = model.training
    model.eval()
    keys = (
        "logits",
        "labels",
        "gamma",
        "pooled",
        "problems",
        "single_logits",
        "group",
        "end",
        "klass",
        "sequence",
        "step",
        "terminal",
    )
    parts = {key: [] for key in keys}
    indices = list(range(rank, len(dataset), world))
    # An MSV_M reads groups of N > M chains in subgroups of M, as generation does (`subgroup_items`); the structure
    # keeps the N-chain group and each chain's number in it.
    m = None if model.config.model_type == "msv_probe" else int(model.config.num_sequences)
    for i in range(0, len(indices), batch_size):
        owner, offset, items = [], [], []
        for j in indices[i : i + batch_size]:
            for part, item in subgroup_items(dataset[j], m) if m else [(0, dataset[j])]:
                owner.append(j)
                offset.append(part * (m or 0))
                items.append(item)
        batch = collate_groups(items, mode)
        if not len(batch["labels"]):
            continue
        out = model(**_inputs(batch) | {"labels": None})
        group = batch["answer_group"].numpy()
        parts["logits"].append(out.logits.float().cpu().numpy())
        parts["labels"].append(batch["labels"].float().numpy())
        parts["gamma"].append(batch["gamma"].float().numpy())
        parts["problems"].append(np.asarray(batch["problem_id"], dtype=object)[group])
        # Groups numbered globally (dataset item index) so that groups of different batches never merge.
        parts["group"].append(np.asarray(owner)[group])
        parts["end"].append(batch["answer_end"].numpy())
        parts["klass"].append(batch["answer_class"].numpy())
        parts["sequence"].append(batch["answer_sequence"].numpy() + np.asarray(offset)[group])
        parts["step"].append(batch["answer_step"].numpy())
        parts["terminal"].append(batch["answer_terminal"].numpy())
        if getattr(out, "vote_logits", None) is not None:
            parts["single_logits"].append(out.vote_logits.float().cpu().numpy())
        if pooled:
            parts["pooled"].append(
                pooled_answer_states(batch["hidden_states"], batch["token_answer"], len(batch["labels"]))
            )
    model.train(was_training)
    local = {k: np.concatenate(v) if v else None for k, v in parts.items()}
    gathered = gather_object([local]) if world > 1 else [local]

    def cat(key, default=None):
        found = [value for g in gathered if (value := g[key]) is not None]
        return np.concatenate(found) if found else default

    empty = np.zeros(0)
    return ValidationPredictions(
        logits=cat("logits", empty).astype(np.float64),
        labels=cat("labels", empty).astype(np.float64),
        gamma=cat("gamma", empty).astype(np.float64),
        pooled=cat("pooled") if pooled else None,
        problems=cat("problems", empty),
        single_logits=cat("single_logits"),
        structure=(
            {k: cat(k) for k in ("group", "end", "klass", "sequence", "step", "terminal")}
            if cat("group") is not None
            else None
        ),
    )


def fit_stopping_rule(
    verifier,
    val_dir,
    epsilon: float = EPSILON,
    delta: float = DELTA,
    batch_size: int = 64,
    statistic: str = "no-loss",
    calibration_dir=None,
    calibration_fraction: float = CALIBRATION_FRACTION,
    lambda_rule: str = "guarantee",
    num_chains: int | None = None,
):
    """Fit a trained streaming MSV's stopping rule on validation shards (groups of N chains) and store it in
    ``verifier.config.early_stopping`` (what ``hf-msv train`` does after training; save the verifier to keep it):
    the stop head on one part of the problems, λ on another (`fit_early_stopping`).

    Args:
        verifier: a trained streaming `MSVVerifier`; its config is updated in place.
        val_dir: the validation shards.
        epsilon: the guarantee's tolerance ε.
        delta: the guarantee's risk δ.
        batch_size: groups per validation forward.
        statistic: what the head fires on (`hf_msv.stop_rules.STOP_STATISTICS`).
        calibration_dir: shards of other problems to choose λ on (the head then uses all of `val_dir`); `None`:
            `calibration_fraction` of `val_dir`'s problems.
        calibration_fraction: the share of `val_dir`'s problems held out for λ.
        lambda_rule: ``"guarantee"`` (λ = ∞ when nothing is certified) or ``"target"``.
        num_chains: N, the chains a run samples (default: the verifier's ``num_sequences`` M); an MSV_M reads N > M
            chains in subgroups of M, as generation does, and the stop head is fitted on N-chain snapshots.

    Returns:
        The `stopping_curve.EarlyStoppingFit`.

    Raises:
        ValueError: a terminal verifier (its answers all arrive at the end: nothing to stop early).
    """
    if verifier.config.mode != "streaming":
        raise UserError("early stopping needs a streaming verifier; this one was trained on terminal answers")
    n = num_chains or verifier.config.num_sequences

    def predict(directory):
        return validation_predictions(
            verifier, ShardDataset(directory, num_sequences=n, mode="streaming"), "streaming", batch_size
        )

    predictions = predict(val_dir)
    fit = fit_early_stopping(
        predictions,
        n,
        epsilon,
        delta,
        statistic=statistic,
        lambda_rule=lambda_rule,
        split=None if calibration_dir else ProblemSplit.of(predictions.problems, calibration_fraction),
        calibration=predict(calibration_dir) if calibration_dir else None,
    )
    verifier.config.early_stopping = fit.config_entry()
    return fit


def prediction_metrics(predictions: ValidationPredictions) -> dict:
    """``bce`` (mean BCE over answers, the training loss), ``auroc``, ``brier``, ``ece``, ``answers``, ``accuracy``."""
    import warnings

    from ..metrics import auroc, brier, ece

    z, y = predictions.logits, predictions.labels
    if not len(y):
        return {"bce": math.nan, "answers": 0}
    bce = float(np.mean(bce_with_logits(z, y)))
    p = 1.0 / (1.0 + np.exp(-z))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metrics = {"bce": bce, "auroc": auroc(p, y), "brier": brier(p, y), "ece": ece(p, y)}
    return metrics | {"answers": len(y), "accuracy": float(y.mean())}


def evaluate_verifier(model, dataset: ShardDataset, mode: str, batch_size: int = 64, accelerator=None) -> dict:
    """Validation metrics of `model` on every group of `dataset` (see `prediction_metrics`).

    Args:
        model: an `MSVVerifier` or `ProbeVerifier`.
        dataset: the validation `ShardDataset`.
        mode: ``"streaming"`` or ``"terminal"``.
        batch_size: groups per forward.
        accelerator: an `accelerate.Accelerator` to spread the groups over processes; `None`: this process.

    Returns:
        The metrics dict of `prediction_metrics`.
    """
    return prediction_metrics(validation_predictions(model, dataset, mode, batch_size, accelerator))


# ----------------------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------------------


def _optimizer_step(accelerator, model, optimizer, scheduler, batch: dict, max_grad_norm: float) -> torch.Tensor:
    """One optimizer step on `batch` (backward, clipping, step, schedule); returns the detached loss."""
    out = model(**_inputs(batch))
    accelerator.backward(out.loss)
    if max_grad_norm:
        accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return out.loss.detach().float()


def _start(config: MSVTrainingConfig, plan: TrainingPlan, train_set: ShardDataset):
    """(model, optimizer, anchor) of a fresh run on `train_set`. An anchored MSV starts at a vote calibrated on
    `train_set` alone, so step 0 *is* that vote: with the vote pathway, the weighted vote of its single-chain head
    trained on the training chains (calibrated Probe+WV; `anchor` is that fit, `anchor_at_weighted_vote`); without
    it, self-consistency (Platt on γ; `anchor` is None)."""
    model = build_verifier(config, train_set.hidden_size, train_set.info)
    anchor = None
    if config.uses_vote_pathway:
        anchor = anchor_at_weighted_vote(model, train_set, config.mode, config.probe_learning_rate, config.seed)
    elif config.anchored:
        # anchoring applies to MSV_N only (MSVTrainingConfig.anchored)
        cast("MSVVerifier", model).anchor_to_vote(*training_vote_platt(train_set, config.mode, config.seed))
    optimizer = torch.optim.AdamW(
        _parameter_groups(model, config, plan.learning_rate, plan.gamma_learning_rate),
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_epsilon,
        weight_decay=config.weight_decay,
    )
    return model, optimizer, anchor


def cross_validate_vote(
    config: MSVTrainingConfig,
    plan: TrainingPlan,
    train_set: ShardDataset,
    accelerator,
    folds: int,
    state_path: Path | None = None,
) -> VoteDecision:
    """Whether, and for how many optimizer steps, an anchored verifier should train past the vote it starts from,
    decided on the training problems alone (`MSVTrainingConfig.vote_folds`).

    The problems are dealt into `folds` folds (`fold_by_problem`); one verifier per fold trains on the other folds,
    all in lockstep with the run's plan (learning rates, batch, budget, `eval_steps`), each starting at the vote
    calibrated on its own training folds. At every evaluation their held-out predictions are pooled, so every
    training problem is scored out of sample once, and compared with the pooled step-0 votes
    (`guard.choose_vote_departure`). The folds stop together when the pooled BCE has not improved for the plan's
    patience. Validation is not used: it stays a held-out check of the final verifier.

    With a `state_path`, the state after each pooled evaluation, then the decision, is saved there, and a state
    found there is resumed (`checkpoint`): the same decision as without the interruption.
    Under several processes every process runs the folds on its own (same seeds: same decision).
    """
    expected = fingerprint(config, plan, folds, train_set)
    saved = load_state(state_path, expected) if state_path is not None else None
    if saved is not None and "decision" in saved:
        logger.info("vote cross-validation resumed from %s: already decided", state_path)
        return VoteDecision(**saved["decision"])
    runs = _fold_runs(config, plan, train_set, folds)

    def pooled() -> ValidationPredictions:
        parts = [
            validation_predictions(model, held_out, config.mode, config.eval_batch_size)
            for model, *_, held_out in runs
        ]

        def cat(key: str) -> np.ndarray:
            return np.concatenate([getattr(p, key) for p in parts])

        return ValidationPredictions(
            logits=cat("logits"), labels=cat("labels"), gamma=cat("gamma"), problems=cat("problems")
        )

    from tqdm.auto import tqdm

    if saved is None:
        curve, steps, step, stale, lowest = [pooled()], [0], 0, 0, math.inf
    else:
        curve, steps, step, stale, lowest = _restore(saved, runs)
        logger.info("vote cross-validation resumed from %s at step %d", state_path, step)
    bar = tqdm(
        total=plan.max_steps,
        initial=step,
        unit="step",
        desc=f"vote cross-validation ({folds} folds)",
        dynamic_ncols=True,
        disable=not (config.progress and accelerator.is_local_main_process),
    )
    while step < plan.max_steps and not (plan.early_stopping_patience and stale >= plan.early_stopping_patience):
        chunk = min(plan.eval_steps, plan.max_steps - step)
        for model, optimizer, scheduler, batches, _ in runs:
            model.train()
            for _ in range(chunk):
                _optimizer_step(accelerator, model, optimizer, scheduler, next(batches), config.max_grad_norm)
        step += chunk
        curve.append(pooled())
        steps.append(step)
        bce = float(np.mean(bce_with_logits(curve[-1].logits, curve[-1].labels)))
        lowest, stale = (bce, 0) if bce < lowest else (lowest, stale + 1)
        if state_path is not None and accelerator.is_main_process:
            progress = {"steps": steps, "step": step, "stale": stale, "lowest": lowest}
            _save_progress(state_path, expected, curve, progress, runs)
        bar.update(chunk)
        bar.set_postfix(pooled_bce=f"{bce:.4f}", refresh=False)
    bar.close()
    decision = choose_vote_departure(steps, curve, config.vote_margin_se, folds)
    if state_path is not None and accelerator.is_main_process:
        save_state(state_path, {"fingerprint": expected, "decision": decision.to_dict()})
    logger.info(
        "vote cross-validation over %d folds: %s (best pooled gain %.4f ± %.4f BCE)",
        folds,
        f"train {decision.step} steps past the vote" if decision.step else "keep the vote",
        decision.gain,
        decision.se,
    )
    return decision


def _fold_runs(config: MSVTrainingConfig, plan: TrainingPlan, train_set: ShardDataset, folds: int) -> list:
    """Per fold: (model, optimizer, scheduler, batches) training on the other folds, and the fold's held-out set."""
    fold = fold_by_problem(np.arange(train_set.num_problems), folds)
    batch_size = resolve_batch_size(config)
    warmup = math.ceil(config.warmup_ratio * plan.max_steps)
    runs = []
    for k in range(folds):
        fit, held_out = (train_set.subset(np.flatnonzero(fold != k)), train_set.subset(np.flatnonzero(fold == k)))
        model, optimizer, _ = _start(config, plan, fit)
        scheduler = get_constant_schedule_with_warmup(optimizer, warmup)
        batches = Batches(fit, batch_size, config.mode, config.seed, config.num_workers)
        runs.append((model, optimizer, scheduler, batches, held_out))
    return runs


def _save_progress(state_path: Path, expected: dict, curve: list, progress: dict, runs: list) -> None:
    """Save the cross-validation after a pooled evaluation (`_restore` reads it back)."""
    # Only the logits change between evaluations (same held-out answers in the same order each time).
    save_state(
        state_path,
        {
            "fingerprint": expected,
            "curve": [c.logits for c in curve],
            "answers": {k: getattr(curve[0], k) for k in ("labels", "gamma", "problems")},
            **progress,
            "rng": rng_state(),
            "folds": [
                {
                    "model": m.state_dict(),
                    "optimizer": o.state_dict(),
                    "scheduler": s.state_dict(),
                    "batches": b.state_dict(),
                }
                for m, o, s, b, _ in runs
            ],
        },
    )


def _restore(saved: dict, runs: list) -> tuple:
    """Load a saved cross-validation state into freshly built `runs`; its curve, steps, step, stale, lowest."""
    for (model, optimizer, scheduler, batches, _), fold in zip(runs, saved["folds"]):
        model.load_state_dict(fold["model"])
        optimizer.load_state_dict(fold["optimizer"])
        scheduler.load_state_dict(fold["scheduler"])
        batches.load_state_dict(fold["batches"])
    set_rng_state(saved["rng"])
    curve = [ValidationPredictions(logits=logits, **saved["answers"]) for logits in saved["curve"]]
    return curve, saved["steps"], saved["step"], saved["stale"], saved["lowest"]


class _TrainingRun:
    """State of one training run: the step loop, validation, checkpointing and early stopping.

    With a `decision` (cross-validation chose the length, `cross_validate_vote`), the run trains exactly
    ``plan.max_steps`` steps and keeps its last checkpoint; validation is recorded but chooses nothing.
    """

    def __init__(
        self,
        config: MSVTrainingConfig,
        plan: TrainingPlan,
        accelerator,
        training: tuple,
        train_set: ShardDataset,
        val_set: ShardDataset,
        output_dir: Path,
        decision: VoteDecision | None = None,
        vote_anchor: dict | None = None,
    ):
        """`training`: ``(model, optimizer, scheduler, loader)``, model, optimizer and loader prepared by
        `accelerator`; `vote_anchor`: how a vote-pathway verifier was anchored (`HeadFit.to_dict`)."""
        self.config, self.accelerator, self.plan, self.decision = config, accelerator, plan, decision
        self.model, self.optimizer, self.scheduler, self.loader = training
        self.train_set, self.val_set = train_set, val_set
        self.output_dir, self.training_data = output_dir, _describe_data(train_set, val_set, config)
        self.history: list[dict] = []
        self.best_bce, self.best_epoch, self.best_step, self.best_metrics = math.inf, 0, 0, {}
        self.step, self.stale, self.stopped_early, self.saved = 0, 0, False, False
        self.lowest_bce = math.inf  # over every evaluation, for early stopping
        self.vote_predictions: ValidationPredictions | None = None  # step 0 of an anchored run
        self.best_vote_gain: dict | None = None  # the best trained gain over the vote that was not significant
        self.losses, self.groups, self.start = [], 0, time.perf_counter()
        self.vote_anchor = vote_anchor
        # Where the loader is: the pass, the batches taken in it, and the loader generator's state when it began
        # (the pass's order follows from it), so that a resumed run replays the rest of the pass.
        self.passes, self.taken, self.pass_start = 0, 0, None
        self.fingerprint: dict | None = None  # set by train_verifier: the training state is saved with it
        self.reporting = False  # trackers (``report_to``) receive the loss of every step and the validations

    # Everything of the loop a resumed run needs besides what `Accelerator.save_state` saves.
    _PROGRESS = (
        "history",
        "best_bce",
        "best_epoch",
        "best_step",
        "best_metrics",
        "step",
        "stale",
        "stopped_early",
        "saved",
        "lowest_bce",
        "vote_predictions",
        "best_vote_gain",
        "passes",
        "taken",
        "pass_start",
    )

    def state_dict(self) -> dict:
        return {name: getattr(self, name) for name in self._PROGRESS}

    def load_state_dict(self, state: dict) -> None:
        for name in self._PROGRESS:
            setattr(self, name, state[name])

    def save_training_state(self) -> None:
        """Save the training state (`checkpoint.save_training_state`) after a validation that training continues
        from: the losses and group counts of the interval are reset there, so the loop's counters are all there is."""
        save_training_state(self.accelerator, self.output_dir, {"fingerprint": self.fingerprint, **self.state_dict()})

    def resume(self, directory: Path, progress: dict) -> None:
        """Continue from the training state saved in `directory` (`checkpoint.load_training_progress`)."""
        self.accelerator.load_state(str(directory))
        self.load_state_dict(progress)
        logger.info("training resumed from %s at step %d", directory, self.step)

    def _beats_vote(self, predictions: ValidationPredictions, entry: dict) -> bool:
        """Whether a trained checkpoint may replace the step-0 verifier of an anchored run (calibrated voting): its
        validation BCE must be lower by more than `vote_margin_se` standard errors (clustered by problem), the
        one-standard-error rule. Small validation sets cannot tell a residual that helps from one that fits noise,
        and keeping the simpler model (the vote) in that case is what keeps the verifier at or above the vote.
        Only with ``vote_folds=0``: by default cross-validation decided before the run (`cross_validate_vote`)."""
        if not self.config.anchored or self.decision is not None:
            return True
        if self.step == 0:
            self.vote_predictions = predictions
            return True
        assert self.vote_predictions is not None  # set at step 0
        gain, se = bce_gain(self.vote_predictions, predictions)
        entry |= {"val_bce_gain_over_vote": gain, "val_bce_gain_se": se}
        margin = self.config.vote_margin_se
        significant = gain > margin * se
        if not significant and (self.best_vote_gain is None or gain > self.best_vote_gain["gain"]):
            self.best_vote_gain = {"gain": gain, "se": se, "margin_se": margin, "step": self.step}
        return significant

    def validate(self) -> None:
        """Validate, keep the checkpoint if validation BCE improved (an anchored run: and beats the vote it started
        from, see `_beats_vote`), count evaluations without improvement."""
        acc, config = self.accelerator, self.config
        predictions = validation_predictions(
            acc.unwrap_model(self.model), self.val_set, config.mode, config.eval_batch_size, acc
        )
        metrics = prediction_metrics(predictions)
        index = len(self.history)
        entry = {
            "epoch": index if self.plan.by_epoch else round(self.step / self.plan.steps_per_pass, 3),
            "step": self.step,
            **{f"val_{k}": v for k, v in metrics.items()},
        }
        if self.step:
            seconds = time.perf_counter() - self.start
            loss = acc.reduce(torch.stack(self.losses).mean().to(acc.device), "mean").item()
            groups = int(acc.reduce(torch.tensor(self.groups, device=acc.device), "sum").item())
            entry |= {
                "train_loss": loss,
                "train_groups": groups,
                "train_seconds": seconds,
                "train_groups_per_s": groups / seconds,
            }
        beats_vote = self._beats_vote(predictions, entry)
        self.history.append(entry)
        if self.reporting:
            acc.log({f"eval/{k}": v for k, v in metrics.items()}, step=self.step)
        # Patience counts evaluations without a lower validation BCE, whether or not it was kept.
        if self.step and metrics["bce"] < self.lowest_bce:
            self.lowest_bce, self.stale = metrics["bce"], 0
        elif self.step:
            self.stale += 1
        if self.decision is not None:  # cross-validation chose the length: keep the last checkpoint, whatever its BCE
            keep = self.step == self.plan.max_steps
        else:
            # Step 0 is a candidate only for an anchored verifier (it is calibrated voting, a sound fallback); an
            # unanchored one is a random initialisation there.
            candidate = bool(self.step) or self.config.anchored
            keep = candidate and metrics["bce"] < self.best_bce and beats_vote
        if keep:
            self.best_bce, self.best_epoch, self.best_step = metrics["bce"], index, self.step
            self.best_metrics, self.saved = metrics, True
            if acc.is_main_process:
                self.write_log()  # first: the card is built from the log's kept checkpoint (hf_msv.hub.read_evidence)
                save_verifier(acc.unwrap_model(self.model), self.output_dir)
        self.write_log()
        acc.wait_for_everyone()
        self.losses, self.groups, self.start = [], 0, time.perf_counter()

    def write_log(self, guard: GuardReport | None = None, stopping: EarlyStoppingFit | None = None) -> None:
        """Write ``training_log.json`` (main process; the one writer of it): the kept checkpoint, the steps so far,
        the plan, how the run started (`vote_cv`, `vote_anchor`), the validation history and the data; after
        training also the guard's comparison and the streaming MSV's stopping rule (`_guard`)."""
        if not self.accelerator.is_main_process:
            return
        log = {
            "best_epoch": self.best_epoch,
            "best_step": self.best_step,
            "steps": self.step,
            "stopped_early": self.stopped_early,
            "plan": asdict(self.plan),
            "vote_cv": self.decision and self.decision.to_dict(),
            "vote_anchor": self.vote_anchor,
            "history": self.history,
            "training_data": self.training_data,
        }
        if guard is not None:
            log |= {"guard": guard.to_dict(), "early_stopping": stopping and stopping.to_dict()}
        atomic_write_json(self.output_dir / "training_log.json", log)

    def train_step(self, batch) -> None:
        acc = self.accelerator
        loss = _optimizer_step(acc, self.model, self.optimizer, self.scheduler, batch, self.config.max_grad_norm)
        self.losses.append(loss)
        self.groups += len(batch["problem_id"])
        self.step += 1
        self.taken += 1
        if self.reporting:  # every process: the loss is averaged over them
            mean = acc.reduce(loss.to(acc.device), "mean").item()
            acc.log({"train/loss": mean, "train/learning_rate": self.scheduler.get_last_lr()[0]}, step=self.step)

    def pass_loader(self):
        """The loader of the pass `passes`: the prepared one, or in the pass a resumed run stopped in, one that starts
        from the loader generator's state at the start of that pass and skips the batches already taken
        (`Accelerator.skip_first_batches`: their samples are not read)."""
        self.train_set.set_epoch(self.passes)  # every pass draws new random N-subsets (they depend on seed and pass)
        loader = self.loader
        if self.taken:
            self.loader.generator.set_state(self.pass_start)
            loader = self.accelerator.skip_first_batches(self.loader, self.taken)
        else:
            self.pass_start = self.loader.generator.get_state()
        loader.set_epoch(self.passes)
        return loader

    def run(self) -> None:
        from tqdm.auto import tqdm

        plan, config = self.plan, self.config
        bar = tqdm(
            total=plan.max_steps,
            initial=self.step,  # a resumed run
            unit="step",
            desc=f"train {config.kind}",
            dynamic_ncols=True,
            disable=not (config.progress and self.accelerator.is_local_main_process),
        )
        if not self.history:  # else resumed after a validation
            self.validate()
        self.model.train()
        while self.step < plan.max_steps and not self.stopped_early:
            for batch in self.pass_loader():
                self.train_step(batch)
                bar.update(1)
                if self.step % config.log_every == 0:
                    bar.set_postfix(
                        loss=f"{torch.stack(self.losses[-config.log_every :]).mean().item():.4f}",
                        best=f"{self.best_bce:.4f}",
                        refresh=False,
                    )
                if self.step % plan.eval_steps == 0 or self.step == plan.max_steps:
                    self.validate()
                    self.model.train()
                    patience = plan.early_stopping_patience
                    self.stopped_early = bool(patience) and self.stale >= patience
                    if self.step < plan.max_steps and not self.stopped_early:
                        self.save_training_state()
                if self.step >= plan.max_steps or self.stopped_early:
                    break
            else:
                self.passes, self.taken = self.passes + 1, 0
        if self.step % plan.eval_steps and self.step != plan.max_steps and not self.stopped_early:
            self.validate()  # the loader ran dry mid-interval (cannot happen with whole passes; kept for safety)
        bar.close()


# accelerate's trackers (`Accelerator(log_with=...)`) and the package each needs
TRACKER_PACKAGES = {
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "trackio": "trackio",
    "mlflow": "mlflow",
    "comet_ml": "comet-ml",
    "aim": "aim",
    "clearml": "clearml",
    "dvclive": "dvclive",
    "swanlab": "swanlab",
}


def resolve_trackers(report_to: str | Sequence[str] | None) -> list[str]:
    """The accelerate trackers `report_to` names, as ``TrainingArguments.report_to`` takes them.

    Args:
        report_to: ``"none"`` (or `None`, or empty), tracker names (`TRACKER_PACKAGES`, or one registered with
            `accelerate.tracking.register_tracker_class`), or ``"all"``: every installed one.

    Returns:
        The names, for ``Accelerator(log_with=...)``; empty: no tracking.

    Raises:
        UserError: an unknown name, ``none`` beside others, or a tracker whose package is not installed (named).
    """
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS, get_available_trackers

    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    if names in ([], ["none"]):
        return []
    if "none" in names:
        raise UserError(f"--report-to {' '.join(names)}: none reports to no tracker; give it alone")
    unknown = [n for n in names if n != "all" and n not in LOGGER_TYPE_TO_CLASS]
    if unknown:
        raise UserError(
            f"--report-to: unknown tracker(s) {unknown}; give some of {sorted(LOGGER_TYPE_TO_CLASS)}, all or none"
        )
    # accelerate leaves out a tracker whose package is missing without a word; here it is an error, before training.
    installed = {str(t) for t in get_available_trackers()}
    for name in names:
        if name in TRACKER_PACKAGES and name not in installed:
            package = TRACKER_PACKAGES[name]
            raise UserError(f"--report-to {name}: the {package} package is not installed (pip install {package})")
    chosen = [n for n in names if n != "all"]
    if "all" in names:
        chosen += sorted(installed - set(chosen))
        if not chosen:
            logger.warning("--report-to all: none of %s is installed; nothing is reported", sorted(TRACKER_PACKAGES))
    return list(dict.fromkeys(chosen))


def _tracker_config(config: MSVTrainingConfig, plan: TrainingPlan) -> dict:
    """The run's settings and plan as tracker hyperparameters (scalars; lists and dicts as JSON)."""
    values = config.to_dict() | {f"plan_{k}": v for k, v in asdict(plan).items()}
    return {k: v if v is None or isinstance(v, (bool, int, float, str)) else json.dumps(v) for k, v in values.items()}


def train_verifier(
    train_dir,
    val_dir,
    output_dir,
    config: MSVTrainingConfig | None = None,
    resume: bool = False,
    report_to: str | Sequence[str] | None = None,
) -> TrainingResult:
    """Train an MSV_N or a Probe on the shards in `train_dir`, keep the checkpoint with the best validation BCE on
    `val_dir` in `output_dir` (weights, config, README.md model card, ``training_config.json``,
    ``training_log.json``), compare it on validation with calibrated self-consistency and a linear probe (the guard;
    a warning line when it is worse than the vote), and return the history, the guard and the best model (loaded on
    every process). Every input check happens before training starts (see `load_training_data`).

    With `resume`, a fit interrupted in `output_dir` continues from its last saved state (`checkpoint`: the vote
    cross-validation's, then the training's, saved at every validation; nothing saved yet: from the start) and ends
    as the uninterrupted fit would have; a state saved with other settings is a UserError before any training.
    Without it, a state left there is discarded.

    Works in one process or under ``accelerate launch`` (any number of processes; CPU or GPU).

    Args:
        train_dir: the training shards (a directory or files).
        val_dir: the validation shards.
        output_dir: where the checkpoint and logs go.
        config: the run's `MSVTrainingConfig`; `None`: the defaults.
        resume: continue an interrupted fit in `output_dir`.
        report_to: experiment trackers for the loss of every step and the validation metrics (`resolve_trackers`;
            file-based ones write under ``output_dir/runs``).

    Returns:
        The `TrainingResult`.

    Raises:
        UserError: bad inputs (`load_training_data`), a tracker that is unknown or not installed, or a saved state of
            other settings with `resume`.
    """
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    from ..utils import cpu_processes

    config = config or MSVTrainingConfig()
    trackers = resolve_trackers(report_to)
    train_set, val_set = load_training_data(train_dir, val_dir, config)
    calibration_note = _calibration_size_note(config, val_set)
    if calibration_note:
        logger.warning(calibration_note)
    output_dir = Path(output_dir)
    accelerator = Accelerator(
        mixed_precision=config.mixed_precision,
        cpu=cpu_processes(),
        log_with=[*trackers] or None,  # a new list: accelerate types its items wider than str
        project_dir=str(output_dir / "runs") if trackers else None,
    )
    set_seed(config.seed)
    loader, steps_per_pass = _training_loader(config, train_set, accelerator.num_processes)
    plan = resolve_plan(config, train_set.hidden_size, steps_per_pass)
    warmup = math.ceil(config.warmup_ratio * plan.max_steps)
    decision = None
    folds = config.folds(train_set.num_problems)
    state_path = output_dir / STATE_FILE
    # The training state is saved with the plan before cross-validation shortens it (the saved decision fixes it).
    expected = fingerprint(config, plan, folds, train_set)
    saved = _saved_progress(output_dir, expected, resume, accelerator)
    if folds:
        # The length of training (0: keep the vote) is chosen on the training problems; the run then trains exactly
        # that long on all of them.
        output_dir.mkdir(parents=True, exist_ok=True)
        decision = cross_validate_vote(config, plan, train_set, accelerator, folds, state_path)
        plan = replace(plan, max_steps=decision.step, early_stopping_patience=0)
        set_seed(config.seed)
    model, optimizer, anchor = _start(config, plan, train_set)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    # Stepped once per optimizer step by hand (not prepared): accelerate would step it once per process. Registered,
    # it is saved with the training state.
    scheduler = get_constant_schedule_with_warmup(optimizer.optimizer, warmup)
    accelerator.register_for_checkpointing(scheduler)
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(output_dir / "training_config.json", config.to_dict())
    run = _TrainingRun(
        config,
        plan,
        accelerator,
        training=(model, optimizer, scheduler, loader),
        train_set=train_set,
        val_set=val_set,
        output_dir=output_dir,
        decision=decision,
        vote_anchor=anchor and anchor.to_dict(),
    )
    run.fingerprint, run.reporting = expected, bool(trackers)
    if saved is not None:
        run.resume(*saved)
    if trackers:
        accelerator.init_trackers("hf-msv", config=_tracker_config(config, plan))
    try:
        run.run()
        accelerator.wait_for_everyone()
        cls = ProbeVerifier if config.kind == "probe" else type(accelerator.unwrap_model(model))
        best = cls.from_pretrained(output_dir) if run.saved else None
        guard = _guard(best, run, train_set, val_set, output_dir) if best is not None else None
    finally:
        # `Accelerator.end_training` without its end of the process group, which a script may go on using.
        for tracker in accelerator.trackers:
            tracker.finish()
    if accelerator.is_main_process:
        state_path.unlink(missing_ok=True)  # the fit is done: nothing to resume
        discard_training_state(output_dir)
    accelerator.free_memory()
    return TrainingResult(
        output_dir=str(output_dir),
        best_epoch=run.best_epoch,
        best_metrics=run.best_metrics,
        history=run.history,
        verifier=best,
        best_step=run.best_step,
        guard=guard,
        plan=plan,
        vote_cv=decision,
    )


def _training_loader(config: MSVTrainingConfig, train_set: ShardDataset, processes: int):
    """The training `DataLoader` (the global batch split over `processes`) and its optimizer steps per pass."""
    per_process = max(1, resolve_batch_size(config) // processes)
    loader = torch.utils.data.DataLoader(
        train_set,
        batch_size=per_process,
        shuffle=True,
        num_workers=config.num_workers,
        collate_fn=partial(collate_groups, mode=config.mode),
        generator=torch.Generator().manual_seed(config.seed),
    )
    return loader, math.ceil(len(train_set) / (per_process * processes))


def _saved_progress(output_dir: Path, expected: dict, resume: bool, accelerator):
    """With `resume`, the progress saved in `output_dir` (`load_training_progress`: a UserError when saved with
    other settings); without it, whatever a previous fit left there is discarded."""
    saved = load_training_progress(output_dir, expected) if resume else None
    if not resume and accelerator.is_main_process:
        (output_dir / STATE_FILE).unlink(missing_ok=True)
        discard_training_state(output_dir)
    accelerator.wait_for_everyone()
    return saved


def _calibration_size_note(config: MSVTrainingConfig, val_set: ShardDataset) -> str | None:
    """One line, before training, when a streaming MSV's calibration problems are too few to certify ε at δ."""
    if config.kind != "msv" or config.mode != "streaming":
        return None
    if config.stop_calibration_dir:
        n = _calibration_set(config).num_problems
    else:
        n = ProblemSplit.of(val_set.problem_ids, config.stop_calibration_fraction).size
    needed = problems_needed(config.stop_epsilon, config.stop_delta)
    if n >= needed:
        return None
    return (
        f"early stopping: {n} calibration problems cannot certify ε = {config.stop_epsilon:g} at δ = "
        f"{config.stop_delta:g} (needs ≥ {needed}); the verifier will decode in full by default (λ = ∞): collect "
        "more validation problems or pass --stop-calibration-dir (best-of-N needs no λ)"
    )


def _certify_pruning(model, config: MSVTrainingConfig, stopping: EarlyStoppingFit, val_set) -> PruningFit | None:
    """A pruning rule certified jointly with λ on the problems λ was certified on (`fit_pruning` over
    `PRUNE_CANDIDATES` with the ``stop_pruning`` loss, docs/pruning.md); `None` when pruning is off, λ itself is not
    the guarantee's certified λ, or the stop alone is cheapest."""
    if config.stop_pruning == "off" or stopping.choice is not stopping.guarantee or not stopping.guarantee.reached:
        return None
    dataset = _calibration_set(config) if config.stop_calibration_dir else val_set
    groups = replay_groups_of(dataset, stopping.split.calibration)
    fit, _ = fit_pruning(
        PRUNE_CANDIDATES,
        stopping.head,
        groups,
        MSVGroupScorer(model),
        config.stop_epsilon,
        config.stop_delta,
        loss=config.stop_pruning,
    )
    return None if fit.rule.off else fit


def _calibration_predictions(model, config: MSVTrainingConfig, accelerator) -> ValidationPredictions:
    """The kept checkpoint's predictions on ``--stop-calibration-dir`` (groups of the training N)."""
    return validation_predictions(model, _calibration_set(config), "streaming", config.eval_batch_size, accelerator)


def _calibration_set(config: MSVTrainingConfig) -> ShardDataset:
    """``--stop-calibration-dir``'s groups of the training N (streaming)."""
    return ShardDataset(config.stop_calibration_dir, num_sequences=config.group_size, mode="streaming")


def _kept_vote(run: _TrainingRun) -> dict | None:
    """For the guard: the best non-significant gain of an anchored run that kept its step-0 vote, else `None`."""
    if not run.config.anchored or run.best_step != 0:
        return None
    start = (
        {
            "start": "the weighted vote of its single-chain head calibrated on the training answers (Probe+WV)",
            "weighted": True,
        }
        if run.config.uses_vote_pathway
        else {}
    )
    if run.decision is not None:
        d = run.decision
        return {
            "gain": d.gain,
            "se": d.se,
            "margin_se": d.margin_se,
            "folds": d.folds,
            "steps": d.curve[-1]["step"],
            **start,
        }
    return (run.best_vote_gain or {"gain": math.nan, "se": math.nan, "margin_se": run.config.vote_margin_se}) | start


def _guard(best, run: _TrainingRun, train_set, val_set, output_dir: Path) -> GuardReport:
    """Compare the kept checkpoint with the baselines on validation; log, card and warning line."""
    config, acc = run.config, run.accelerator
    predictions = validation_predictions(best, val_set, config.mode, config.eval_batch_size, acc, pooled=True)
    assert predictions.pooled is not None  # pooled=True
    probe_p = linear_probe_scores(train_set, predictions.pooled, config.seed)
    name = "the Probe" if config.kind == "probe" else f"MSV_{config.num_sequences}"
    report = build_guard_report(
        name,
        config.group_size,
        predictions,
        probe_p,
        {
            "problems": train_set.num_problems,
            "steps": run.step,
            "output_dir": str(output_dir),
            "stopped_early": run.stopped_early,
            "kept_vote": _kept_vote(run),
            "streaming": config.mode == "streaming",
        },
    )
    stopping = None
    if (
        config.kind == "msv"
        and config.mode == "streaming"
        and predictions.structure is not None
        and len(predictions.labels)
    ):
        calibration = config.stop_calibration_dir
        stopping = fit_early_stopping(
            predictions,
            config.group_size,
            config.stop_epsilon,
            config.stop_delta,
            statistic=config.stop_statistic,
            lambda_rule=config.lambda_rule,
            split=None if calibration else ProblemSplit.of(predictions.problems, config.stop_calibration_fraction),
            calibration=_calibration_predictions(best, config, acc) if calibration else None,
        )
        best.config.early_stopping = stopping.config_entry()
        report.add_early_stopping(stopping)
        pruning = _certify_pruning(best, config, stopping, val_set)
        if pruning is not None:
            best.config.early_stopping["pruning"] = pruning.config_entry()
            report.extra["pruning_line"] = (
                f"pruning, certified jointly with λ = {pruning.choice.choice.lam:g}: {pruning.rule.describe()}"
            )
    run.write_log(report, stopping)
    if acc.is_main_process:
        # The card is rebuilt from the log just written (validation, guard) and the config (the stop head and λ
        # generation uses), the files push_to_hub uploads with the weights.
        save_verifier(best, output_dir)
        for warning in (report.warning, report.extra.get("early_stopping_warning")):
            if warning:
                logger.warning(warning)
    acc.wait_for_everyone()
    return report
