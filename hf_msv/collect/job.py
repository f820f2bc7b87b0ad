"""What live collection and trace re-encoding share: `CollectResult`, the frame of a collection job, the recorded
settings, the context rule (`sequence_budget`) and the checker's verdict counts. See ``docs/collection.md``.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..data import STORAGE_DTYPES
from ..data.problems import Problem
from ..elicitation import ElicitationSettings
from ..errors import UserError
from ..utils import process_state
from .config import CollectConfig, as_config
from .lm import lm_info, template_name
from .store import (
    ShardStore,
    acquire_lock,
    check_settings,
    done_problem_ids,
    pending_batches,
    release_lock,
    write_index,
)

DELIMITER_ROOM = 4
"""Positions kept free for the text of a delimiter's first token that `AnswerElicitor` re-feeds before the prompt."""

VERDICT_COUNTS = ("checks", "unverifiable")
"""The checker counters (`EquivalenceChecker.stats`) stored per shard and summed in `CollectResult`."""


@dataclass
class CollectResult:
    """What one process did.

    Args:
        output_dir, rank, world_size: where and which process of how many.
        problems: this process's share of the problems; already_done: those committed before this run;
            generated: those done by this run.
        tokens: chain-of-thought tokens sampled or re-encoded (EOS included); answer_tokens, answers: elicited.
        cut_sequences: sequences that stopped where the LM's context ends (`sequence_budget`): sampled up to it
            live, cut there when re-encoded.
        skipped_lines: trace-file lines skipped with ``skip_bad_lines``.
        checks, unverifiable: equivalence verdicts of this run and how many were ``UNVERIFIABLE``.
        seconds: wall time; shards: the shard files written.
    """

    output_dir: str
    rank: int
    world_size: int
    problems: int
    already_done: int
    generated: int
    tokens: int = 0
    answer_tokens: int = 0
    answers: int = 0
    cut_sequences: int = 0
    skipped_lines: int = 0
    checks: int = 0
    unverifiable: int = 0
    seconds: float = 0.0
    shards: list[str] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else math.nan

    @property
    def problems_per_s(self) -> float:
        return self.generated / self.seconds if self.seconds else math.nan


