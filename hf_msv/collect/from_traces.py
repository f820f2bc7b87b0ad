"""``collect_from_traces``: a trace file (chains of thought sampled anywhere) → the shards live collection writes.

``hf-msv collect --traces FILE.jsonl --model M --output-dir D`` re-encodes the traces of `hf_msv.collect.traces`
with `hf_msv.collect.reencode.TraceReencoder` and commits them through the same `ShardStore` as `collect`: batches of
``problems_per_batch`` problems go to the spool, then into shards of ``problems_per_shard`` problems, every file
atomic, so a killed run resumes where it stopped (a problem is done iff it is in a shard or a spool file) and the
settings, including a fingerprint of the trace file, must match to resume. Under ``accelerate launch`` process r
takes the good traces ``[r::W]``, as `collect` takes problems.

The shard info (``collect`` metadata) holds the settings plus ``collected_from: "traces"``, the trace file's
fingerprint, the first line's ``sampling`` metadata (its ``temperature`` and ``max_new_tokens``, vLLM's
``max_tokens``, fill ``temperature`` and ``max_new_tokens`` as live collection reports them),
``cot_confidence_source`` (``model``, ``trace`` or ``missing``) and ``bad_lines`` / ``skipped_lines``: the lines
skipped with ``skip_bad_lines`` and why. Bad lines are found before anything is written (the whole file is read and
tokenised first, and held in memory: split files of many millions of tokens), so a bad line never loses work
already committed, and resuming sees the same list.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence

from ..answers import ELICITATION_PROMPT, MAX_ANSWER_TOKENS
from ..data import STORAGE_DTYPES
from .lm import lm_info, prompt_builder, template_name
from .live import CollectResult, collection_job, start_collection
from .recording import build_record
from .reencode import EncodedTrace, TraceReencoder, encode_trace, eos_token_ids
from .store import ShardStore
from .traces import Trace, TraceError, TraceFile, read_traces

__all__ = ["collect_from_traces"]

CONFIDENCE_SOURCES = ("model", "trace", "none")


def _trace_file(traces, skip_bad_lines: bool) -> TraceFile:
    if isinstance(traces, TraceFile):
        return traces
    if isinstance(traces, (str, os.PathLike)):
        return read_traces(traces, skip_bad_lines=skip_bad_lines)
    traces = list(traces)
    blob = json.dumps([t.to_json() for t in traces], sort_keys=True).encode()
    return TraceFile(traces, [], hashlib.sha256(blob).hexdigest()[:16])


def _encode_all(file: TraceFile, tokenizer, build_prompt, *, eos_ids, max_length, chat_template, top_k,
                skip_bad_lines: bool) -> tuple[list[EncodedTrace], list[tuple[int, str]]]:
    """Tokenise and check every trace up front, so bad lines are known before anything is written."""
    encoded, bad = [], list(file.bad_lines)
    for trace in file.traces:
        try:
            encoded.append(encode_trace(trace, tokenizer, build_prompt, eos_ids=eos_ids, max_length=max_length,
                                        chat_template=chat_template, confidence_top_k=top_k))
        except TraceError as e:
            if not skip_bad_lines:
                raise
            bad.append((e.line, e.reason))
    if not encoded:
        raise ValueError(f"no usable trace ({len(bad)} bad lines; the first: {bad[:1]})")
    return encoded, sorted(bad)


def _info(settings: dict, file: TraceFile, bad: list) -> dict:
    """The shard info: the settings, the first line's sampling metadata (as live collection reports sampling),
    where confidences come from, and the skipped lines."""
    sampling = dict(file.traces[0].sampling)
    return dict(settings, format_version="1", token_logprobs_source="generation", sampling=sampling,
                temperature=sampling.get("temperature"),
                max_new_tokens=sampling.get("max_new_tokens", sampling.get("max_tokens")),
                cot_confidence_source="missing" if settings["confidence"] == "none" else settings["confidence"],
                bad_lines=[list(b) for b in bad], skipped_lines=len(bad))


def _reencode_batches(reencoder: TraceReencoder, todo, by_id: dict, store: ShardStore, result: CollectResult,
                      checker, *, use_trace_confidence: bool, progress: bool) -> None:
    """Re-encode every pending batch, record its problems (classes in live arrival order), commit them to `store`
    and count them in `result`."""
    from tqdm.auto import tqdm

    from ..equivalence import EquivalenceClasses

    width = reencoder.model.config.get_text_config().hidden_size
    bar = tqdm(total=result.problems, initial=result.skipped, unit="problem", dynamic_ncols=True,
               desc=f"reencode[{result.rank}]", disable=not progress)
    try:
        for b, _, left in todo:
            batch = [by_id[p.id] for p in left]
            answers, model_confidence = reencoder.answers(batch)
            records = []
            for trace, found, confidence in zip(batch, answers, model_confidence):
                classes = EquivalenceClasses(checker)
                # Live arrival order: answers complete at their end step; those completing together in the order
                # their branches joined the decoding batch (by τ; at a step, budget answers after the others).
                for a in sorted(found, key=lambda a: (a.end, a.tau, a.trigger == "budget", a.sequence)):
                    a.class_id = classes.add(a.text)
                records.append(build_record(trace.problem, found, trace.sequences, trace.finish,
                                            trace.confidence if use_trace_confidence else confidence, checker, width))
                result.tokens += sum(map(len, trace.sequences))
                result.answer_tokens += sum(a.length for a in found)
                result.answers += len(found)
            store.add_batch(b, records)
            result.generated += len(records)
            bar.update(len(records))
    finally:
        bar.close()


def collect_from_traces(
    model,
    tokenizer,
    traces: str | os.PathLike | TraceFile | Sequence[Trace],
    output_dir: str | os.PathLike,
    *,
    mode: str = "streaming",
    delimiters: Sequence[str] | None = None,
    every_k_tokens: int | None = None,
    keep_delimiter: bool = False,
    elicitation_prompt: str = ELICITATION_PROMPT,
    max_answer_tokens: int = MAX_ANSWER_TOKENS,
    checker: str = "symbolic",
    checker_kwargs: dict | None = None,
    prompt_template="auto",
    chat_template: str | None = None,
    problems_per_shard: int = 16,
    problems_per_batch: int = 1,
    dtype: str = "bfloat16",
    confidence: str = "model",
    confidence_top_k: int = 20,
    skip_bad_lines: bool = False,
    max_batch_tokens: int = 32768,
    chunk_tokens: int = 2048,
    progress: bool = True,
    overwrite: bool = False,
) -> CollectResult:
    """Re-encode sampled chains of thought into hidden-state shards (module docstring; format: `traces`).

    Args:
        model, tokenizer: the decoder-only LM the traces were sampled from (full-attention dynamic cache).
        traces: a trace file path, a `TraceFile` or `Trace`s.
        output_dir: where shards go; rerunning with the same arguments resumes.
        mode, delimiters, every_k_tokens, keep_delimiter, elicitation_prompt, max_answer_tokens: where and how
            answers are elicited, as in `collect` / `prepare_generation`.
        checker, checker_kwargs: equivalence checker for classes and labels.
        prompt_template, chat_template: how a trace without ``prompt_token_ids`` / ``prompt`` becomes a prompt (as
            in `collect`), and the chat template used at sampling time (default: the tokenizer's).
        problems_per_shard, problems_per_batch, dtype: as in `collect` (a batch is re-encoded together).
        confidence: DeepConf confidences from the ``model`` (recomputed in the prefill, as live collection records
            them), from the ``trace``'s logprobs, or ``none``; confidence_top_k: their k.
        skip_bad_lines: skip (and count in the shard info) bad lines instead of raising `TraceError`.
        max_batch_tokens, chunk_tokens: memory budgets (`hf_msv.collect.reencode`); they do not change results.
        progress: show a tqdm bar on the local main process. overwrite: start over in `output_dir`.

    Returns: this process's `CollectResult` (``tokens``: chain-of-thought tokens re-encoded).
    """
    from ..equivalence import get_checker
    from ..generation import DelimiterMatcher
    from ..generation.forking import AnswerElicitor

    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"dtype must be one of {list(STORAGE_DTYPES)}, got {dtype!r}")
    if confidence not in CONFIDENCE_SOURCES:
        raise ValueError(f"confidence must be one of {CONFIDENCE_SOURCES}, got {confidence!r}")
    if mode not in ("streaming", "terminal"):
        raise ValueError(f"mode must be 'streaming' or 'terminal', got {mode!r}")
    if problems_per_shard < 1 or problems_per_batch < 1 or max_batch_tokens < 1 or chunk_tokens < 1:
        raise ValueError("problems_per_shard, problems_per_batch, max_batch_tokens and chunk_tokens must be positive")
    delimiters = ["Wait"] if delimiters is None else list(delimiters)
    file = _trace_file(traces, skip_bad_lines)
    elicitor = AnswerElicitor(tokenizer, elicitation_prompt, max_answer_tokens, keep_delimiter)
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    room = len(elicitor.prompt_ids) + max_answer_tokens + 4  # elicitation prompt, answer, a delimiter's prefix
    encoded, bad = _encode_all(file, tokenizer, prompt_builder(prompt_template, tokenizer),
                               eos_ids=eos_token_ids(model), max_length=limit - room if limit else None,
                               chat_template=chat_template, top_k=confidence_top_k if confidence == "trace" else None,
                               skip_bad_lines=skip_bad_lines)

    checker_kwargs = dict(checker_kwargs or {})
    # Everything that changes what is stored; resuming with other values would mix two datasets.
    settings = {"collected_from": "traces", "traces_fingerprint": file.fingerprint, "num_samples": file.num_samples,
                "mode": mode, "delimiters": delimiters, "every_k_tokens": every_k_tokens,
                "keep_delimiter": keep_delimiter, "elicitation_prompt": elicitation_prompt,
                "max_answer_tokens": max_answer_tokens, "checker": checker, "checker_kwargs": checker_kwargs,
                "prompt_template": template_name(prompt_template), "chat_template": chat_template,
                "problems_per_shard": problems_per_shard, "problems_per_batch": problems_per_batch, "dtype": dtype,
                "confidence": confidence, "confidence_top_k": confidence_top_k, **lm_info(model, tokenizer)}
    state, store, todo, result = start_collection(output_dir, settings, _info(settings, file, bad),
                                                  [e.problem for e in encoded], overwrite=overwrite)
    by_id = {e.problem.id: e for e in encoded}
    checker_obj = get_checker(checker, **checker_kwargs)
    matcher = DelimiterMatcher(tokenizer, delimiters) if delimiters and mode == "streaming" else None
    reencoder = TraceReencoder(model, tokenizer, elicitor, matcher=matcher, every_k_tokens=every_k_tokens,
                               streaming=mode == "streaming", max_batch_tokens=max_batch_tokens,
                               chunk_tokens=chunk_tokens, confidence_top_k=confidence_top_k if confidence == "model"
                               else None)
    with collection_job(model, store, result, state):
        _reencode_batches(reencoder, todo, by_id, store, result, checker_obj,
                          use_trace_confidence=confidence == "trace", progress=progress and state.is_local_main_process)
    return result
