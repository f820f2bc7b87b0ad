"""The start of a vote-pathway MSV (`anchor_at_weighted_vote`): its single-chain head trained as a Probe on the
training chains, then the verifier anchored at the calibrated weighted vote of that head's scores, i.e. at Probe+WV.
See ``docs/msv_vote_pathway.md``.
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..baselines import fit_platt
from ..data import collate_groups
from ..errors import UserError
from ..metrics import fold_by_problem

__all__ = ["HeadFit", "answer_states", "train_single_chain_head", "anchor_at_weighted_vote"]

logger = logging.getLogger(__name__)

MAX_STATE_BYTES = 512 * 2**20  # the answer states a head fit holds in memory (float32)
HEAD_BATCH = 256  # answers per optimizer step (the Probe's batch in sequences)
MAX_HEAD_EPOCHS = 40
HEAD_PATIENCE = 4  # epochs without a lower held-out BCE before stopping


@dataclass
class HeadFit:
    """What `anchor_at_weighted_vote` did (``training_log.json["vote_anchor"]``): the head's epochs (median over the
    folds of the training problems), its mean held-out BCE there, and the Platt fit (a, b) of the out-of-fold
    weighted vote shares."""

    epochs: int
    held_out_bce: float
    platt: tuple[float, float]
    answers: int
    held_out_answers: int

    def to_dict(self) -> dict:
        return asdict(self)


def answer_states(dataset, limit_bytes: int = MAX_STATE_BYTES) -> tuple[torch.Tensor, torch.Tensor]:
    """(states (m, d) float32, labels (m,) float) of every labelled answer of `dataset` (a `ShardDataset` of the
    run's mode: every sequence once), read at the answer's last token as the single-chain head reads it; at most
    `limit_bytes` of states (a random subset of groups beyond that)."""
    limit = max(1, limit_bytes // (4 * dataset.hidden_size))
    states, labels, count = [], [], 0
    for item in np.random.default_rng(0).permutation(len(dataset)).tolist():
        group = dataset[item]
        lengths = group["answer_length"].long()
        if not len(lengths):
            continue
        keep = group["labels"] >= 0
        last = torch.cumsum(lengths, 0) - 1
        states.append(group["hidden_states"][last][keep].float())
        labels.append(group["labels"][keep].float())
        count += int(keep.sum())
        if count >= limit:
            break
    if not states:
        raise UserError("the training data has no labelled answers to train the single-chain head on")
    return torch.cat(states), torch.cat(labels)


def _bce(head, x, y) -> float:
    with torch.no_grad():
        return float(F.binary_cross_entropy_with_logits(head(x), y)) if len(y) else math.nan


def train_single_chain_head(
    head: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    lr: float,
    seed: int,
    held_out: tuple[torch.Tensor, torch.Tensor] | None = None,
    epochs: int | None = None,
) -> tuple[int, float]:
    """Train `head` ((m, d) -> (m,) logits) on answers `x` (m, d), labels `y` (m,) with AdamW at `lr`.

    With `held_out` (x, y): up to `MAX_HEAD_EPOCHS` epochs, stopped after `HEAD_PATIENCE` without a lower held-out
    BCE, and the best epoch's weights restored; else exactly `epochs` epochs. Returns (epochs, held-out BCE)."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)

    def one_epoch() -> None:
        head.train()
        for rows in torch.randperm(len(y), generator=generator).split(HEAD_BATCH):
            loss = F.binary_cross_entropy_with_logits(head(x[rows]), y[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        head.eval()

    if held_out is None:
        if epochs is None:
            raise ValueError("train_single_chain_head needs `held_out` or `epochs`")
        for _ in range(epochs):
            one_epoch()
        return epochs, math.nan
    best_bce, best_epoch, best_state = _bce(head, *held_out), 0, copy.deepcopy(head.state_dict())
    for epoch in range(1, MAX_HEAD_EPOCHS + 1):
        one_epoch()
        bce = _bce(head, *held_out)
        if bce < best_bce:
            best_bce, best_epoch, best_state = bce, epoch, copy.deepcopy(head.state_dict())
        elif epoch - best_epoch >= HEAD_PATIENCE:
            break
    head.load_state_dict(best_state)
    return best_epoch, best_bce


def _fresh_head(model, seed: int) -> torch.nn.Module:
    head = copy.deepcopy(model.vote_head)
    torch.manual_seed(seed)
    for layer in (head.up, head.head):
        layer.reset_parameters()
    return head


@torch.no_grad()
def _shares(model, dataset, mode: str, batch_size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """(weighted vote shares, labels) of every labelled answer of `dataset` under `model`'s vote pathway."""
    from ..modeling_msv import weighted_vote_share

    shares, labels = [], []
    for start in range(0, len(dataset), batch_size):
        batch = collate_groups([dataset[i] for i in range(start, min(start + batch_size, len(dataset)))], mode)
        if not len(batch["labels"]):
            continue
        h = batch["hidden_states"].float()
        positions = torch.arange(len(h))
        last = torch.full((len(batch["labels"]),), -1, dtype=torch.long).scatter_reduce(
            0, batch["token_answer"].long(), positions, reduce="amax"
        )
        p = torch.sigmoid(model.vote_head(h[last]).float())
        share = weighted_vote_share(
            p,
            batch["answer_group"].long(),
            batch["answer_end"].long(),
            batch["answer_class"].long(),
            model.config.streaming,
            model.config.vote_threshold,
        )
        keep = batch["labels"] >= 0
        shares.append(share[keep].double().numpy())
        labels.append(batch["labels"][keep].double().numpy())
    return np.concatenate(shares), np.concatenate(labels)


def _platt(share: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """Platt fit of the share with an L2 penalty (C = 1): in terminal mode every answer of a class has one share, so
    a few held-out problems are often separable and an unpenalised fit would start the verifier overconfident."""
    from sklearn.linear_model import LogisticRegression

    y = labels.astype(bool)
    if y.all() or not y.any():
        return fit_platt(share, labels)
    fit = LogisticRegression(C=1.0, max_iter=1000).fit(share.reshape(-1, 1), y)
    return float(fit.coef_[0, 0]), float(fit.intercept_[0])


def anchor_at_weighted_vote(model, train_set, mode: str, lr: float, seed: int = 0) -> HeadFit:
    """Start a vote-pathway `model` at Probe+WV, calibrated, on `train_set`'s problems alone.

    The training problems are dealt into up to four folds; per fold, a single-chain head trains on the other folds
    (early stopping on this one) and scores this fold, so every training answer gets an out-of-sample weighted vote
    share, as on new data; the shares are Platt-fitted. The head then retrains on every training problem for the
    median chosen number of epochs, and `MSVVerifier.anchor_to_weighted_vote` makes the verifier output
    σ(a·share + b). With one training problem nothing is held out (10 epochs; Platt in sample)."""
    folds = min(4, train_set.num_problems)
    shares, labels, epochs, bces = [], [], [], []
    if folds >= 2:
        fold = fold_by_problem(np.arange(train_set.num_problems), folds)
        for k in range(folds):
            inner, held = train_set.subset(np.flatnonzero(fold != k)), train_set.subset(np.flatnonzero(fold == k))
            head = _fresh_head(model, seed + k)
            chosen, bce = train_single_chain_head(
                head, *answer_states(inner), lr, seed + k, held_out=answer_states(held)
            )
            model.vote_head.load_state_dict(head.state_dict())
            share, label = _shares(model, held, mode)
            shares.append(share)
            labels.append(label)
            epochs.append(max(chosen, 1))
            bces.append(bce)
    x, y = answer_states(train_set)
    head = _fresh_head(model, seed)
    train_single_chain_head(head, x, y, lr, seed, epochs=int(np.median(epochs)) if epochs else 10)
    model.vote_head.load_state_dict(head.state_dict())
    if not shares:
        share, label = _shares(model, train_set, mode)
        shares, labels = [share], [label]
    a, b = _platt(np.concatenate(shares), np.concatenate(labels))
    model.anchor_to_weighted_vote(a, b)
    fit = HeadFit(
        epochs=int(np.median(epochs)) if epochs else 10,
        held_out_bce=float(np.mean(bces)) if bces else math.nan,
        platt=(a, b),
        answers=len(y),
        held_out_answers=int(sum(len(x) for x in labels)) if epochs else 0,
    )
    logger.info(
        "single-chain head: %d epochs on %d answers (held-out BCE %.4f); anchored at σ(%.3f·share %+.3f)",
        fit.epochs,
        fit.answers,
        fit.held_out_bce,
        a,
        b,
    )
    return fit
