"""``hf-msv reproduce``: the paper's experiments re-run end to end on the testbed, with the paper's numbers beside ours.

    from hf_msv.reproduction import reproduce
    summary = reproduce("docs/results")              # paper sizes (main study: 14 min on an H100; see below)
    summary = reproduce("/tmp/quick", quick=True)    # a few minutes: few problems, N in {1, 4}, 2 training seeds

On a GPU pass ``device="cuda"`` and a larger ``ReproduceConfig.problems_per_batch`` (32: 0.30 s per problem at 64
samples on an H100, vs 1.17 s at 4, testbed v1; v2 on one H200: 0.24 s per problem at 32, 2.0 s at 1, from
``scripts/gpu_checks.sh``'s collection step, so all of v2's collections take about 5 min there). On 2 CPU cores
(``threads=2``) testbed v1 took about 2 h 5 min from scratch:
the main study 58 min (collection 45, training 11), the checker, mask and delimiter studies 16 min, grouping 23 min
(mostly its 256-sample collection) and the training-set-size study 28 min (mostly collecting 224 more problems).
Testbed v2's traces are twice as long with twice the answers: its train / validation collection alone took 50 min
(~10 s a problem at 64 samples) and one streaming MSV_16 20 min (mostly the vote cross-validation), so a v2 run is
several hours on 2 cores: split it over runs (collections resume) or use a GPU.

Pipeline (every stage is resumable: shards, trained verifiers, study evaluations and measured costs of an earlier
run in the work directory are reused when their reuse key — settings, data fingerprint, code version;
`hf_msv.reproduction.reuse` — matches; the report lists what was reused and what was redone, and why):

1. **collect** with the task's shipped testbed LM (`hf_msv.testbed`; v2 by default): 224 train / 64 validation / 448
   evaluation problems × 64 samples (temperature 1, ``Wait`` delimiter, elicitation ``### Final Answer ###
   \\boxed``, ≤ 40 answer tokens, symbolic checker as the reference), plus the delimiter-free every-K collection
   (delimiter study), a 256-sample evaluation set (grouping study) and training problems 225-448 (training-set-size
   study);
2. **measure** the LM's cost per shared decode step and per elicited answer for each N (wall clock, this machine);
3. **train** Probe and MSV_1/4/16/64 in both modes (terminal, streaming), the mask ablations of MSV_16, MSV_64
   with each weak checker, the delimiter-study verifiers, and Probe / MSV_64 on 56, 112 and 448 problems; each
   ``training_seeds`` times (default 3), with training seeds 0, 1, ...;
4. **evaluate** with `hf_msv.evaluation.evaluate_study` (groups: a fixed partition of each problem's samples; mean
   ± std over training seeds; paired bootstrap intervals over problems; λ rules on validation);
5. **report** ``testbed.md`` / ``testbed.json`` in `output_dir`: each experiment with the paper's corresponding
   numbers (AIME unless stated: the dataset of the paper's appendix studies) beside ours, and one sentence per claim
   saying whether it held — generated from the numbers (`hf_msv.reproduction.claims`, `.report`).

The testbed is a ~1M-parameter character-level LM on a synthetic arithmetic task, so absolute numbers are not
comparable with the paper's (a 1.5B reasoning LM on competition math); the comparisons that matter are the relative
ones (MSV_N vs the baselines), which is what the claims test. Training hyperparameters are adapted to the testbed's
128-wide hidden states and small data (see `training_config`); everything else follows the paper.

Each study is one public function of a `ReproductionContext` (the state the stages share: configuration,
directories, the LM, its measured costs and the main study's verifiers), returning its entry of the summary.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from .claims import compute_claims
from .config import ReproduceArguments, ReproduceConfig, training_config
from .paper import CHECKER_KWARGS, MASKS, PAPER
from .report import render_testbed
from .reuse import (COLLECTION_CODE, EVALUATION_CODE, TRAINING_CODE, ReuseLog, artefact_key, code_version,
                    data_fingerprint, only_code_differs, reuse_key, stored_key, write_key)
from .summary import autc_row, grouping_summary, main_summary, size_row, vote_check_rows

__all__ = ["ReproductionContext", "collect_problems", "collect_splits", "train_or_reuse", "kept_despite_code",
           "measure_lm_costs",
           "checker_agreement", "train_main_verifiers", "main_study", "checkers_study", "masks_study",
           "delimiters_study", "grouping_study", "training_size_study", "STUDY_STAGES", "reproduce",
           "train_shipped_verifier", "shipped_lambda", "SHIPPED_LAMBDA_FILE", "parse_arguments", "main"]


# ----------------------------------------------------------------------------------------------------------------
# Stages
# ----------------------------------------------------------------------------------------------------------------


def collect_problems(model, tokenizer, split: str, count: int, out: Path, cfg: ReproduceConfig, num_samples: int,
                     problem_seed: int = 0, first: int = 0, log: ReuseLog | None = None,
                     reuse_shards: str = "matching", **kwargs):
    """Collect testbed problems ``first..count-1`` of `split` into `out` (the first `count` are a prefix of any
    larger draw, so a bigger collection extends a smaller one); resumable, as `hf_msv.collect.collect` is.

    Shards already in `out` are extended only when their reuse key (collection settings, the testbed LM's weights,
    the collection code) matches; otherwise they are collected again, unless ``reuse_shards="keep"`` (then reused
    and logged as kept). The count is not part of the key (a larger count extends)."""
    from ..collect import collect
    from ..testbed import get_task

    task = get_task(cfg.task)
    settings = dict(split=split, first=first, num_samples=num_samples, max_new_tokens=cfg.max_new_tokens,
                    checker=cfg.reference_checker, problems_per_shard=cfg.problems_per_shard, seed=cfg.collect_seed,
                    problem_seed=problem_seed, **kwargs)
    key = reuse_key(settings, code_version(COLLECTION_CODE), data_fingerprint(task.lm_dir))
    log = log if log is not None else ReuseLog()
    name = f"{out.parent.name}/{out.name}"
    exists = out.is_dir() and any(out.glob("*.safetensors"))
    kept = False
    if not log.decide("shards", name, out, key, exists) and exists:
        if reuse_shards == "keep":
            stored = stored_key(out)
            log.keep("shards", name, f"kept by --reuse-shards keep: same settings and LM, collected by code version "
                                     f"{stored['code']}" if only_code_differs(stored, key)
                     else "kept by --reuse-shards keep although its key differs or is missing")
            kept = True
        else:
            shutil.rmtree(out)
    problems = task.generate_problems(split, count, seed=problem_seed)[first:]
    if not kept:  # before collecting: an interrupted run's shards then match the next run's key and are extended
        out.mkdir(parents=True, exist_ok=True)
        write_key(out, key)
    return collect(model, tokenizer, problems, out, num_samples=num_samples, max_new_tokens=cfg.max_new_tokens,
                   checker=cfg.reference_checker, prompt_template="testbed", problems_per_shard=cfg.problems_per_shard,
                   problems_per_batch=cfg.problems_per_batch, seed=cfg.collect_seed, progress=False, **kwargs)


def collect_splits(model, tokenizer, root: Path, cfg: ReproduceConfig, num_samples: int, sizes, **kwargs):
    """`sizes` = problem counts of train, validation[, evaluation], collected into root/train, root/val, root/eval."""
    for (split, name), count in zip((("train", "train"), ("validation", "val"), ("evaluation", "eval")), sizes):
        collect_problems(model, tokenizer, split, count, root / name, cfg, num_samples, **kwargs)


def train_or_reuse(train_dir, val_dir, out: Path, config, counts: dict | None = None, log: ReuseLog | None = None,
                   code: str | None = None, queue: "TrainingQueue | None" = None, reuse: str = "matching") -> Path:
    """Train unless `out` holds a finished run with the same reuse key: the training config, the fingerprint of the
    training and validation shards, and the training code's version (`code`, default
    ``code_version(TRAINING_CODE)``); with ``reuse="keep"`` a finished run whose config and data match is reused
    whatever code trained it (`kept_despite_code`). `counts` tallies trained / reused; `log` records the decision.
    With a `queue` the fit is handed to it (it may still be running when this returns: `TrainingQueue.wait`)."""
    out = Path(out)
    key = reuse_key(asdict(config), code or code_version(TRAINING_CODE), data_fingerprint(train_dir, val_dir))
    finished = (out / "training_log.json").exists() and (out / "config.json").exists()
    log = log if log is not None else ReuseLog()
    if log.decide("verifier", out.name, out, key, finished) or (
            reuse == "keep" and finished and kept_despite_code(out, key, log)):
        if counts is not None:
            counts["reused"] = counts.get("reused", 0) + 1
        return out
    (queue or TrainingQueue()).submit(train_fit, train_dir, val_dir, out, config, key)
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
    log.keep("verifier", out.name, f"kept by --reuse-verifiers keep: same settings and data, trained by code "
                                   f"version {stored.get('code')} (commit {str(stored.get('git_commit'))[:10]})")
    return True


def train_fit(train_dir, val_dir, out: Path, config, key: dict) -> None:
    """One verifier fit into a fresh `out`, its reuse `key` stored last (an interrupted fit is never reused)."""
    from ..training import train_verifier

    if out.exists():
        shutil.rmtree(out)
    train_verifier(train_dir, val_dir, out, config)
    write_key(out, key)


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

    def submit(self, fn, *args) -> None:
        if self.workers <= 1:
            fn(*args)
            return
        if self._executor is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # spawn: a forked copy of a process holding torch's thread pools (and maybe CUDA) is unsafe
            self._executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_set_threads, initargs=(self.threads,))
        self._pending.append(self._executor.submit(fn, *args))

    def wait(self) -> None:
        """Block until every submitted fit has finished; re-raise the first failure."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def close(self, cancel: bool = False) -> None:
        """Wait for the fits (or, with `cancel`, drop those not started) and stop the worker processes."""
        if not cancel:
            self.wait()
        if self._executor is not None:
            self._executor.shutdown(wait=not cancel, cancel_futures=True)
            self._executor = None
        self._pending = []


