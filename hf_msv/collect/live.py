"""`collect`: problems → N sampled chains of thought each → answers and hidden states → shards.

Sampling runs with the generation hook (`prepare_generation`); one pass stores streaming and terminal answers. Work
is resumable and atomic (`ShardStore`) and split over ``accelerate launch`` processes. See ``docs/collection.md``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import numpy as np
import torch
from transformers import LogitsProcessorList

from ..data.problems import Problem
from ..elicitation import ElicitationSettings
from .confidence import ConfidenceRecorder
from .config import CollectConfig
from .job import (
    CollectResult,
    batch_seed,
    collection_job,
    count_verdicts,
    recorded_settings,
    sampling_config,
    sequence_budget,
    start_collection,
    verdict_counts,
)
from .lm import prompt_builder, prompt_token_ids
from .recording import build_record
from .store import ShardStore

# The `CollectConfig` fields recorded in a live collection's settings (with the elicitation and the LM).
LIVE_SETTINGS = (
    "num_samples",
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "checker",
    "checker_kwargs",
    "prompt_template",
    "problems_per_shard",
    "problems_per_batch",
    "seed",
    "dtype",
    "confidence_top_k",
)


def collect(
    model,
    tokenizer,
    problems: Sequence[Problem],
    output_dir: str | os.PathLike,
    config: CollectConfig | None = None,
    *,
    elicitation: ElicitationSettings | None = None,
    **settings,
) -> CollectResult:
    """Sample ``num_samples`` chains of thought per problem, elicit answers and write hidden-state shards.

    Args:
        model, tokenizer: a decoder-only transformers LM (dynamic KV cache) and its tokenizer, on the device to use.
        problems: `Problem`s with unique ids (``gold`` is graded with the checker; ``meta["gold_alternatives"]``
            too).
        output_dir: where shards go; rerunning with the same settings resumes.
        config: the settings (`CollectConfig`; its LM, problem and output fields are not read here).
        elicitation: where and how answers are elicited; replaces the config's elicitation fields.
        **settings: `CollectConfig` fields to change, e.g. ``num_samples=64, max_new_tokens=4096,
            delimiters=["Wait"], checker="symbolic", prompt_template="chat", seed=0``.

    Returns:
        This process's `CollectResult`.

    Raises:
        ValueError: invalid settings, duplicate problem ids, a prompt that leaves no room in the LM's context, or an
            existing collection in `output_dir` made with other settings.
    """
    config = sampling_config(config, elicitation, settings, problems)
    elicit = config.elicitation
    build_prompt = prompt_builder(config.prompt_template, tokenizer)
    budgets = {
        p.id: sequence_budget(model, tokenizer, elicit, len(prompt_token_ids(build_prompt(p), tokenizer)))
        for p in problems
    }  # every prompt checked before any work
    recorded = recorded_settings(config, elicit, model, tokenizer, LIVE_SETTINGS)
    info = dict(recorded, format_version="1", token_logprobs_source="generation")
    state, store, todo, result = start_collection(output_dir, recorded, info, problems, overwrite=config.overwrite)
    from ..equivalence import get_checker
    from ..generation import prepare_generation

    checker = get_checker(config.checker, **config.checker_options)
    with (
        collection_job(model, store, result, state) as start,
        prepare_generation(
            model, tokenizer, None, elicitation=elicit, checker=checker, capture_hidden_states=True
        ) as msv,
    ):
        _sample_batches(
            msv,
            todo,
            store,
            result,
            config,
            build_prompt,
            budgets,
            progress=config.progress and state.is_local_main_process,
            start=start,
        )
    return result


def _batch_budget(config: CollectConfig, budgets: dict, batch) -> int:
    """The batch's ``max_new_tokens``: the configured one, lowered to the context rule of its longest prompt (one
    ``generate`` call has one budget)."""
    room: list[int] = [budgets[p.id] for p in batch if budgets[p.id] is not None]
    return min([config.token_budget, *room])


def _sample_batch(
    msv, model, batch, left, config: CollectConfig, build_prompt, checker, max_new_tokens: int, result: CollectResult
) -> list:
    """Sample one batch and return the records of its problems in `left`, counted in `result`."""
    torch.manual_seed(batch_seed(config.seed, [p.id for p in batch]))
    recorder = ConfidenceRecorder(config.confidence_top_k)
    results = msv.generate(
        [build_prompt(p) for p in batch],
        num_sequences=config.num_samples,
        max_new_tokens=max_new_tokens,
        do_sample=True,
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        logits_processor=LogitsProcessorList([recorder]),
    )
    table = recorder.table()
    left_ids = {p.id for p in left}
    records = []
    for i, (problem, res) in enumerate(zip(batch, results)):
        if problem.id not in left_ids:
            continue  # done by another process of an earlier run with another world size
        rows = range(i * config.num_samples, (i + 1) * config.num_samples)
        confidence = [table[:n, row] if table.size else np.zeros(0) for n, row in zip(map(len, res.sequences), rows)]
        record = build_record(
            problem,
            res.answers,
            res.sequences,
            res.finish_reasons,
            confidence,
            checker,
            model.config.get_text_config().hidden_size,
        )
        records.append(record)
        result.tokens += int(record.sequence_length.sum())
        result.answer_tokens += int(record.answer_length.sum())
        result.answers += record.num_answers
        if max_new_tokens < config.token_budget:
            result.cut_sequences += sum(
                len(s) == max_new_tokens and f == "budget" for s, f in zip(res.sequences, res.finish_reasons)
            )
    return records


def _sample_batches(
    msv,
    todo,
    store: ShardStore,
    result: CollectResult,
    config: CollectConfig,
    build_prompt,
    budgets: dict,
    *,
    progress: bool,
    start: float,
) -> None:
    """Sample every pending batch with the session `msv` (its LM and checker), commit its records to `store` with
    its verdict counts, and count it in `result` (tokens per second on the bar are measured from `start`)."""
    from tqdm.auto import tqdm

    model, checker = msv.model, msv.checker
    bar = tqdm(
        total=result.problems,
        initial=result.already_done,
        unit="problem",
        dynamic_ncols=True,
        desc=f"collect[{result.rank}]",
        disable=not progress,
    )
    try:
        for b, batch, left in todo:
            before = verdict_counts(checker)
            records = _sample_batch(
                msv, model, batch, left, config, build_prompt, checker, _batch_budget(config, budgets, batch), result
            )
            store.add_batch(b, records, count_verdicts(result, before, checker))
            result.generated += len(records)
            bar.update(len(records))
            elapsed = time.perf_counter() - start
            bar.set_postfix(tok_s=f"{result.tokens / elapsed:.0f}", answers=result.answers, refresh=False)
    finally:
        bar.close()


__all__ = ["collect"]
