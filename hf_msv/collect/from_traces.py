"""`collect_from_traces`: a trace file (chains of thought sampled anywhere) → the shards live collection writes.

``hf-msv collect --traces FILE.jsonl --model M --output-dir D``. The traces are re-encoded by `TraceReencoder` and
committed through the same `ShardStore` as `collect` (resumable, atomic, split over processes). See
``docs/collection.md``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from functools import partial

from ..elicitation import ElicitationSettings
from ..errors import UserError
from ..generation import ElicitationPolicy, eos_token_ids
from .config import CollectConfig, as_config
from .job import (
    CollectResult,
    check_storage,
    collection_job,
    count_verdicts,
    recorded_settings,
    sequence_budget,
    start_collection,
    verdict_counts,
)
from .lm import prompt_builder
from .recording import build_record
from .reencode import EncodedTrace, TraceReencoder, encode_trace
from .store import ShardStore
from .traces import Trace, TraceError, TraceFile, read_traces

__all__ = ["collect_from_traces"]

# The `CollectConfig` fields recorded in a re-encoding's settings (with the elicitation, the trace file and the LM).
TRACE_SETTINGS = (
    "checker",
    "checker_kwargs",
    "prompt_template",
    "chat_template",
    "problems_per_shard",
    "problems_per_batch",
    "dtype",
    "confidence",
    "confidence_top_k",
)


def _trace_file(traces, config: CollectConfig) -> TraceFile:
    if isinstance(traces, TraceFile):
        return traces
    if isinstance(traces, (str, os.PathLike)):
        return read_traces(traces, skip_bad_lines=config.skip_bad_lines, format=config.traces_format)
    traces = list(traces)
    blob = json.dumps([t.to_json() for t in traces], sort_keys=True).encode()
    return TraceFile(traces, [], hashlib.sha256(blob).hexdigest()[:16])


def _encode_all(
    file: TraceFile, model, tokenizer, config: CollectConfig, elicitation: ElicitationSettings
) -> tuple[list[EncodedTrace], list[tuple[int, str]]]:
    """Tokenise and check every trace up front, so bad lines are known before anything is written."""
    encoded, bad = [], list(file.bad_lines)
    for trace in file.traces:
        try:
            encoded.append(
                encode_trace(
                    trace,
                    tokenizer,
                    prompt_builder(config.prompt_template, tokenizer),
                    eos_ids=eos_token_ids(model.generation_config),
                    budget=partial(sequence_budget, model, tokenizer, elicitation),
                    chat_template=config.chat_template,
                    confidence_top_k=config.confidence_top_k if config.confidence == "trace" else None,
                )
            )
        except TraceError as e:
            if not config.skip_bad_lines:
                raise
            bad.append((e.line, e.reason))
    if not encoded:
        raise UserError(f"no usable trace ({len(bad)} bad lines; the first: {bad[:1]})")
    return encoded, sorted(bad)


def _info(settings: dict, file: TraceFile, bad: list, cut: int) -> dict:
    """The shard info: the settings, the first line's sampling metadata (as live collection reports sampling),
    where confidences come from, the skipped lines and the completions cut by the context rule."""
    sampling = dict(file.traces[0].sampling)
    return dict(
        settings,
        format_version="1",
        token_logprobs_source="generation",
        sampling=sampling,
        temperature=sampling.get("temperature"),
        max_new_tokens=sampling.get("max_new_tokens", sampling.get("max_tokens")),
        cot_confidence_source="missing" if settings["confidence"] == "none" else settings["confidence"],
        bad_lines=[list(b) for b in bad],
        skipped_lines=len(bad),
        cut_sequences=cut,
    )


def _reencode_batch(
    reencoder: TraceReencoder, batch: list[EncodedTrace], result: CollectResult, checker, use_trace_confidence: bool
) -> list:
    """Re-encode one batch and return its records (classes in live arrival order), counted in `result`."""
    from ..equivalence import EquivalenceClasses

    width = reencoder.model.config.get_text_config().hidden_size
    answers, model_confidence = reencoder.answers(batch)
    records = []
    for trace, found, confidence in zip(batch, answers, model_confidence):
        classes = EquivalenceClasses(checker)
        # Live arrival order: answers complete at their end step; those completing together in the order their
        # branches joined the decoding batch (by τ; at a step, budget answers after the others).
        for a in sorted(found, key=lambda a: (a.end, a.tau, a.trigger == "budget", a.sequence)):
            a.class_id = classes.add(a.text)
        records.append(
            build_record(
                trace.problem,
                found,
                trace.sequences,
                trace.finish,
                trace.confidence if use_trace_confidence and trace.confidence is not None else confidence,
                checker,
                width,
            )
        )
        result.tokens += sum(map(len, trace.sequences))
        result.answer_tokens += sum(a.length for a in found)
        result.answers += len(found)
        result.cut_sequences += trace.cut
    return records


def _reencode_batches(
    reencoder: TraceReencoder,
    todo,
    by_id: dict,
    store: ShardStore,
    result: CollectResult,
    checker,
    *,
    use_trace_confidence: bool,
    progress: bool,
) -> None:
    """Re-encode every pending batch, commit its records to `store` with its verdict counts, and count it in
    `result`."""
    from tqdm.auto import tqdm

    bar = tqdm(
        total=result.problems,
        initial=result.already_done,
        unit="problem",
        dynamic_ncols=True,
        desc=f"reencode[{result.rank}]",
        disable=not progress,
    )
    try:
        for b, _, left in todo:
            before = verdict_counts(checker)
            records = _reencode_batch(reencoder, [by_id[p.id] for p in left], result, checker, use_trace_confidence)
            store.add_batch(b, records, count_verdicts(result, before, checker))
            result.generated += len(records)
            bar.update(len(records))
    finally:
        bar.close()


def _reencoder(model, tokenizer, config: CollectConfig, elicitation: ElicitationSettings) -> TraceReencoder:
    # The EOS ids ``generate`` stops on, as live collection ran (not the tokenizer's too).
    policy = ElicitationPolicy(tokenizer, elicitation, eos_token_ids(model.generation_config))
    return TraceReencoder(
        model,
        tokenizer,
        policy,
        max_batch_tokens=config.max_batch_tokens,
        chunk_tokens=config.chunk_tokens,
        confidence_top_k=config.confidence_top_k if config.confidence == "model" else None,
    )


def collect_from_traces(
    model,
    tokenizer,
    traces: str | os.PathLike | TraceFile | Sequence[Trace],
    output_dir: str | os.PathLike,
    config: CollectConfig | None = None,
    *,
    elicitation: ElicitationSettings | None = None,
    **settings,
) -> CollectResult:
    """Re-encode sampled chains of thought into hidden-state shards (trace format: ``docs/collection.md``).

    Args:
        model, tokenizer: the decoder-only LM the traces were sampled from (full-attention dynamic cache).
        traces: a trace file path, a `TraceFile` or `Trace`s.
        output_dir: where shards go; rerunning with the same settings resumes.
        config: the settings (`CollectConfig`; sampling fields do not apply, the trace file fixed them).
        elicitation: where and how answers are elicited; replaces the config's elicitation fields.
        **settings: `CollectConfig` fields to change, e.g. ``checker="exact", skip_bad_lines=True,
            confidence="trace"``.

    Returns:
        This process's `CollectResult` (``tokens``: chain-of-thought tokens re-encoded; ``skipped_lines``).

    Raises:
        TraceError: a bad line (without ``skip_bad_lines``), naming it, before anything is written.
        ValueError: invalid settings, no usable trace, or an existing collection made with other settings.
    """
    config = as_config(config, elicitation, settings)
    elicit = config.elicitation
    check_storage(config)
    file = _trace_file(traces, config)
    encoded, bad = _encode_all(file, model, tokenizer, config, elicit)
    recorded = dict(
        recorded_settings(config, elicit, model, tokenizer, TRACE_SETTINGS),
        collected_from="traces",
        traces_fingerprint=file.fingerprint,
        num_samples=file.num_samples,
    )
    info = _info(recorded, file, bad, sum(e.cut for e in encoded))
    state, store, todo, result = start_collection(
        output_dir, recorded, info, [e.problem for e in encoded], overwrite=config.overwrite
    )
    result.skipped_lines = len(bad)
    from ..equivalence import get_checker

    checker = get_checker(config.checker, **config.checker_options)
    reencoder = _reencoder(model, tokenizer, config, elicit)
    with collection_job(model, store, result, state):
        _reencode_batches(
            reencoder,
            todo,
            {e.problem.id: e for e in encoded},
            store,
            result,
            checker,
            use_trace_confidence=config.confidence == "trace",
            progress=config.progress and state.is_local_main_process,
        )
    return result
