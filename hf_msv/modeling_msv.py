"""Multi-Sequence Verifier (MSV) as a transformers model.

Reads top-down: packed inputs and γ → masks → multi-mask attention (dense reference, chunked fast path) → the
Multi-Mask Transformer Block → the online cache → `MSVVerifier`.

Inputs are *packed*: the answer tokens of every answer of every group are concatenated along one axis of length T
(no padding, no separators), with answer-level metadata of length A. Attention never crosses groups, so one call can
score many groups (a training batch, or B prompts × N samples during generation).

This file imports only torch and transformers so that it can travel to the Hub as remote code.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from safetensors import SafetensorError
from torch import nn
from torch.nn import functional as F
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.utils.generic import ModelOutput

from .baselines import WV_THRESHOLD
from .configuration_msv import MSVConfig

# Whether this is hf_msv's own copy of the file, not remote code loaded by transformers (`MSVVerifier.hub_uploader`).
_INSIDE_HF_MSV = __name__ == "hf_msv.modeling_msv"

# Rows of the (5, T) token-metadata tensor. One stacked tensor keeps slicing and concatenation in one op.
GROUP, SEQUENCE, ANSWER, CLASS, END = range(5)


@dataclass
class MSVOutput(ModelOutput):
    """
    Args:
        loss (`torch.FloatTensor` of shape `()`, *optional*): mean BCE over labelled answers.
        logits (`torch.FloatTensor` of shape `(A,)`): one logit per answer (after logit averaging if enabled).
        probabilities (`torch.FloatTensor` of shape `(A,)`): `sigmoid(logits)`, the predicted P(correct).
        gamma (`torch.FloatTensor` of shape `(A,)`): the agreement feature used.
        cache (`MSVCache`, *optional*): the online cache, updated in place (also readable as `past_key_values`).
        vote_logits (`torch.FloatTensor` of shape `(A,)`, *optional*): with `config.vote_pathway`, the per-answer
            single-chain head's logit of each answer.
        vote_share (`torch.FloatTensor` of shape `(A,)`, *optional*): with `config.vote_pathway`, the weighted vote
            of the single-chain probabilities over each answer's class (`weighted_vote_share`).
    """

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    probabilities: torch.Tensor | None = None
    gamma: torch.Tensor | None = None
    # `cache`, the name transformers >= 5.24 gives every ModelOutput's cache (its ModelOutput turns a
    # `past_key_values` field or key into `cache`, so a field by the old name silently stayed None there).
    cache: MSVCache | None = None
    vote_logits: torch.Tensor | None = None
    vote_share: torch.Tensor | None = None

    @property
    def past_key_values(self) -> MSVCache | None:
        """The online cache under its transformers < 5.24 name (the same object as `cache`)."""
        return self.cache


# ----------------------------------------------------------------------------------------------------------------
# Answer-level features: γ, logit averaging, grouping
# ----------------------------------------------------------------------------------------------------------------


def _padded_by_group(answer_group: torch.Tensor, rows: torch.Tensor | None):
    """Lay answers out as (G, n_max) so per-group features vectorise across groups.

    Returns `slot (A,)` (position of each answer in its group), `index (G, n_max)` (answer at each slot, -1 for
    padding), and for the rows to compute: their group and slot.
    """
    _, group_of = torch.unique(answer_group, return_inverse=True)
    order = torch.argsort(group_of, stable=True)
    counts = torch.bincount(group_of)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(group_of)
    slot[order] = torch.arange(len(order), device=order.device) - starts[group_of[order]]
    index = torch.full((len(counts), int(counts.max())), -1, dtype=torch.long, device=order.device)
    index[group_of, slot] = torch.arange(len(group_of), device=order.device)
    rows = torch.arange(len(answer_group), device=order.device) if rows is None else rows
    return index, group_of[rows], slot[rows], rows


def compute_gamma(
    answer_group: torch.Tensor,
    answer_sequence: torch.Tensor,
    answer_step: torch.Tensor,
    answer_end: torch.Tensor,
    answer_class: torch.Tensor,
    streaming: bool,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """The agreement feature γ of the paper (Algorithm 1).

    For answer a: among the sequences S that have completed an answer by a's end time (terminal: all sequences),
    the fraction whose latest completed answer (largest step) is equivalent to a.

    Args:
        answer_group, answer_sequence, answer_step, answer_end, answer_class (`(A,)` long): group, sequence, step,
            end time and equivalence class of each answer.
        streaming: count only the answers completed by a's end time (else all).
        rows (`(R,)` long, *optional*): restricts the computation to some answers (online scoring).

    Returns:
        `(len(rows),)` float tensor (or `(A,)`).
    """
    if len(answer_group) == 0:
        return torch.zeros(0, device=answer_group.device)
    index, row_group, _, rows = _padded_by_group(answer_group, rows)
    members = index[row_group]  # (R, n): the answers of each row's group
    valid = members >= 0
    safe = members.clamp(min=0)
    n = members.shape[1]
    done = valid & (answer_end[safe] <= answer_end[rows, None]) if streaming else valid
    # Latest completed answer of each sequence: maximise step, break ties by slot, in one integer key.
    key = torch.where(done, answer_step[safe] * n + torch.arange(n, device=safe.device), -1)
    latest = torch.full((len(rows), int(answer_sequence.max()) + 1), -1, dtype=torch.long, device=safe.device)
    latest = latest.scatter_reduce(1, answer_sequence[safe], key, reduce="amax")
    present = latest >= 0
    latest_answer = members.gather(1, latest.clamp(min=0) % n)
    agree = present & (answer_class[latest_answer.clamp(min=0)] == answer_class[rows, None])
    return agree.sum(1).float() / present.sum(1).clamp(min=1).float()


def average_logits(
    logits: torch.Tensor,
    answer_group: torch.Tensor,
    answer_end: torch.Tensor,
    answer_class: torch.Tensor,
    streaming: bool,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eq. 1 of the paper: average each answer's logit over its equivalence class in its group.

    Streaming averages only over equivalent answers that ended no later (the paper's causal ablation).

    Args:
        logits (`(A,)` float): per-answer logits.
        answer_group, answer_end, answer_class (`(A,)` long): group, end time and equivalence class of each answer.
        streaming: average causally (over answers that ended no later).
        rows (`(R,)` long, *optional*): restricts the output to some answers (online scoring).

    Returns:
        `(len(rows),)` float tensor (or `(A,)`).
    """
    if len(logits) == 0:
        return logits
    index, row_group, _, rows = _padded_by_group(answer_group, rows)
    members = index[row_group]
    safe = members.clamp(min=0)
    same = (members >= 0) & (answer_class[safe] == answer_class[rows, None])
    if streaming:
        same &= answer_end[safe] <= answer_end[rows, None]
    weights = same.to(logits.dtype)
    return (weights * logits[safe]).sum(1) / weights.sum(1)