def measure_lm_costs(model, tokenizer, problems, num_sequences, max_new_tokens: int, cache: Path | None = None,
                     delimiters=("Wait",)) -> dict:
    """Wall-clock LM costs on this machine, per N: seconds per shared decode step of N parallel sequences
    (``timings["cot"]`` ÷ decode steps) and per elicited answer (``timings["elicitation"]`` ÷ answers), from
    `hf_msv.generation.msv_generate` (no verifier) on `problems`, best of the problems."""
    from ..evaluation.early_stop import LatencyCosts
    from ..generation import msv_generate
    from ..testbed import format_prompt

    if cache is not None and cache.exists():
        data = json.loads(cache.read_text())
        if all(str(n) in data for n in num_sequences):
            return {int(n): LatencyCosts(**v) for n, v in data.items()}
    out = {}
    for n in num_sequences:
        best = None
        for p in problems:
            res = msv_generate(model, tokenizer, [format_prompt(p)], num_sequences=n, max_new_tokens=max_new_tokens,
                               delimiters=list(delimiters), checker="exact")[0]
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


# ----------------------------------------------------------------------------------------------------------------
# The state the studies share
# ----------------------------------------------------------------------------------------------------------------


class _Clock:
    """Wall-clock seconds per named stage (summed when a name repeats), logged as each starts and ends."""

    def __init__(self, log):
        self.times: dict[str, float] = {}
        self.log = log

    @contextmanager
    def __call__(self, name):
        start = time.perf_counter()
        self.log(f"[reproduce] {name} ...")
        try:
            yield
        finally:
            self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - start
            self.log(f"[reproduce] {name} done in {time.perf_counter() - start:.0f} s")


