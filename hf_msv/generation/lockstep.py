"""`lockstep_sample`: ``generate``'s sampling loop with MSV elicitation branches riding in the same forwards as the
chain of thought, installed through ``generate(custom_generate=...)``.

`DecodingBatch` holds the rows of one forward: main rows (``generate``'s rows, sampled exactly as ``_sample``
samples them, so with early stopping off the tokens equal a plain ``generate`` with the same seed) and branch rows
(`forking.LiveBranch`, greedy). Each step regroups the batch with one gather (`caches.branch_cache`): finished rows
and completed or undecided branches leave, fired rows are copied in. The LM and its cache are checked before the
prefill (`caches.check_decodable`) and after it (`caches.check_prefilled`), so an LM whose decoding state cannot be
forked (a model kwarg, a ``state`` argument, state on its modules, an unsupported cache) is refused, by class name
and cause, before any decoding step.

The loop, the transformers internals it relies on (tested with transformers 5.12-5.25) and what it does not support
(``synced_gpus``; ``return_dict_in_generate`` outputs other than ``sequences``): ``docs/generation.md``; why a branch
that leaves out tokens is exact on every supported cache layer: ``docs/caches.md``.
"""

from __future__ import annotations

import functools
import inspect
import time
import warnings
from typing import TYPE_CHECKING, cast

import torch
import transformers
from packaging import version
from transformers.cache_utils import Cache
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..errors import UnsupportedError
from .caches import (
    RecurrentHistory,
    attention_length,
    branch_cache,
    cache_argument,
    check_decodable,
    check_prefilled,
    fork_cache,
    module_state,
    output_cache,
    widen_windows,
)
from .forking import LiveBranch
from .stopping import MSVEarlyStop

if TYPE_CHECKING:
    from .run import GenerationRun

__all__ = ["NEWEST_TESTED_TRANSFORMERS", "DecodingBatch", "lockstep_sample"]

NEWEST_TESTED_TRANSFORMERS = (5, 25)
"""The newest transformers minor the loop is tested with (``make test``); the oldest is pyproject.toml's floor."""


@functools.cache
def warn_if_untested_transformers(installed: str = transformers.__version__) -> bool:
    """Warn once when `installed` is a newer minor than `NEWEST_TESTED_TRANSFORMERS`: the loop calls ``generate``'s
    private ``_prefill`` and ``_pad_token_tensor``, which a release may change without notice. Returns whether it
    warned. A warning rather than a pin, so that a user is not locked out of a transformers fix."""
    if version.parse(installed).release[:2] <= NEWEST_TESTED_TRANSFORMERS:
        return False
    tested = ".".join(map(str, NEWEST_TESTED_TRANSFORMERS))
    warnings.warn(
        f"hf_msv's generation loop is tested with transformers up to {tested}.x; this is {installed}. It relies on "
        "generate's private _prefill and _pad_token_tensor: if generation fails, install transformers<="
        f"{tested}.* and report it.",
        stacklevel=3,
    )
    return True


