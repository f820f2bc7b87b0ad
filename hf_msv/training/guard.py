"""The guard against a silently useless checkpoint (`build_guard_report`): after training, the verifier is compared
on the same validation answers with calibrated self-consistency (cross-fitted over two halves of the validation
problems; at N = 1, where γ is always 1, the cross-fitted base rate) and a linear probe on mean-pooled answer states
(`linear_probe_scores`); also the vote cross-validation's statistics (`bce_gain`, `choose_vote_departure`) and the
Platt anchor fitted on the training answers (`training_vote_platt`). See ``docs/training.md``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ..baselines import WV_THRESHOLD, fit_logistic, fit_platt, logistic, logit, platt
from ..errors import UserError
from ..metrics import auroc, bce_with_logits, brier, fold_by_problem, nll

__all__ = [
    "BASE_RATE_REFERENCE",
    "GuardReport",
    "ValidationPredictions",
    "bce_gain",
    "calibrated_self_consistency",
    "training_vote_platt",
    "linear_probe_scores",
    "pooled_answer_states",
    "build_guard_report",
]

MAX_PROBE_ANSWERS = 20000
# The reference at N = 1 (γ is always 1 there): calibrated γ is then a base rate, fitted on the other half.
BASE_RATE_REFERENCE = "the base rate cross-fitted over validation halves (each half scored at the other's accuracy)"


@dataclass
class ValidationPredictions:
    """What one validation pass produces, per answer (m answers of every validation group, in batch order):
    ``logits`` (m,), ``labels`` (m,) 0/1, ``gamma`` (m,) the γ the verifier received, ``pooled`` (m, d) the
    mean-pooled answer hidden states (float32; `None` when not asked for), ``problems`` (m,) problem ids,
    ``single_logits`` (m,) a vote-pathway MSV's single-chain head, ``structure`` {"group", "end", "klass"} (m,)
    each, for weighted votes."""

    logits: np.ndarray
    labels: np.ndarray
    gamma: np.ndarray
    pooled: np.ndarray | None = None
    problems: np.ndarray | None = None
    single_logits: np.ndarray | None = None
    structure: dict | None = None


def bce_gain(reference: ValidationPredictions, candidate: ValidationPredictions) -> tuple[float, float]:
    """(gain, standard error): how much lower `candidate`'s mean BCE is than `reference`'s on the same answers, and
    the standard error of that difference clustered by problem (answers of one problem are not independent: they
    share the problem's difficulty and, in a group, each other's γ). Both must come from the same validation pass
    order with ``problems`` set; the error is `inf` with fewer than two problems."""
    if reference.problems is None:
        raise ValueError("bce_gain clusters by problem: pass predictions with `problems` set")
    y = reference.labels
    diff = bce_with_logits(reference.logits, y) - bce_with_logits(candidate.logits, y)
    _, cluster = np.unique(reference.problems, return_inverse=True)
    sums = np.bincount(cluster, weights=diff)
    gain, count = float(diff.mean()), len(sums)
    if count < 2:
        return gain, math.inf
    sizes = np.bincount(cluster)
    se = math.sqrt(count / (count - 1) * float(np.sum((sums - sizes * gain) ** 2))) / len(diff)
    return gain, se


@dataclass
class VoteDecision:
    """What cross-validation over the training problems decided for an anchored verifier
    (`hf_msv.training.trainer.cross_validate_vote`): train `step` optimizer steps past the vote (0: keep the vote).
    `gain` ± `se` is the pooled held-out BCE gain over the vote at the best evaluated step (clustered by problem);
    `curve` has one entry per evaluation (step, pooled BCE, gain, se)."""

    folds: int
    step: int
    gain: float
    se: float
    margin_se: float
    curve: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def choose_vote_departure(
    steps: list[int], predictions: list[ValidationPredictions], margin_se: float, folds: int
) -> VoteDecision:
    """The evaluated step whose predictions gain the most BCE over step 0's (``steps[0] == 0``: the vote), chosen
    only if that gain exceeds `margin_se` standard errors clustered by problem (`bce_gain`); else step 0.

    The predictions are pooled held-out folds (every training problem once), so the decision rests on all training
    problems rather than on a small validation set; the margin guards against the best of many noisy evaluations.
    """
    vote, curve = predictions[0], []
    for step, candidate in zip(steps, predictions):
        gain, se = bce_gain(vote, candidate) if step else (0.0, 0.0)
        curve.append(
            {
                "step": int(step),
                "bce": float(np.mean(bce_with_logits(candidate.logits, candidate.labels))),
                "gain": gain,
                "se": se,
            }
        )
    best = max(curve[1:], key=lambda entry: entry["gain"], default=None)
    if best is None:
        return VoteDecision(folds, 0, math.nan, math.nan, margin_se, curve)
    step = best["step"] if best["gain"] > margin_se * best["se"] else 0
    return VoteDecision(folds, step, best["gain"], best["se"], margin_se, curve)


def _scores(p: np.ndarray, y: np.ndarray) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # AUROC of a one-class validation set is nan, said once by the report
        return {"brier": brier(p, y), "auroc": auroc(p, y), "nll": nll(p, y)}


def calibrated_self_consistency(
    gamma: np.ndarray, labels: np.ndarray, problems: np.ndarray | None = None
) -> tuple[np.ndarray, dict]:
    """(probabilities (m,), {"brier", "auroc", "nll", "platt": [a, b]}) of γ Platt-scaled on these labels.

    With `problems` (m,) (two or more distinct), the probabilities are cross-fitted: the answers of every other
    problem (in order of first appearance, `fold_by_problem`) are scaled by the fit on the rest, so the scores are
    out of sample like the verifier's; ``platt`` is then the fit on all answers (what a user would apply to new data).

    Args:
        gamma: (m,) agreement feature γ of each answer.
        labels: (m,) 0/1 correctness.
        problems: (m,) problem id of each answer; `None`: no cross-fitting.

    Returns:
        ``(probabilities, metrics)``: an (m,) array and the dict above.
    """
    a, b = fit_platt(gamma, labels)
    p = platt(gamma, a, b)
    if problems is not None and len(np.unique(problems)) >= 2:
        fold = fold_by_problem(problems, 2)
        for k in (0, 1):
            p[fold == k] = platt(gamma[fold == k], *fit_platt(gamma[fold != k], labels[fold != k]))
    return p, _scores(p, labels) | {"platt": [a, b]}


def weighted_vote_shares(p: np.ndarray, structure: dict, streaming: bool, threshold: int = WV_THRESHOLD) -> np.ndarray:
    """(m,) the weighted vote share of each answer's class under single-chain probabilities `p` (m,), per group of
    `structure` ({"group", "end", "klass"}): the evaluation's Probe+WV rule (streaming: causal, R = `threshold`),
    computed by the verifier's own `weighted_vote_share`."""
    from ..modeling_msv import weighted_vote_share

    as_long = lambda key: torch.as_tensor(structure[key], dtype=torch.long)
    share = weighted_vote_share(
        torch.as_tensor(p, dtype=torch.float64),
        as_long("group"),
        as_long("end"),
        as_long("klass"),
        streaming,
        threshold,
    )
    return share.numpy()