@dataclass
class ReproductionContext:
    """What a reproduction's stages share. `verifiers` (method -> mode -> [path per training seed]) and
    `main_results` are the main study's, filled by `train_main_verifiers` / `main_study`; `reports` (study -> report
    path relative to `output_dir`), `counts` (verifiers trained / reused) and `reuse` (every reuse decision) are
    filled as stages run; `vote_checks` holds every MSV fit against the vote (`vote_check_rows`), per evaluation."""

    config: ReproduceConfig
    work_dir: Path
    output_dir: Path
    model: object = None
    tokenizer: object = None
    lm_costs: dict = field(default_factory=dict)
    verifiers: dict = field(default_factory=dict)
    main_results: dict | None = None
    reports: dict = field(default_factory=dict)
    counts: dict = field(default_factory=lambda: {"trained": 0, "reused": 0})
    clock: _Clock = field(default_factory=lambda: _Clock(lambda *a, **k: None))
    reuse: ReuseLog = field(default_factory=ReuseLog)
    reuse_shards: str = "matching"
    reuse_verifiers: str = "matching"
    vote_checks: list = field(default_factory=list)
    queue: TrainingQueue = field(default_factory=TrainingQueue)

    @property
    def data(self) -> Path:
        """The main collection: data/train, data/val, data/eval."""
        return self.work_dir / "data"

    @property
    def stem(self) -> str:
        """File stem of the reports (`ReproduceConfig.stem`)."""
        return self.config.stem

    @property
    def collect_kwargs(self) -> dict:
        """What every collection of the run passes to `collect_problems` (the reuse log and policy)."""
        return {"log": self.reuse, "reuse_shards": self.reuse_shards}

    def train(self, train_dir, name: str, config, val_dir=None) -> list[str]:
        """`train_or_reuse` into work_dir/verifiers/`name` (``name-seed{s}`` for training seed s ≥ 1; validation:
        the main collection's), once per training seed: the paths, seed 0 first."""
        paths = []
        for seed in range(self.config.training_seeds):
            out = self.work_dir / "verifiers" / (name if seed == 0 else f"{name}-seed{seed}")
            paths.append(str(train_or_reuse(train_dir, val_dir or self.data / "val", out, replace(config, seed=seed),
                                            counts=self.counts, log=self.reuse, queue=self.queue,
                                            reuse=self.reuse_verifiers)))
        return paths

    def specs(self, name: str, modes=("terminal", "streaming")) -> list[dict]:
        """One main-study verifier's checkpoints for `evaluate_study`: [{mode: path} per training seed]."""
        return seed_specs({m: self.verifiers[name][m] for m in modes})

    def evaluate(self, eval_dir, verifiers: dict, ns, val_dir=None, *, report_name: str, title: str,
                 subdir: bool = True, **kwargs) -> dict:
        """`evaluate_study` with the run's LM costs and DeepConf window; the report goes to output_dir/studies
        (`subdir`) or output_dir, and is recorded in `reports` by the caller;
        every MSV fit of it is checked against the vote into `vote_checks`."""
        from ..evaluation import evaluate_study

        self.queue.wait()  # the fits being evaluated may still be training
        kwargs = {"figures": False, "progress": False} | kwargs
        out, stem = self.output_dir / "studies" if subdir else self.output_dir, f"{self.stem}-{report_name}"
        # A v2 run spans several sittings on 2 CPU cores, and evaluating the main study alone takes ~half an hour:
        # an evaluation is kept (results, report, figures) and reused while its inputs are unchanged.
        settings = {"verifiers": {name: checkpoint_keys(specs) for name, specs in verifiers.items()},
                    "ns": sorted(ns), "title": title, "deepconf_window": self.config.deepconf_window,
                    "lm_costs": {str(n): asdict(c) for n, c in self.lm_costs.items()},
                    "validation": val_dir is not None, **{k: v for k, v in kwargs.items() if k != "progress"}}
        key = reuse_key(settings, code_version(EVALUATION_CODE),
                        data_fingerprint(*[d for d in (eval_dir, val_dir) if d is not None]))
        kept = self.work_dir / "evaluations" / stem
        if self.reuse.decide("evaluation", stem, kept, key, (kept / f"{stem}.json").exists()):
            res = restore_evaluation(kept, out, stem)
        else:
            res = evaluate_study(eval_dir, verifiers, out, ns, val_dir, lm_costs=self.lm_costs,
                                 deepconf_window=self.config.deepconf_window, title=title, report_name=stem, **kwargs)
            keep_evaluation(out, stem, kept, key)
        self.vote_checks += vote_check_rows(res, report_name)
        return res


