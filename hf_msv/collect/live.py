"""``collect``: problems → N sampled chains of thought each → answers and their hidden states → shards.

One pass collects terminal *and* streaming answers (streaming mode elicits at every delimiter and at the end; the
terminal answers are flagged). For every answer it stores the answer-token hidden states (16-bit), the text, the
sequence n, step k, time τ, length L, whether it is terminal, its correctness under the chosen checker, its online
equivalence class (`EquivalenceClasses`, arrival order, as the generation hook assigns it at inference), the answer
tokens' log-probabilities (Token-Probs) and, per sequence, the sampled chain-of-thought token ids and the DeepConf
token confidence of each (and per problem its question), so post-hoc scorers such as a PRM can re-read the text. See `hf_msv.data.shards` for the file format.

Resumable and atomic
====================

Work is done in *batches* of ``problems_per_batch`` problems (one ``generate`` call, seeded from the base seed and
the batch's problem ids, so a batch always samples the same tokens). A finished batch is committed at once to a
*spool* file (``spool/spool-r{rank}-b{batch}.safetensors``, same format as a shard); as soon as the spool holds
``problems_per_shard`` problems it is packed into the next shard ``shard-r{rank}-{index}.safetensors``, the rank's
manifest ``index-r{rank}.json`` is rewritten, and the packed spool files are deleted. Every file is written to a
temporary name, fsynced and moved into place with ``os.replace``, so a run killed at any instant (SIGKILL included)
leaves only complete files behind, and the shard files themselves are the record of what is done:

* restart: temporaries are deleted; spool files whose problems are already in a shard (killed between packing and
  deleting) are deleted; the manifest is rebuilt from the shard files; spool files still pending are kept and packed
  exactly as an uninterrupted run would have packed them;
* a problem is done iff it is in a shard or a spool file, so no finished batch is lost or repeated, and with the same
  settings the final shards are byte-identical to an uninterrupted run's;
* changing a generation setting between runs is refused (``collect_config.json``); ``overwrite=True`` starts over.

Multi-process
=============

Under ``accelerate launch`` each process takes every W-th problem (index striding: rank r gets ``problems[r::W]``)
and writes its own shards, spool and manifest (``-r{rank}`` in every name), so processes never touch the same file;
readers glob ``shard-*.safetensors``. The done set is global, so a restart with another number of processes skips
what any process finished (orphaned spool files of vanished ranks are packed by rank ``r' % W``). At the end the
main process writes ``index.json`` over all shards.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import LogitsProcessorList

from ..answers import ELICITATION_PROMPT, MAX_ANSWER_TOKENS
from ..data.problems import Problem
from ..data import STORAGE_DTYPES
from ..utils import process_state
from .config import CollectConfig, build_parser
from .confidence import ConfidenceRecorder
from .lm import lm_info, load_lm, load_problems, prompt_builder, template_name
from .recording import build_record
from .store import ShardStore, check_settings, done_problem_ids, pending_batches, write_index


@dataclass
class CollectResult:
    """What one process did. ``tokens`` counts sampled chain-of-thought tokens (EOS included)."""

    output_dir: str
    rank: int
    world_size: int
    problems: int  # this process's share
    skipped: int  # already done before this run
    generated: int  # done by this run
    tokens: int = 0
    answer_tokens: int = 0
    answers: int = 0
    seconds: float = 0.0
    shards: list[str] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else math.nan

    @property
    def problems_per_s(self) -> float:
        return self.generated / self.seconds if self.seconds else math.nan


def batch_seed(seed: int, ids: Sequence[str]) -> int:
    """The seed of the batch of problems ``ids``: a batch samples the same tokens in every run and on every rank."""
    digest = hashlib.sha256(f"{seed}\x00{'|'.join(ids)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (2**63 - 1)


def collect(
    model,
    tokenizer,
    problems: Sequence[Problem],
    output_dir: str | os.PathLike,
    *,
    num_samples: int = 16,
    max_new_tokens: int = 4096,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    mode: str = "streaming",
    delimiters: Sequence[str] | None = None,
    every_k_tokens: int | None = None,
    elicitation_prompt: str = ELICITATION_PROMPT,
    max_answer_tokens: int = MAX_ANSWER_TOKENS,
    checker: str = "symbolic",
    checker_kwargs: dict | None = None,
    prompt_template="auto",
    problems_per_shard: int = 16,
    problems_per_batch: int = 1,
    seed: int = 0,
    dtype: str = "bfloat16",
    confidence_top_k: int = 20,
    progress: bool = True,
    overwrite: bool = False,
) -> CollectResult:
    """Sample `num_samples` chains of thought per problem, elicit answers and write hidden-state shards.

    Args:
        model, tokenizer: a decoder-only transformers LM (dynamic KV cache) and its tokenizer, on the device to use.
        problems: `Problem`s with unique ids (``gold`` is graded with `checker`; ``meta["gold_alternatives"]`` too).
        output_dir: where shards go; rerunning with the same arguments resumes (module docstring).
        num_samples: N sequences sampled per problem (the paper collects 64).
        max_new_tokens, temperature, top_p, top_k: sampling (paper: 4096 tokens, temperature 1, no other
            heuristics, hence top_p=1 and top_k=0).
        mode: ``"streaming"`` (answers at every delimiter and at the end; terminal ones flagged) or ``"terminal"``.
        delimiters, every_k_tokens: where streaming answers are elicited (default ``["Wait"]``).
        elicitation_prompt, max_answer_tokens: the elicitation (paper: ``### Final Answer ### \\boxed``, 40 tokens).
        checker, checker_kwargs: equivalence checker (`hf_msv.equivalence.get_checker`) for classes and labels.
        prompt_template: how a problem becomes a prompt: ``"auto"``, ``"chat"``, ``"plain"``, ``"testbed"``, a
            string containing ``{question}`` or a callable ``Problem -> str | chat messages``.
        problems_per_shard: problems per shard file (a multiple of `problems_per_batch` keeps it exact).
        problems_per_batch: prompts per ``generate`` call (batch rows = this × N) and the unit of resumption.
        seed: base seed; each batch is seeded from it and its problem ids.
        dtype: storage dtype of hidden states, ``"bfloat16"`` (default) or ``"float16"``.
        confidence_top_k: k of DeepConf's token confidence (paper of DeepConf: 20).
        progress: show a tqdm bar (problems/s, tokens/s) on the local main process.
        overwrite: delete an existing collection in `output_dir` first.

    Returns: this process's `CollectResult`.
    """
    from ..equivalence import get_checker
    from ..generation import prepare_generation

    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"dtype must be one of {list(STORAGE_DTYPES)}, got {dtype!r}")
    if problems_per_shard < 1 or problems_per_batch < 1 or num_samples < 1:
        raise ValueError("num_samples, problems_per_shard and problems_per_batch must be positive")
    ids = [p.id for p in problems]
    if len(set(ids)) != len(ids):
        raise ValueError("problem ids must be unique: shards and resumption key on them")
    delimiters = ["Wait"] if delimiters is None else list(delimiters)
    checker_kwargs = dict(checker_kwargs or {})
    # Everything that changes what is sampled or stored; resuming with other values would mix two datasets.
    settings = {"num_samples": num_samples, "max_new_tokens": max_new_tokens, "temperature": temperature,
                "top_p": top_p, "top_k": top_k, "mode": mode, "delimiters": delimiters,
                "every_k_tokens": every_k_tokens, "elicitation_prompt": elicitation_prompt,
                "max_answer_tokens": max_answer_tokens, "checker": checker, "checker_kwargs": checker_kwargs,
                "prompt_template": template_name(prompt_template), "problems_per_shard": problems_per_shard,
                "problems_per_batch": problems_per_batch, "seed": seed, "dtype": dtype,
                "confidence_top_k": confidence_top_k, **lm_info(model, tokenizer)}
    info = dict(settings, format_version="1", token_logprobs_source="generation")
    state, store, todo, result = start_collection(output_dir, settings, info, problems, overwrite=overwrite)
    checker_obj = get_checker(checker, **checker_kwargs)
    sampling = dict(num_sequences=num_samples, max_new_tokens=max_new_tokens, do_sample=True,
                    temperature=temperature, top_p=top_p, top_k=top_k)
    with collection_job(model, store, result, state) as start:
        with prepare_generation(model, tokenizer, None, mode=mode, delimiters=delimiters,
                                every_k_tokens=every_k_tokens, elicitation_prompt=elicitation_prompt,
                                max_answer_tokens=max_answer_tokens, checker=checker_obj,
                                capture_hidden_states=True) as session:
            _sample_batches(session, model, todo, store, result, prompt_builder(prompt_template, tokenizer),
                            sampling, seed=seed, confidence_top_k=confidence_top_k, checker=checker_obj,
                            progress=progress and state.is_local_main_process, start=start)
    return result


def start_collection(output_dir, settings: dict, info: dict, problems: Sequence[Problem], *, overwrite: bool = False):
    """Open `output_dir` for this process's share of a collection, live or re-encoded (module docstring).

    Checks `settings` against a collection already there (``overwrite``: start over), recovers what a killed run
    left, and finds the batches still to do of this process's problems, ``problems[rank::world]``. `settings` needs
    ``problems_per_shard``, ``problems_per_batch`` and ``dtype``; `info` is the shard info. Returns (process state,
    `ShardStore`, pending batches as `pending_batches` gives them, `CollectResult`)."""
    state = process_state()
    rank, world = state.process_index, state.num_processes
    root = Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    check_settings(root, settings, state.is_main_process, overwrite, state)
    store = ShardStore(root, rank, world, settings["problems_per_shard"], settings["dtype"], info)
    store.recover()
    state.wait_for_everyone()  # every rank has cleaned up before anyone reads the done set
    mine = list(problems[rank::world])
    todo = pending_batches(mine, settings["problems_per_batch"], done_problem_ids(root))
    skipped = len(mine) - sum(len(left) for _, _, left in todo)
    return state, store, todo, CollectResult(str(root), rank, world, problems=len(mine), skipped=skipped, generated=0)


@contextlib.contextmanager
def collection_job(model, store: ShardStore, result: CollectResult, state):
    """The frame of one process's collection job, live or re-encoded (yields its start time): the LM in eval mode
    and the store finished; whatever happens, the LM's mode restored and `result` given the seconds and the shards
    written; once every rank is done, the main process writes the manifest over all shards."""
    start = time.perf_counter()
    was_training = model.training
    model.eval()
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


def _sample_batches(session, model, todo, store: ShardStore, result: CollectResult, build_prompt, sampling: dict,
                    *, seed: int, confidence_top_k: int, checker, progress: bool, start: float) -> None:
    """Sample every pending batch with ``session``, record its problems, commit them to ``store`` and count them in
    ``result`` (tokens per second on the bar are measured from ``start``)."""
    from tqdm.auto import tqdm

    bar = tqdm(total=result.problems, initial=result.skipped, unit="problem", dynamic_ncols=True,
               desc=f"collect[{result.rank}]", disable=not progress)
    num_samples = sampling["num_sequences"]
    try:
        for b, batch, left in todo:
            torch.manual_seed(batch_seed(seed, [p.id for p in batch]))
            recorder = ConfidenceRecorder(confidence_top_k)
            results = session.generate([build_prompt(p) for p in batch], **sampling,
                                       logits_processor=LogitsProcessorList([recorder]))
            table = recorder.table()
            left_ids = {p.id for p in left}
            records = []
            for i, (problem, res) in enumerate(zip(batch, results)):
                if problem.id not in left_ids:
                    continue  # done by another process of an earlier run with another world size
                rows = range(i * num_samples, (i + 1) * num_samples)
                confidence = [table[:n, row] if table.size else np.zeros(0)
                              for n, row in zip(map(len, res.sequences), rows)]
                record = build_record(problem, res.answers, res.sequences, res.finish_reasons, confidence, checker,
                                      model.config.get_text_config().hidden_size)
                records.append(record)
                result.tokens += int(record.sequence_length.sum())
                result.answer_tokens += int(record.answer_length.sum())
                result.answers += record.num_answers
            store.add_batch(b, records)
            result.generated += len(records)
            bar.update(len(records))
            elapsed = time.perf_counter() - start
            bar.set_postfix(tok_s=f"{result.tokens / elapsed:.0f}", answers=result.answers, refresh=False)
    finally:
        bar.close()


def collect_from_config(config: CollectConfig) -> CollectResult:
    """Load the LM and the problems `config` names and run `collect` with its settings (or, with ``traces``,
    `collect_from_traces` on that trace file)."""
    model, tokenizer = load_lm(config.model, config.model_dtype)
    if config.traces is not None:
        from .from_traces import collect_from_traces

        return collect_from_traces(model, tokenizer, config.traces, config.output_dir, **config.traces_kwargs())
    problems = load_problems(config.problems)
    return collect(model, tokenizer, problems, config.output_dir, **config.collect_kwargs())


def main(argv: Sequence[str] | None = None) -> None:
    """``hf-msv collect``: flags from `CollectConfig`; prints this process's `CollectResult` as one JSON line."""
    (config,) = build_parser().parse_args_into_dataclasses(argv)
    result = collect_from_config(config)
    summary = {k: v for k, v in asdict(result).items() if k != "shards"}
    summary.update(shards_written=len(result.shards), tokens_per_s=result.tokens_per_s)
    print(json.dumps(summary))


__all__ = ["CollectResult", "batch_seed", "collect", "collect_from_config", "main"]


if __name__ == "__main__":
    main()
