"""Copying batch rows of a transformers `Cache`, attention and recurrent layers alike, and rewinding recurrent states.

A branch starts as a copy of some rows of the live decoding cache (`fork_cache`). Attention layers can drop a
row's trailing tokens from a branch by masking them (see `forking`); recurrent layers (conv, SSM and
linear-attention states) have folded every consumed token into a fixed-size state and cannot. So when a branch
must leave out the last d tokens already consumed (a delimiter's earlier tokens), its recurrent layers start from
the state saved *before* those tokens: `RecurrentHistory` keeps such states, `branch_cache` builds the branch.

Supported layers (transformers 5.x, the `DynamicCache` that ``generate`` builds for decoder LMs):

* ``DynamicLayer``, ``DynamicSlidingWindowLayer``, ``DynamicIndexedLayer`` (keys/values, and indexer keys):
  Llama-style, sliding-window and sparse-attention models.
* ``LinearAttentionLayer`` (conv and recurrent states): Mamba, Mamba-2, FalconMamba, LFM2's conv layers, the
  linear-attention / SSM layers of Qwen3-Next, Jamba, Bamba, Falcon-H1, GraniteMoeHybrid (all tested).
* ``LinearAttentionAndFullAttentionLayer``, ``LinearAttentionAndSlidingWindowAttentionLayer`` (both kinds in one
  layer), and ``DummyLayer`` (layers that hold nothing).

Every fork gathers its rows with the layer's own ``reorder_cache`` (``index_select``, so repeated rows are allowed)
into new tensors. That is what keeps the live cache untouched: `DynamicLayer.update` concatenates into new tensors,
but `LinearAttentionLayer.update_conv_state` / ``update_recurrent_state`` write *in place* (``copy_``), so a fork
must never share a recurrent tensor with the live cache. Static, quantized and offloaded caches, and any
model-specific layer class not listed above, raise `NotImplementedError` naming the layer and what would be needed.

**Memory cost of the history.** Each saved row costs one copy of that row's recurrent states,
``recurrent_state_bytes(cache)`` (the sum over recurrent layers of the conv ``channels x kernel`` and recurrent state
elements times their element size; attention keys/values are never copied): 120 KiB for LFM2-1.2B's shapes (10 conv
layers, 2048 channels x 3, bf16), 74 MiB at `Qwen3NextConfig` defaults (the 80B-A3B shapes: 36 gated-delta-rule
layers, bf16 conv and fp32 recurrent states), 32 MiB at `FalconH1Config` defaults (32 Mamba-2 layers). The session
saves a row at step s only when its token s may *start* a delimiter that completes at a later token
(`DelimiterMatcher.could_start`: the text ends with a proper prefix of a delimiter beginning in that token, such as
"Wa" for "Wait") and discards the save at the first step where that occurrence can no longer complete, so usually
after one step; the horizon (the matcher's token window) bounds it in any case. Measured by
``benchmarks/recurrent_history.py`` (SmolLM2's tokenizer on the paper's text): 0.09 % of tokens start a save for
"Wait" (always one token there, so no save is ever read), held 1.6 steps on average, and 4.4 % for "\\n\\n" (89 % of
its occurrences are two tokens), held 1.0 step; at N = 64 that is about 6 MiB ("Wait") and 210 MiB ("\\n\\n") held
on average for Qwen3-Next-80B-A3B.
With ``keep_delimiter=True``, every-K or terminal elicitation, or a model without recurrent layers, nothing is saved.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Hashable, Sequence

import torch
import transformers
from packaging import version
from transformers import cache_utils
from transformers.cache_utils import (
    Cache,
    DynamicIndexedLayer,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionAndFullAttentionLayer,
    LinearAttentionCacheLayerMixin,
    LinearAttentionLayer,
)

__all__ = [
    "RecurrentHistory",
    "attention_length",
    "branch_cache",
    "cache_argument",
    "fork_cache",
    "has_recurrent_state",
    "output_cache",
    "recurrent_state_bytes",
]


# Recurrent layers keep their conv / recurrent states in per-state dicts from transformers 5.14.0 on (tensors before).
_DICT_STATES = version.parse(transformers.__version__).release >= (5, 14)


def _optional(*names: str) -> tuple[type, ...]:
    """The layer classes among `names` that this transformers has (`DummyLayer` and
    `LinearAttentionAndSlidingWindowAttentionLayer` came after 5.12.0, the oldest release hf_msv supports)."""
    return tuple(getattr(cache_utils, name) for name in names if hasattr(cache_utils, name))


# Exact classes only: a subclass (a quantized layer, a model's own layer) may hold state that these do not gather.
_KV_LAYERS = (DynamicLayer, DynamicSlidingWindowLayer, DynamicIndexedLayer, *_optional("DummyLayer"))
_RECURRENT_LAYERS = (LinearAttentionLayer, LinearAttentionAndFullAttentionLayer,
                     *_optional("LinearAttentionAndSlidingWindowAttentionLayer"))


def _check_forkable(cache: Cache) -> None:
    """Raise `NotImplementedError` naming what `fork_cache` would need for a cache it does not support."""
    if getattr(cache, "offloading", False):
        raise NotImplementedError("MSV generation cannot fork an offloaded cache: it would need each layer fetched "
                                  "back to the accelerator before the gather (use a cache without offloading).")
    for layer in cache.layers:
        kind = type(layer)
        if kind in _RECURRENT_LAYERS and not _DICT_STATES:
            raise NotImplementedError(
                f"MSV generation forks {kind.__name__} cache layers with transformers >= 5.14.0 (where conv and "
                f"recurrent states are per-state dicts); this is transformers {transformers.__version__}.")
        if kind in _KV_LAYERS or kind in _RECURRENT_LAYERS:
            continue
        if "Static" in kind.__name__:
            need = ("a dynamic cache (leave cache_implementation unset); a static layer would need its preallocated "
                    "tensors gathered by row and a write position per row")
        elif "Quantized" in kind.__name__:
            need = "a dynamic cache (no cache_implementation='quantized'), or its quantized tensors gathered by row"
        else:
            need = "a row gather of every tensor this layer holds (its reorder_cache) added to hf_msv.generation.caches"
        raise NotImplementedError(f"MSV generation cannot fork a {kind.__name__} cache layer: it would need {need}.")


# What an LM's forward calls its cache: transformers >= 5.24 takes (and returns) it as `cache` on every model, before
# that as `past_key_values`, or `cache_params` on Mamba-style LMs. Passing an old name to 5.24 goes through a
# deprecation shim that Mamba's does not honour, so the name is read from the forward's signature.
_CACHE_NAMES = ("cache", "cache_params", "past_key_values")


def cache_argument(model) -> str:
    """The keyword `model`'s forward takes its cache under (`cache`, `cache_params` or `past_key_values`)."""
    parameters = inspect.signature(model.forward).parameters
    return next((name for name in _CACHE_NAMES if name in parameters), "past_key_values")