def checkpoint_keys(spec):
    """A verifier spec of `evaluate_study` (a checkpoint path, {mode: path}, or a list of those, one per training
    seed) with every path replaced by the reuse key stored with it (the path itself when it has none)."""
    if isinstance(spec, dict):
        return {mode: checkpoint_keys(path) for mode, path in spec.items()}
    if isinstance(spec, (list, tuple)):
        return [checkpoint_keys(one) for one in spec]
    return artefact_key(spec) or str(spec)


def _copy_evaluation(source: Path, destination: Path, stem: str) -> None:
    """Copy the files `evaluate_study` writes for report `stem` (``stem.json``, ``stem.md``, the figures
    ``stem_*.png``) from `source` into `destination`."""
    destination.mkdir(parents=True, exist_ok=True)
    for f in [source / f"{stem}.json", source / f"{stem}.md", *source.glob(f"{stem}_*.png")]:
        if f.exists():
            shutil.copy2(f, destination / f.name)


def keep_evaluation(out: Path, stem: str, kept: Path, key: dict) -> None:
    """Keep what `evaluate_study` wrote into `out` in a fresh `kept`, its reuse `key` last (an interrupted copy is
    never reused)."""
    if kept.exists():
        shutil.rmtree(kept)
    _copy_evaluation(out, kept, stem)
    write_key(kept, key)


def restore_evaluation(kept: Path, out: Path, stem: str) -> dict:
    """Put a kept evaluation's results, report and figures back into `out`; its results dict."""
    _copy_evaluation(kept, out, stem)
    return json.loads((kept / f"{stem}.json").read_text())


def seed_specs(paths_by_mode: dict) -> list[dict]:
    """{mode: [path per training seed]} -> [{mode: path} per training seed] (what `evaluate_study` takes)."""
    counts = {len(v) for v in paths_by_mode.values()}
    if len(counts) != 1:
        raise ValueError(f"modes with different numbers of training seeds: {paths_by_mode}")
    return [{m: v[s] for m, v in paths_by_mode.items()} for s in range(counts.pop())]


# ----------------------------------------------------------------------------------------------------------------
# Studies: each returns its summary entry and records its report in `ctx.reports`
# ----------------------------------------------------------------------------------------------------------------


def train_main_verifiers(ctx: ReproductionContext) -> dict:
    """Probe and MSV_n for every n of the main study, terminal and streaming: ``{method: {mode: path}}``."""
    cfg, data = ctx.config, ctx.data
    for mode in ("terminal", "streaming"):
        ctx.verifiers.setdefault("Probe", {})[mode] = ctx.train(
            data / "train", f"probe-{mode}", training_config("probe", 1, mode, cfg.quick))
        for n in cfg.num_sequences:
            ctx.verifiers.setdefault(f"MSV_{n}", {})[mode] = ctx.train(
                data / "train", f"msv{n}-{mode}", training_config("msv", n, mode, cfg.quick))
    ctx.queue.wait()  # so that the "train main" stage times the training
    return ctx.verifiers


def main_study(ctx: ReproductionContext, progress: bool = True) -> dict:
    """The main study (C1-C5): the main verifiers and every baseline on the evaluation split, each N, with figures
    and λ rules chosen on validation. Needs `train_main_verifiers` first; keeps the results in `ctx.main_results`."""
    cfg = ctx.config
    from ..evaluation import difficulty_from_problems
    from ..testbed import get_task

    steps = difficulty_from_problems(get_task(cfg.task).generate_problems("evaluation", cfg.eval_problems), "ops")
    ctx.main_results = ctx.evaluate(ctx.data / "eval", {k: ctx.specs(k) for k in ctx.verifiers}, cfg.num_sequences,
                                    ctx.data / "val", difficulty=steps, difficulty_name="reasoning steps",
                                    title="Testbed reproduction: main study", report_name="main", subdir=False,
                                    figures=True, progress=progress)
    ctx.reports["main"] = f"{ctx.stem}-main.md"
    return main_summary(ctx.main_results, cfg.num_sequences)


def checkers_study(ctx: ReproductionContext) -> dict:
    """Checker robustness: terminal MSV_N (without logit averaging) trained with each weak checker's classes, and
    best-of-N of it and of the checker-dependent baselines when evaluation groups answers with that checker."""
    from ..evaluation import load_split

    cfg, data, n = ctx.config, ctx.data, ctx.config.max_n
    ref_problems, _ = load_split(data / "eval", hidden=False)
    trained = {"reference": ctx.train(data / "train", f"msv{n}-terminal-nolavg",
                                      training_config("msv", n, "terminal", cfg.quick, logit_averaging=False))}
    for c in cfg.checkers:
        trained[c] = ctx.train(data / "train", f"msv{n}-terminal-nolavg-{c}",
                               training_config("msv", n, "terminal", cfg.quick, logit_averaging=False, checker=c,
                                               checker_kwargs=CHECKER_KWARGS[c]))
    rows = {}
    for c in ("reference",) + tuple(cfg.checkers):
        vs = {f"MSV_{n} (reference-trained)": ctx.verifiers[f"MSV_{n}"]["terminal"],
              f"MSV_{n} (trained with checker)": trained[c],
              "Probe": ctx.verifiers["Probe"]["terminal"], "MSV_1": ctx.verifiers["MSV_1"]["terminal"]}
        # name -> [path per training seed]
        checker = None if c == "reference" else c
        res = ctx.evaluate(data / "eval", vs, [n], checker=checker, checker_kwargs=CHECKER_KWARGS.get(c),
                           title=f"Checker robustness: {c}", report_name=f"checker-{c}")
        weak = ref_problems if checker is None else load_split(data / "eval", checker, CHECKER_KWARGS[c],
                                                               hidden=False)[0]
        term = res["terminal"][str(n)]
        rows[c] = {"agreement": checker_agreement(ref_problems, weak),
                   **{m: term[m]["bon_accuracy"] for m in ("Self-consistency", "Probe+WV", "MSV_1+WV",
                                                           f"MSV_{n} (reference-trained)",
                                                           f"MSV_{n} (trained with checker)") if m in term}}
        ctx.reports[f"checker-{c}"] = f"studies/{ctx.stem}-checker-{c}.md"
    return {"n": n, "rows": rows}