def weighted_vote_share(
    probabilities: torch.Tensor,
    answer_group: torch.Tensor,
    answer_end: torch.Tensor,
    answer_class: torch.Tensor,
    streaming: bool,
    threshold: int = WV_THRESHOLD,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Weighted voting (WV) of per-answer probabilities, the evaluation's Probe+WV rule, differentiable.

    An answer's share is the summed probability of its class over the summed probability of all answers available
    to it: every answer of its group (terminal), or those that ended no later than it (streaming; then only when
    more than `threshold` answers are available, else its own probability, as
    `hf_msv.baselines.streaming_weighted_voting`). A group without probability mass gives 0.

    Args:
        probabilities (`(A,)` float): per-answer probabilities in [0, 1].
        answer_group, answer_end, answer_class (`(A,)` long): group, end time and equivalence class of each answer.
        streaming: vote causally over the answers available to each answer.
        threshold: R, the availability count above which the streaming vote applies.
        rows (`(R,)` long, *optional*): restricts the output to some answers (online scoring).

    Returns:
        `(len(rows),)` float tensor (or `(A,)`).
    """
    if len(probabilities) == 0:
        return probabilities
    index, row_group, _, rows = _padded_by_group(answer_group, rows)
    members = index[row_group]
    safe = members.clamp(min=0)
    available = members >= 0
    if streaming:
        available &= answer_end[safe] <= answer_end[rows, None]
    mass = torch.where(
        available, probabilities[safe], torch.zeros((), dtype=probabilities.dtype, device=probabilities.device)
    )
    same = answer_class[safe] == answer_class[rows, None]
    total = mass.sum(1)
    # Divide only where there is mass, so an all-zero group has a finite gradient.
    share = torch.where(
        total > 0,
        (mass * same).sum(1) / torch.where(total > 0, total, torch.ones_like(total)),
        torch.zeros_like(total),
    )
    if streaming:
        share = torch.where(available.sum(1) > threshold, share, probabilities[rows])
    return share


def split_into_groups(
    answer_group: torch.Tensor, answer_sequence: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Partition each group's sequences into sub-groups of `group_size` (appendix "Scaling with MSV_M").

    Sequence n of group g goes to sub-group `g * ceil(S / M) + n // M` as sequence `n % M`, so an MSV_M scores
    N > M samples with O(M·N) instead of O(N²) attention.

    Args:
        answer_group (`(A,)` long): group of each answer.
        answer_sequence (`(A,)` long): sequence index n of each answer within its group.
        group_size: M, the sequences per sub-group.

    Returns:
        `(new_group, new_sequence)`, two `(A,)` long tensors.
    """
    per_group = -(-(int(answer_sequence.max()) + 1) // group_size) if len(answer_sequence) else 1
    return answer_group * per_group + answer_sequence // group_size, answer_sequence % group_size


# ----------------------------------------------------------------------------------------------------------------
# Masks
# ----------------------------------------------------------------------------------------------------------------


def build_masks(mask_names: list[str], q_meta: torch.Tensor, k_meta: torch.Tensor, streaming: bool) -> torch.Tensor:
    """Which key token each query token may attend to, under each mask.

    Args:
        q_meta: `(5, Q)` long token metadata (group, sequence, answer, class, end) of the queries.
        k_meta: `(5, K)` the same for the keys.
    Returns:
        `(J, Q, K)` bool. Every mask is restricted to the query's group and, in streaming mode, to keys whose
        answer ended no later than the query's (τ + L causality). A token always sees itself, so no row is empty.
    """

    def same(row):
        return q_meta[row, :, None] == k_meta[row, None, :]

    allowed = same(GROUP)
    if streaming:
        allowed = allowed & (q_meta[END, :, None] >= k_meta[END, None, :])
    by_name = {
        "full": lambda: allowed,
        "within_sequence": lambda: allowed & same(SEQUENCE),
        "equivalence": lambda: allowed & same(CLASS),
        "within_answer": lambda: allowed & same(ANSWER),
    }
    return torch.stack([by_name[name]() for name in mask_names])


# ----------------------------------------------------------------------------------------------------------------
# Multi-mask attention
#
# The paper's A_{h,j} = softmax(Q_h K_h^T / √d + log M_j) V_h mixed as Σ_j α_{h,j} A_{h,j}. Because the mixture is
# linear, Σ_j α_j P_j V = (Σ_j α_j P_j) V: scores and the value product are computed once per head, not once per mask.
# ----------------------------------------------------------------------------------------------------------------


def _mixed_probabilities(scores: torch.Tensor, masks: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """`scores (H, Q, K)` float32, `masks (J, Q, K)`, `alpha (H, J)` → Σ_j α_j softmax_j(scores), `(H, Q, K)`."""
    mixed = torch.zeros_like(scores)
    for j in range(masks.shape[0]):
        mixed += alpha[:, j, None, None] * scores.masked_fill(~masks[j], float("-inf")).softmax(-1)
    return mixed


def dense_multi_mask_attention(q, k, v, alpha, q_meta, k_meta, mask_names, streaming):
    """Reference implementation with explicit (J, Q, K) masks; O(Q·K) memory. Shapes: q `(H, Q, D)`, k/v
    `(H, K, D)`, alpha `(H, J)` → `(H, Q, D)`."""
    scores = (q @ k.transpose(1, 2)).float() / math.sqrt(q.shape[-1])
    masks = build_masks(mask_names, q_meta, k_meta, streaming)
    return (_mixed_probabilities(scores, masks, alpha.float()).to(v.dtype)) @ v


def _plan_chunks(key_lo: list[int], key_hi: list[int], heads: int, budget: int):
    """Split queries into chunks [i, j) with key window [lo, hi).

    A chunk grows while heads·rows·window stays within `budget` and the window stays within about twice the keys
    its queries actually need, so packed batches of many small groups stay block-diagonal instead of quadratic.
    """
    chunks, i, total = [], 0, len(key_lo)
    while i < total:
        lo, hi, needed, j = key_lo[i], key_hi[i], key_hi[i] - key_lo[i], i + 1
        while j < total:
            new_hi = max(hi, key_hi[j])
            area = (j + 1 - i) * (new_hi - lo)
            if heads * area > budget or area > 2 * (needed + key_hi[j] - key_lo[j]) + 16384:
                break
            hi, needed, j = new_hi, needed + key_hi[j] - key_lo[j], j + 1
        chunks.append((i, j, lo, hi))
        i = j
    return chunks


class _ChunkedMultiMaskAttention(torch.autograd.Function):
    """Multi-mask attention over query chunks and their key windows, flash-attention style: probabilities are
    recomputed in backward and dK/dV are accumulated in place, so memory stays O(budget + T·D) at any T."""

    @staticmethod
    def forward(ctx, q, k, v, alpha, q_meta, k_meta, chunks, mask_names, streaming):
        scale = 1.0 / math.sqrt(q.shape[-1])
        out = torch.empty_like(q)
        for i, j, lo, hi in chunks:
            scores = (q[:, i:j] @ k[:, lo:hi].transpose(1, 2)).float() * scale
            masks = build_masks(mask_names, q_meta[:, i:j], k_meta[:, lo:hi], streaming)
            out[:, i:j] = _mixed_probabilities(scores, masks, alpha.float()).to(v.dtype) @ v[:, lo:hi]
        ctx.save_for_backward(q, k, v, alpha, q_meta, k_meta)
        ctx.chunks, ctx.mask_names, ctx.streaming = chunks, mask_names, streaming
        return out

    @staticmethod
    def backward(ctx, *grad_outputs):
        (grad_out,) = grad_outputs
        q, k, v, alpha, q_meta, k_meta = ctx.saved_tensors
        scale = 1.0 / math.sqrt(q.shape[-1])
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dalpha = torch.zeros(alpha.shape, dtype=torch.float32, device=alpha.device)
        alpha32 = alpha.float()
        for i, j, lo, hi in ctx.chunks:
            q_c, k_c, v_c, do_c = q[:, i:j], k[:, lo:hi], v[:, lo:hi], grad_out[:, i:j]
            scores = (q_c @ k_c.transpose(1, 2)).float() * scale
            masks = build_masks(ctx.mask_names, q_meta[:, i:j], k_meta[:, lo:hi], ctx.streaming)
            grad_p = (do_c @ v_c.transpose(1, 2)).float()  # dL/dP_mix, shared by every mask
            grad_scores = torch.zeros_like(scores)
            mixed = torch.zeros_like(scores)
            for m in range(masks.shape[0]):
                p = scores.masked_fill(~masks[m], float("-inf")).softmax(-1)
                row_dot = (grad_p * p).sum(-1, keepdim=True)
                grad_scores += alpha32[:, m, None, None] * p * (grad_p - row_dot)
                dalpha[:, m] += row_dot.sum((1, 2))
                mixed += alpha32[:, m, None, None] * p
            dv[:, lo:hi] += mixed.to(v.dtype).transpose(1, 2) @ do_c
            grad_scores = (grad_scores * scale).to(q.dtype)
            dq[:, i:j] = grad_scores @ k_c
            dk[:, lo:hi] += grad_scores.transpose(1, 2) @ q_c
        return dq, dk, dv, dalpha.to(alpha.dtype), None, None, None, None, None


def chunked_multi_mask_attention(q, k, v, alpha, q_meta, k_meta, mask_names, streaming, key_window, budget):
    """Memory-bounded multi-mask attention. `key_window` is `(key_lo, key_hi)`: lists of ints, one per query,
    non-decreasing, that bound the keys each query may need; masks inside the window are rebuilt per chunk from the
    metadata, in chunks of at most `budget` score elements."""
    key_lo, key_hi = key_window
    chunks = _plan_chunks(key_lo, key_hi, q.shape[0], budget)
    return _ChunkedMultiMaskAttention.apply(q, k, v, alpha, q_meta, k_meta, chunks, mask_names, streaming)


# ----------------------------------------------------------------------------------------------------------------
# Multi-Mask Transformer Block
# ----------------------------------------------------------------------------------------------------------------


class MSVAttention(nn.Module):
    """Per-head attention under each mask, mixed per head by α_h = softmax(w_h) over masks.

    The paper's Σ_h Σ_j α_{h,j} A_{h,j} is read, as usual for multi-head attention, as the concatenation of the
    heads' mixed outputs followed by an output projection.
    """

    def __init__(self, config: MSVConfig):
        super().__init__()
        self.mask_names = config.effective_masks
        self.streaming = config.streaming
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.backend = config.attention_backend
        self.budget = config.attention_chunk_elements
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.mask_logits = nn.Parameter(torch.zeros(config.num_attention_heads, len(self.mask_names)))
        self.dropout = nn.Dropout(config.attention_dropout)

    def _heads(self, x):  # (T, d) -> (H, T, D)
        return x.view(x.shape[0], self.num_heads, self.head_dim).transpose(0, 1)

    def forward(self, x, meta, key_lo, key_hi, cache=None, layer_idx=0, query_rows=None):
        """x `(T, d)` sorted so that each query's keys lie in [key_lo, key_hi) → `(Q, d)`.

        `query_rows` (sorted long tensor) restricts the queries: keys and values always come from every token, but
        only the rows whose output is read need a query (the last block with last-token readout, appendix "Online
        Inference", step 2). With `cache`, x holds only new tokens; their keys/values are appended and queries
        attend to everything cached.
        """
        k, v = self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        q_in, q_meta = (x, meta) if query_rows is None else (x[query_rows], meta[:, query_rows])
        q = self._heads(self.q_proj(q_in))
        k_meta = meta
        if cache is not None:
            k, v = cache.update(layer_idx, k, v)
            k_meta = cache.visible_meta
        alpha = self.mask_logits.softmax(-1)
        if self.backend == "dense":
            out = dense_multi_mask_attention(q, k, v, alpha, q_meta, k_meta, self.mask_names, self.streaming)
        else:
            if query_rows is not None:
                rows = query_rows.tolist()
                key_lo, key_hi = [key_lo[r] for r in rows], [key_hi[r] for r in rows]
            out = chunked_multi_mask_attention(
                q, k, v, alpha, q_meta, k_meta, self.mask_names, self.streaming, (key_lo, key_hi), self.budget
            )
        return self.dropout(self.o_proj(out.transpose(0, 1).reshape(q_in.shape)))


class MSVMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, out_size: int, act: str):
        super().__init__()
        self.up = nn.Linear(hidden_size, intermediate_size)
        self.act = ACT2FN[act]
        self.down = nn.Linear(intermediate_size, out_size)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


class MSVVoteHead(nn.Module):
    """The per-answer single-chain head of the vote pathway, shaped like `ProbeVerifier`: `(A, d)` → `(A,)` logits."""

    def __init__(self, config: MSVConfig):
        super().__init__()
        self.up = nn.Linear(config.hidden_size, config.vote_hidden_size)
        self.act = ACT2FN[config.vote_hidden_act]
        self.head = nn.Linear(config.vote_hidden_size, 1)

    def forward(self, x):
        return self.head(self.act(self.up(x))).squeeze(-1)


class MSVBlock(nn.Module):
    """Multi-Mask Transformer Block: Z = (U + Ũ) + MLP(LN(U + Ũ)), Ũ the mixed multi-mask attention of U."""

    def __init__(self, config: MSVConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.attn = MSVAttention(config)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        intermediate = config.intermediate_size or 4 * config.hidden_size  # set by MSVConfig.__post_init__
        self.mlp = MSVMLP(config.hidden_size, intermediate, config.hidden_size, config.hidden_act)

    def forward(self, x, meta, key_lo, key_hi, cache=None, query_rows=None):
        """`(T, d)` → `(T, d)`, or `(Q, d)` for the rows in `query_rows`."""
        residual = x if query_rows is None else x[query_rows]
        x = residual + self.attn(x, meta, key_lo, key_hi, cache, self.layer_idx, query_rows)
        return x + self.mlp(self.norm(x))


# ----------------------------------------------------------------------------------------------------------------
# Online cache
# ----------------------------------------------------------------------------------------------------------------


class MSVCache:
    """Keys/values of every answer token scored so far (per block) and the answer metadata that γ and logit
    averaging need. Streaming causality makes cached keys/values final: a new answer never changes them, so
    scoring it costs O(L·T_acc) instead of O(T_acc²) (appendix "Online Inference with KV Caching").

    Buffers grow by doubling so appending stays amortised O(new tokens). A long-lived cache (a server's) forgets
    the groups it will never score again with `drop`.
    """

    def __init__(self):
        self._keys: list[torch.Tensor | None] = []  # per layer; None until the layer's first update
        self._values: list[torch.Tensor | None] = []
        self._meta: torch.Tensor | None = None  # (5, capacity)
        self.num_tokens = 0
        self._pending = 0
        self.answers: dict[str, torch.Tensor] = {}  # group, sequence, step, end, class, raw_logit: (A,) each
        self._dropped: list[int] = []  # groups dropped but still stored (`drop` compacts lazily)
        self._dropped_tokens = 0
        self._visible: torch.Tensor | None = None  # positions of the staged tokens' groups (`begin`); None: all

    @property
    def num_answers(self) -> int:
        return len(self.answers["group"]) if self.answers else 0

    @property
    def token_meta(self) -> torch.Tensor:
        """`(5, T_acc + new)` metadata of cached and pending tokens."""
        if self._meta is None:
            return torch.zeros((5, 0), dtype=torch.long)
        return self._meta[:, : self.num_tokens + self._pending]

    @property
    def visible_meta(self) -> torch.Tensor:
        """`(5, T_vis)` metadata of the tokens the staged ones may attend to (those of their groups), in cache
        order: the keys `update` returns."""
        meta = self.token_meta
        return meta if self._visible is None else meta[:, self._visible]

    def __len__(self) -> int:
        return self.num_tokens

    @staticmethod
    def _grow(buffer: torch.Tensor | None, needed: int, dim: int, like: torch.Tensor) -> torch.Tensor:
        if buffer is not None and buffer.shape[dim] >= needed:
            return buffer
        capacity = max(needed, 2 * (buffer.shape[dim] if buffer is not None else 64))
        shape = list(like.shape)
        shape[dim] = capacity
        grown = like.new_empty(shape)
        if buffer is not None:
            grown.narrow(dim, 0, buffer.shape[dim]).copy_(buffer)
        return grown

    def begin(self, token_meta: torch.Tensor):
        """Stage the metadata of new tokens `(5, T_new)` before the blocks run.

        Args:
            token_meta (`(5, T_new)` long): group, sequence, answer, class and end of each new token.
        """
        self._pending = token_meta.shape[1]
        self._meta = self._grow(self._meta, self.num_tokens + self._pending, 1, token_meta)
        self._meta[:, self.num_tokens : self.num_tokens + self._pending] = token_meta
        # Every mask keeps a query inside its group, so the other groups' keys (a shared cache holds every prompt
        # in flight) are gathered out rather than masked: the attention costs O(new × own group's tokens).
        groups = self.token_meta[GROUP]
        visible = torch.isin(groups, token_meta[GROUP].unique())
        self._visible = None if bool(visible.all()) else visible.nonzero().squeeze(1)

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor):
        """Append new keys/values `(H, T_new, D)` of one block; return those the new tokens may attend to.

        Args:
            layer_idx: the block's index.
            k, v (`(H, T_new, D)`): the new tokens' keys and values.

        Returns:
            `(keys, values)` of the tokens of the new tokens' groups, cached and new (`visible_meta`'s), each
            `(H, T_vis, D)`.
        """
        if layer_idx == len(self._keys):
            self._keys.append(None)
            self._values.append(None)
        end = self.num_tokens + k.shape[1]
        keys = self._keys[layer_idx] = self._grow(self._keys[layer_idx], end, 1, k)
        values = self._values[layer_idx] = self._grow(self._values[layer_idx], end, 1, v)
        keys[:, self.num_tokens : end] = k
        values[:, self.num_tokens : end] = v
        if self._visible is not None:
            return keys[:, self._visible], values[:, self._visible]
        return keys[:, :end], values[:, :end]

    def commit(self, answers: dict[str, torch.Tensor]):
        """Make the staged tokens and their answers part of the cache.

        Args:
            answers: the new answers' `(A_new,)` tensors by name (group, sequence, step, end, class, raw_logit),
                appended to `self.answers`.
        """
        self.num_tokens += self._pending
        self._pending, self._visible = 0, None
        self.answers = (
            answers if not self.answers else {name: torch.cat([self.answers[name], answers[name]]) for name in answers}
        )

    def rollback(self):
        self._pending, self._visible = 0, None

    def drop(self, groups: list[int]):
        """Forget `groups`: no answer of theirs will be scored again. Every mask keeps a query inside its own
        group, so a dropped group's tokens change no other score; they are removed once they fill half the cache
        (amortised O(1) per token), with the answers and the answer index of the tokens kept.

        Args:
            groups: group ids (`answer_group`) of cached or never-seen groups.
        """
        if self._pending:
            raise RuntimeError("MSVCache.drop between a forward's begin and commit")
        if not self.answers or not groups:
            return
        new = torch.tensor(groups, dtype=torch.long, device=self.answers["group"].device)
        self._dropped += groups
        self._dropped_tokens += int(torch.isin(self.token_meta[GROUP], new).sum())
        if 2 * self._dropped_tokens < self.num_tokens:
            return
        dropped = torch.tensor(self._dropped, dtype=torch.long, device=new.device)
        keep_answer = ~torch.isin(self.answers["group"], dropped)
        keep = ~torch.isin(self.token_meta[GROUP], dropped)
        meta = self.token_meta[:, keep]
        meta[ANSWER] = (torch.cumsum(keep_answer, 0) - 1)[meta[ANSWER]]  # answer indices of the answers kept
        self._meta = meta
        self._keys = [None if k is None else k[:, : self.num_tokens][:, keep] for k in self._keys]
        self._values = [None if v is None else v[:, : self.num_tokens][:, keep] for v in self._values]
        self.answers = {name: column[keep_answer] for name, column in self.answers.items()}
        self.num_tokens, self._dropped, self._dropped_tokens = int(keep.sum()), [], 0


# ----------------------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------------------


class MSVPreTrainedModel(PreTrainedModel):
    config: MSVConfig
    config_class = MSVConfig
    base_model_prefix = "msv"
    main_input_name = "hidden_states"
    _no_split_modules = ["MSVBlock"]

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, MSVAttention):
            init.zeros_(module.mask_logits)  # start from a uniform mixture of masks
        # The skips are neutral until training anchors them (`anchor_to_vote`, `anchor_to_weighted_vote`).
        for name in ("gamma_skip_weight", "gamma_skip_bias", "vote_skip_weight", "vote_skip_bias"):
            parameter = getattr(module, name, None)
            if isinstance(parameter, torch.Tensor):
                init.zeros_(parameter)


class MSVVerifier(MSVPreTrainedModel):
    """The Multi-Sequence Verifier: U = h + e⁽ⁿ⁾ → Multi-Mask Transformer Block(s) → readout of each answer
    (last token or mean) + MLP(γ) → linear head (+ w·γ + b with `config.gamma_skip`) → logit (averaged over
    equivalence classes in terminal mode). With `config.vote_pathway`, a single-chain head scores each answer on its
    own, the weighted vote of those scores (its class's share) and the answer's own probability enter the head
    beside γ, and `w_share·share + w_own·own_logit + b` is added to the logit (docs/msv_vote_pathway.md).

    Args:
        config (`MSVConfig`): the architecture; weights are initialised as `post_init` does.

    Example:

    ```python
    >>> out = verifier(hidden_states, token_answer, answer_group, answer_sequence, answer_step, answer_end,
    ...                answer_class)
    >>> out.probabilities  # (A,) P(answer is correct)
    ```
    """

    def __init__(self, config: MSVConfig):
        super().__init__(config)
        self.sequence_embedding = nn.Embedding(config.num_sequences, config.hidden_size)
        self.layers = nn.ModuleList(MSVBlock(config, i) for i in range(config.num_hidden_layers))
        self.gamma_mlp = MSVMLP(1, config.gamma_hidden_size, config.hidden_size, config.hidden_act)
        self.head = nn.Linear(config.hidden_size, 1)
        if config.gamma_skip:
            # Two scalars: an affine map of γ added to the logit, i.e. Platt-scaled self-consistency as a skip path.
            self.gamma_skip_weight = nn.Parameter(torch.zeros(()))
            self.gamma_skip_bias = nn.Parameter(torch.zeros(()))
        if config.vote_pathway:
            self.vote_head = MSVVoteHead(config)
            self.vote_mlp = MSVMLP(2, config.gamma_hidden_size, config.hidden_size, config.hidden_act)
            # Affine skip on (vote share, own single-chain logit): the weighted vote as a point the model can sit at.
            self.vote_skip_weight = nn.Parameter(torch.zeros(2))
            self.vote_skip_bias = nn.Parameter(torch.zeros(()))
        self.post_init()

    @torch.no_grad()
    def anchor_to_vote(self, weight: float, bias: float) -> None:
        """Make this verifier output exactly calibrated self-consistency, σ(weight·γ + bias), for every answer.

        Sets the γ skip to (weight, bias) (a Platt fit of γ, e.g. `hf_msv.baselines.fit_platt` on training answers)
        and zeroes the head, so the rest of the model starts as a residual on top of the vote: the verifier cannot
        start below the vote it is fed, and validation at step 0 scores calibrated voting. Needs
        `config.gamma_skip`.

        Args:
            weight: the γ skip's weight.
            bias: the γ skip's bias.

        Raises:
            ValueError: without `config.gamma_skip`.
        """
        if not self.config.gamma_skip:
            raise ValueError("anchor_to_vote needs a verifier built with config.gamma_skip=True.")
        self.gamma_skip_weight.fill_(weight)
        self.gamma_skip_bias.fill_(bias)
        self.head.weight.zero_()
        self.head.bias.zero_()

    @torch.no_grad()
    def anchor_to_weighted_vote(self, weight: float, bias: float) -> None:
        """Make this verifier output exactly a calibrated weighted vote of its own single-chain scores,
        σ(weight·share + bias) for every answer, `share` the class share of `weighted_vote_share`.

        Sets the vote skip to (weight on the share, 0 on the own logit, bias), zeroes the γ skip (if any) and the
        head, so the rest of the model is a residual on top of the weighted vote; the single-chain head is kept (load
        a trained Probe into it first with `load_vote_head_from_probe`). Best-of-N on the result picks the weighted
        vote's answer whenever `weight > 0`. Needs `config.vote_pathway`; raises `ValueError` otherwise.

        Args:
            weight: the vote skip's weight on the class share.
            bias: the vote skip's bias.

        Raises:
            ValueError: without `config.vote_pathway`.
        """
        if not self.config.vote_pathway:
            raise ValueError("anchor_to_weighted_vote needs a verifier built with config.vote_pathway=True.")
        self.vote_skip_weight.copy_(torch.tensor([float(weight), 0.0]))
        self.vote_skip_bias.fill_(bias)
        if self.config.gamma_skip:
            self.gamma_skip_weight.zero_()
            self.gamma_skip_bias.zero_()
        self.head.weight.zero_()
        self.head.bias.zero_()

    @torch.no_grad()
    def load_vote_head_from_probe(self, probe) -> None:
        """Copy a trained `ProbeVerifier`'s weights into the single-chain head of the vote pathway.

        Args:
            probe (`ProbeVerifier`): the trained Probe.

        Raises:
            ValueError: without `config.vote_pathway` or when the Probe's width, hidden size or activation differ
                from `hidden_size`, `vote_hidden_size`, `vote_hidden_act`.
        """
        if not self.config.vote_pathway:
            raise ValueError("load_vote_head_from_probe needs a verifier built with config.vote_pathway=True.")
        theirs = (probe.config.hidden_size, probe.config.intermediate_size, probe.config.hidden_act)
        ours = (self.config.hidden_size, self.config.vote_hidden_size, self.config.vote_hidden_act)
        if theirs != ours:
            raise ValueError(
                f"the Probe has (hidden_size, intermediate_size, hidden_act) = {theirs}, but this "
                f"verifier's vote head has (hidden_size, vote_hidden_size, vote_hidden_act) = {ours}."
            )
        for name in ("up", "head"):
            getattr(self.vote_head, name).load_state_dict(getattr(probe, name).state_dict())

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """`PreTrainedModel.from_pretrained`, with a clear error for truncated or corrupt weights.

        Args:
            pretrained_model_name_or_path: a local directory or Hub repo id.
            *args, **kwargs: passed to `PreTrainedModel.from_pretrained`.

        Returns:
            The loaded `MSVVerifier`.

        Raises:
            OSError: if the safetensors weights cannot be read.
        """
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except SafetensorError as error:
            raise OSError(
                f"The verifier weights in {pretrained_model_name_or_path!r} are truncated or corrupt "
                f"(safetensors: {error}). Re-download or re-save the checkpoint."
            ) from error

    @staticmethod
    def hub_uploader() -> Callable[..., Any] | None:
        """hf_msv's uploader, `hf_msv.hub.push_verifier_to_hub` (it writes hf_msv's model card and the evidence
        files); `None` where this file runs as remote code, without hf_msv, and the verifier uploads as transformers
        does.

        Looked up by name because this file also travels to the Hub, where ``hf_msv.hub`` does not exist (and the
        package's layers keep `hf_msv.hub` above the modeling code)."""
        if not _INSIDE_HF_MSV:
            return None
        return importlib.import_module("hf_msv.hub").push_verifier_to_hub

    def push_to_hub(self, repo_id: str, **kwargs):  # pyright: ignore[reportIncompatibleVariableOverride]  (transformers wraps its own)
        """Upload weights, config, remote code, the checkpoint's evidence files and its model card
        (`hf_msv.hub.push_verifier_to_hub`, see `hub_uploader`; transformers' own upload where the verifier was
        loaded as remote code).

        Args:
            repo_id: the Hub repository.
            **kwargs: `PreTrainedModel.push_to_hub`'s (``commit_message``, ``commit_description``, ``private``,
                ``token``, ``revision``, ``create_pr``, ``max_shard_size``, ``tags``), plus the card's ``metrics``
                and ``training_data`` (`hf_msv.hub.push_verifier_to_hub`).

        Returns:
            What the uploader returns (the commit's info).
        """
        uploader = self.hub_uploader()
        if uploader is None:
            return super().push_to_hub(repo_id, **kwargs)  # pyright: ignore[reportArgumentType]  (wrapped method)
        return uploader(self, repo_id, **kwargs)

    def parameter_groups(
        self, lr: float = 5e-5, mask_lr: float = 1e-1, embedding_lr: float = 1e-3, vote_lr: float = 1e-3
    ) -> list[dict]:
        """The paper's per-module learning rates: mask-mixture weights w, sequence embeddings e⁽ⁿ⁾, the rest; with
        `config.vote_pathway` a fourth group, the single-chain head and the vote skip, at `vote_lr` (the Probe's).

        Args:
            lr: learning rate of the rest of the model.
            mask_lr: learning rate of the mask-mixture weights.
            embedding_lr: learning rate of the sequence embeddings.
            vote_lr: learning rate of the vote pathway's parameters.

        Returns:
            Optimizer parameter groups (``{"params", "lr"}`` dicts).
        """
        groups = {"mask": [], "embedding": [], "body": [], "vote": []}
        for name, param in self.named_parameters():
            key = (
                "mask"
                if name.endswith("mask_logits")
                else "embedding"
                if name.startswith("sequence_")
                else "vote"
                if name.startswith(("vote_head.", "vote_skip_"))
                else "body"
            )
            groups[key].append(param)
        out = [
            {"params": groups["body"], "lr": lr},
            {"params": groups["mask"], "lr": mask_lr},  # empty without blocks (the no-block ablation)
            {"params": groups["embedding"], "lr": embedding_lr},
        ]
        return out + [{"params": groups["vote"], "lr": vote_lr}] if groups["vote"] else out

    # transformers' generic output flags: accepted (callers pass them to any model) and meaningless here.
    _IGNORED_KWARGS = frozenset({"return_dict", "output_attentions", "output_hidden_states"})

    def _resolve_cache(self, cache, past_key_values, use_cache: bool, kwargs: dict) -> MSVCache | None:
        """The cache `forward` scores with: the one given under either name, a new one for `use_cache`, or None."""
        unknown = sorted(set(kwargs) - self._IGNORED_KWARGS)
        if unknown:
            raise TypeError(f"MSVVerifier.forward got unexpected keyword arguments {unknown}")
        if cache is not None and past_key_values is not None and cache is not past_key_values:
            raise ValueError("give the online cache as `cache` or as `past_key_values`, not two different ones")
        cache = cache if cache is not None else past_key_values
        return cache if cache is not None else (MSVCache() if use_cache else None)

    def _check_inputs(self, hidden_states, token_answer, answer_sequence, num_answers, cache):
        if hidden_states.dim() != 2 or hidden_states.shape[-1] != self.config.hidden_size:
            raise ValueError(
                f"hidden_states must have shape (T, {self.config.hidden_size}) but has {tuple(hidden_states.shape)}; "
                f"this verifier expects the base LM's width (config.hidden_size={self.config.hidden_size}, "
                f"base_model_name_or_path={self.config.base_model_name_or_path!r})."
            )
        if token_answer.shape != hidden_states.shape[:1]:
            raise ValueError("token_answer must have one entry per token of hidden_states.")
        if len(token_answer) and not num_answers:
            raise ValueError(f"token_answer must index answers in [0, {num_answers}).")
        if num_answers and not len(token_answer):
            raise ValueError("every answer needs at least one token.")
        if num_answers:
            # One read of the device for the three checks (each read waits for it); bincount refuses negative ids,
            # which the range check reports.
            counts = torch.bincount(token_answer.clamp(0, num_answers - 1), minlength=num_answers)
            stats = [answer_sequence.max(), token_answer.min(), token_answer.max(), counts.min()]
            sequence, low, high, fewest = torch.stack(stats).tolist()
            if sequence >= self.config.num_sequences:
                raise ValueError(
                    f"sequence id {sequence} exceeds this verifier's {self.config.num_sequences} sequence "
                    "embeddings; split larger groups with hf_msv.split_into_groups (MSV_M grouping)."
                )
            if low < 0 or high >= num_answers:
                raise ValueError(f"token_answer must index answers in [0, {num_answers}).")
            if fewest == 0:
                raise ValueError("every answer needs at least one token.")
        if cache is not None and not self.config.streaming:
            raise ValueError("online scoring with a cache needs a streaming verifier (config.mode='streaming').")

    def forward(
        self,
        hidden_states: torch.Tensor,
        token_answer: torch.Tensor,
        answer_group: torch.Tensor,
        answer_sequence: torch.Tensor,
        answer_step: torch.Tensor,
        answer_end: torch.Tensor,
        answer_class: torch.Tensor,
        gamma: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        past_key_values: MSVCache | None = None,
        use_cache: bool = False,
        cache: MSVCache | None = None,
        **kwargs,
    ) -> MSVOutput:
        r"""
        Args:
            hidden_states (`(T, d)`): last-layer hidden states of all answer tokens, packed.
            token_answer (`(T,)` long): index in [0, A) of the answer each token belongs to.
            answer_group, answer_sequence, answer_step, answer_end, answer_class (`(A,)` long): group, sequence n,
                step k, end time τ + L and equivalence-class id (compared within a group) of each answer.
            gamma (`(A,)` float, *optional*): agreement feature; computed with `compute_gamma` when omitted.
            labels (`(A,)` float, *optional*): 1 if correct, 0 if not, negative to ignore; gives the BCE loss.
            past_key_values (`MSVCache`, *optional*): online scoring (streaming only). The inputs are the *new*
                answers only; each must end no earlier than every cached answer of its group.
            use_cache (`bool`): create a cache when none is given, and return it (as `MSVOutput.cache`).
            cache (`MSVCache`, *optional*): `past_key_values` under transformers >= 5.24's name; give one of them.
            kwargs: only transformers' generic output flags (`return_dict`, `output_attentions`,
                `output_hidden_states`), which change nothing here; anything else is a `TypeError`, so that a
                misspelt argument (a cache among them) cannot be dropped silently.

        Returns:
            `MSVOutput`: ``logits``, ``probabilities`` and ``gamma`` of shape `(A,)`, ``loss`` with `labels`, the
            cache when one is used, and ``vote_logits`` with `config.vote_pathway`.
        """
        device = self.head.weight.device
        num_answers = len(answer_group)
        answer_group, answer_sequence, answer_step, answer_end, answer_class, token_answer = (
            t.to(device=device, dtype=torch.long)
            for t in (answer_group, answer_sequence, answer_step, answer_end, answer_class, token_answer)
        )
        cache = self._resolve_cache(cache, past_key_values, use_cache, kwargs)
        self._check_inputs(hidden_states, token_answer, answer_sequence, num_answers, cache)
        streaming = self.config.streaming
        offset = cache.num_answers if cache is not None else 0
        new = {
            "group": answer_group,
            "sequence": answer_sequence,
            "step": answer_step,
            "end": answer_end,
            "class": answer_class,
        }
        every = _with_cached_answers(new, cache)
        new_rows = torch.arange(offset, offset + num_answers, device=device)
        if gamma is None:
            gamma = compute_gamma(
                every["group"],
                every["sequence"],
                every["step"],
                every["end"],
                every["class"],
                streaming,
                rows=new_rows if offset else None,
            )
        gamma = gamma.to(device=device, dtype=torch.float32)
        vote_logits = vote_share = None
        if self.config.vote_pathway:
            rows = new_rows if offset else None
            vote_logits, vote_share = self._vote(hidden_states, token_answer, every, cache, rows)

        readout = self._encode(hidden_states, token_answer, new, offset, cache)
        logits = self._answer_logits(readout, gamma, vote_logits, vote_share)
        raw_logits = logits
        if self.config.logit_averaging and num_answers:
            all_logits = torch.cat([cache.answers["raw_logit"], logits]) if offset and cache is not None else logits
            logits = average_logits(
                all_logits, every["group"], every["end"], every["class"], streaming, rows=new_rows if offset else None
            )
        if cache is not None:
            vote = {"vote_logit": vote_logits.detach()} if vote_logits is not None else {}
            cache.commit({**new, "raw_logit": raw_logits.detach(), **vote})

        loss = None
        if labels is not None:
            labels = labels.to(device=device, dtype=torch.float32)
            keep = labels >= 0
            loss = F.binary_cross_entropy_with_logits(logits[keep], labels[keep])
            if vote_logits is not None and self.config.vote_loss_weight:
                # Keeps the single-chain head a calibrated single-chain scorer, so its weighted vote is Probe+WV's.
                loss = loss + self.config.vote_loss_weight * F.binary_cross_entropy_with_logits(
                    vote_logits[keep], labels[keep]
                )
        return MSVOutput(
            loss=loss,
            logits=logits,
            probabilities=torch.sigmoid(logits),
            gamma=gamma,
            cache=cache,
            vote_logits=vote_logits,
            vote_share=vote_share,
        )

    def _answer_logits(self, readout, gamma, vote_logits, vote_share) -> torch.Tensor:
        """Per-answer logits before logit averaging, `(A,)` float32, from the readout `(A, d)` and the features."""
        features = readout + self.gamma_mlp(gamma[:, None].to(readout.dtype))
        if vote_share is not None:
            vote = torch.stack([vote_share, torch.sigmoid(vote_logits)], -1)
            features = features + self.vote_mlp(vote.to(readout.dtype))
        logits = self.head(features).squeeze(-1).float()
        if self.config.gamma_skip:
            # Per answer and before averaging, so the cache's raw logits and logit averaging include it. On γ itself,
            # not logit(γ): γ = 1 is common (unanimous groups) and the guard's calibrated self-consistency is Platt
            # on γ, so (w, b) from the same fit reproduce that baseline exactly.
            logits = logits + self.gamma_skip_weight.float() * gamma + self.gamma_skip_bias.float()
        if vote_share is not None:
            weight = self.vote_skip_weight.float()
            logits = logits + weight[0] * vote_share + weight[1] * vote_logits + self.vote_skip_bias.float()
        return logits

    def _vote(self, hidden_states, token_answer, every: dict, cache, rows) -> tuple[torch.Tensor, torch.Tensor]:
        """The vote pathway for the new answers: their single-chain logits `(A,)` (the head on each answer's last
        token) and weighted vote shares `(A,)` over every answer available to them, cached ones included."""
        num_answers = len(every["group"]) - (cache.num_answers if cache is not None else 0)
        positions = torch.arange(len(token_answer), device=token_answer.device)
        last = torch.full((num_answers,), -1, dtype=torch.long, device=token_answer.device).scatter_reduce(
            0, token_answer, positions, reduce="amax"
        )
        own = self.vote_head(hidden_states.to(device=token_answer.device, dtype=self.dtype)[last]).float()
        probabilities = torch.sigmoid(own)
        if rows is not None and cache is not None:  # online: the cached answers vote too
            probabilities = torch.cat([torch.sigmoid(cache.answers["vote_logit"]), probabilities])
        share = weighted_vote_share(
            probabilities,
            every["group"],
            every["end"],
            every["class"],
            self.config.streaming,
            self.config.vote_threshold,
            rows=rows,
        )
        return own, share

    def _encode(self, hidden_states, token_answer, new: dict, offset: int, cache) -> torch.Tensor:
        """The blocks over the packed tokens; returns one readout vector per new answer, `(A, d)`."""
        device, num_answers = token_answer.device, len(new["group"])
        meta, order, key_lo, key_hi = _sorted_tokens(new, token_answer, offset, cache, self.config.streaming)
        x = hidden_states.to(device=device, dtype=self.dtype)[order] + self.sequence_embedding(meta[SEQUENCE])
        # With last-token readout the last block is queried only at each answer's last token (exact: no other
        # output of that block is read), which cuts its attention and MLP by ~L×.
        positions = torch.arange(len(order), device=device)
        last = torch.full((num_answers,), -1, dtype=torch.long, device=device).scatter_reduce(
            0, token_answer, positions, reduce="amax"
        )  # each answer's last token, in the caller's order
        last_rows, answer_of_row = torch.sort(torch.argsort(order)[last])  # the same tokens, in sorted order
        try:
            for i, layer in enumerate(self.layers):
                final = i == len(self.layers) - 1 and self.config.readout == "last"
                x = layer(x, meta, key_lo, key_hi, cache, query_rows=last_rows if final else None)
        except BaseException:
            if cache is not None:
                cache.rollback()
            raise
        if not self.layers and self.config.readout == "last":
            x = x[last_rows]  # no block (the ablation): the readout is each answer's own last-token state
        if self.config.readout == "mean":
            sorted_answer = meta[ANSWER] - offset
            summed = torch.zeros(num_answers, x.shape[1], dtype=x.dtype, device=device).index_add_(0, sorted_answer, x)
            return summed / torch.bincount(sorted_answer, minlength=num_answers).clamp(min=1)[:, None].to(x.dtype)
        readout = torch.empty_like(x)
        readout[answer_of_row] = x
        return readout


def _with_cached_answers(new: dict, cache) -> dict:
    """The fields of every answer the call scores against, `(A_cached + A,)` each: the cached answers, then `new`.

    Online scoring needs the new answers in end-time order after the cached ones of their group; checked here."""
    if cache is None or not cache.num_answers:
        return new
    old = cache.answers
    for g in torch.unique(new["group"]).tolist():
        cached_end = old["end"][old["group"] == g]
        # Strict: answers that end together see each other, so they must arrive in the same call.
        if len(cached_end) and new["end"][new["group"] == g].min() <= cached_end.max():
            raise ValueError(
                f"online scoring needs answers in end-time order, but group {g} has a new "
                f"answer ending no later than an already cached one ({int(cached_end.max())}); "
                "score answers that end at the same time in one call."
            )
    return {k: torch.cat([old[k], v]) for k, v in new.items()}


def _sorted_tokens(new: dict, token_answer, offset: int, cache, streaming: bool):
    """Sort the tokens by (group, end, answer): each answer stays contiguous, and every query's allowed keys become
    one window [group start, last key that ended no later), which the chunked backend alone visits.

    Returns (meta `(5, T)` sorted, order `(T,)`, key_lo, key_hi: lists of T ints); with a cache, the cache is told
    the new tokens' metadata and the window is every token of their groups, cached and new (`MSVCache.update`)."""
    num_answers = len(new["group"])
    answer_ids = torch.arange(num_answers, device=token_answer.device) + offset
    meta = torch.stack([new["group"], new["sequence"], answer_ids, new["class"], new["end"]])[:, token_answer]
    order = torch.argsort(meta[ANSWER], stable=True)
    if streaming:
        order = order[torch.argsort(meta[END][order], stable=True)]
    order = order[torch.argsort(meta[GROUP][order], stable=True)]
    meta = meta[:, order]
    if cache is not None:
        cache.begin(meta)
        window = cache.visible_meta.shape[1]
        return meta, order, [0] * len(order), [window] * len(order)
    group_key = meta[GROUP] * (int(meta[END].max()) + 1) + meta[END] if streaming and len(order) else meta[GROUP]
    key_lo = torch.searchsorted(meta[GROUP], meta[GROUP]).tolist()
    key_hi = torch.searchsorted(group_key, group_key, right=True).tolist()
    return meta, order, key_lo, key_hi


def check_compatible(verifier, model) -> None:
    """Raise a clear error if `verifier` cannot read `model`'s hidden states.

    Args:
        verifier: the `MSVVerifier`, or anything with ``config.hidden_size`` (a scorer).
        model: the LM whose hidden states it will read.

    Raises:
        ValueError: if the LM's hidden size differs from the verifier's.
    """
    lm_width = model.config.get_text_config().hidden_size
    if lm_width != verifier.config.hidden_size:
        raise ValueError(
            f"The verifier reads hidden states of width {verifier.config.hidden_size} (trained on "
            f"{verifier.config.base_model_name_or_path!r}) but the LM {model.config.name_or_path!r} has hidden size "
            f"{lm_width}."
        )


# Saved verifiers carry this file (and what it imports) and an ``auto_map``, so that
# ``AutoModel.from_pretrained(repo, trust_remote_code=True)`` loads them without hf_msv.
MSVVerifier.register_for_auto_class("AutoModel")

__all__ = [
    "MSVVerifier",
    "MSVPreTrainedModel",
    "MSVOutput",
    "MSVCache",
    "compute_gamma",
    "average_logits",
    "weighted_vote_share",
    "split_into_groups",
    "build_masks",
    "check_compatible",
]
