"""The building blocks the reproduction's studies share: collections of the task's problems (resumable, reused under
their reuse key), verifier fits (trained, reused or queued on `TrainingQueue`'s worker processes), the LM's measured
costs, and the agreement of a weak equivalence checker with the reference one."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..elicitation import ElicitationSettings
from ..utils import atomic_write_json
from .config import ReproduceConfig
from .own_lm import reproduction_task
from .reuse import (
    COLLECTION_CODE,
    KEY_FILE,
    TRAINING_CODE,
    ReuseLog,
    code_version,
    data_fingerprint,
    only_code_differs,
    reuse_key,
    stored_key,
    write_key,
)

if TYPE_CHECKING:
    from ..evaluation.early_stop import LatencyCosts

__all__ = [
    "ShardReuse",
    "collect_problems",
    "set_aside",
    "collect_splits",
    "train_or_reuse",
    "kept_despite_code",
    "pending_despite_code",
    "train_fit",
    "resumable",
    "PENDING_KEY",
    "TrainingQueue",
    "measure_lm_costs",
    "checker_agreement",
]

PENDING_KEY = "reuse_key.pending.json"  # the key of a fit still training (`train_fit`)


@dataclass(frozen=True)
class ShardReuse:
    """How a run's collections treat shards already in the work directory: `policy` "matching" (reuse them only
    under the same reuse key) or "keep" (reuse them whatever their key), every decision recorded in `log`."""

    log: ReuseLog = field(default_factory=ReuseLog)
    policy: str = "matching"


def collect_problems(
    model,
    tokenizer,
    split: str,
    problems: range,
    out: Path,
    cfg: ReproduceConfig,
    num_samples: int,
    *,
    problem_seed: int = 0,
    elicitation: ElicitationSettings | None = None,
    reuse: ShardReuse | None = None,
):
    """Collect the task's problems `problems` of `split` into `out` (`reproduction_task`: a testbed task's draw, or
    an own LM's spec); resumable, as `hf_msv.collect.collect` is.

    Args:
        problems: indices into the seeded draw of `split` (seed `problem_seed`; an own LM's: its spec, in order):
            ``range(count)``, or ``range(first, count)`` for the problems beyond the first `first` (the first
            `count` of a draw are a prefix of any larger draw, so a bigger collection extends a smaller one).
        elicitation: where answers are elicited, when not at the library's default (the delimiter study's
            delimiter-free collection); None: the default.
        reuse: shards already in `out` are extended only when their reuse key (collection settings, the LM's
            weights, the collection code; an own LM's prompt template, delimiters and problems) matches; otherwise
            they are collected again, the old ones moved aside (`set_aside`), unless its policy is "keep". The
            count is not part of the key (a larger count extends).
    """
    from ..collect import collect

    task, reuse = reproduction_task(cfg), reuse or ShardReuse()
    where = (
        {}
        if elicitation is None
        else {"delimiters": list(elicitation.delimiters), "every_k_tokens": elicitation.every_k_tokens}
    )
    settings = dict(
        split=split,
        first=problems.start,
        num_samples=num_samples,
        max_new_tokens=cfg.max_new_tokens,
        checker=cfg.reference_checker,
        problems_per_shard=cfg.problems_per_shard,
        seed=cfg.collect_seed,
        problem_seed=problem_seed,
        **where,
        **task.collection_settings(split),
    )
    key = reuse_key(settings, code_version(COLLECTION_CODE), task.lm_fingerprint(model))
    kept = _decide_shards(out, key, reuse)
    drawn = task.problems(split, problems.stop, seed=problem_seed)[problems.start :]
    if not kept:  # before collecting: an interrupted run's shards then match the next run's key and are extended
        out.mkdir(parents=True, exist_ok=True)
        write_key(out, key)
    return collect(model, tokenizer, drawn, out, cfg.collect_config(num_samples), elicitation=elicitation)


def _decide_shards(out: Path, key: dict, reuse: ShardReuse) -> bool:
    """Whether the shards in `out` are kept despite their key (policy "keep"); logs the decision, and moves
    shards that are not reused aside."""
    name = f"{out.parent.name}/{out.name}"
    exists = out.is_dir() and any(out.glob("*.safetensors"))
    if reuse.log.decide("shards", name, out, key, exists) or not exists:
        return False
    if reuse.policy == "keep":
        stored = stored_key(out)
        reuse.log.keep(
            "shards",
            name,
            f"kept by --reuse-shards keep: same settings and LM, collected by code version {stored['code']}"
            if only_code_differs(stored, key)
            else "kept by --reuse-shards keep although its key differs or is missing",
        )
        return True
    reuse.log.annotate("shards", name, f"the old shards moved to {set_aside(out).name}")
    return False


def set_aside(directory: Path) -> Path:
    """Move a stale collection or fit to the first free ``<name>.replaced-<k>`` beside it and return that path. Both
    are re-made when their reuse key differs, but either can take hours: the old one is kept for the user to compare,
    restore or delete, never deleted by a run."""
    k = 1
    while (aside := directory.with_name(f"{directory.name}.replaced-{k}")).exists():
        k += 1
    return directory.rename(aside)


def collect_splits(
    model,
    tokenizer,
    root: Path,
    cfg: ReproduceConfig,
    num_samples: int,
    sizes,
    *,
    elicitation: ElicitationSettings | None = None,
    reuse: ShardReuse | None = None,
):
    """`sizes` = problem counts of train, validation[, evaluation], collected into root/train, root/val, root/eval
    (`elicitation`, `reuse`: as in `collect_problems`)."""
    for (split, name), count in zip((("train", "train"), ("validation", "val"), ("evaluation", "eval")), sizes):
        collect_problems(
            model, tokenizer, split, range(count), root / name, cfg, num_samples, elicitation=elicitation, reuse=reuse
        )


def train_or_reuse(
    train_dir,
    val_dir,
    out: Path,
    config,
    counts: dict | None = None,
    log: ReuseLog | None = None,
    code: str | None = None,
    queue: TrainingQueue | None = None,
    reuse: str = "matching",
) -> Path:
    """Train unless `out` holds a finished run with the same reuse key: the training config, the fingerprint of the
    training and validation shards, and the training code's version (`code`, default
    ``code_version(TRAINING_CODE)``); with ``reuse="keep"`` a finished run whose config and data match is reused
    whatever code trained it (`kept_despite_code`), and a fit interrupted under another code version is resumed
    (`pending_despite_code`). `counts` tallies trained / reused; `log` records the decision.
    With a `queue` the fit is handed to it (it may still be running when this returns: `TrainingQueue.wait`). A
    finished fit that is not reused is moved aside (`set_aside`) before the new one trains."""
    out = Path(out)
    key = reuse_key(config.to_dict(), code or code_version(TRAINING_CODE), data_fingerprint(train_dir, val_dir))
    resume, begun = resumable(out, key), None
    if not resume and reuse == "keep" and (begun := pending_despite_code(out, key)) is not None:
        key, resume = begun, True  # finished under the key it was begun with: a later matching run retrains it
    finished = not resume and (out / "training_log.json").exists() and (out / "config.json").exists()
    log = log if log is not None else ReuseLog()
    if log.decide("verifier", out.name, out, key, finished) or (
        reuse == "keep" and finished and kept_despite_code(out, key, log)
    ):
        if counts is not None:
            counts["reused"] = counts.get("reused", 0) + 1
        return out
    if finished:  # a fit can take hours: the replaced one is kept for the user, never deleted by a run
        log.annotate("verifier", out.name, f"the old fit moved to {set_aside(out).name}")
    elif resume:
        why = (
            "interrupted by an earlier run with the same key"
            if begun is None
            else f"interrupted by an earlier run of code version {begun['code']} (--reuse-verifiers keep)"
        )
        log.annotate("verifier", out.name, f"{why}: resumed from its saved state")
    (queue or TrainingQueue()).submit(train_fit, train_dir, val_dir, out, config, key, tag=str(out))
    if counts is not None:
        counts["trained"] = counts.get("trained", 0) + 1
    return out


def kept_despite_code(out: Path, key: dict, log: ReuseLog) -> bool:
    """``--reuse-verifiers keep``: reuse the fit in `out` when only the code version of its key differs from `key`
    (same training config, same data), and log which code trained it. For a code change shown to leave training
    unchanged (e.g. a renamed output field); a fit whose config or data differ is still trained again."""
    stored = stored_key(out)
    if not only_code_differs(stored, key):
        return False
    log.keep(
        "verifier",
        out.name,
        f"kept by --reuse-verifiers keep: same settings and data, trained by code "
        f"version {stored.get('code')} (commit {str(stored.get('git_commit'))[:10]})",
    )
    return True


def train_fit(train_dir, val_dir, out: Path, config, key: dict) -> None:
    """One verifier fit into `out`, its reuse `key` stored last. While it trains, the key is kept as pending
    (`PENDING_KEY`): a fit interrupted then is resumed by the next run with the same key (`resumable`;
    ``train_verifier(resume=True)``: the same verifier as an uninterrupted fit), and whatever else is in `out`
    (an interrupted fit with another key) is removed first; a finished one was moved aside by `train_or_reuse`."""
    from ..training import train_verifier

    resume = resumable(out, key)
    if out.exists() and not resume:
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / PENDING_KEY, key)
    train_verifier(train_dir, val_dir, out, config, resume=resume)
    write_key(out, key)
    (out / PENDING_KEY).unlink()


def pending_despite_code(out: Path, key: dict) -> dict[str, Any] | None:
    """``--reuse-verifiers keep``: the pending key of a fit interrupted in `out` whose settings and data are `key`'s
    and only its training code differs (None otherwise). Resuming it under that key finishes it with the current
    code from the state the older code saved, and stores the older code's version: like a fit kept despite its code,
    it is the user's call that the change does not change training, and a later ``matching`` run trains it again."""
    pending = _interrupted_key(out)
    return pending if pending is not None and only_code_differs(pending, json.loads(json.dumps(key))) else None