def masks_study(ctx: ReproductionContext) -> dict:
    """Mask ablation: streaming MSV_N with each attention mask removed, against the full MSV_N (Brier/AUROC/NLL)."""
    cfg, n = ctx.config, ctx.config.mask_n
    vs = {f"MSV_{n}": ctx.verifiers[f"MSV_{n}"]["streaming"]}
    for m in cfg.mask_ablations:
        masks = [x for x in MASKS if x != m]
        vs[f"w/o {m}"] = ctx.train(ctx.data / "train", f"msv{n}-streaming-no-{m}",
                                   training_config("msv", n, "streaming", cfg.quick, masks=masks))
    vs = {k: seed_specs({"streaming": v}) for k, v in vs.items()}
    res = ctx.evaluate(ctx.data / "eval", vs, [n], title="Mask ablation", report_name="masks")
    stream = res["streaming"][str(n)]
    ctx.reports["masks"] = f"studies/{ctx.stem}-masks.md"
    return {"n": n, "rows": {k: {m: stream[k][m] for m in ("brier", "auroc", "nll")} for k in vs if k in stream}}


def delimiters_study(ctx: ReproductionContext) -> dict:
    """Delimiter sensitivity: a delimiter-free collection elicited every K tokens, with its own Probe / MSV_1 /
    MSV_N, against the main (``Wait``) study's: streaming AUTC over tokens and answers per sequence."""
    cfg, n = ctx.config, ctx.config.delimiter_n
    dk = ctx.work_dir / "data-every-k"
    collect_splits(ctx.model, ctx.tokenizer, dk, cfg, cfg.delimiter_samples, cfg.delimiter_sizes, delimiters=[],
                   every_k_tokens=cfg.every_k_tokens, **ctx.collect_kwargs)
    vs = {}
    for name, kind, m in (("Probe", "probe", 1), ("MSV_1", "msv", 1), (f"MSV_{n}", "msv", n)):
        vs[name] = seed_specs({"streaming": ctx.train(dk / "train", f"everyk-{kind}{m}",
                                                      training_config(kind, m, "streaming", cfg.quick),
                                                      val_dir=dk / "val")})
    res = ctx.evaluate(dk / "eval", vs, [n], dk / "val", report_name="every-k",
                       title=f"Delimiter-free elicitation every {cfg.every_k_tokens} tokens")
    every_k = f"every {cfg.every_k_tokens} tokens"
    methods = ("Probe", "MSV_1", f"MSV_{n}")
    rows = {"Wait": autc_row(ctx.main_results, n, methods), every_k: autc_row(res, n, methods)}
    wait = ctx.main_results["data"]["eval"]
    rows["Wait"]["answers_per_sequence"] = wait["answers_per_sequence"]
    rows[every_k]["answers_per_sequence"] = res["data"]["eval"]["answers_per_sequence"]
    ctx.reports["delimiters"] = f"studies/{ctx.stem}-every-k.md"
    return {"n": n, "rows": rows, "mean_sequence_tokens": wait["mean_sequence_tokens"]}


def grouping_study(ctx: ReproductionContext) -> dict:
    """Large N with grouping: the streaming MSV_M scoring groups of M at N > M (a 256-sample collection; the main
    evaluation split when ``grouping_problems`` is 0) against Probe and MSV_1, over latency and tokens."""
    cfg, m = ctx.config, ctx.config.grouping_m
    if cfg.grouping_problems:
        gdir = ctx.work_dir / "data-n{}".format(cfg.grouping_samples) / "eval"
        collect_problems(ctx.model, ctx.tokenizer, "evaluation", cfg.grouping_problems, gdir, cfg,
                         cfg.grouping_samples, problem_seed=1, **ctx.collect_kwargs)
    else:
        gdir = ctx.data / "eval"
    vs = {k: ctx.specs(k, ("streaming",)) for k in ("Probe", "MSV_1", f"MSV_{m}")}
    res = ctx.evaluate(gdir, vs, list(cfg.grouping_ns), title=f"Grouping with MSV_{m} for large N",
                       report_name="grouping", subdir=False, figures=True)
    ctx.reports["grouping"] = f"{ctx.stem}-grouping.md"
    return grouping_summary(res, cfg.grouping_ns, m)