def _cross_fitted(features: np.ndarray, labels: np.ndarray, problems: np.ndarray) -> np.ndarray:
    """(m,) a logistic regression of `labels` on `features` (m, F), each half of the problems scored by the fit on
    the other half (out of sample, like the verifier's scores)."""
    fold = fold_by_problem(problems, 2) if len(np.unique(problems)) >= 2 else np.zeros(len(labels), dtype=int)
    out = np.empty(len(labels))
    for k in np.unique(fold):
        train = fold != k if (fold != k).any() else fold == k
        out[fold == k] = logistic(features[fold == k], *fit_logistic(features[train], labels[train]))
    return out


def vote_baselines(predictions: ValidationPredictions, single_p: np.ndarray, streaming: bool) -> dict:
    """{name: (m,) probabilities} of the single-chain vote baselines on the validation answers, cross-fitted over
    validation halves: Probe+WV (the Platt-scaled weighted vote share of the single-chain scores `single_p` (m,))
    and stacked (a logistic regression on [γ, logit of the single-chain score])."""
    y, problems, structure = predictions.labels, predictions.problems, predictions.structure
    if problems is None or structure is None:
        raise ValueError("vote baselines need predictions with `problems` and `structure` set")
    share = weighted_vote_shares(single_p, structure, streaming)
    return {
        "Probe+WV": _cross_fitted(share[:, None], y, problems),
        "stacked [vote, Probe]": _cross_fitted(np.stack([predictions.gamma, logit(single_p)], 1), y, problems),
    }