def resumable(out: Path, key: dict) -> bool:
    """Whether `out` holds a fit that was interrupted while training under `key` (its pending key, no final one)."""
    return _interrupted_key(out) == json.loads(json.dumps(key))


def _interrupted_key(out: Path) -> dict | None:
    """The pending key of a fit interrupted in `out`: kept while it trained, no final key written (None if not)."""
    if (Path(out) / KEY_FILE).exists():
        return None
    try:
        return json.loads((Path(out) / PENDING_KEY).read_text())
    except (OSError, ValueError):
        return None


def _set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


class TrainingQueue:
    """Where a reproduction's verifier fits run: inline (``workers=1``), or `workers` at a time, each in its own
    process with `threads` torch threads. Small verifiers use two CPU cores poorly from one process (an MSV_16 step
    is a chain of small matrix products), so on 2 cores two 1-thread fits at once finish ~1.4× sooner than one
    2-thread fit after another (`ReproduceArguments.train_workers`). Fits are independent, so their order and
    results do not change; `wait` before reading what they write. Workers are spawned processes, which import the
    main module: a script that queues fits keeps them under ``if __name__ == "__main__":``."""

    def __init__(self, workers: int = 1, threads: int = 1):
        self.workers, self.threads = workers, max(1, threads)
        self._executor = None
        self._pending = []

    def submit(self, fn, *args, tag: str | None = None) -> None:
        """Run ``fn(*args)`` now (one worker) or in a worker process; `tag` (a fit's output path) lets `wait` wait
        for this fit alone."""
        if self.workers <= 1:
            fn(*args)
            return
        if self._executor is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # spawn: a forked copy of a process holding torch's thread pools (and maybe CUDA) is unsafe
            self._executor = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_set_threads,
                initargs=(self.threads,),
            )
        self._pending.append((tag, self._executor.submit(fn, *args)))

    def wait(self, tags=None) -> None:
        """Block until the submitted fits tagged with one of `tags` (default: every fit) have finished; re-raise the
        first failure. The others keep training: a study can evaluate its small fits while its large ones run."""
        chosen = [tags is None or tag in tags for tag, _ in self._pending]
        wanted = [f for (_, f), c in zip(self._pending, chosen) if c]
        self._pending = [entry for entry, c in zip(self._pending, chosen) if not c]
        for future in wanted:
            future.result()

    def close(self, cancel: bool = False) -> None:
        """Wait for the fits (or, with `cancel`, drop those not started) and stop the worker processes."""
        if not cancel:
            self.wait()
        if self._executor is not None:
            self._executor.shutdown(wait=not cancel, cancel_futures=True)
            self._executor = None
        self._pending = []


