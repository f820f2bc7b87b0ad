"""`ReproductionContext`: the state a reproduction's stages share (configuration, directories, the LM, its measured
costs, the main study's verifiers, the reuse log, the training queue), with the two things every study does through
it: train a verifier once per training seed, and evaluate (or restore a kept evaluation)."""

from __future__ import annotations

import json
import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..evaluation.results import StudyResults
from .config import ReproduceConfig, training_config
from .own_lm import ReproductionTask, reproduction_task
from .reuse import (
    EVALUATION_CODE,
    ReuseLog,
    artefact_key,
    code_version,
    data_fingerprint,
    git_commit,
    reuse_key,
    write_key,
)
from .stages import ShardReuse, TrainingQueue, collect_splits, train_or_reuse
from .summary import vote_check_rows

__all__ = [
    "StageClock",
    "ReproductionContext",
    "checkpoint_keys",
    "keep_evaluation",
    "restore_evaluation",
    "seed_specs",
]


class StageClock:
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
    `main_results` are the main study's: fits are made on first use (`main_fit`), so a part that continues a
    committed report trains only those its studies need; `reports` (study -> report path relative to
    `output_dir`), `counts` (verifiers trained / reused), `reuse` (every reuse decision) and `collections` (the
    main collection's shard fingerprints, once made by this run) are filled as stages run; `vote_checks` holds
    every MSV fit against the vote (`vote_check_rows`), per evaluation."""

    config: ReproduceConfig
    work_dir: Path
    output_dir: Path
    model: Any = None  # the LM (a transformers model), loaded by the pipeline
    tokenizer: Any = None
    lm_costs: dict = field(default_factory=dict)
    verifiers: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    main_results: StudyResults | None = None
    reports: dict = field(default_factory=dict)
    counts: dict = field(default_factory=lambda: {"trained": 0, "reused": 0})
    clock: StageClock = field(default_factory=lambda: StageClock(lambda *a, **k: None))
    reuse: ReuseLog = field(default_factory=ReuseLog)
    reuse_shards: str = "matching"
    reuse_verifiers: str = "matching"
    vote_checks: list = field(default_factory=list)
    queue: TrainingQueue = field(default_factory=TrainingQueue)
    collections: dict = field(default_factory=dict)
    # The commit this run's code was loaded from: a commit made while it runs (hours) is not the code it ran.
    git_commit: str | None = field(default_factory=git_commit)

    @property
    def data(self) -> Path:
        """Where the main collection goes (data/train, data/val, data/eval); `main_data` makes it."""
        return self.work_dir / "data"

    def main_data(self) -> Path:
        """The main collection's root, collected (or reused, or extended) on first use, its shards fingerprinted into
        `collections`. Studies call this rather than reading `data`: the delimiter study needs no main collection,
        so a run of only that study does not spend most of an hour on 2 cores making one."""
        if not self.collections:
            cfg = self.config
            collect_splits(
                self.model,
                self.tokenizer,
                self.data,
                cfg,
                cfg.num_samples,
                (cfg.train_problems, cfg.val_problems, cfg.eval_problems),
                reuse=self.shard_reuse,
            )
            # the shards alone: collect_config.json names the LM by its absolute path, which differs across checkouts
            self.collections = {
                f"data/{s}": data_fingerprint(sorted((self.data / s).glob("*.safetensors")))
                for s in ("train", "val", "eval")
            }
        return self.data

    def main_fit(self, method: str, mode: str) -> list[str]:
        """A main-study verifier ("Probe" or "MSV_<n>") in `mode` ("terminal" | "streaming"), trained (or reused)
        on first use with the library defaults: [path per training seed]."""
        fits = self.verifiers.setdefault(method, {})
        if mode not in fits:
            kind, n = ("probe", 1) if method == "Probe" else ("msv", int(method.removeprefix("MSV_")))
            name = f"probe-{mode}" if kind == "probe" else f"msv{n}-{mode}"
            fits[mode] = self.train(
                self.main_data() / "train", name, training_config(kind, n, mode, self.config.quick)
            )
        return fits[mode]

    @property
    def stem(self) -> str:
        """File stem of the reports (`ReproduceConfig.stem`)."""
        return self.config.stem

    @property
    def task(self) -> ReproductionTask:
        """What the run samples from: its LM, problems and prompts (`reproduction_task`)."""
        return reproduction_task(self.config)

    @property
    def shard_reuse(self) -> ShardReuse:
        """What every collection of the run passes to `collect_problems`: the reuse log and policy."""
        return ShardReuse(self.reuse, self.reuse_shards)

    def train(self, train_dir, name: str, config, val_dir=None) -> list[str]:
        """`train_or_reuse` into work_dir/verifiers/`name` (``name-seed{s}`` for training seed s ≥ 1; validation:
        the main collection's), once per training seed: the paths, seed 0 first."""
        paths = []
        for seed in range(self.config.training_seeds):
            out = self.work_dir / "verifiers" / (name if seed == 0 else f"{name}-seed{seed}")
            paths.append(
                str(
                    train_or_reuse(
                        train_dir,
                        val_dir or self.main_data() / "val",
                        out,
                        replace(config, seed=seed),
                        counts=self.counts,
                        log=self.reuse,
                        queue=self.queue,
                        reuse=self.reuse_verifiers,
                    )
                )
            )
        return paths

    def specs(self, name: str, modes=("terminal", "streaming")) -> list[dict[str, str]]:
        """One main-study verifier's checkpoints for `evaluate_study`: [{mode: path} per training seed]."""
        return seed_specs({m: self.main_fit(name, m) for m in modes})

    def evaluate(
        self,
        eval_dir,
        verifiers: dict,
        ns,
        val_dir=None,
        *,
        report_name: str,
        title: str,
        subdir: bool = True,
        **kwargs: Any,
    ) -> StudyResults:
        """`evaluate_study` with the run's LM costs and DeepConf window; the report goes to output_dir/studies
        (`subdir`) or output_dir, and is recorded in `reports` by the caller;
        every MSV fit of it is checked against the vote into `vote_checks`. Returns its `StudyResults`."""
        from ..evaluation import EvaluateConfig, evaluate_study

        self.queue.wait(checkpoint_paths(verifiers))  # the fits being evaluated may still be training
        kwargs = {"figures": False, "progress": False} | kwargs
        out, stem = self.output_dir / "studies" if subdir else self.output_dir, f"{self.stem}-{report_name}"
        # Evaluating the v2 main study alone takes ~half an hour on 2 CPU cores, and a report is made in parts:
        # an evaluation is kept (results, report, figures) and reused while its inputs are unchanged.
        settings = {
            "verifiers": {name: checkpoint_keys(specs) for name, specs in verifiers.items()},
            "ns": sorted(ns),
            "title": title,
            "deepconf_window": self.config.deepconf_window,
            "lm_costs": {str(n): asdict(c) for n, c in self.lm_costs.items()},
            "validation": val_dir is not None,
            **{k: v for k, v in kwargs.items() if k != "progress"},
        }
        key = reuse_key(
            settings,
            code_version(EVALUATION_CODE),
            data_fingerprint(*[d for d in (eval_dir, val_dir) if d is not None]),
        )
        kept = self.work_dir / "evaluations" / stem
        if self.reuse.decide("evaluation", stem, kept, key, (kept / f"{stem}.json").exists()):
            res = restore_evaluation(kept, out, stem)
        else:
            inputs = {k: v for k, v in kwargs.items() if k in ("difficulty", "difficulty_name")}  # not settings
            config = EvaluateConfig(
                eval_dir=str(eval_dir),
                output_dir=str(out),
                num_sequences=list(ns),
                val_dir=None if val_dir is None else str(val_dir),
                deepconf_window=self.config.deepconf_window,
                title=title,
                report_name=stem,
                **{k: v for k, v in kwargs.items() if k not in inputs},
            )
            res = evaluate_study(config, verifiers, lm_costs=self.lm_costs, **inputs)
            keep_evaluation(out, stem, kept, key)
        self.vote_checks += vote_check_rows(res, report_name)
        return res


def checkpoint_paths(spec) -> set[str]:
    """Every checkpoint path in a verifier spec of `evaluate_study` (see `checkpoint_keys`), or a {name: spec}."""
    if isinstance(spec, dict):
        return set().union(*map(checkpoint_paths, spec.values()))
    if isinstance(spec, (list, tuple)):
        return set().union(*map(checkpoint_paths, spec))
    return {str(spec)}


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


def restore_evaluation(kept: Path, out: Path, stem: str) -> StudyResults:
    """Put a kept evaluation's results, report and figures back into `out`; its `StudyResults`."""
    _copy_evaluation(kept, out, stem)
    return StudyResults.from_dict(json.loads((kept / f"{stem}.json").read_text()))


def seed_specs(paths_by_mode: dict) -> list[dict[str, str]]:
    """{mode: [path per training seed]} -> [{mode: path} per training seed] (what `evaluate_study` takes)."""
    counts = {len(v) for v in paths_by_mode.values()}
    if len(counts) != 1:
        raise ValueError(f"modes with different numbers of training seeds: {paths_by_mode}")
    return [{m: v[s] for m, v in paths_by_mode.items()} for s in range(counts.pop())]