def training_vote_platt(train_set, mode: str, seed: int = 0, batch_size: int = 64) -> tuple[float, float]:
    """(a, b) of calibrated self-consistency fitted on the training split: Platt scaling of γ over the `mode`
    answers of (up to `MAX_PROBE_ANSWERS` answers of random groups of) `train_set` at its current epoch. Used to
    anchor a new verifier at the vote (`MSVVerifier.anchor_to_vote`) before training."""
    from ..data import collate_groups

    gammas, labels, count = [], [], 0
    order = np.random.default_rng(seed).permutation(len(train_set)).tolist()
    for start in range(0, len(order), batch_size):
        batch = collate_groups([train_set[i] for i in order[start : start + batch_size]], mode)
        if batch["gamma"] is None:
            continue
        gammas.append(batch["gamma"].double().numpy())
        labels.append(batch["labels"].double().numpy())
        count += len(labels[-1])
        if count >= MAX_PROBE_ANSWERS:
            break
    if not gammas:
        raise UserError(f"the training data has no {mode} answers")
    _, fit = calibrated_self_consistency(np.concatenate(gammas), np.concatenate(labels))
    return tuple(fit["platt"])


def pooled_answer_states(hidden_states: torch.Tensor, token_answer: torch.Tensor, num_answers: int) -> np.ndarray:
    """`(A, d)` float32 mean of each answer's token states: `hidden_states (T, d)`, `token_answer (T,)` in [0, A)."""
    h = hidden_states.float()
    total = torch.zeros(num_answers, h.shape[1]).index_add_(0, token_answer.long(), h)
    count = torch.bincount(token_answer.long(), minlength=num_answers).clamp(min=1)
    return (total / count[:, None]).numpy()


