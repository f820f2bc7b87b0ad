"""``collect``: problems → N sampled chains of thought each → answers and their hidden states → shards.

One pass collects terminal *and* streaming answers (streaming mode elicits at every delimiter and at the end; the
terminal answers are flagged). For every answer it stores the answer-token hidden states (16-bit), the text, the
sequence n, step k, time τ, length L, whether it is terminal, its correctness under the chosen checker, its online
equivalence class (`EquivalenceClasses`, arrival order, as the generation hook assigns it at inference), the answer
tokens' log-probabilities (Token-Probs) and, per sequence, the DeepConf token confidence of every chain-of-thought
token. See `hf_msv.shards` for the file format.

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

import argparse
import hashlib
import json
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from ..answers import ELICITATION_PROMPT, MAX_ANSWER_TOKENS
from ..data.problems import Problem
from ..utils import atomic_write_json, fsync_dir, process_state, resolve_device
from ..data.shards import (
    SHARD_GLOB,
    STORAGE_DTYPES,
    CollectedProblem,
    read_shard,
    read_shard_info,
    write_shard,
)

__all__ = ["collect", "CollectResult", "ConfidenceRecorder", "load_problems", "load_lm", "done_problem_ids",
           "write_index", "add_collect_arguments",
           "collect_from_args", "main"]

CONFIG_FILE = "collect_config.json"
INDEX_FILE = "index.json"
_SHARD_RE = re.compile(r"shard-r(\d+)-(\d+)\.safetensors$")
_SPOOL_RE = re.compile(r"spool-r(\d+)-b(\d+)\.safetensors$")


def _checkpoint(stage: str, **info) -> None:
    """Called after each durable step ("spooled", "shard_written", "manifest_written", "spool_removed").

    A no-op; tests replace it to inject crashes at exact points of the commit protocol.
    """


# ----------------------------------------------------------------------------------------------------------------
# Signals beyond the generation hook: CoT token confidence, answer-token log-probabilities
# ----------------------------------------------------------------------------------------------------------------


class ConfidenceRecorder(LogitsProcessor):
    """Passive logits processor that records DeepConf's token confidence C_t = −(1/k) Σ_{j≤k} log P_t(j) of every
    row at every decode step (top-k of the model's log-probs; DeepConf uses k = 20).

    Custom processors run before generate's temperature / top-k / top-p warpers, so these are the LM's own
    probabilities, as DeepConf reads them. It returns the scores unchanged, so sampling is not affected. One float
    per row and step is kept, never the vocabulary-sized scores.
    """

    def __init__(self, top_k: int = 20):
        self.top_k = top_k
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        logprobs = torch.log_softmax(scores.float(), dim=-1)
        k = min(self.top_k, logprobs.shape[-1])
        # Stays on the device: one host transfer per generate call, not a synchronisation per decode step.
        self.steps.append(-logprobs.topk(k, dim=-1).values.mean(-1))
        return scores

    def table(self) -> np.ndarray:
        """`(steps, rows)` float32 confidences recorded so far."""
        if not self.steps:
            return np.zeros((0, 0), dtype=np.float32)
        return torch.stack(self.steps).float().cpu().numpy()


def _is_correct(checker, text: str | None, problem: Problem) -> bool:
    golds = [problem.gold] + [g for g in (problem.meta.get("gold_alternatives") or []) if g != problem.gold]
    return text is not None and any(checker.is_correct(text, str(g)) for g in golds)


def _record(model, problem: Problem, result, confidence: np.ndarray, rows: range, checker) -> CollectedProblem:
    answers = sorted(result.answers, key=lambda a: (a.tau, a.sequence, a.step))  # elicitation order
    logprobs = [np.asarray(a.token_logprobs, dtype=np.float32).reshape(-1) for a in answers]
    lengths = [len(s) for s in result.sequences]
    width = model.config.get_text_config().hidden_size
    return CollectedProblem(
        problem_id=problem.id,
        gold=problem.gold,
        source=problem.source,
        hidden_states=torch.cat([a.hidden_states for a in answers]) if answers else torch.zeros(0, width),
        token_ids=np.array([t for a in answers for t in a.token_ids], dtype=np.int64),
        token_logprobs=np.concatenate(logprobs) if logprobs else np.zeros(0, dtype=np.float32),
        answer_text=[a.text for a in answers],
        answer_raw_text=[a.raw_text for a in answers],
        answer_trigger=[a.trigger for a in answers],
        answer_sequence=[a.sequence for a in answers],
        answer_step=[a.step for a in answers],
        answer_tau=[a.tau for a in answers],
        answer_length=[a.length for a in answers],
        answer_class=[a.class_id for a in answers],
        answer_terminal=[a.terminal for a in answers],
        answer_correct=[_is_correct(checker, a.text, problem) for a in answers],
        sequence_length=lengths,
        sequence_finish=list(result.finish_reasons),
        cot_confidence=[confidence[:n, row] if confidence.size else np.zeros(0) for n, row in zip(lengths, rows)],
    )


# ----------------------------------------------------------------------------------------------------------------
# The rank-local store: spool → shards → manifest
# ----------------------------------------------------------------------------------------------------------------


def _problem_count(path: Path) -> int:
    return len(read_shard_info(path)["problem_id"])


class _ShardStore:
    """Durable storage of one process's finished batches (see the module docstring for the protocol)."""

    def __init__(self, root: Path, rank: int, world: int, problems_per_shard: int, dtype: str, info: dict):
        self.root, self.rank, self.world = root, rank, world
        self.spool_dir = root / "spool"
        self.problems_per_shard = problems_per_shard
        self.dtype, self.info = dtype, info
        self.written: list[Path] = []
        self.manifest: dict[str, list[str]] = {}  # this rank's shard name -> problem ids, kept in memory

    # -- names ----------------------------------------------------------------------------------------------

    def _own_shards(self) -> list[Path]:
        return sorted(p for p in self.root.glob(f"shard-r{self.rank:03d}-*.safetensors") if _SHARD_RE.search(p.name))

    def _spools(self, rank: int | None = None) -> list[Path]:
        pattern = "spool-r*-b*.safetensors" if rank is None else f"spool-r{rank:03d}-b*.safetensors"
        return sorted(p for p in self.spool_dir.glob(pattern) if _SPOOL_RE.search(p.name))

    def _next_shard(self) -> Path:
        indices = [int(_SHARD_RE.search(p.name).group(2)) for p in self._own_shards()]
        return self.root / f"shard-r{self.rank:03d}-{max(indices, default=-1) + 1:05d}.safetensors"

    # -- startup ----------------------------------------------------------------------------------------------

    def recover(self) -> None:
        """Bring this rank's files to a clean state after a crash (before anyone scans the done set)."""
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        pid_tmp = [p for d in (self.root, self.spool_dir) for p in d.glob(".*.tmp-*")]
        mine = (f"-r{self.rank:03d}-", f".index-r{self.rank:03d}.")
        if self.rank == 0:
            mine += (f".{INDEX_FILE}.", f".{CONFIG_FILE}.")
        for tmp in pid_tmp:  # temporaries of a killed writer of this rank are garbage
            if any(m in tmp.name for m in mine):
                tmp.unlink(missing_ok=True)
        in_shards = {pid for shard in self.root.glob(SHARD_GLOB) for pid in read_shard_info(shard)["problem_id"]}
        # Orphans: spool files of ranks that no longer exist (the run restarted with fewer processes).
        orphans = [p for p in self._spools() if (r := int(_SPOOL_RE.search(p.name).group(1))) >= self.world
                   and r % self.world == self.rank]
        for spool in self._spools(self.rank) + orphans:
            if set(read_shard_info(spool)["problem_id"]) <= in_shards:  # packed, then killed before deleting
                spool.unlink()
                _checkpoint("spool_removed", path=spool)
        # The shard files are the record; the manifest is rebuilt from them (it may predate the last shard).
        self.manifest = {p.name: read_shard_info(p)["problem_id"] for p in self._own_shards()}
        orphans = [p for p in orphans if p.exists()]
        if orphans:
            self._pack(orphans)
        if sum(_problem_count(p) for p in self._spools(self.rank)) >= self.problems_per_shard:
            self._pack(self._spools(self.rank))
        self.write_manifest()

    # -- writing ----------------------------------------------------------------------------------------------

    def add_batch(self, batch_index: int, problems: list[CollectedProblem]) -> None:
        path = self.spool_dir / f"spool-r{self.rank:03d}-b{batch_index:07d}.safetensors"
        write_shard(path, problems, self.info, self.dtype)
        _checkpoint("spooled", path=path, problems=[p.problem_id for p in problems])
        spools = self._spools(self.rank)
        if sum(_problem_count(p) for p in spools) >= self.problems_per_shard:
            self._pack(spools)

    def finish(self) -> None:
        spools = self._spools(self.rank)
        if spools:
            self._pack(spools)
        self.write_manifest()

    def _pack(self, spools: list[Path]) -> None:
        problems = [p for spool in spools for p in read_shard(spool)[0]]
        path = write_shard(self._next_shard(), problems, self.info, self.dtype)
        self.written.append(path)
        self.manifest[path.name] = [p.problem_id for p in problems]
        _checkpoint("shard_written", path=path)
        self.write_manifest()
        _checkpoint("manifest_written", path=path)
        for spool in spools:
            spool.unlink(missing_ok=True)
            _checkpoint("spool_removed", path=spool)
        fsync_dir(self.spool_dir)

    def write_manifest(self) -> None:
        """``index-r{rank}.json``: this rank's shards and their problems (atomic replace)."""
        shards = dict(sorted(self.manifest.items()))
        atomic_write_json(self.root / f"index-r{self.rank:03d}.json",
                          {"rank": self.rank, "shards": shards, "problems": sum(map(len, shards.values()))})


def done_problem_ids(output_dir: str | os.PathLike) -> set[str]:
    """Ids of every problem already committed in `output_dir` (shards and pending spool files of all ranks)."""
    root = Path(output_dir)
    files = list(root.glob(SHARD_GLOB)) + list((root / "spool").glob("spool-r*-b*.safetensors"))
    return {pid for f in files for pid in read_shard_info(f)["problem_id"]}


def write_index(output_dir: str | os.PathLike) -> dict:
    """Merge every shard into ``index.json`` (shard → problem ids, totals). Run by the main process at the end."""
    root = Path(output_dir)
    shards = {p.name: read_shard_info(p)["problem_id"] for p in sorted(root.glob(SHARD_GLOB))}
    index = {"shards": shards, "problems": sum(map(len, shards.values())), "format": "hf_msv.shard"}
    atomic_write_json(root / INDEX_FILE, index)
    return index


# ----------------------------------------------------------------------------------------------------------------
# collect
# ----------------------------------------------------------------------------------------------------------------


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


def _prompt_builder(template, tokenizer) -> Callable[[Problem], str | list]:
    """``"auto"`` (chat template if the tokenizer has one, else the question), ``"chat"``, ``"plain"``,
    ``"testbed"`` (`hf_msv.testbed.format_prompt`), a string with ``{question}``, or a callable."""
    if callable(template):
        return template
    if template == "auto":
        template = "chat" if getattr(tokenizer, "chat_template", None) else "plain"
    if template == "chat":
        return lambda p: [{"role": "user", "content": p.question}]
    if template == "plain":
        return lambda p: p.question
    if template == "testbed":
        from ..testbed import format_prompt

        return format_prompt
    if "{question}" not in template:
        raise ValueError(f"prompt_template must be auto/chat/plain/testbed or contain '{{question}}', got {template!r}")
    # str.replace, not str.format: templates often contain LaTeX braces such as \boxed{}.
    return lambda p: template.replace("{question}", p.question)


def _batch_seed(seed: int, ids: Sequence[str]) -> int:
    digest = hashlib.sha256(f"{seed}\x00{'|'.join(ids)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (2**63 - 1)


def _lm_info(model, tokenizer) -> dict:
    config = model.config.get_text_config()
    return {"lm_name_or_path": getattr(model.config, "_name_or_path", "") or getattr(model, "name_or_path", ""),
            "lm_model_type": getattr(model.config, "model_type", None),
            "lm_hidden_size": config.hidden_size,
            "lm_num_attention_heads": getattr(config, "num_attention_heads", None),
            "lm_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "lm_weights_fingerprint": _weights_fingerprint(model),
            "tokenizer": getattr(tokenizer, "name_or_path", "")}


def _weights_fingerprint(model) -> str:
    """A short hash of every parameter's name, shape and first values: a retrained checkpoint under the same path
    must not resume a collection made with the old one. Exact values, so it is the same on every device."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, p in model.named_parameters():
            digest.update(f"{name}{tuple(p.shape)}{p.flatten()[:8].float().tolist()}".encode())
    return digest.hexdigest()[:16]


def _check_config(root: Path, settings: dict, is_main: bool, overwrite: bool, state) -> None:
    path = root / CONFIG_FILE
    if is_main:
        if overwrite:
            for f in [*root.glob(SHARD_GLOB), *root.glob("index*.json"), *(root / "spool").glob("*"), path]:
                f.unlink(missing_ok=True)
        if not path.exists():
            atomic_write_json(path, settings)
    state.wait_for_everyone()
    existing = json.loads(path.read_text())
    if existing != settings:
        diff = {k: (existing.get(k), settings.get(k)) for k in set(existing) | set(settings)
                if existing.get(k) != settings.get(k)}
        raise ValueError(f"{root} holds a collection with other settings (existing, requested): {diff}. Use a new "
                         "output_dir, the same settings to resume, or overwrite=True to start over.")


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
    from tqdm.auto import tqdm

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
    state = process_state()
    rank, world = state.process_index, state.num_processes
    root = Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    checker_kwargs = dict(checker_kwargs or {})
    # Everything that changes what is sampled or stored; resuming with other values would mix two datasets.
    settings = {"num_samples": num_samples, "max_new_tokens": max_new_tokens, "temperature": temperature,
                "top_p": top_p, "top_k": top_k, "mode": mode, "delimiters": delimiters,
                "every_k_tokens": every_k_tokens, "elicitation_prompt": elicitation_prompt,
                "max_answer_tokens": max_answer_tokens, "checker": checker, "checker_kwargs": checker_kwargs,
                "prompt_template": prompt_template if isinstance(prompt_template, str) else
                f"{getattr(prompt_template, '__module__', '')}.{getattr(prompt_template, '__qualname__', '')}",
                "problems_per_shard": problems_per_shard, "problems_per_batch": problems_per_batch, "seed": seed,
                "dtype": dtype, "confidence_top_k": confidence_top_k, **_lm_info(model, tokenizer)}
    _check_config(root, settings, state.is_main_process, overwrite, state)

    info = dict(settings, format_version="1", token_logprobs_source="generation")
    store = _ShardStore(root, rank, world, problems_per_shard, dtype, info)
    store.recover()
    state.wait_for_everyone()  # every rank has cleaned up before anyone reads the done set
    done = done_problem_ids(root)

    mine = list(problems[rank::world])
    batches = [mine[i:i + problems_per_batch] for i in range(0, len(mine), problems_per_batch)]
    todo = [(b, [p for p in batch if p.id not in done]) for b, batch in enumerate(batches)]
    todo = [(b, batch, left) for (b, left), batch in zip(todo, batches) if left]
    skipped = len(mine) - sum(len(left) for _, _, left in todo)
    result = CollectResult(str(root), rank, world, problems=len(mine), skipped=skipped, generated=0)

    checker_obj = get_checker(checker, **checker_kwargs)
    build_prompt = _prompt_builder(prompt_template, tokenizer)
    bar = tqdm(total=len(mine), initial=skipped, unit="problem", dynamic_ncols=True, desc=f"collect[{rank}]",
               disable=not (progress and state.is_local_main_process))
    start = time.perf_counter()
    was_training = model.training
    model.eval()
    try:
        with prepare_generation(model, tokenizer, None, mode=mode, delimiters=delimiters,
                                every_k_tokens=every_k_tokens, elicitation_prompt=elicitation_prompt,
                                max_answer_tokens=max_answer_tokens, checker=checker_obj,
                                capture_hidden_states=True) as session:
            for b, batch, left in todo:
                torch.manual_seed(_batch_seed(seed, [p.id for p in batch]))
                recorder = ConfidenceRecorder(confidence_top_k)
                results = session.generate([build_prompt(p) for p in batch], num_sequences=num_samples,
                                           max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature,
                                           top_p=top_p, top_k=top_k,
                                           logits_processor=LogitsProcessorList([recorder]))
                table = recorder.table()
                records = []
                for i, (problem, res) in enumerate(zip(batch, results)):
                    if problem.id not in {p.id for p in left}:
                        continue  # done by another process of an earlier run with another world size
                    rows = range(i * num_samples, (i + 1) * num_samples)
                    record = _record(model, problem, res, table, rows, checker_obj)
                    records.append(record)
                    result.tokens += int(record.sequence_length.sum())
                    result.answer_tokens += int(record.answer_length.sum())
                    result.answers += record.num_answers
                store.add_batch(b, records)
                result.generated += len(records)
                bar.update(len(records))
                elapsed = time.perf_counter() - start
                bar.set_postfix(tok_s=f"{result.tokens / elapsed:.0f}", answers=result.answers, refresh=False)
        store.finish()
    finally:
        bar.close()
        model.train(was_training)
        result.seconds = time.perf_counter() - start
        result.shards = [str(p) for p in store.written]
    state.wait_for_everyone()
    if state.is_main_process:
        write_index(root)
    return result


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------


def load_problems(spec: str) -> list[Problem]:
    """Problems from a spec: ``testbed:<split>:<n>[:<seed>]``, ``<benchmark>[:<n>]`` (a name of
    `hf_msv.problems.BENCHMARKS`, first n problems), or a ``.jsonl`` file of ``{"id", "question", "gold"}``."""
    from ..data.problems import BENCHMARKS, load_benchmark

    parts = spec.split(":")
    if parts[0] == "testbed":
        from ..testbed import generate_problems

        if len(parts) not in (3, 4):
            raise ValueError("testbed spec is testbed:<split>:<n>[:<seed>]")
        return generate_problems(parts[1], int(parts[2]), seed=int(parts[3]) if len(parts) == 4 else 0)
    if parts[0] in BENCHMARKS:
        problems = load_benchmark(parts[0])
        return problems[: int(parts[1])] if len(parts) > 1 else problems
    path = Path(spec)
    if path.is_file():
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [Problem(id=str(r["id"]), question=r["question"], gold=str(r["gold"]), source=r.get("source", path.stem),
                        meta=r.get("meta", {})) for r in rows]
    raise ValueError(f"unknown problem spec {spec!r}: use testbed:<split>:<n>[:<seed>], one of {sorted(BENCHMARKS)}"
                     "[:<n>], or a .jsonl file")


def load_lm(name: str, dtype: str = "auto", device=None, gguf_file: str | None = None):
    """``(model, tokenizer)`` in eval mode: ``"testbed"`` is the shipped testbed LM, anything else goes to
    ``AutoModelForCausalLM`` / ``AutoTokenizer`` (`gguf_file`: a GGUF file inside that repo or directory).
    `device` (``None`` or ``"auto"``) defaults to this process's accelerate device: the GPU when there is one."""
    device = resolve_device(device)
    torch_dtype = None if dtype == "auto" else getattr(torch, dtype)
    if name == "testbed":
        from ..testbed import load_testbed_lm

        return load_testbed_lm(device=device, dtype=torch_dtype)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(name, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype if dtype == "auto" else torch_dtype, **kwargs)
    return model.to(device).eval(), tokenizer


def add_collect_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``hf-msv collect`` options (one per `collect` argument)."""
    parser.add_argument("--model", required=True, help='LM path or Hub id; "testbed" for the shipped testbed LM')
    parser.add_argument("--problems", required=True,
                        help="testbed:<split>:<n>[:<seed>] | <benchmark>[:<n>] | problems.jsonl")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--num-samples", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=4096)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--mode", choices=["streaming", "terminal"], default="streaming")
    parser.add_argument("--delimiters", nargs="*", default=None, help='default: "Wait"')
    parser.add_argument("--every-k-tokens", type=int, default=None)
    parser.add_argument("--elicitation-prompt", default=ELICITATION_PROMPT)
    parser.add_argument("--max-answer-tokens", type=int, default=MAX_ANSWER_TOKENS)
    parser.add_argument("--checker", default="symbolic", help="symbolic | exact | jaccard | embedding | random")
    parser.add_argument("--prompt-template", default="auto",
                        help='auto | chat | plain | testbed | a string containing "{question}"')
    parser.add_argument("--problems-per-shard", type=int, default=16)
    parser.add_argument("--problems-per-batch", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=sorted(STORAGE_DTYPES), default="bfloat16",
                        help="storage dtype of hidden states")
    parser.add_argument("--model-dtype", default="auto", help="dtype to load the LM in (auto, bfloat16, float32)")
    parser.add_argument("--confidence-top-k", type=int, default=20)
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--overwrite", action="store_true")
    return parser


def collect_from_args(args: argparse.Namespace) -> CollectResult:
    """Run `collect` from parsed `add_collect_arguments` options."""
    model, tokenizer = load_lm(args.model, args.model_dtype)
    problems = load_problems(args.problems)
    template = args.prompt_template
    if template == "auto" and args.model == "testbed":
        template = "testbed"
    return collect(model, tokenizer, problems, args.output_dir, num_samples=args.num_samples,
                   max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                   top_k=args.top_k, mode=args.mode, delimiters=args.delimiters, every_k_tokens=args.every_k_tokens,
                   elicitation_prompt=args.elicitation_prompt, max_answer_tokens=args.max_answer_tokens,
                   checker=args.checker, prompt_template=template, problems_per_shard=args.problems_per_shard,
                   problems_per_batch=args.problems_per_batch, seed=args.seed, dtype=args.dtype,
                   confidence_top_k=args.confidence_top_k, progress=not args.no_progress, overwrite=args.overwrite)


def main(argv: Sequence[str] | None = None) -> None:
    parser = add_collect_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    result = collect_from_args(parser.parse_args(argv))
    summary = {k: v for k, v in asdict(result).items() if k != "shards"}
    summary.update(shards_written=len(result.shards), tokens_per_s=result.tokens_per_s)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