class DecodingBatch:
    """The rows of the decoding forward: main rows (ints, their ``generate`` row) then branch rows (`LiveBranch`).

    Args:
        cache: the cache of the rows, in `members` order (attention and / or recurrent layers, `caches`).
        mask: `(rows, S)` long 2D attention mask over the cached positions, or `None` while it is all ones (always
            `None` for a cache without attention layers, such as Mamba's: there is nothing to mask).
        position: `(rows,)` position of each row's next input token.
        members: what each batch row is.
        model: the LM (which inputs its forward accepts).
        margin: the most consumed tokens a branch may leave out (`caches.widen_windows` was applied with it).
    """

    def __init__(
        self, cache: Cache, mask: torch.Tensor | None, position: torch.Tensor, members: list, model, margin: int = 0
    ):
        self.attends = attention_length(cache) is not None
        self.margin = margin
        self.windowed = any(getattr(layer, "is_sliding", False) for layer in cache.layers)
        self.cache, self.position, self.members = cache, position, members
        self.mask = mask if self.attends else None  # as generate does: Mamba decodes without a mask
        self.model = model
        parameters = inspect.signature(model.forward).parameters
        self.cache_argument = cache_argument(model)
        self.accepts_position_ids = "position_ids" in parameters
        self.accepts_logits_to_keep = "logits_to_keep" in parameters
        self.forwards = 0
        self.rows_computed = 0  # Σ over forwards of the batch size: the rows × steps figure

    @property
    def main_rows(self) -> list[int]:
        return [m for m in self.members if isinstance(m, int)]

    @property
    def branches(self) -> list[LiveBranch]:
        return [m for m in self.members if not isinstance(m, int)]

    def regroup(
        self, keep: list[int], forks: list[tuple[int, LiveBranch]], t: int, history: RecurrentHistory | None = None
    ):
        """Keep the batch rows `keep` (in order) and append a copy of row `source` for each ``(source, branch)``
        fired at step `t`.

        The new branch rows hide the branch's dropped tokens (a per-row crop): on attention layers their cached tokens
        and mask move ``drop`` slots later, the ``drop`` slots that wrap to the front are masked, and their next
        position moves back by ``drop``; recurrent layers start from the state `history` saved before step
        ``t - drop`` under the branch's ``generate`` row.
        """
        index = keep + [source for source, _ in forks]
        if not forks and index == list(range(len(self.members))):
            return
        drops = [0] * len(keep) + [live.branch.drop for _, live in forks]
        if self.windowed and max(drops, default=0) > self.margin:
            raise RuntimeError(
                f"a branch leaves out {max(drops)} tokens but the sliding-window / chunked layers "
                f"keep only {self.margin} extra (caches.widen_windows)."
            )
        if any(drops) and self.mask is None and self.attends:
            self.mask = torch.ones(
                len(self.members), attention_length(self.cache) or 0, dtype=torch.long, device=self.position.device
            )
        rows = torch.tensor(index, dtype=torch.long, device=self.position.device)
        keys = [None] * len(keep) + [live.branch.row for _, live in forks]  # the history's keys: generate rows
        self.cache = branch_cache(self.cache, rows, drops, t, history, keys)  # one gather (+ restored states)
        self.position = self.position[rows]
        if self.mask is not None:
            self.mask = self.mask[rows]
        for i, drop in enumerate(drops):
            if drop:
                if self.mask is not None:  # no attention layers (Mamba): the restored state is the whole crop
                    self.mask[i] = self.mask[i].roll(drop)  # as branch_cache moved the row's keys and values
                    self.mask[i, :drop] = 0
                self.position[i] -= drop
        self.members = [self.members[i] for i in keep] + [live for _, live in forks]

    def forward(self, tokens: torch.Tensor, hidden: bool):
        """One forward over the batch, `tokens` `(rows,)` being each row's next input; returns the model output
        (logits `(rows, 1, V)`, and ``hidden_states`` when `hidden`)."""
        if self.mask is not None:
            self.mask = torch.cat([self.mask, self.mask.new_ones(len(self.members), 1)], dim=1)
        kwargs = {
            "input_ids": tokens[:, None],
            "attention_mask": self.mask,
            self.cache_argument: self.cache,
            "use_cache": True,
        }
        if self.accepts_position_ids:
            kwargs["position_ids"] = self.position[:, None]
        if self.accepts_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        if hidden:
            kwargs["output_hidden_states"] = True
        out = self.model(**kwargs, return_dict=True)
        cache = output_cache(out)
        if cache is None:  # check_prefilled saw the prefill return one: every step must
            raise RuntimeError(f"{type(self.model).__name__} returned no cache from a decoding step")
        self.cache = cache
        self.position = self.position + 1
        self.forwards += 1
        self.rows_computed += len(self.members)
        return out


def _bound_run(stopping_criteria) -> GenerationRun | None:
    ours = [c for c in stopping_criteria if isinstance(c, MSVEarlyStop)]
    return ours[0].run if ours else None


def _drop_margin(run) -> int:
    """The most consumed tokens a branch of `run` may leave out (a delimiter spans at most the matcher's window)."""
    if run is None or run.matcher is None or run.elicitor.keep_delimiter:
        return 0
    return run.matcher.window - 1