def _size_verifiers(ctx: ReproductionContext, k: int, more: Path) -> dict:
    """Probe and MSV_N (both modes) trained on the first `k` training problems: the main study's at its own size;
    beyond it, the main training split plus `more` (problems collected for this study)."""
    cfg, data, n = ctx.config, ctx.data, ctx.config.max_n
    vs = {}  # name -> mode -> [path per training seed]
    for name, kind, m in (("Probe", "probe", 1), (f"MSV_{n}", "msv", n)):
        for mode in ("terminal", "streaming"):
            if k == cfg.train_problems:   # the main study's verifiers
                vs.setdefault(name, {})[mode] = ctx.verifiers[name][mode]
                continue
            bigger = k > cfg.train_problems
            train_dirs = [data / "train", more] if bigger else data / "train"
            # No limit when `k` is everything the directories hold (so the stored config names no prefix).
            limit = None if k == (max(cfg.training_sizes) if bigger else cfg.train_problems) else k
            vs.setdefault(name, {})[mode] = ctx.train(
                train_dirs, f"size{k}-{kind}{m}-{mode}", training_config(kind, m, mode, cfg.quick,
                                                                         max_train_problems=limit))
    return {k: seed_specs(v) for k, v in vs.items()}


def training_size_study(ctx: ReproductionContext) -> dict:
    """Training-set size: Probe and MSV_N trained on nested prefixes of the training problems (collecting more
    when a size exceeds the main split), each evaluated at N = max N."""
    cfg, n = ctx.config, ctx.config.max_n
    more = ctx.work_dir / "data-more-train" / "train"
    if max(cfg.training_sizes) > cfg.train_problems:
        collect_problems(ctx.model, ctx.tokenizer, "train", max(cfg.training_sizes), more, cfg, cfg.num_samples,
                         first=cfg.train_problems, **ctx.collect_kwargs)
    per_size = {}
    for k in cfg.training_sizes:
        res = ctx.evaluate(ctx.data / "eval", _size_verifiers(ctx, k, more), [n],
                           title=f"Training-set size: {k} problems", report_name=f"size-{k}")
        per_size[str(k)] = size_row(res, n)
        ctx.reports[f"size-{k}"] = f"studies/{ctx.stem}-size-{k}.md"
    return {"n": n, "per_size": per_size}


# Each optional study: its function and the name its stage time is logged under.
STUDY_STAGES = {"checkers": (checkers_study, "checkers"), "masks": (masks_study, "masks"),
                "delimiters": (delimiters_study, "delimiters"), "grouping": (grouping_study, "grouping"),
                "training_size": (training_size_study, "training size")}


# ----------------------------------------------------------------------------------------------------------------
# The reproduction
# ----------------------------------------------------------------------------------------------------------------