def measure_lm_costs(
    model,
    tokenizer,
    problems,
    num_sequences,
    max_new_tokens: int,
    cache: Path | None = None,
    delimiters=("Wait",),
    prompt_template="testbed",
) -> dict[int, LatencyCosts]:
    """Wall-clock LM costs on this machine, per N (N -> `LatencyCosts`): seconds per shared decode step of N parallel
    sequences (``timings["cot"]`` ÷ decode steps) and per elicited answer (``timings["elicitation"]`` ÷ answers), from
    `hf_msv.generation.msv_generate` (no verifier) on `problems` (prompts: `prompt_template`, as collections take
    it; each sequence at most `max_new_tokens`, or what the LM's context leaves room for), best of the problems."""
    from ..collect import sequence_budget
    from ..collect.lm import prompt_builder, prompt_token_ids
    from ..evaluation.early_stop import LatencyCosts
    from ..generation import msv_generate

    if cache is not None and cache.exists():
        data = json.loads(cache.read_text())
        if all(str(n) in data for n in num_sequences):
            return {int(n): LatencyCosts(**v) for n, v in data.items()}
    out, build = {}, prompt_builder(prompt_template, tokenizer)
    elicitation = ElicitationSettings(delimiters=tuple(delimiters))
    for n in num_sequences:
        best = None
        for p in problems:
            prompt = build(p)
            room = sequence_budget(model, tokenizer, elicitation, len(prompt_token_ids(prompt, tokenizer)))
            res = msv_generate(
                model,
                tokenizer,
                [prompt],
                num_sequences=n,
                max_new_tokens=max_new_tokens if room is None else min(max_new_tokens, room),
                delimiters=list(delimiters),
                checker="exact",
            )[0]
            steps = max(len(s) for s in res.sequences)
            c = LatencyCosts(res.timings["cot"] / max(steps, 1), res.timings["elicitation"] / max(len(res.answers), 1))
            best = c if best is None or c.decode_step_s < best.decode_step_s else best
        out[int(n)] = best
    if cache is not None:
        cache.write_text(json.dumps({str(n): asdict(c) for n, c in out.items()}, indent=1))
    return out


def checker_agreement(problems_ref, problems_weak, pairs_per_problem: int = 200, seed: int = 0) -> float:
    """Pairwise accuracy of a weak checker's classes against the reference ones: over random pairs of terminal
    answers of different sequences of a problem, how often "same class" agrees."""
    rng = np.random.default_rng(seed)
    hits = total = 0
    for ref, weak in zip(problems_ref, problems_weak):
        idx = np.flatnonzero(ref.answer_terminal)
        if len(idx) < 2:
            continue
        a = rng.choice(idx, size=pairs_per_problem)
        b = rng.choice(idx, size=pairs_per_problem)
        keep = ref.answer_sequence[a] != ref.answer_sequence[b]
        a, b = a[keep], b[keep]
        same_ref = ref.answer_class[a] == ref.answer_class[b]
        same_weak = weak.answer_class[a] == weak.answer_class[b]
        hits += int((same_ref == same_weak).sum())
        total += len(a)
    return hits / total if total else math.nan