def _start_batch(model, cache, model_kwargs: dict, batch: int, device, margin: int) -> DecodingBatch:
    """The decoding batch after the prefill (`cache`: the one it returned, `caches.check_prefilled`): every row a
    main row, positions continuing ``generate``'s."""
    mask = model_kwargs.get("attention_mask")
    positions = model_kwargs.get("position_ids")
    if positions is not None and positions.dim() == 2:
        position = (positions[:, -1] + 1).expand(batch).clone()
    elif mask is not None:
        position = mask.long().sum(-1)
    else:
        position = torch.full((batch,), attention_length(cache) or 0, dtype=torch.long, device=device)
    # A shallow fork: the loop owns its cache and layer objects, and unsupported caches fail before any decoding.
    cache = fork_cache(cache, torch.arange(batch))
    widen_windows(cache, margin)
    return DecodingBatch(
        cache, None if mask is None else mask.long(), position.to(device), list(range(batch)), model, margin
    )


def _sample_tokens(
    scores: torch.Tensor, active: torch.Tensor, pad: int, do_sample: bool, all_active: bool
) -> torch.Tensor:
    """`(B,)` next tokens from processed `(B, V)` scores, drawn for every row as ``_sample`` draws them; rows not
    `active` get `pad` (their placeholder probabilities are a one-hot on it). `all_active`: the host's copy of
    ``active.all()`` (reading the device's would wait for it)."""
    if do_sample:
        probs = torch.nn.functional.softmax(scores, dim=-1)
        if not all_active:
            placeholder = torch.zeros_like(probs[0])
            placeholder[pad] = 1.0
            probs = torch.where(active[:, None], probs, placeholder)
        tokens = torch.multinomial(probs, num_samples=1).squeeze(1)
    else:
        tokens = torch.argmax(scores, dim=-1)
    return tokens if all_active else torch.where(active, tokens, pad)


@torch.no_grad()
def lockstep_sample(
    model,
    input_ids: torch.Tensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    **model_kwargs,
):
    """``generate``'s sampling / greedy loop with MSV branches in the decoding batch (module docstring).

    Args: as ``GenerationMixin._sample``. Returns `(B, prompt + T)` token ids (or a ``GenerateDecoderOnlyOutput``
    holding them when ``return_dict_in_generate``).

    Raises:
        UnsupportedError: (a `NotImplementedError`) ``synced_gpus``, ``use_cache=False``, or an LM whose decoding
            state cannot be forked exactly, naming its class and where the state is (`caches.check_decodable`,
            `caches.check_forkable`): before the prefill when the model kwargs, the forward's signature or the
            model class show it, after it (`caches.check_prefilled`) otherwise; never mid-decoding.
    """
    if synced_gpus:
        raise UnsupportedError(
            f"MSV generation does not support synced_gpus ({type(model).__name__}.generate was "
            "called with it): load the LM whole on each process and call generate without it."
        )
    warn_if_untested_transformers()
    run = _bound_run(stopping_criteria)
    pad_tensor = generation_config._pad_token_tensor
    pad = int(pad_tensor) if pad_tensor is not None else 0
    B, device = input_ids.shape[0], input_ids.device
    unfinished = torch.ones(B, dtype=torch.bool, device=device)

    # The LM, its model kwargs and the cache generate prepared: refused before the prefill costs anything.
    check_decodable(model, model_kwargs, generation_config.use_cache)
    before = module_state(model)
    outputs = model._prefill(input_ids, generation_config, model_kwargs)
    cache = check_prefilled(model, outputs, before, B)  # what only the prefill shows; still before any decoding
    batch = _start_batch(model, cache, model_kwargs, B, device, _drop_margin(run))
    batch.forwards, batch.rows_computed = 1, B
    if run is not None:
        run.bind_cache(batch.cache)
    logits = outputs.logits[:, -1].to(copy=True, dtype=torch.float32, device=device)
    del outputs
    # The host reads the device once a step besides the tokens (MSVEarlyStop's): `unfinished`, after the stopping
    # criteria. Everything else a step needs about the rows comes from that copy, so the step waits on no other
    # device value (docs/generation.md, "Cost").
    keep_main, keep_index = list(range(B)), None  # main rows still decoding; their index tensor when not all are
    t = 0
    while True:  # main phase: one sampled token per live main row per step
        if keep_index is None:  # every row computed (always so with early stopping off and no EOS yet)
            scores = logits
        else:
            scores = logits.new_zeros(B, logits.shape[-1]).index_copy_(0, keep_index, logits)
        scores = logits_processor(input_ids, scores)
        tokens = _sample_tokens(scores, unfinished, pad, generation_config.do_sample, keep_index is None)
        input_ids = torch.cat([input_ids, tokens[:, None]], dim=-1)
        if streamer is not None:
            streamer.put(tokens.cpu())
        unfinished = unfinished & ~stopping_criteria(input_ids, None).to(device)
        live = unfinished.tolist()
        if sum(live) != len(keep_main):  # rows only ever leave
            keep_main = [row for row, on in enumerate(live) if on]
            keep_index = torch.tensor(keep_main, dtype=torch.long, device=device)
        _regroup(batch, run, keep_main, run.take_forks(t, live) if run is not None else [], t)
        if not keep_main:
            break
        if run is not None and run.history is not None:
            # After step t's forks, before token t is fed: the recurrent states a later branch may start from.
            run.update_history(t, batch.cache, {m: i for i, m in enumerate(batch.members) if isinstance(m, int)})
        t += 1
        newest = input_ids[:, -1]
        logits = _forward(batch, run, newest if keep_index is None else newest[keep_index], t)
    while batch.members:  # the tail: branches still decoding after the last main row ended
        t += 1
        _forward(batch, run, input_ids.new_zeros(0), t)
        if run is not None:
            run.tail_step(t)
        _regroup(batch, run, [], [], t)
    if streamer is not None:
        streamer.end()
    if run is not None:
        run.count_forwards(batch.forwards, batch.rows_computed)
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=cast(torch.LongTensor, input_ids))
    return input_ids