def output_cache(outputs) -> Cache | None:
    """The cache a forward or ``generate`` step returned, under whichever name this transformers / LM uses."""
    for name in _CACHE_NAMES:
        cache = getattr(outputs, name, None)
        if cache is not None:
            return cache
    return None


def _is_recurrent(layer) -> bool:
    return isinstance(layer, LinearAttentionCacheLayerMixin)


def has_recurrent_state(cache: Cache) -> bool:
    """Whether `cache` has conv / SSM / linear-attention states (which cannot be cropped or masked)."""
    return any(_is_recurrent(layer) for layer in cache.layers)


def attention_length(cache: Cache) -> int | None:
    """Tokens held by the first attention (key/value) layer of `cache`, or `None` if it has none (Mamba)."""
    for layer in cache.layers:
        if isinstance(layer, DynamicLayer):
            return layer.get_seq_length()
    return None


def _batch_size(cache: Cache) -> int | None:
    for layer in cache.layers:
        for tensor in (*_kv_tensors(layer), *_recurrent_tensors(layer)):
            return tensor.shape[0]
    return None


def _kv_tensors(layer) -> list[torch.Tensor]:
    """The key and value tensors of a layer, `(batch, heads, tokens, head_dim)` each; none before any token."""
    if isinstance(layer, DynamicLayer) and layer.is_initialized and layer.get_seq_length() > 0:
        return [layer.keys, layer.values]
    return []


def _recurrent_tensors(layer) -> list[torch.Tensor]:
    """The conv states `(batch, channels, kernel)` and recurrent states `(batch, ...)` of a layer."""
    if not _is_recurrent(layer):
        return []
    return [s for states in (layer.conv_states, layer.recurrent_states) for s in states.values() if s is not None]


def fork_cache(cache: Cache, rows: torch.Tensor | Sequence[int]) -> Cache:
    """A new cache holding copies of the `rows` of `cache`; `cache` itself is never modified.

    Args:
        cache: a transformers `Cache` of supported layers (module docstring), as built by ``generate``.
        rows: `(n,)` batch rows to copy, in the order wanted in the fork; a row may repeat.

    Returns:
        A cache of batch size n. Its layers are shallow copies whose tensors are replaced by gathered ones (and
        whose per-state dicts are copied), so later updates of the fork, in place or not, never reach `cache`.
        Key/value layers are not gathered when `rows` is every row in order (their updates concatenate into new
        tensors anyway); recurrent layers always are, because their updates write in place.
    """
    _check_forkable(cache)
    batch = _batch_size(cache)
    rows = torch.as_tensor(rows, dtype=torch.long)
    identity = batch is not None and len(rows) == batch and torch.equal(rows.cpu(), torch.arange(batch))
    fork = copy.copy(cache)
    fork.layers = [_fork_layer(layer, rows, identity) for layer in cache.layers]
    return fork


def _fork_layer(layer, rows: torch.Tensor, identity: bool):
    """A copy of one cache layer holding `rows` (every row as it is when `identity`), sharing nothing written."""
    fork = copy.copy(layer)
    for name, value in vars(layer).items():
        if isinstance(value, dict):  # conv_states, recurrent_states, has_previous_state, ...: per-fork entries
            setattr(fork, name, dict(value))
    if _is_recurrent(layer) or not identity:
        device = next(iter(_kv_tensors(layer) + _recurrent_tensors(layer)), rows).device
        fork.reorder_cache(rows.to(device))  # index_select into new tensors, for every state the layer holds
    return fork