def reproduce(output_dir="docs/results", quick: bool = False, work_dir=None, config: ReproduceConfig | None = None,
              studies=None, threads: int | None = None, progress: bool = True, device=None,
              reuse_shards: str = "matching", train_workers: int = 1, reuse_verifiers: str = "matching") -> dict:
    """Run the testbed reproduction (module docstring) and write ``testbed.md`` / ``testbed.json`` (quick:
    ``testbed-quick.*``) plus figures and per-study reports into `output_dir`. Returns the summary dict.

    Args:
        work_dir: shards, verifiers and caches (default `ReproduceConfig.default_work_dir`: ``outputs/reproduce``,
            ``-v2`` / ``-quick`` appended);
            reused across runs, so an interrupted reproduction resumes.
        config: sizes/settings, the testbed task included (default: the paper's sizes on v2, the default testbed, or
            `ReproduceConfig.quick_config()`).
        studies: subset of ``config.studies`` to run ("main" is always run: the others build on it).
        threads: torch threads (default: all cores).
        device: where the LM samples (default: this process's accelerate device, the GPU when there is one);
            verifiers train on accelerate's device and are evaluated on CPU.
        reuse_shards: "matching" (reuse shards only under the same reuse key) or "keep" (reuse any shards in the
            work directory; e.g. to re-train and re-evaluate an earlier collection with new code).
        reuse_verifiers: "matching" (reuse a fit only under the same reuse key) or "keep" (also a fit whose settings
            and data match but whose training code differs: `kept_despite_code`; the report lists each).
        train_workers: verifier fits run at once (`TrainingQueue`), each with ``threads // train_workers`` threads.
            Above 1, call `reproduce` from under ``if __name__ == "__main__":`` in a script (the workers are
            spawned, and a spawned process imports the main module; ``hf-msv reproduce`` needs nothing).
    """
    import torch

    if train_workers < 1:
        raise ValueError(f"train_workers must be ≥ 1, got {train_workers}")
    for name, policy in (("reuse_shards", reuse_shards), ("reuse_verifiers", reuse_verifiers)):
        if policy not in ("matching", "keep"):
            raise ValueError(f"{name} must be 'matching' or 'keep', got {policy!r}")
    cfg = config or (ReproduceConfig.quick_config() if quick else ReproduceConfig())
    studies = tuple(dict.fromkeys(("main",) + tuple(studies or cfg.studies)))
    if threads:
        torch.set_num_threads(threads)
    log = print if progress else (lambda *a, **k: None)
    queue = TrainingQueue(train_workers, (threads or torch.get_num_threads()) // train_workers)
    ctx = ReproductionContext(cfg, Path(work_dir or cfg.default_work_dir),
                              Path(output_dir), clock=_Clock(log), reuse_shards=reuse_shards,
                              reuse_verifiers=reuse_verifiers, queue=queue)
    try:
        summary = _run_studies(ctx, studies, device, progress, log)
    except BaseException:
        queue.close(cancel=True)  # fits not yet started are dropped; an interrupted run resumes from the rest
        raise
    queue.close()
    return summary


def _run_studies(ctx: ReproductionContext, studies: tuple, device, progress: bool, log) -> dict:
    """`reproduce`'s body: collect, measure, train, evaluate every study, write the reports."""
    from ..collect import load_lm
    from ..testbed import get_task

    cfg = ctx.config
    task = get_task(cfg.task)
    ctx.output_dir.mkdir(parents=True, exist_ok=True)
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    summary: dict = {"config": asdict(cfg), "studies": list(studies), "paper": PAPER, "reports": ctx.reports,
                     "verifiers": ctx.counts}

    ctx.model, ctx.tokenizer = load_lm(task.lm_name, device=device)
    summary["device"] = str(ctx.model.device)
    with ctx.clock("collect"):
        collect_splits(ctx.model, ctx.tokenizer, ctx.data, cfg, cfg.num_samples,
                       (cfg.train_problems, cfg.val_problems, cfg.eval_problems), **ctx.collect_kwargs)
    with ctx.clock("lm costs"):
        ns_cost = sorted(set(cfg.num_sequences) | (set(cfg.grouping_ns) if "grouping" in studies else set()))
        ctx.lm_costs = measure_lm_costs(ctx.model, ctx.tokenizer,
                                        task.generate_problems("evaluation", cfg.cost_problems, seed=99), ns_cost,
                                        cfg.max_new_tokens, cache=ctx.work_dir / "lm_costs.json")
    summary["lm_costs"] = {str(n): asdict(c) for n, c in ctx.lm_costs.items()}
    with ctx.clock("train main"):
        train_main_verifiers(ctx)
    with ctx.clock("evaluate main"):
        summary["main"] = main_study(ctx, progress=progress)
    optional = [name for name in STUDY_STAGES if name in studies]
    for i, name in enumerate(optional):
        # A full v2 run spans several sittings: the report so far is written before each study starts, so what
        # is finished can be read (and committed) while the rest is still running.
        write_summary(ctx, summary, started, pending=optional[i:])
        study, stage = STUDY_STAGES[name]
        with ctx.clock(stage):
            summary[name] = study(ctx)
    summary = write_summary(ctx, summary, started)
    log(f"[reproduce] wrote {ctx.output_dir / (ctx.stem + '.md')} in {summary['timing_s']['total']:.0f} s")
    return summary


def write_summary(ctx: ReproductionContext, summary: dict, started: float, pending=()) -> dict:
    """Complete `summary` (stage times, reuse log, vote checks, claims) and write ``{stem}.json`` / ``{stem}.md``
    into the output directory; `pending` names the studies still to run (an interim report says so at its top).
    Returns the JSON-safe summary as written."""
    from ..utils import json_safe

    done = dict(summary, timing_s=dict(ctx.clock.times, total=time.perf_counter() - started),
                reuse=ctx.reuse.summary(), vote_check=list(ctx.vote_checks))
    if pending:
        done["pending"] = list(pending)
    done["claims"] = compute_claims(done, ctx.config)
    done = json_safe(done)
    (ctx.output_dir / f"{ctx.stem}.json").write_text(json.dumps(done, indent=1))
    (ctx.output_dir / f"{ctx.stem}.md").write_text(render_testbed(done, ctx.main_results))
    return done


def train_shipped_verifier(work_dir=None, destination=None, threads: int | None = None,
                           config: ReproduceConfig | None = None, device=None,
                           reuse_shards: str = "matching", reuse_verifiers: str = "matching") -> Path:
    """The MSV shipped in ``hf_msv/testbed/verifier``: a streaming MSV_16 trained with `training_config` on the
    reproduction's train / validation shards (collected first when missing; shared with `reproduce`, whose
    ``msv16-streaming`` it is; MSV_8 on the quick configuration's 8 samples) in `work_dir` (default: the full
    reproduction's, ``ReproduceConfig.default_work_dir``). Saves weights, config, model card and the early-stopping λ
    chosen on validation (`shipped_lambda`, in `SHIPPED_LAMBDA_FILE`) to `destination` (default: the package's, for
    `TESTBED_VERIFIER_TASK` only). `reuse_shards` and `reuse_verifiers` as in `reproduce`."""
    import torch

    from ..collect import load_lm
    from ..hub import save_verifier
    from ..modeling_msv import MSVVerifier
    from ..testbed import TESTBED_VERIFIER_DIR, TESTBED_VERIFIER_TASK, get_task

    if threads:
        torch.set_num_threads(threads)
    # The demo pairs the package's verifier with TESTBED_VERIFIER_TASK's LM: another task's verifier goes elsewhere
    # until that constant moves with it.
    cfg = config or ReproduceConfig(task=TESTBED_VERIFIER_TASK)
    work = Path(work_dir or replace(cfg, quick=False).default_work_dir)  # the full run's shards, even quick
    if destination is None and cfg.task != TESTBED_VERIFIER_TASK:
        raise ValueError(f"the package's verifier is paired with testbed {TESTBED_VERIFIER_TASK}'s LM "
                         f"(hf_msv.testbed.TESTBED_VERIFIER_TASK); a testbed {cfg.task} verifier needs a destination, "
                         f"or that constant set to {cfg.task!r} first")
    data, task = work / "data", get_task(cfg.task)
    model, tokenizer = load_lm(task.lm_name, device=device)
    collect_splits(model, tokenizer, data, cfg, cfg.num_samples, (cfg.train_problems, cfg.val_problems),
                   reuse_shards=reuse_shards)
    n = min(16, cfg.num_samples)  # 16 at the paper's sizes; the quick collection has fewer samples
    path = train_or_reuse(data / "train", data / "val", work / "verifiers" / f"msv{n}-streaming",
                          training_config("msv", n, "streaming", cfg.quick), reuse=reuse_verifiers)
    log = json.loads((path / "training_log.json").read_text())
    best = log["history"][log["best_epoch"]]  # `best_epoch` indexes the validation history (0 = before training)
    metrics = {k.replace("val_", "validation "): v for k, v in best.items() if k.startswith("val_")}
    stopping = shipped_lambda(data / "val", path, n, cfg, work / "shipped-lambda")
    metrics["validation λ (early stopping)"] = stopping["lambda"]
    destination = Path(destination or TESTBED_VERIFIER_DIR)
    shutil.rmtree(destination, ignore_errors=True)
    verifier = MSVVerifier.from_pretrained(path)
    local = verifier.config.base_model_name_or_path  # this machine's path: the card names the package's LM instead
    lm = f"hf_msv/testbed/{task.lm_dir.name}"
    verifier.config.base_model_name_or_path = f"hf_msv-{task.lm_name} ({lm})"
    training_data = log["training_data"].replace(f"`{local}`", f"the hf_msv {task.lm_name} LM (`{lm}`)")
    save_verifier(verifier, destination, metrics=metrics | {"step": best.get("step", best["epoch"])},
                  training_data=training_data + " Reproduce with `scripts/train_shipped_verifier.sh`.",
                  repo_id="hf-msv/msv16-testbed")
    (destination / SHIPPED_LAMBDA_FILE).write_text(json.dumps(stopping, indent=2) + "\n")
    for stale in destination.glob("*.py"):  # remote-code copies: save_pretrained/push_to_hub regenerate them
        stale.unlink()
    return destination


SHIPPED_LAMBDA_FILE = "early_stopping.json"  # beside the shipped verifier: the λ the demo uses, and how it was chosen


def shipped_lambda(val_dir: Path, verifier_dir: Path, n: int, cfg: ReproduceConfig, output_dir: Path) -> dict:
    """The early-stopping λ of the streaming MSV_n in `verifier_dir`, chosen on the validation shards by the
    reproduction's validation rule (`hf_msv.evaluation.select_lambda_validation`: the cheapest λ whose validation
    accuracy reaches `evaluate_study`'s target fraction × the best full-decoding validation accuracy of any method at
    N = n). The evaluation split is the validation split itself: only the validation curves matter here."""
    from ..evaluation import evaluate_study
    from ..evaluation.early_stop import LatencyCosts

    name = f"MSV_{n}"
    # The rule is on tokens, so latency is not needed: zero LM costs, given explicitly (no "no costs" warning).
    res = evaluate_study(val_dir, {name: {"streaming": str(verifier_dir)}}, output_dir, [n], val_dir, bootstrap=0,
                         deepconf_window=cfg.deepconf_window, figures=False, progress=False,
                         report_name="lambda", lm_costs=LatencyCosts())
    rule = res["lambda_selection"][str(n)][name]["validation"]
    first = {k: v["values"][0] for k, v in rule.items()}  # one training seed: its values
    lam = round(first["lambda"], 6)  # the grid's value, without float noise
    return {"lambda": lam, "num_sequences": n, "target_accuracy": first["target"],
            "validation_accuracy": first["val_accuracy"], "validation_tokens": first["val_tokens"],
            "rule": f"cheapest λ whose validation accuracy reaches {res['config']['target_fraction']} × the best "
                    "full-decoding validation accuracy (hf_msv.evaluation.select_lambda_validation)",
            "validation_problems": cfg.val_problems}


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------


def parse_arguments(argv: list[str] | None = None) -> ReproduceArguments:
    """The ``hf-msv reproduce`` options, one flag per `ReproduceArguments` field (``--work-dir`` or ``--work_dir``)."""
    from transformers import HfArgumentParser

    parser = HfArgumentParser(ReproduceArguments, description=__doc__.splitlines()[0])
    (args,) = parser.parse_args_into_dataclasses(argv)
    return args


def main(argv: list[str] | None = None) -> dict:
    """``hf-msv reproduce``: runs `reproduce` (or, with ``--shipped-verifier``, `train_shipped_verifier`) with the
    parsed options and returns its summary."""
    args = parse_arguments(argv)
    cfg = args.reproduce_config()
    if args.shipped_verifier:
        return {"shipped_verifier": str(train_shipped_verifier(args.work_dir, threads=args.threads, config=cfg,
                                                               device=args.device, reuse_shards=args.reuse_shards,
                                                               reuse_verifiers=args.reuse_verifiers))}
    return reproduce(args.output_dir, quick=args.quick, work_dir=args.work_dir, config=cfg, studies=args.studies,
                     threads=args.threads, progress=args.progress, device=args.device, reuse_shards=args.reuse_shards,
                     train_workers=args.train_workers, reuse_verifiers=args.reuse_verifiers)


if __name__ == "__main__":
    main()