def _training_features(train_set, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(X (m, d), y (m,)) mean-pooled states and labels of up to `MAX_PROBE_ANSWERS` training answers (random
    groups; the answers a group holds follow the dataset's mode)."""
    xs, ys, count = [], [], 0
    for item in np.random.default_rng(seed).permutation(len(train_set)).tolist():
        group = train_set[item]
        lengths = group["answer_length"]
        if not len(lengths):
            continue
        token_answer = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
        xs.append(pooled_answer_states(group["hidden_states"], token_answer, len(lengths)))
        ys.append(group["labels"].numpy())
        count += len(lengths)
        if count >= MAX_PROBE_ANSWERS:
            break
    return np.concatenate(xs), np.concatenate(ys)


def linear_probe_scores(train_set, val_pooled: np.ndarray, seed: int = 0) -> np.ndarray | None:
    """P(correct) of the validation answers `val_pooled (m, d)` under a logistic regression on standardised
    mean-pooled states fitted on `train_set` (a `ShardDataset`); `None` if the training labels have one class.

    Args:
        train_set: the training `ShardDataset`.
        val_pooled: (m, d) mean-pooled hidden states of the validation answers.
        seed: seed of the training answers' draw.

    Returns:
        (m,) probabilities, or `None`.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = _training_features(train_set, seed)
    if y.min() == y.max():
        return None
    model = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=2000))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lbfgs convergence chatter on wide, collinear states
        model.fit(x, y.astype(bool))
    return model.predict_proba(val_pooled)[:, 1]


@dataclass
class GuardReport:
    """The verifier and its baselines on the same validation answers (``training_log.json["guard"]``).

    ``verifier``, ``self_consistency``, ``linear_probe`` and each of ``baselines`` (Probe+WV, stacked):
    {"brier", "auroc", "nll"} (the probe's may be `None`); ``base_rate``: accuracy of the validation answers;
    ``best``: the baseline with the lowest Brier; ``passed``: verifier Brier ≤ that best's; ``warning``: the
    one-line warning when not, naming what to use instead.

    Args:
        name: the verifier's name in the report.
        num_sequences: N of the validation groups.
        answers: the number of validation answers.
        base_rate: their accuracy.
        verifier, self_consistency, linear_probe: the scores above.
        passed: whether the verifier beat the best baseline.
        warning: the warning line, or `None`.
        reference: the name of the vote row (calibrated self-consistency, or the base rate for N = 1).
        extra: further notes (the kept vote, early-stopping lines).
        baselines: the other baselines' scores by name.
        best: the name of the best baseline.
    """

    name: str
    num_sequences: int
    answers: int
    base_rate: float
    verifier: dict
    self_consistency: dict
    linear_probe: dict | None
    passed: bool
    warning: str | None = None
    reference: str = "calibrated self-consistency"
    extra: dict = field(default_factory=dict)
    baselines: dict = field(default_factory=dict)
    best: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    def rows(self) -> dict:
        """{method: scores} of the verifier and every baseline, table order."""
        rows = {self.name: self.verifier, self.reference: self.self_consistency}
        return rows | ({"linear probe": self.linear_probe} if self.linear_probe else {}) | self.baselines

    def card_metrics(self) -> dict:
        """Flat rows for the model card (`hf_msv.hub.guard_rows`, which cards read from ``training_log.json``)."""
        from ..hub import guard_rows

        return guard_rows(self.to_dict())

    def add_early_stopping(self, stopping) -> None:
        """Record a streaming MSV's stopping rule (`stopping_curve.EarlyStoppingFit`): the λ saved with it and the
        guarantee behind it, the stop-time calibration on the calibration problems, and a warning when the saved λ
        does not stop early (nothing certified: full decoding; the curves go to the log).

        Args:
            stopping: the `EarlyStoppingFit`; its lines go into `extra`.
        """
        choice, at_stop = stopping.choice, stopping.replay.at_stop(stopping.choice.lam)
        line = f"early stopping ({stopping.split.size} calibration problems): {choice.describe()}"
        if at_stop["stopped"] > 0:
            line += (
                f"; at the stop ({at_stop['stopped']:.0%} of groups) accuracy {at_stop['accuracy']:.3f}, mean "
                f"confidence {at_stop['confidence']:.3f}"
            )
        if choice is not stopping.guarantee:
            line += f"; the guarantee: {stopping.guarantee.describe()}"
        if choice.reached:
            self.extra["early_stopping_line"] = line
        else:
            self.extra["early_stopping_warning"] = (
                f"WARNING: {self.name} does not stop early by default: {line}. The curve is in training_log.json "
                "(early_stopping); `hf-msv evaluate` compares it with the baselines' curves."
            )

    def summary_lines(self) -> list[str]:
        """The CLI's closing lines: the comparison table, the early-stopping line, then the warnings if any."""
        lines = [
            f"validation ({self.answers} answers, accuracy {self.base_rate:.3f}); Brier (lower is better), "
            "AUROC; baselines cross-fitted over validation halves:"
        ]
        for method, scores in self.rows().items():
            mark = " <- best baseline" if method == self.best else ""
            lines.append(f"  {method:<34} Brier {scores['brier']:.4f}  AUROC {scores['auroc']:.3f}{mark}")
        keys = ("early_stopping_line", "pruning_line", "early_stopping_warning")
        extra = [self.extra[k] for k in keys if self.extra.get(k)]
        return lines + extra + ([self.warning] if self.warning else [])


def _kept_vote_warning(name: str, vote: dict, ours: dict, best: str, best_scores: dict, problems) -> str:
    where = (
        f"BCE pooled over {vote['folds']}-fold cross-validation of the training problems"
        if vote.get("folds")
        else "validation BCE"
    )
    start = vote.get("start", "the vote calibrated on the training answers")
    return (
        f"WARNING: {name} kept its starting point, {start}: no trained checkpoint beat it on {where} by more "
        f"than {vote['margin_se']:g} standard error(s) (best gain {vote['gain']:.4f} ± {vote['se']:.4f}, "
        f"{vote.get('steps', '?')} optimizer steps). It scores like that vote (validation Brier "
        f"{ours['brier']:.4f}; {best} {best_scores['brier']:.4f}); with {problems} training problems the data "
        "does not show more. Collect more problems to learn more than the vote."
    )


def build_guard_report(
    name: str, num_sequences: int, predictions: ValidationPredictions, probe_p: np.ndarray | None, context: dict
) -> GuardReport:
    """Compare the verifier's validation `predictions` with calibrated γ, the linear probe `probe_p` (m,), and the
    vote baselines of a single-chain scorer (`vote_baselines`: the verifier's own single-chain head when it has
    one, else the linear probe).

    Args:
        context: ``problems`` (training problems), ``steps`` (optimizer steps run), ``stopped_early`` (bool),
            ``output_dir``, ``kept_vote`` (the vote cross-validation's gain when the start was kept), ``streaming``.
    """
    y = predictions.labels.astype(np.float64)
    ours = _scores(1.0 / (1.0 + np.exp(-predictions.logits.astype(np.float64))), y)
    _, sc = calibrated_self_consistency(predictions.gamma, y, predictions.problems)
    # Two constants, one per half, so its AUROC need not be 0.5: it is labelled by what it computes.
    reference = "calibrated self-consistency" if num_sequences > 1 else BASE_RATE_REFERENCE
    probe = _scores(probe_p, y) if probe_p is not None else None
    single = 1.0 / (1.0 + np.exp(-predictions.single_logits)) if predictions.single_logits is not None else probe_p
    baselines = {}
    # One chain per group (the Probe, MSV_1): the single-chain scorers it would be compared with are itself.
    if num_sequences > 1 and single is not None and predictions.structure is not None and len(y):
        baselines = {
            k: _scores(p, y) for k, p in vote_baselines(predictions, single, bool(context.get("streaming"))).items()
        }
    candidates = {reference: sc} | ({"linear probe": probe} if probe and num_sequences > 1 else {}) | baselines
    best = min(candidates, key=lambda k: np.inf if math.isnan(candidates[k]["brier"]) else candidates[k]["brier"])
    passed = not (ours["brier"] > candidates[best]["brier"]) or math.isnan(ours["brier"])
    warning = None
    vote = context.get("kept_vote")
    if vote and not vote.get("weighted"):
        passed = False  # calibrated self-consistency kept: the verifier adds nothing to the plain vote
    if vote and not passed:
        warning = _kept_vote_warning(name, vote, ours, best, candidates[best], context.get("problems", "?"))
    elif not passed:
        steps = f"{context.get('steps', '?')} optimizer steps"
        if context.get("stopped_early"):
            steps += " (stopped early: validation stopped improving)"
        warning = (
            f"WARNING: {name} is worse than {best} on validation: Brier {ours['brier']:.4f} > "
            f"{candidates[best]['brier']:.4f} (AUROC {ours['auroc']:.3f} vs {candidates[best]['auroc']:.3f}): "
            f"use {best} rather than the checkpoint in {context.get('output_dir', '?')} (`hf-msv evaluate` "
            f"reports it; generate accepts a Probe for Probe+WV). Likely causes: too little data "
            f"({context.get('problems', '?')} training problems), too few steps ({steps}) or an unsuited "
            f"learning rate: collect more problems, raise --max-steps or run --lr-sweep."
        )
    return GuardReport(
        name=name,
        num_sequences=num_sequences,
        answers=len(y),
        base_rate=float(y.mean()) if len(y) else math.nan,
        verifier=ours,
        self_consistency=sc,
        linear_probe=probe,
        passed=passed,
        warning=warning,
        reference=reference,
        extra={"kept_vote": vote} if vote else {},
        baselines=baselines,
        best=best,
    )