def batch_seed(seed: int, ids: Sequence[str]) -> int:
    """The seed of the batch of problems ``ids``: a batch samples the same tokens in every run and on every rank.

    Args:
        seed: the collection's base seed.
        ids: the batch's problem ids, in order.

    Returns:
        A seed in [0, 2**63 - 1).
    """
    digest = hashlib.sha256(f"{seed}\x00{'|'.join(ids)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (2**63 - 1)


def context_limit(model) -> int | None:
    """The LM's context in positions (``max_position_embeddings``), or `None` when its config has none."""
    return getattr(model.config.get_text_config(), "max_position_embeddings", None)


def sequence_budget(model, tokenizer, elicitation: ElicitationSettings, prompt_length: int) -> int | None:
    """The context rule shared by live collection and re-encoding: the most chain-of-thought tokens a sequence of a
    `prompt_length`-token prompt may have so that every elicitation (re-fed delimiter text, elicitation prompt,
    ``max_answer_tokens`` answer tokens) stays inside the LM's context; `None` without a known context.

    Args:
        model: the LM (its ``max_position_embeddings`` is the context).
        tokenizer: its tokenizer (to measure the elicitation prompt).
        elicitation: the elicitation settings.
        prompt_length: the prompt's token count.

    Returns:
        The token budget, or `None`.

    Raises:
        ValueError: the prompt leaves no room for a single token and an answer.
    """
    limit = context_limit(model)
    if limit is None:
        return None
    prompt_ids = tokenizer(elicitation.prompt, add_special_tokens=False)["input_ids"]
    budget = limit - prompt_length - len(prompt_ids) - elicitation.max_answer_tokens - DELIMITER_ROOM
    if budget < 1:
        raise UserError(
            f"a {prompt_length}-token prompt leaves no room in the LM's {limit}-position context for a "
            f"chain of thought and a {elicitation.max_answer_tokens}-token answer"
        )
    return budget


def check_storage(config: CollectConfig) -> None:
    """Raises `ValueError` for a storage dtype shards cannot hold."""
    if config.dtype not in STORAGE_DTYPES:
        raise UserError(f"dtype must be one of {list(STORAGE_DTYPES)}, got {config.dtype!r}")


def sampling_config(
    config: CollectConfig | None, elicitation: ElicitationSettings | None, overrides: dict, problems: Sequence[Problem]
) -> CollectConfig:
    """The resolved settings a sampling run (transformers or vLLM) collects `problems` with, checked before any work.

    Raises:
        ValueError: a storage dtype shards cannot hold, or duplicate problem ids.
    """
    config = as_config(config, elicitation, overrides).resolved()
    check_storage(config)
    ids = [p.id for p in problems]
    if len(set(ids)) != len(ids):
        raise UserError("problem ids must be unique: shards and resumption key on them")
    return config


def config_settings(config: CollectConfig, elicitation: ElicitationSettings, names) -> dict:
    """The recorded settings that need no LM: the fields `names` of `config` and the elicitation settings (what
    `hf_msv.collect.store.check_output_dir` compares before the LM loads)."""
    settings = {name: getattr(config, name) for name in names}
    settings.update(
        elicitation=elicitation.to_dict(),
        checker_kwargs=config.checker_options,
        prompt_template=template_name(config.prompt_template),
    )
    return settings


def recorded_settings(config: CollectConfig, elicitation: ElicitationSettings, model, tokenizer, names) -> dict:
    """Everything that changes what is collected (resuming with other values would mix two datasets): the fields
    `names` of `config`, the elicitation settings and the LM's identity."""
    return dict(config_settings(config, elicitation, names), **lm_info(model, tokenizer))


def verdict_counts(checker) -> dict[str, int]:
    """The checker's `VERDICT_COUNTS` so far (zeros for a checker without ``stats``)."""
    stats = getattr(checker, "stats", None) or {}
    return {key: int(stats.get(key, 0)) for key in VERDICT_COUNTS}


def count_verdicts(result: CollectResult, before: dict, checker) -> dict[str, int]:
    """Add the verdicts the checker gave since `before` (`verdict_counts`) to `result`; returns them."""
    now = verdict_counts(checker)
    delta = {key: now[key] - before[key] for key in VERDICT_COUNTS}
    result.checks += delta["checks"]
    result.unverifiable += delta["unverifiable"]
    return delta


def start_collection(output_dir, settings: dict, info: dict, problems: Sequence[Problem], *, overwrite: bool = False):
    """Open `output_dir` for this process's share of a collection, live or re-encoded.

    Checks `settings` against a collection already there (``overwrite``: start over), recovers what a killed run
    left, and finds the batches still to do of this process's problems, ``problems[rank::world]``.

    Args:
        settings: needs ``problems_per_shard``, ``problems_per_batch`` and ``dtype``.
        info: the shard info (``collect`` metadata).

    Returns:
        (process state, `ShardStore`, pending batches as `pending_batches` gives them, `CollectResult`).
    """
    state = process_state()
    rank, world = state.process_index, state.num_processes
    root = Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    lock = acquire_lock(root) if state.is_main_process else None  # one writer per directory
    try:
        check_settings(root, settings, state.is_main_process, overwrite, state)
    except BaseException:
        release_lock(lock)
        raise
    store = ShardStore(root, rank, world, settings["problems_per_shard"], settings["dtype"], info)
    store.lock = lock
    store.recover()
    state.wait_for_everyone()  # every rank has cleaned up before anyone reads the done set
    mine = list(problems[rank::world])
    todo = pending_batches(mine, settings["problems_per_batch"], done_problem_ids(root))
    done = len(mine) - sum(len(left) for _, _, left in todo)
    return (
        state,
        store,
        todo,
        CollectResult(str(root), rank, world, problems=len(mine), already_done=done, generated=0),
    )


@contextlib.contextmanager
def collection_job(model, store: ShardStore, result: CollectResult, state):
    """The frame of one process's collection job, live or re-encoded (yields its start time): the LM in eval mode
    and the store finished; whatever happens, the LM's mode restored, `result` given the seconds and the shards
    written, and the directory's lock released; once every rank is done, the main process writes the manifest over
    all shards."""
    start = time.perf_counter()
    was_training = model.training
    model.eval()
    try:
        try:
            yield start
            store.finish()
        finally:
            model.train(was_training)
            result.seconds = time.perf_counter() - start
            result.shards = [str(p) for p in store.written]
        state.wait_for_everyone()
        if state.is_main_process:
            write_index(store.root)
    finally:
        release_lock(store.lock)


__all__ = [
    "CollectResult",
    "DELIMITER_ROOM",
    "VERDICT_COUNTS",
    "batch_seed",
    "check_storage",
    "collection_job",
    "config_settings",
    "context_limit",
    "count_verdicts",
    "recorded_settings",
    "sampling_config",
    "sequence_budget",
    "start_collection",
    "verdict_counts",
]
