"""Copying batch rows of a transformers `Cache` into branch rows, and what a branch needs to leave tokens out.

`fork_cache` copies rows (every layer type of the table in ``docs/caches.md``; anything else is refused with an
`UnsupportedError`, a `NotImplementedError`, naming the cache class, layer or attribute, see `check_forkable`).
`check_decodable` (before the prefill) and `check_prefilled` (after it) refuse an LM that keeps its decoding state
anywhere but a cache the loop can fork: a model kwarg, a ``state`` argument, its own modules. `branch_cache` builds the
rows of branches that leave out their last d consumed tokens: on attention layers the row's cached tokens move d
slots later (the caller masks the d slots that wrap to the front), on recurrent layers the row starts from the state
`RecurrentHistory` saved before those tokens. `widen_windows` makes sliding-window and chunked layers keep the
extra tokens such a branch still needs. Design, exactness argument and memory costs: ``docs/caches.md``.
"""

from __future__ import annotations

import copy
import inspect
from collections import UserDict
from collections.abc import Hashable, Sequence

import torch
import transformers
from packaging import version
from transformers import cache_utils
from transformers.cache_utils import (
    Cache,
    DynamicCache,
    DynamicIndexedLayer,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionAndFullAttentionLayer,
    LinearAttentionCacheLayerMixin,
    LinearAttentionLayer,
)

from ..errors import UnsupportedError

__all__ = [
    "RecurrentHistory",
    "attention_length",
    "branch_cache",
    "cache_argument",
    "check_decodable",
    "check_forkable",
    "check_prefilled",
    "fork_cache",
    "has_recurrent_state",
    "module_state",
    "output_cache",
    "recurrent_state_bytes",
    "widen_windows",
]


# Recurrent layers keep their conv / recurrent states in per-state dicts from transformers 5.14.0 on (tensors before).
_DICT_STATES = version.parse(transformers.__version__).release >= (5, 14)


def _optional(*names: str) -> tuple[type, ...]:
    """The layer classes among `names` that this transformers has (`DummyLayer` and
    `LinearAttentionAndSlidingWindowAttentionLayer` came after 5.12.0, the oldest release hf_msv supports)."""
    return tuple(getattr(cache_utils, name) for name in names if hasattr(cache_utils, name))


# Exact classes only: a subclass (a quantized layer, a model's own layer) may hold state that these do not gather.
_KV_LAYERS = (DynamicLayer, DynamicSlidingWindowLayer, DynamicIndexedLayer, *_optional("DummyLayer"))
_RECURRENT_LAYERS = (
    LinearAttentionLayer,
    LinearAttentionAndFullAttentionLayer,
    *_optional("LinearAttentionAndSlidingWindowAttentionLayer"),
)


# Where a supported cache and its layers may hold tensors. A tensor anywhere else is state that a row copy would not
# gather (MiniMaxCache.linear_cache, an attribute a model adds), so the cache is refused rather than half-forked.
_CACHE_STATE = frozenset({"layers"})
_LAYER_STATE = frozenset(
    {
        "keys",
        "values",
        "indexer_keys",
        "indexer_position_ids",
        "conv_states",
        "recurrent_states",
        "_sliding_window_tensor",
        "cumulative_length_linear",
    }
)  # the last two are 0-d tensors without rows: the window size and (transformers >= 5.25) a linear layer's length