def _forward(batch: DecodingBatch, run, main_tokens: torch.Tensor, t: int) -> torch.Tensor:
    """Forward number t over the batch (main rows fed `main_tokens`, branches their next input); hands the branch
    rows' outputs to the run and returns the main rows' next-token logits `(main rows, V)` in float32."""
    started = time.perf_counter()
    branches = batch.branches
    tokens = main_tokens
    if branches:  # their next inputs are host values: one copy to the device, only in steps that have branches
        branch_tokens = torch.tensor([b.next_input() for b in branches], dtype=torch.long, device=main_tokens.device)
        tokens = torch.cat([main_tokens, branch_tokens])
    out = batch.forward(tokens, hidden=any(b.answering for b in branches))
    n_main = len(main_tokens)
    logits = out.logits[:n_main, -1].to(copy=True, dtype=torch.float32)
    if run is not None and branches:
        # On a row-bound device the branch rows' share of the forward is what elicitation costs.
        share = (time.perf_counter() - started) * len(branches) / len(batch.members)
        run.advance_branches(branches, out, n_main, t, share)
    return logits


def _regroup(batch: DecodingBatch, run, keep_main: list[int], forks: list, t: int):
    """Main rows in `keep_main` stay; branches stay unless complete or their prompt is decided; `forks` (branches
    of `generate` rows, fired at step t) are copied in from their row."""
    started = time.perf_counter()
    position = {m: i for i, m in enumerate(batch.members) if isinstance(m, int)}
    keep = [position[r] for r in keep_main]
    branches = 0
    for i, m in enumerate(batch.members):
        if not isinstance(m, int):
            branches += 1
            if not m.complete and run.wants(m):
                keep.append(i)
    batch.regroup(
        keep, [(position[live.branch.row], live) for live in forks], t, run.history if run is not None else None
    )
    if run is not None and (
        forks or len(keep) - len(keep_main) < branches
    ):  # elicitation's gather: a branch came or went
        run.timings["elicitation"] += time.perf_counter() - started