def recurrent_state_bytes(cache: Cache) -> int:
    """Bytes of one batch row's recurrent states (conv + recurrent, all layers): the cost of one saved row."""
    return sum(t[0].numel() * t.element_size() for layer in cache.layers for t in _recurrent_tensors(layer))


class RecurrentHistory:
    """Recurrent states of chosen rows, saved at chosen steps, so a branch can leave out tokens already consumed.

    A loop calls `save` at step s with the live cache *before* the token of step s is fed to the LM (in
    ``generate``: when the stopping criteria see token s), for the rows whose token s may start a delimiter, and
    `discard` once that delimiter can no longer complete; `forget` bounds what is kept in any case. `branch_cache`
    reads the state of a branch that drops d consumed tokens at step t from the save at step t - d. Rows are
    identified by keys (any hashable; the batch row by default), so a loop that compacts its batch can keep
    stable sequence ids.

    Args:
        horizon: the largest number of consumed tokens a branch may drop; `forget` drops saves older than that.
    """

    def __init__(self, horizon: int):
        if horizon < 1:
            raise ValueError(f"horizon must be at least 1, got {horizon}.")
        self.horizon = horizon
        # (key, step) -> per layer index, the layer's conv and recurrent states of that row: (kind, state_idx) -> tensor
        self._saves: dict[tuple[Hashable, int], dict[int, dict[tuple[str, int], torch.Tensor]]] = {}

    def save(self, cache: Cache, rows: Sequence[int], step: int, keys: Sequence[Hashable] | None = None) -> None:
        """Copy the recurrent states of batch `rows` of `cache` as their states before the token of `step`."""
        rows = [int(r) for r in rows]
        for row, key in zip(rows, rows if keys is None else keys):
            self._saves[key, step] = {
                index: {(kind, i): s[row].clone() for kind, states in _named_states(layer)
                        for i, s in states.items() if s is not None}
                for index, layer in enumerate(cache.layers) if _is_recurrent(layer)}

    def steps(self, key: Hashable) -> list[int]:
        """The steps at which `key`'s states are saved."""
        return [step for k, step in self._saves if k == key]

    def discard(self, key: Hashable, step: int) -> None:
        """Drop the save of `key` at `step` (no branch will need it)."""
        self._saves.pop((key, step), None)

    def forget(self, step: int) -> None:
        """Drop the saves no branch at `step` or later can need (older than ``step - horizon``)."""
        for old in [saved for saved in self._saves if saved[1] < step - self.horizon]:
            del self._saves[old]

    @property
    def nbytes(self) -> int:
        """Bytes held by the saved states now."""
        return sum(t.nbytes for layers in self._saves.values() for states in layers.values() for t in states.values())

    def restore(self, fork: Cache, row: int, key: Hashable, step: int) -> None:
        """Write the state saved for `key` at `step` into batch `row` of `fork` (a cache from `fork_cache`)."""
        if (key, step) not in self._saves:
            raise RuntimeError(
                f"no recurrent state saved for sequence {key!r} before step {step}: a branch of a recurrent model "
                f"can only drop tokens whose first one was saved (DelimiterMatcher.could_start).")
        for index, saved in self._saves[key, step].items():
            states = dict(_named_states(fork.layers[index]))
            for (kind, i), state in saved.items():
                states[kind][i][row] = state  # the fork's own tensor (gathered by fork_cache)


def _named_states(layer) -> list[tuple[str, dict[int, torch.Tensor | None]]]:
    return [("conv", layer.conv_states), ("recurrent", layer.recurrent_states)]


def branch_cache(cache: Cache, rows: Sequence[int], drops: Sequence[int], step: int,
                 history: RecurrentHistory | None = None, keys: Sequence[Hashable] | None = None) -> Cache:
    """The cache of branches off `rows` of `cache` at `step`, branch i leaving out its last `drops[i]` tokens.

    Recurrent layers of a branch with ``drops[i] > 0`` start from the state saved before step ``step - drops[i]``;
    attention layers still hold the dropped tokens, which the caller hides with the attention mask and by
    numbering the branch's new tokens from the first dropped position (see `forking`). `cache` is not modified.

    Args:
        cache: the live cache, holding every token before the newest one of `step`.
        rows: `(n,)` batch rows that branch.
        drops: n counts of trailing consumed tokens each branch leaves out.
        step: the current step.
        history: the saved recurrent states; needed only if the cache is recurrent and some drop is positive.
        keys: the ids `history` saved the rows under (default: the rows).
    """
    fork = fork_cache(cache, rows)
    if not any(drops) or not has_recurrent_state(cache):
        return fork
    if history is None:
        raise RuntimeError("a branch that leaves out consumed tokens of a recurrent cache needs a RecurrentHistory.")
    keys = [int(r) for r in rows] if keys is None else list(keys)
    for i, (key, drop) in enumerate(zip(keys, drops)):
        if drop:
            history.restore(fork, i, key, step - drop)
    return fork