def _holds_tensor(value, depth: int = 0) -> bool:
    """Whether `value` is a tensor or holds one (in containers or plain objects, a few levels deep)."""
    if isinstance(value, torch.Tensor):
        return True
    if depth >= 4 or isinstance(value, (type, str, bytes)):
        return False
    if isinstance(value, (dict, UserDict)):
        return any(_holds_tensor(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_holds_tensor(v, depth + 1) for v in value)
    return hasattr(value, "__dict__") and any(_holds_tensor(v, depth + 1) for v in vars(value).values())


def _alternative(name: str, generic: str) -> str:
    """What `name` (a cache or layer class) would need, or what to use instead."""
    if "Static" in name:
        return (
            "a dynamic cache (leave cache_implementation unset); a static layer would need its preallocated "
            "tensors gathered by row and a write position per row"
        )
    if "Quantized" in name:
        return "a dynamic cache (no cache_implementation='quantized'), or its quantized tensors gathered by row"
    return generic


def check_forkable(cache: Cache, owner: str | None = None) -> None:
    """Raise `UnsupportedError` naming what keeps `fork_cache` from copying rows of `cache` exactly.

    The whole object is inspected: offloading, every attribute of the cache that holds tensors (not only
    ``cache.layers``), the cache class (transformers' `DynamicCache` only), and each layer's class and tensor
    attributes. Supported and refused types, with their messages: ``docs/caches.md``.

    Args:
        cache: the cache to check.
        owner: the LM's class name, named in the messages (``"MiniMaxForCausalLM"``).

    Raises:
        UnsupportedError: (a `NotImplementedError`) naming the cache class, the attribute
            (``MiniMaxCache.linear_cache``) or the layer class.
    """
    kind = type(cache).__name__
    of = f" (the cache of {owner})" if owner else ""
    if getattr(cache, "offloading", False):
        raise UnsupportedError(
            f"MSV generation cannot fork an offloaded cache{of}: it would need each layer fetched "
            "back to the accelerator before the gather (use a cache without offloading)."
        )
    for name, value in vars(cache).items():
        if name not in _CACHE_STATE and _holds_tensor(value):
            raise UnsupportedError(
                f"MSV generation cannot fork {kind}{of}: {kind}.{name} holds per-row state outside cache.layers "
                f"that hf_msv.generation.caches does not know how to copy by row (supported caches: docs/caches.md)."
            )
    for layer in getattr(cache, "layers", ()):
        _check_layer(layer, of)
    if type(cache) is not DynamicCache:
        need = _alternative(kind, "its own row copy added to hf_msv.generation.caches")
        raise UnsupportedError(
            f"MSV generation cannot fork {kind}{of}: it forks transformers' DynamicCache only (a model-specific or "
            f"other cache class may keep or read state that a row copy does not reproduce); it would need {need} "
            f"(supported caches: docs/caches.md)."
        )


def _check_layer(layer, of: str = "") -> None:
    kind = type(layer)
    name = kind.__name__
    if kind in _RECURRENT_LAYERS and not _DICT_STATES:
        raise UnsupportedError(
            f"MSV generation forks {name} cache layers{of} with transformers >= 5.14.0 (where conv and recurrent "
            f"states are per-state dicts); this is transformers {transformers.__version__}."
        )
    if kind not in _KV_LAYERS and kind not in _RECURRENT_LAYERS:
        need = _alternative(
            name, "a row gather of every tensor it holds (its reorder_cache) added to hf_msv.generation.caches"
        )
        raise UnsupportedError(f"MSV generation cannot fork a {name} cache layer{of}: it would need {need}.")
    for attribute, value in vars(layer).items():
        if attribute not in _LAYER_STATE and _holds_tensor(value):
            raise UnsupportedError(
                f"MSV generation cannot fork a {name} cache layer{of} holding a tensor in {name}.{attribute}: "
                f"hf_msv.generation.caches does not know how to copy it by row (supported layers: docs/caches.md)."
            )


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


# What the user can do about an LM whose decoding state the loop cannot fork (the end of every such refusal).
_INSTEAD = (
    "Use an LM whose decoding state transformers keeps in a DynamicCache (the supported models and layers: "
    "docs/caches.md), or give this state a row copy in hf_msv.generation.caches; plain generate (without "
    "prepare_generation) still samples this LM, without MSV answers."
)
# Forward arguments that carry decoding state under a name other than a cache's (RWKV's `state`, Transformer-XL's
# `mems`, `*_state(s)`); flags and inputs that merely end that way are not state.
_STATE_ARGUMENTS = ("state", "states", "mems", "memory")
_NOT_STATE = ("output_", "return_", "encoder_", "image_", "vision_", "audio_", "video_", "pixel_")
# Model outputs that are no decoding state.
_NOT_STATE_OUTPUTS = frozenset({"loss", "logits", "hidden_states", "attentions", "last_hidden_state"})


def _refusal(owner: str, cause: str) -> UnsupportedError:
    return UnsupportedError(f"MSV generation cannot fork the decoding state of {owner}: {cause}. {_INSTEAD}")


def _is_state_name(name: str) -> bool:
    """Whether an argument or output named `name` (not a cache's name) is named like decoding state."""
    return (
        name not in _CACHE_NAMES
        and not name.startswith(_NOT_STATE)
        and name != "hidden_states"
        and (name in _STATE_ARGUMENTS or name.endswith(("_state", "_states")))
    )


def _state_arguments(model) -> list[str]:
    """The forward's arguments, other than a cache argument, named like decoding state (`state`, `*_states`)."""
    return [name for name in inspect.signature(model.forward).parameters if _is_state_name(name)]


def _module_cache_setup(model) -> str | None:
    """The model class that defines ``_setup_cache`` (per-row state written onto its own modules), if one does."""
    for cls in type(model).__mro__:
        if "_setup_cache" in vars(cls) and not cls.__module__.startswith(
            ("transformers.modeling_utils", "transformers.generation")
        ):
            return cls.__name__
    return None


def module_state(model) -> dict[str, torch.Tensor]:
    """Tensors that the modules of `model` hold as plain attributes (neither parameters nor buffers), by dotted name.

    Snapshot it before a forward and compare with `check_prefilled`: a forward that (re)assigns per-row tensors
    there keeps decoding state outside any cache (RecurrentGemma's ``rg_lru.recurrent_states``).
    """
    return {
        f"{prefix}.{attribute}" if prefix else attribute: value
        for prefix, module in model.named_modules()
        for attribute, value in vars(module).items()
        if isinstance(value, torch.Tensor)
    }


def check_decodable(model, model_kwargs: dict | None = None, use_cache: bool | None = True) -> None:
    """Refuse, before any forward, an LM whose decoding state the lockstep loop could not fork per answer branch.

    The loop feeds each forward ``input_ids``, the 2D ``attention_mask``, ``position_ids`` and one cache under the
    forward's cache argument (`cache_argument`), and forks that cache's rows (`check_forkable`). Refused, naming the
    LM class and where its state is:

    * ``use_cache=False``: there is no cache to fork;
    * a forward that takes no cache argument but a state one (RWKV's ``state``): state outside any `Cache`;
    * a model kwarg that holds state under another name than a cache argument (a `Cache`, a container or object of
      tensors, or a tensor under a state-named argument): the loop would neither pass it on nor copy it;
    * the cache ``generate`` prepared, when `check_forkable` refuses it, or an object that is no `Cache`;
    * a model class with its own ``_setup_cache`` (RecurrentGemma): it writes per-row state onto its modules;
    * an attention mask that is not 2D.

    State that only the prefill reveals (tensors a forward writes onto modules, a state output) is refused by
    `check_prefilled`, still before any decoding step.

    Args:
        model: the LM.
        model_kwargs: the model kwargs ``generate`` hands the decoding loop (default: none).
        use_cache: ``generate``'s ``use_cache``.

    Raises:
        UnsupportedError: (a `NotImplementedError`) naming the LM class, the argument, kwarg or class holding the
            state, why it cannot be forked, and what to use instead.
    """
    owner = type(model).__name__
    model_kwargs = model_kwargs or {}
    if use_cache is False or model_kwargs.get("use_cache") is False:
        raise UnsupportedError(
            f"MSV generation needs the cache of the decoding loop, which {owner}.generate was "
            "called without: call generate with use_cache=True (the default), so each answer "
            "branch can start from a copy of its sequence's cache."
        )
    parameters = inspect.signature(model.forward).parameters
    states = _state_arguments(model)
    if states and not any(name in parameters for name in _CACHE_NAMES):
        raise _refusal(
            owner,
            f"its forward takes no cache ({', '.join(_CACHE_NAMES)}) but carries its state in "
            f"its {' and '.join(f'`{s}`' for s in states)} argument, tensors outside any "
            "transformers Cache that the decoding loop can neither pass on nor copy per answer "
            "branch",
        )
    for key, value in model_kwargs.items():
        if value is None:
            continue
        if key in _CACHE_NAMES:
            if isinstance(value, Cache):
                check_forkable(value, owner)
            elif _holds_tensor(value):
                raise _refusal(
                    owner,
                    f"generate passes it a {type(value).__name__} as `{key}`, not a transformers "
                    "Cache, so hf_msv.generation.caches cannot copy its rows per answer branch",
                )
        elif (
            isinstance(value, Cache)
            or (key in states and _holds_tensor(value))
            or (not isinstance(value, torch.Tensor) and _holds_tensor(value))
        ):
            raise _refusal(
                owner,
                f"generate carries its state in the model kwarg `{key}` ({type(value).__name__}), "
                f"not in the forward's cache argument `{cache_argument(model)}`, so the decoding "
                "loop would neither pass it on to later forwards nor copy it per answer branch",
            )
    defined_by = _module_cache_setup(model)
    if defined_by is not None:
        raise _refusal(
            owner,
            f"it keeps per-row recurrent state on its own modules ({defined_by}._setup_cache "
            "writes it there), outside the cache generate passes to its forward, so every answer "
            "branch would read and overwrite the state of the sequence it forked from",
        )
    mask = model_kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() != 2:
        raise UnsupportedError(
            f"MSV generation needs a 2D attention mask (batch, tokens); {owner}.generate was "
            f"given a {mask.dim()}D one: pass a 2D attention_mask, or none."
        )


def check_prefilled(model, outputs, before: dict[str, torch.Tensor], batch: int) -> Cache:
    """The cache the prefill returned, or a refusal naming the LM class and where it keeps its decoding state.

    Args:
        model: the LM, right after the prefill.
        outputs: the prefill's output.
        before: `module_state` of the LM before the prefill.
        batch: rows of the prefill (module state is looked for only when there are several).

    Raises:
        UnsupportedError: the prefill wrote per-row tensors onto the LM's modules (not parameters or buffers), it
            returned its state under another name than a cache's (instead of a cache, or beside one under a state
            name), it returned no cache, or `check_forkable` refuses the cache it returned; always before any
            decoding step.
    """
    owner = type(model).__name__
    # Tensors (re)assigned by the prefill with a row per batch row; with one row, a (1, ...) constant such as a
    # remote-code rotary table looks the same, so a one-row batch is not checked here.
    written = [
        name
        for name, tensor in module_state(model).items()
        if batch > 1 and before.get(name) is not tensor and tensor.dim() > 0 and tensor.shape[0] == batch
    ]
    if written:
        shown = ", ".join(written[:3]) + (f" and {len(written) - 3} more" if len(written) > 3 else "")
        raise _refusal(
            owner,
            f"its forward keeps per-row recurrent state on its own modules (the prefill wrote "
            f"{shown}), outside the cache generate passes to it, so every answer branch would "
            "read and overwrite the state of the sequence it forked from",
        )
    cache = output_cache(outputs)
    keys = list(outputs.keys()) if hasattr(outputs, "keys") else []
    beside = [k for k in keys if _is_state_name(k) and _holds_tensor(outputs[k])]
    if cache is not None and beside:
        raise _refusal(
            owner,
            f"its forward returns state as {' and '.join(f'`{k}`' for k in beside)} beside its "
            "cache, which the decoding loop can neither pass on nor copy per answer branch",
        )
    if cache is None:
        other = [k for k in keys if k not in _NOT_STATE_OUTPUTS and _holds_tensor(outputs[k])]
        if other:
            raise _refusal(
                owner,
                f"its forward returns its state as {' and '.join(f'`{k}`' for k in other)}, not "
                f"as a transformers Cache under {', '.join(_CACHE_NAMES)}, so the decoding loop "
                "can neither pass it on nor copy it per answer branch",
            )
        raise _refusal(
            owner,
            f"its forward returned no cache ({', '.join(_CACHE_NAMES)}) with use_cache=True, so "
            "there is nothing an answer branch could start from",
        )
    check_forkable(cache, owner)
    return cache


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
        return [t for t in (layer.keys, layer.values) if t is not None]
    return []


def _recurrent_tensors(layer) -> list[torch.Tensor]:
    """The conv states `(batch, channels, kernel)` and recurrent states `(batch, ...)` of a layer."""
    if not _is_recurrent(layer):
        return []
    return [s for states in (layer.conv_states, layer.recurrent_states) for s in states.values() if s is not None]


def fork_cache(cache: Cache, rows: torch.Tensor | Sequence[int]) -> Cache:
    """A new cache holding copies of the `rows` of `cache`; `cache` itself is never modified.

    Args:
        cache: a transformers `DynamicCache` of supported layers (``docs/caches.md``), as built by ``generate``.
        rows: `(n,)` batch rows to copy, in the order wanted in the fork; a row may repeat.

    Returns:
        A cache of batch size n. Its layers are shallow copies whose tensors are replaced by gathered ones (and
        whose per-state dicts are copied), so later updates of the fork, in place or not, never reach `cache`.
        Key/value layers are not gathered when `rows` is every row in order (their updates concatenate into new
        tensors anyway); recurrent layers always are, because their updates write in place.

    Raises:
        NotImplementedError: from `check_forkable`, for a cache it cannot copy exactly.
    """
    check_forkable(cache)
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
        elif isinstance(value, torch.Tensor) and value.dim() == 0:  # a row-less counter, updated in place (add_)
            setattr(fork, name, value.clone())
    if _is_recurrent(layer) or not identity:
        device = next(iter(_kv_tensors(layer) + _recurrent_tensors(layer)), rows).device
        fork.reorder_cache(rows.to(device))  # index_select into new tensors, for every state the layer holds
    return fork


def recurrent_state_bytes(cache: Cache) -> int:
    """Bytes of one batch row's recurrent states (conv + recurrent, all layers): the cost of one saved row.

    Args:
        cache: a transformers `Cache` (layers without recurrent states count 0).

    Returns:
        The size in bytes (int).
    """
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

    Raises:
        ValueError: if `horizon` < 1.
    """

    def __init__(self, horizon: int):
        if horizon < 1:
            raise ValueError(f"horizon must be at least 1, got {horizon}.")
        self.horizon = horizon
        # (key, step) -> per layer index, the layer's conv and recurrent states of that row: (kind, state_idx) ->
        # tensor
        self._saves: dict[tuple[Hashable, int], dict[int, dict[tuple[str, int], torch.Tensor]]] = {}

    def save(self, cache: Cache, rows: Sequence[int], step: int, keys: Sequence[Hashable] | None = None) -> None:
        """Copy the recurrent states of batch `rows` of `cache` as their states before the token of `step`.

        Args:
            cache: the live cache.
            rows: the batch rows to save.
            step: the step whose token has not been fed yet.
            keys: one key per row; `None`: the row indices.
        """
        rows = [int(r) for r in rows]
        for row, key in zip(rows, rows if keys is None else keys):
            self._saves[key, step] = {
                index: {
                    (kind, i): s[row].clone()
                    for kind, states in _named_states(layer)
                    for i, s in states.items()
                    if s is not None
                }
                for index, layer in enumerate(cache.layers)
                if _is_recurrent(layer)
            }

    def steps(self, key: Hashable) -> list[int]:
        """The steps at which `key`'s states are saved.

        Args:
            key: the sequence's key.

        Returns:
            The steps, in save order.
        """
        return [step for k, step in self._saves if k == key]

    def discard(self, key: Hashable, step: int) -> None:
        """Drop the save of `key` at `step` (no branch will need it).

        Args:
            key: the sequence's key.
            step: the save's step (a missing save is ignored).
        """
        self._saves.pop((key, step), None)

    def forget(self, step: int) -> None:
        """Drop the saves no branch at `step` or later can need (older than ``step - horizon``).

        Args:
            step: the current step.
        """
        for old in [saved for saved in self._saves if saved[1] < step - self.horizon]:
            del self._saves[old]

    @property
    def nbytes(self) -> int:
        """Bytes held by the saved states now."""
        return sum(t.nbytes for layers in self._saves.values() for states in layers.values() for t in states.values())

    def restore(self, fork: Cache, row: int, key: Hashable, step: int) -> None:
        """Write the state saved for `key` at `step` into batch `row` of `fork` (a cache from `fork_cache`).

        Args:
            fork: the forked cache, written in place.
            row: the batch row of `fork`.
            key: the sequence's key.
            step: the save's step.

        Raises:
            RuntimeError: if nothing was saved for `key` at `step`.
        """
        if (key, step) not in self._saves:
            raise RuntimeError(
                f"no recurrent state saved for sequence {key!r} before step {step}: a branch of a recurrent model "
                f"can only drop tokens whose first one was saved (DelimiterMatcher.could_start)."
            )
        for index, saved in self._saves[key, step].items():
            states = dict(_named_states(fork.layers[index]))
            for (kind, i), state in saved.items():
                target = states[kind][i]  # the fork's own tensor (gathered by fork_cache)
                assert target is not None, "a state was saved for a layer that holds none"
                target[row] = state


def _named_states(layer) -> list[tuple[str, dict[int, torch.Tensor | None]]]:
    return [("conv", layer.conv_states), ("recurrent", layer.recurrent_states)]


def widen_windows(cache: Cache, margin: int) -> None:
    """Make the sliding-window and chunked-attention layers of `cache` keep `margin` more past tokens.

    A branch that leaves out d consumed tokens still needs the full window (or chunk) before them, which a layer
    keeping ``window - 1`` tokens has already let go. Masks take the window from the model config, so only the stored
    span grows (to ``window - 1 + margin`` tokens); the attention pattern is unchanged. The tokens the prefill let go
    are not brought back: their slots are zero-filled, and they stay outside the window of every main row and every
    branch (a branch leaves out at most as many tokens as were sampled after the prefill).

    Args:
        cache: a cache whose layer objects the caller owns (from `fork_cache`), right after the prefill.
        margin: the most consumed tokens a branch may leave out; 0 leaves the cache as it is.
    """
    if margin < 0:
        raise ValueError(f"margin must be at least 0, got {margin}.")
    for layer in cache.layers:
        if margin and isinstance(layer, DynamicSlidingWindowLayer):
            layer.sliding_window += margin
            _fill_window(layer)
            window = getattr(layer, "_sliding_window_tensor", None)
            if isinstance(window, torch.Tensor):
                layer._sliding_window_tensor = torch.tensor(
                    layer.sliding_window, dtype=window.dtype, device=window.device
                )


def _fill_window(layer: DynamicSlidingWindowLayer) -> None:
    """Zero slots before the stored tokens, up to the length `get_mask_sizes` reports for the widened window."""
    keys, values = layer.keys, layer.values
    if not layer.is_initialized or keys is None or values is None or keys.dim() < 2:
        return
    missing = min(layer.cumulative_length, layer.sliding_window - 1) - keys.shape[-2]
    if missing > 0:
        layer.keys, layer.values = (
            torch.cat([t.new_zeros(*t.shape[:-2], missing, t.shape[-1]), t], dim=-2) for t in (keys, values)
        )


# Attention tensors with a token axis, as (attribute, batch axis, token axis counted from the end).
_TOKEN_AXES = (("keys", 0, -2), ("values", 0, -2), ("indexer_keys", 0, -2), ("indexer_position_ids", 1, -1))


def _shift_rows(source, layer, shifts: dict[int, int]) -> None:
    """Move the cached tokens of batch rows ``shifts`` keys of `layer` that many slots later, wrapping around."""
    if not isinstance(layer, DynamicLayer):
        return
    for name, batch_axis, token_axis in _TOKEN_AXES:
        tensor = getattr(layer, name, None)
        if not isinstance(tensor, torch.Tensor) or tensor.dim() < 2 or tensor.shape[token_axis] == 0:
            continue
        if tensor is getattr(source, name, None):  # not gathered by the fork: never write into the live cache
            tensor = tensor.clone()
        for row, shift in shifts.items():
            view = tensor.select(batch_axis, row)
            view.copy_(view.roll(shift, dims=token_axis))
        setattr(layer, name, tensor)


def branch_cache(
    cache: Cache,
    rows: Sequence[int] | torch.Tensor,
    drops: Sequence[int],
    step: int,
    history: RecurrentHistory | None = None,
    keys: Sequence[Hashable] | None = None,
) -> Cache:
    """The cache of branches off `rows` of `cache` at `step`, branch i leaving out its last `drops[i]` tokens.

    On attention layers, branch i's cached tokens move ``drops[i]`` slots later along the token axis, so the dropped
    tokens wrap to the first slots: the caller must shift that row's 2D attention mask the same way, zero its first
    ``drops[i]`` entries and number the branch's new tokens from the first dropped position (the row then looks like
    a row with ``drops[i]`` more left padding, for full, sliding-window and chunked masks alike). Sliding-window and
    chunked layers must keep ``drops[i]`` extra tokens (`widen_windows`). Recurrent layers start from the state saved
    before step ``step - drops[i]``. `cache` is not modified.

    Args:
        cache: the live cache, holding every token before the newest one of `step`.
        rows: `(n,)` batch rows that branch.
        drops: n counts of trailing consumed tokens each branch leaves out.
        step: the current step.
        history: the saved recurrent states; needed only if the cache is recurrent and some drop is positive.
        keys: the ids `history` saved the rows under (default: the rows).

    Returns:
        A cache of batch size n (`fork_cache`).

    Raises:
        RuntimeError: a recurrent cache, a positive drop and no `history` (or no save for that step).
    """
    fork = fork_cache(cache, rows)
    shifts = {i: int(drop) for i, drop in enumerate(drops) if drop}
    if not shifts:
        return fork
    for source, layer in zip(cache.layers, fork.layers):
        _shift_rows(source, layer, shifts)
    if not has_recurrent_state(cache):
        return fork
    if history is None:
        raise RuntimeError("a branch that leaves out consumed tokens of a recurrent cache needs a RecurrentHistory.")
    keys = [int(r) for r in rows] if keys is None else list(keys)
    for i, drop in shifts.items():
        history.restore(fork, i, keys[i], step - drop)
    return fork
