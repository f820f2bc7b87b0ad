"""``hf-msv reproduce``: the paper's experiments re-run end to end on the testbed, with the paper's numbers beside ours.

    from hf_msv.reproduction import reproduce
    summary = reproduce("docs/results")              # paper sizes (main study: 14 min on an H100; see below)
    summary = reproduce("/tmp/quick", quick=True)    # a few minutes: few problems, N in {1, 4}, 2 seeds

On a GPU pass ``device="cuda"`` and a larger ``ReproduceConfig.problems_per_batch`` (32: 0.30 s per problem at 64
samples on an H100, vs 1.17 s at 4). On 2 CPU cores (``threads=2``) everything takes about 2 h 5 min from scratch:
the main study 58 min (collection 45, training 11), the checker, mask and delimiter studies 16 min, grouping 23 min
(mostly its 256-sample collection) and the training-set-size study 28 min (mostly collecting 224 more problems).

Pipeline (every stage is resumable: existing shards, trained verifiers and measured costs are reused):

1. **collect** with the shipped testbed LM (`hf_msv.testbed`): 224 train / 64 validation / 448 evaluation problems
   × 64 samples (temperature 1, ``Wait`` delimiter, elicitation ``### Final Answer ### \\boxed``, ≤ 40 answer tokens,
   symbolic checker as the reference), plus the delimiter-free every-K collection (delimiter study), a 256-sample
   evaluation set (grouping study) and training problems 225-448 (training-set-size study);
2. **measure** the LM's cost per shared decode step and per elicited answer for each N (wall clock, this machine);
3. **train** Probe and MSV_1/4/16/64 in both modes (terminal, streaming), the mask ablations of MSV_16, MSV_64
   with each weak checker, the delimiter-study verifiers, and Probe / MSV_64 on 56, 112 and 448 problems;
4. **evaluate** with `hf_msv.evaluation.evaluate_study` (5 seeds; λ rules on validation);
5. **report** ``testbed.md`` / ``testbed.json`` in `output_dir`: each experiment with the paper's corresponding
   numbers (AIME unless stated: the dataset of the paper's appendix studies) beside ours, and one sentence per claim
   saying whether it held — generated from the numbers.

The testbed is a ~1M-parameter character-level LM on a synthetic arithmetic task, so absolute numbers are not
comparable with the paper's (a 1.5B reasoning LM on competition math); the comparisons that matter are the relative
ones (MSV_N vs the baselines), which is what the claims test. Training hyperparameters are adapted to the testbed's
128-wide hidden states and small data (see `training_config`); everything else follows the paper.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np

__all__ = ["ReproduceConfig", "PAPER", "reproduce", "training_config", "measure_lm_costs", "checker_agreement",
           "add_reproduce_arguments", "reproduce_from_args", "train_shipped_verifier", "main"]


# ----------------------------------------------------------------------------------------------------------------
# The paper's numbers (mean over seeds; AIME unless stated)
# ----------------------------------------------------------------------------------------------------------------

PAPER = {
    "source": "Calibrated and Efficient Parallel Test-Time Scaling with Multi-Sequence Verifiers (tables of the "
              "full report; AIME column unless stated)",
    # Table "AUROC / Brier of verifiers on terminal answers" (AIME)
    "terminal": {
        "1": {"Token Probs": {"auroc": 0.8999, "brier": 0.3073}, "Probe": {"auroc": 0.9461, "brier": 0.0859},
              "MSV_1": {"auroc": 0.9469, "brier": 0.0819}, "PRM": {"auroc": 0.9374, "brier": 0.1472}},
        "4": {"Token Probs+WV": {"auroc": 0.8223, "brier": 0.2239}, "Self-consistency": {"auroc": 0.8001,
              "brier": 0.2274}, "Probe+WV": {"auroc": 0.8624, "brier": 0.2100},
              "MSV_1+WV": {"auroc": 0.8636, "brier": 0.2096}, "PRM+WV": {"auroc": 0.8444, "brier": 0.2171},
              "MSV_N": {"auroc": 0.9628, "brier": 0.0687}},
        "16": {"Token Probs+WV": {"auroc": 0.8531, "brier": 0.1662}, "Self-consistency": {"auroc": 0.8422,
               "brier": 0.1696}, "Probe+WV": {"auroc": 0.9092, "brier": 0.1368},
               "MSV_1+WV": {"auroc": 0.9057, "brier": 0.1404}, "PRM+WV": {"auroc": 0.8693, "brier": 0.1588},
               "MSV_N": {"auroc": 0.9732, "brier": 0.0572}},
        "64": {"Token Probs+WV": {"auroc": 0.8608, "brier": 0.1549}, "Self-consistency": {"auroc": 0.8517,
               "brier": 0.1583}, "Probe+WV": {"auroc": 0.9216, "brier": 0.1217},
               "MSV_1+WV": {"auroc": 0.9168, "brier": 0.1264}, "PRM+WV": {"auroc": 0.8784, "brier": 0.1473},
               "MSV_N": {"auroc": 0.9822, "brier": 0.0387}},
    },
    # Table "Best-of-N accuracy" (AIME); N=1 is the base LM's accuracy
    "bon_accuracy": {
        "1": {"base": 0.2748},
        "4": {"Self-consistency": 0.3251, "Probe": 0.3771, "MSV_1": 0.3758, "PRM": 0.3744, "Probe+WV": 0.3847,
              "MSV_1+WV": 0.3852, "PRM+WV": 0.3570, "MSV_N": 0.3811},
        "16": {"Self-consistency": 0.3566, "Probe": 0.4470, "MSV_1": 0.4325, "PRM": 0.4475, "Probe+WV": 0.4481,
               "MSV_1+WV": 0.4460, "PRM+WV": 0.3817, "MSV_N": 0.4615},
        "64": {"Self-consistency": 0.3594, "Probe": 0.4897, "MSV_1": 0.4621, "PRM": 0.4688, "Probe+WV": 0.4790,
               "MSV_1+WV": 0.4714, "PRM+WV": 0.3884, "MSV_N": 0.5098},
    },
    # Table "ECE / Brier of confidence on best-of-N answers" (AIME)
    "bon_calibration": {
        "16": {"Self-consistency": {"ece": 0.1927, "brier": 0.4558}, "Probe": {"ece": 0.2364, "brier": 0.3776},
               "MSV_1": {"ece": 0.2407, "brier": 0.3754}, "Probe+WV": {"ece": 0.1633, "brier": 0.4286},
               "MSV_1+WV": {"ece": 0.1659, "brier": 0.4352}, "MSV_N": {"ece": 0.0876, "brier": 0.2067}},
        "64": {"Self-consistency": {"ece": 0.1733, "brier": 0.4341}, "Probe": {"ece": 0.3013, "brier": 0.5159},
               "MSV_1": {"ece": 0.3162, "brier": 0.5324}, "Probe+WV": {"ece": 0.1222, "brier": 0.4165},
               "MSV_1+WV": {"ece": 0.1302, "brier": 0.4232}, "MSV_N": {"ece": 0.0749, "brier": 0.2351}},
    },
    # Table "AUROC / Brier of verifiers on streaming answers" (AIME)
    "streaming": {
        "1": {"Token Probs": {"auroc": 0.8858, "brier": 0.3217}, "PRM": {"auroc": 0.9309, "brier": 0.1185},
              "Probe": {"auroc": 0.9120, "brier": 0.0796}, "MSV_1": {"auroc": 0.9056, "brier": 0.0642}},
        "4": {"Token Probs+WV": {"auroc": 0.8601, "brier": 0.2990}, "PRM+WV": {"auroc": 0.8646, "brier": 0.1241},
              "Probe+WV": {"auroc": 0.8702, "brier": 0.0842}, "MSV_1+WV": {"auroc": 0.8826, "brier": 0.0763},
              "MSV_N": {"auroc": 0.9312, "brier": 0.0472}},
        "16": {"Token Probs+WV": {"auroc": 0.8604, "brier": 0.2967}, "PRM+WV": {"auroc": 0.8497, "brier": 0.1266},
               "Probe+WV": {"auroc": 0.8609, "brier": 0.0873}, "MSV_1+WV": {"auroc": 0.8749, "brier": 0.0804},
               "MSV_N": {"auroc": 0.9532, "brier": 0.0375}},
        "64": {"Token Probs+WV": {"auroc": 0.8592, "brier": 0.2966}, "PRM+WV": {"auroc": 0.8451, "brier": 0.1272},
               "Probe+WV": {"auroc": 0.8588, "brier": 0.0878}, "MSV_1+WV": {"auroc": 0.8731, "brier": 0.0812},
               "MSV_N": {"auroc": 0.9662, "brier": 0.0309}},
    },
    # Early stopping (MATH, N=64): "the maximum achievable accuracy with single-sequence baselines can be achieved by
    # MSV_64 with less than half the token budget"; the issue's target is a fraction <= 0.40.
    "early_stop": {"token_fraction_statement": "< 0.5 (MATH, N=64)", "token_fraction_target": 0.40},
    # Latency table (AIME, seconds, lambda = 1): CoT / answer generation / verifier inference
    "latency": {"cot": {"4": 52.8, "16": 62.4, "64": 131.6}, "answers": {"4": 1.5, "16": 1.8, "64": 3.8},
                "verifier": {"Probe": {"4": 0.0008, "16": 0.003, "64": 0.01},
                             "MSV_N": {"4": 0.4, "16": 2.3, "64": 23.2}}},
    # Table "Best-of-64 accuracy on Omni-MATH under different equivalence checkers"
    "checkers": {
        "reference": {"agreement": 1.000, "Self-consistency": 0.279, "Probe+WV": 0.321, "MSV_1+WV": 0.318,
                      "MSV_64 (reference-trained)": 0.356, "MSV_64 (trained with checker)": 0.348},
        "exact": {"agreement": 0.990, "Self-consistency": 0.277, "Probe+WV": 0.321, "MSV_1+WV": 0.318,
                  "MSV_64 (reference-trained)": 0.355, "MSV_64 (trained with checker)": 0.345},
        "jaccard": {"agreement": 0.970, "Self-consistency": 0.277, "Probe+WV": 0.316, "MSV_1+WV": 0.315,
                    "MSV_64 (reference-trained)": 0.352, "MSV_64 (trained with checker)": 0.345},
        "embedding": {"agreement": 0.894, "Self-consistency": 0.272, "Probe+WV": 0.301, "MSV_1+WV": 0.298,
                      "MSV_64 (reference-trained)": 0.328, "MSV_64 (trained with checker)": 0.344},
        "random": {"agreement": 0.467, "Self-consistency": 0.246, "Probe+WV": 0.246, "MSV_1+WV": 0.246,
                   "MSV_64 (reference-trained)": 0.251, "MSV_64 (trained with checker)": 0.336},
    },
    # Table "Mask ablation, AIME, streaming MSV_16"
    "masks": {"MSV_16": {"brier": 0.038, "auroc": 0.953, "nll": 0.150},
              "w/o full": {"brier": 0.040, "auroc": 0.953, "nll": 0.157},
              "w/o equivalence": {"brier": 0.045, "auroc": 0.922, "nll": 0.236},
              "w/o within_sequence": {"brier": 0.048, "auroc": 0.945, "nll": 0.192},
              "w/o within_answer": {"brier": 0.050, "auroc": 0.949, "nll": 0.169}},
    # Table "AUTC with different delimiters, AIME, N=16" (raw AUTC in accuracy x tokens)
    "delimiters": {"Wait": {"Probe": 1024.2, "MSV_1": 954.8, "MSV_N": 1078.3},
                   "Alternatively": {"Probe": 985.9, "MSV_1": 980.0, "MSV_N": 1012.4},
                   "But": {"Probe": 1039.3, "MSV_1": 1023.6, "MSV_N": 1070.7},
                   "every K tokens": {"Probe": 910.9, "MSV_1": None, "MSV_N": 1013.9}},
    # Table "Brier score of Probe on AIME as a function of training set size" (terminal answers)
    "training_size": {"Probe": {"56": 0.0833, "112": 0.0821, "224": 0.0809, "448": 0.0812},
                      "statement": "Probe's Brier plateaus beyond 224 problems; 448 gives no improvement"},
    # Appendix "Scaling with MSV_M": figure only; the claims are qualitative
    "grouping": {"statement": "MSV_64 (grouped) dominates the single-sequence baselines in accuracy-latency at "
                              "N=128 and 256, and its latency scales linearly in N"},
}

CHECKER_KWARGS = {"exact": {}, "jaccard": {"threshold": 0.8}, "embedding": {"threshold": 0.85},
                  "random": {"probability": 0.5, "seed": 0}}
MASKS = ("full", "equivalence", "within_sequence", "within_answer")


@dataclass
class ReproduceConfig:
    """Sizes and settings of a reproduction (`full` = the paper's sizes; `quick` = a smoke run)."""

    train_problems: int = 224
    val_problems: int = 64
    eval_problems: int = 448
    num_samples: int = 64
    num_sequences: tuple = (1, 4, 16, 64)
    seeds: int = 5
    max_new_tokens: int = 320
    reference_checker: str = "symbolic"
    problems_per_batch: int = 4
    problems_per_shard: int = 16
    collect_seed: int = 0
    deepconf_window: int = 32  # DeepConf's 2048 is ~half of a 4k-token trace; testbed traces are ~100 tokens
    studies: tuple = ("main", "checkers", "masks", "delimiters", "grouping", "training_size")
    checkers: tuple = ("exact", "jaccard", "embedding", "random")
    mask_ablations: tuple = MASKS
    mask_n: int = 16
    every_k_tokens: int = 40  # about the testbed's mean distance between "Wait"s
    delimiter_sizes: tuple = (112, 32, 224)  # train / validation / evaluation problems of the every-K collection
    delimiter_samples: int = 16
    delimiter_n: int = 16
    grouping_problems: int = 32
    grouping_samples: int = 256
    grouping_ns: tuple = (64, 128, 256)
    grouping_m: int = 64
    training_sizes: tuple = (56, 112, 224, 448)  # problems; those beyond train_problems are collected in addition
    cost_problems: int = 2
    quick: bool = False

    @classmethod
    def quick_config(cls) -> "ReproduceConfig":
        return cls(train_problems=16, val_problems=8, eval_problems=16, num_samples=8, num_sequences=(1, 4),
                   seeds=2, checkers=("random",), mask_ablations=("equivalence",), mask_n=4,
                   delimiter_sizes=(12, 6, 12), delimiter_samples=4, delimiter_n=4, grouping_problems=0,
                   grouping_samples=8, grouping_ns=(4, 8), grouping_m=4, training_sizes=(8, 16, 24),
                   cost_problems=1, quick=True)

    @property
    def max_n(self) -> int:
        return max(self.num_sequences)


def training_config(kind: str, n: int, mode: str, quick: bool = False, **overrides):
    """The `MSVTrainingConfig` used on the testbed for a Probe or an MSV_n.

    The paper's recipe (AdamW, constant schedule, clipping 1.0, mask-weight lr 1e-1, embedding lr 1e-3, Probe lr
    1e-3, best epoch by validation BCE) is kept, with changes for the testbed's scale, chosen on the first 64
    train / 32 validation problems (never the evaluation split): (1) with 224 problems MSV_64 would see 224 groups
    (3.5 optimizer steps of 64) per epoch, so an epoch draws ``groups_per_problem = max(2, 128 // n)`` random
    n-subsets per problem and batches hold 256 sequences (``min(64, 256 // n)`` groups, at least 4): every MSV_n
    takes ~112 steps per epoch on 224 problems; (2) body learning rate 1e-3 for terminal and 3e-4 for streaming
    verifiers (the paper swept 1e-5..5e-3; 5e-5 under-fits the from-scratch 128-wide verifier in this many steps,
    and streaming verifiers over-fit at 1e-3); (3) 8 epochs for MSVs, 4 for the Probe (the best epoch by validation
    BCE is kept; with 4 streaming epochs the shipped MSV_16's validation BCE was still falling at the last one).
    Training the MSV remains noisy at this scale (best-of-N varies with the seed).
    """
    from ..training import MSVTrainingConfig

    if kind == "probe":
        cfg = dict(kind="probe", num_sequences=1, mode=mode, batch_size=64, probe_learning_rate=1e-3, num_epochs=4)
    else:
        cfg = dict(kind="msv", num_sequences=n, mode=mode, learning_rate=1e-3 if mode == "terminal" else 3e-4,
                   mask_learning_rate=1e-1, embedding_learning_rate=1e-3, batch_size=min(64, max(4, 256 // n)),
                   groups_per_problem=None if n == 1 else max(2, 128 // n), num_epochs=8)
    if quick:
        cfg |= dict(num_epochs=2, batch_size=8)
    cfg |= dict(progress=False)
    cfg |= overrides
    return MSVTrainingConfig(**cfg)


# ----------------------------------------------------------------------------------------------------------------
# Stages
# ----------------------------------------------------------------------------------------------------------------


class _Clock:
    def __init__(self, log):
        self.times: dict[str, float] = {}
        self.log = log

    def __call__(self, name):
        clock = self

        class _Ctx:
            def __enter__(self):
                self.start = time.perf_counter()
                clock.log(f"[reproduce] {name} ...")

            def __exit__(self, *exc):
                clock.times[name] = clock.times.get(name, 0.0) + time.perf_counter() - self.start
                clock.log(f"[reproduce] {name} done in {time.perf_counter() - self.start:.0f} s")

        return _Ctx()


def _collect(model, tokenizer, split: str, count: int, out: Path, cfg: ReproduceConfig, num_samples: int,
             problem_seed: int = 0, first: int = 0, **kwargs):
    """Collect problems ``first..count-1`` of `split` (the first `count` are a prefix of any larger draw)."""
    from ..collect import collect
    from ..testbed import generate_problems

    problems = generate_problems(split, count, seed=problem_seed)[first:]
    return collect(model, tokenizer, problems, out, num_samples=num_samples, max_new_tokens=cfg.max_new_tokens,
                   checker=cfg.reference_checker, prompt_template="testbed",
                   problems_per_shard=cfg.problems_per_shard, problems_per_batch=cfg.problems_per_batch,
                   seed=cfg.collect_seed, progress=False, **kwargs)


def _collect_splits(model, tokenizer, root: Path, cfg: ReproduceConfig, num_samples: int, sizes, **kwargs):
    """`sizes` = problem counts of train, validation[, evaluation], collected into root/train, root/val, root/eval."""
    for (split, name), count in zip((("train", "train"), ("validation", "val"), ("evaluation", "eval")), sizes):
        _collect(model, tokenizer, split, count, root / name, cfg, num_samples, **kwargs)


def _train(train_dir, val_dir, out: Path, config, counts: dict | None = None) -> Path:
    """Train unless `out` holds a finished run of the same config (resumable); `counts` tallies trained / reused."""
    from ..training import train_verifier

    done = out / "training_log.json"
    if done.exists() and (out / "config.json").exists():
        try:
            # Through the config class, so a run saved before a field was added still matches its default.
            stored = type(config)(**json.loads((out / "training_config.json").read_text()))
            same = json.loads(json.dumps(asdict(stored))) == json.loads(json.dumps(asdict(config)))
        except (OSError, ValueError, TypeError):
            same = False
        if same:
            if counts is not None:
                counts["reused"] = counts.get("reused", 0) + 1
            return out
        shutil.rmtree(out)
    train_verifier(train_dir, val_dir, out, config)
    if counts is not None:
        counts["trained"] = counts.get("trained", 0) + 1
    return out


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
# Reproduction
# ----------------------------------------------------------------------------------------------------------------


def reproduce(output_dir="docs/results", quick: bool = False, work_dir=None, config: ReproduceConfig | None = None,
              studies=None, threads: int | None = None, progress: bool = True, device=None) -> dict:
    """Run the testbed reproduction (module docstring) and write ``testbed.md`` / ``testbed.json`` (quick:
    ``testbed-quick.*``) plus figures and per-study reports into `output_dir`. Returns the summary dict.

    Args:
        work_dir: shards, verifiers and caches (default ``outputs/reproduce`` or ``outputs/reproduce-quick``);
            reused across runs, so an interrupted reproduction resumes.
        config: sizes/settings (default: the paper's sizes, or `ReproduceConfig.quick_config()`).
        studies: subset of ``config.studies`` to run ("main" is always run: the others build on it).
        threads: torch threads (default: all cores).
        device: where the LM samples (default: this process's accelerate device, the GPU when there is one);
            verifiers train on accelerate's device and are evaluated on CPU.
    """
    import torch

    from ..evaluation import evaluate_study, load_split

    cfg = config or (ReproduceConfig.quick_config() if quick else ReproduceConfig())
    studies = tuple(dict.fromkeys(("main",) + tuple(studies or cfg.studies)))
    if threads:
        torch.set_num_threads(threads)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    work = Path(work_dir or ("outputs/reproduce-quick" if cfg.quick else "outputs/reproduce"))
    work.mkdir(parents=True, exist_ok=True)
    stem = "testbed-quick" if cfg.quick else "testbed"
    log = print if progress else (lambda *a, **k: None)
    clock = _Clock(log)
    started = time.perf_counter()
    data, ver = work / "data", work / "verifiers"
    summary: dict = {"config": asdict(cfg), "studies": list(studies), "paper": PAPER, "reports": {},
                     "verifiers": {"trained": 0, "reused": 0}}
    train = partial(_train, counts=summary["verifiers"])

    from ..collect import load_lm
    from ..testbed import generate_problems

    model, tokenizer = load_lm("testbed", device=device)
    summary["device"] = str(model.device)
    with clock("collect"):
        _collect_splits(model, tokenizer, data, cfg, cfg.num_samples,
                        (cfg.train_problems, cfg.val_problems, cfg.eval_problems))
    with clock("lm costs"):
        ns_cost = sorted(set(cfg.num_sequences) | (set(cfg.grouping_ns) if "grouping" in studies else set()))
        lm_costs = measure_lm_costs(model, tokenizer, generate_problems("evaluation", cfg.cost_problems, seed=99),
                                    ns_cost, cfg.max_new_tokens, cache=work / "lm_costs.json")
    summary["lm_costs"] = {str(n): asdict(c) for n, c in lm_costs.items()}

    # -- main verifiers -------------------------------------------------------------------------------------------
    verifiers: dict = {}
    with clock("train main"):
        for mode in ("terminal", "streaming"):
            path = train(data / "train", data / "val", ver / f"probe-{mode}", training_config("probe", 1, mode,
                                                                                                 cfg.quick))
            verifiers.setdefault("Probe", {})[mode] = str(path)
            for n in cfg.num_sequences:
                path = train(data / "train", data / "val", ver / f"msv{n}-{mode}",
                              training_config("msv", n, mode, cfg.quick))
                verifiers.setdefault(f"MSV_{n}", {})[mode] = str(path)
    with clock("evaluate main"):
        main = evaluate_study(data / "eval", verifiers, output_dir, cfg.num_sequences, cfg.seeds, data / "val",
                              lm_costs=lm_costs, deepconf_window=cfg.deepconf_window,
                              title="Testbed reproduction: main study", report_name=f"{stem}-main",
                              progress=progress)
    summary["reports"]["main"] = f"{stem}-main.md"
    summary["main"] = _main_summary(main, cfg)

    # -- checker robustness -----------------------------------------------------------------------------------------
    if "checkers" in studies:
        n = cfg.max_n
        rows = {}
        with clock("checkers"):
            ref_problems, _ = load_split(data / "eval", hidden=False)
            trained = {"reference": train(data / "train", data / "val", ver / f"msv{n}-terminal-nolavg",
                                           training_config("msv", n, "terminal", cfg.quick, logit_averaging=False))}
            for c in cfg.checkers:
                trained[c] = train(data / "train", data / "val", ver / f"msv{n}-terminal-nolavg-{c}",
                                    training_config("msv", n, "terminal", cfg.quick, logit_averaging=False,
                                                    checker=c, checker_kwargs=CHECKER_KWARGS[c]))
            for c in ("reference",) + tuple(cfg.checkers):
                vs = {f"MSV_{n} (reference-trained)": verifiers[f"MSV_{n}"]["terminal"],
                      f"MSV_{n} (trained with checker)": str(trained[c]),
                      "Probe": verifiers["Probe"]["terminal"], "MSV_1": verifiers["MSV_1"]["terminal"]}
                checker = None if c == "reference" else c
                res = evaluate_study(data / "eval", vs, output_dir / "studies", [n], cfg.seeds, None,
                                     checker=checker, checker_kwargs=CHECKER_KWARGS.get(c), lm_costs=lm_costs,
                                     deepconf_window=cfg.deepconf_window, figures=False,
                                     title=f"Checker robustness: {c}", report_name=f"{stem}-checker-{c}",
                                     progress=False)
                weak = ref_problems if checker is None else load_split(data / "eval", checker,
                                                                       CHECKER_KWARGS[c], hidden=False)[0]
                term = res["terminal"][str(n)]
                rows[c] = {"agreement": checker_agreement(ref_problems, weak),
                           **{m: term[m]["bon_accuracy"] for m in ("Self-consistency", "Probe+WV", "MSV_1+WV",
                                                                   f"MSV_{n} (reference-trained)",
                                                                   f"MSV_{n} (trained with checker)") if m in term}}
                summary["reports"][f"checker-{c}"] = f"studies/{stem}-checker-{c}.md"
        summary["checkers"] = {"n": n, "rows": rows}

    # -- mask ablation ----------------------------------------------------------------------------------------------
    if "masks" in studies:
        n = cfg.mask_n
        with clock("masks"):
            vs = {f"MSV_{n}": verifiers[f"MSV_{n}"]["streaming"]}
            for m in cfg.mask_ablations:
                masks = [x for x in MASKS if x != m]
                vs[f"w/o {m}"] = str(train(data / "train", data / "val", ver / f"msv{n}-streaming-no-{m}",
                                            training_config("msv", n, "streaming", cfg.quick, masks=masks)))
            vs = {k: {"streaming": v} for k, v in vs.items()}
            res = evaluate_study(data / "eval", vs, output_dir / "studies", [n], cfg.seeds, None, lm_costs=lm_costs,
                                 deepconf_window=cfg.deepconf_window, figures=False, title="Mask ablation",
                                 report_name=f"{stem}-masks", progress=False)
        stream = res["streaming"][str(n)]
        summary["masks"] = {"n": n, "rows": {k: {m: stream[k][m] for m in ("brier", "auroc", "nll")}
                                             for k in vs if k in stream}}
        summary["reports"]["masks"] = f"studies/{stem}-masks.md"

    # -- delimiter sensitivity ---------------------------------------------------------------------------------------
    if "delimiters" in studies:
        n = cfg.delimiter_n
        dk = work / "data-every-k"
        with clock("delimiters"):
            _collect_splits(model, tokenizer, dk, cfg, cfg.delimiter_samples, cfg.delimiter_sizes, delimiters=[],
                            every_k_tokens=cfg.every_k_tokens)
            vs = {}
            for name, kind, m in (("Probe", "probe", 1), ("MSV_1", "msv", 1), (f"MSV_{n}", "msv", n)):
                vs[name] = {"streaming": str(train(dk / "train", dk / "val", ver / f"everyk-{kind}{m}",
                                                    training_config(kind, m, "streaming", cfg.quick)))}
            res = evaluate_study(dk / "eval", vs, output_dir / "studies", [n], cfg.seeds, dk / "val",
                                 lm_costs=lm_costs, deepconf_window=cfg.deepconf_window, figures=False,
                                 title=f"Delimiter-free elicitation every {cfg.every_k_tokens} tokens",
                                 report_name=f"{stem}-every-k", progress=False)
        rows = {"Wait": _autc_row(main, n, ("Probe", "MSV_1", f"MSV_{n}")),
                f"every {cfg.every_k_tokens} tokens": _autc_row(res, n, ("Probe", "MSV_1", f"MSV_{n}"))}
        wait = main["data"]["eval"]
        rows["Wait"]["answers_per_sequence"] = wait["answers_per_sequence"]
        rows[f"every {cfg.every_k_tokens} tokens"]["answers_per_sequence"] = res["data"]["eval"][
            "answers_per_sequence"]
        summary["delimiters"] = {"n": n, "rows": rows, "mean_sequence_tokens": wait["mean_sequence_tokens"]}
        summary["reports"]["delimiters"] = f"studies/{stem}-every-k.md"

    # -- grouping for large N --------------------------------------------------------------------------------------
    if "grouping" in studies:
        m = cfg.grouping_m
        with clock("grouping"):
            if cfg.grouping_problems:
                gdir = work / "data-n{}".format(cfg.grouping_samples) / "eval"
                _collect(model, tokenizer, "evaluation", cfg.grouping_problems, gdir, cfg, cfg.grouping_samples,
                         problem_seed=1)
            else:
                gdir = data / "eval"
            vs = {k: {"streaming": verifiers[k]["streaming"]} for k in ("Probe", "MSV_1", f"MSV_{m}")}
            res = evaluate_study(gdir, vs, output_dir, list(cfg.grouping_ns), cfg.seeds, None, lm_costs=lm_costs,
                                 deepconf_window=cfg.deepconf_window, title=f"Grouping with MSV_{m} for large N",
                                 report_name=f"{stem}-grouping", progress=False)
        summary["grouping"] = _grouping_summary(res, cfg)
        summary["reports"]["grouping"] = f"{stem}-grouping.md"

    # -- training-set size -----------------------------------------------------------------------------------------
    if "training_size" in studies:
        n = cfg.max_n
        more = work / "data-more-train" / "train"
        per_size = {}
        with clock("training size"):
            if max(cfg.training_sizes) > cfg.train_problems:
                _collect(model, tokenizer, "train", max(cfg.training_sizes), more, cfg, cfg.num_samples,
                         first=cfg.train_problems)
            for k in cfg.training_sizes:
                vs = {}
                for name, kind, m in (("Probe", "probe", 1), (f"MSV_{n}", "msv", n)):
                    for mode in ("terminal", "streaming"):
                        if k == cfg.train_problems:   # the main study's verifiers
                            vs.setdefault(name, {})[mode] = verifiers[name][mode]
                            continue
                        bigger = k > cfg.train_problems
                        train_dirs = [data / "train", more] if bigger else data / "train"
                        limit = None if k == (max(cfg.training_sizes) if bigger else cfg.train_problems) else k
                        vs.setdefault(name, {})[mode] = str(train(
                            train_dirs, data / "val", ver / f"size{k}-{kind}{m}-{mode}",
                            training_config(kind, m, mode, cfg.quick, max_train_problems=limit)))
                res = evaluate_study(data / "eval", vs, output_dir / "studies", [n], cfg.seeds, None,
                                     lm_costs=lm_costs, deepconf_window=cfg.deepconf_window, figures=False,
                                     title=f"Training-set size: {k} problems", report_name=f"{stem}-size-{k}",
                                     progress=False)
                per_size[str(k)] = _size_row(res, n)
                summary["reports"][f"size-{k}"] = f"studies/{stem}-size-{k}.md"
        summary["training_size"] = {"n": n, "per_size": per_size}

    summary["timing_s"] = dict(clock.times, total=time.perf_counter() - started)
    summary["claims"] = _claims(summary, cfg)
    from ..utils import json_safe

    summary = json_safe(summary)
    (output_dir / f"{stem}.json").write_text(json.dumps(summary, indent=1))
    (output_dir / f"{stem}.md").write_text(render_testbed(summary, main))
    log(f"[reproduce] wrote {output_dir / (stem + '.md')} in {summary['timing_s']['total']:.0f} s")
    return summary


def train_shipped_verifier(work_dir="outputs/reproduce", destination=None, threads: int | None = None,
                           config: ReproduceConfig | None = None, device=None) -> Path:
    """The MSV shipped in ``hf_msv/testbed/verifier``: a streaming MSV_16 trained with `training_config` on the
    reproduction's train / validation shards (collected first when missing; shared with `reproduce`, whose
    ``msv16-streaming`` it is; MSV_8 on the quick configuration's 8 samples). Saves weights, config and model card
    to `destination` (default: the package's)."""
    import torch

    from ..collect import load_lm
    from ..hub import save_verifier
    from ..modeling_msv import MSVVerifier
    from ..testbed import TESTBED_VERIFIER_DIR

    if threads:
        torch.set_num_threads(threads)
    cfg, work = config or ReproduceConfig(), Path(work_dir)
    data = work / "data"
    model, tokenizer = load_lm("testbed", device=device)
    _collect_splits(model, tokenizer, data, cfg, cfg.num_samples, (cfg.train_problems, cfg.val_problems))
    n = min(16, cfg.num_samples)  # 16 at the paper's sizes; the quick collection has fewer samples
    path = _train(data / "train", data / "val", work / "verifiers" / f"msv{n}-streaming",
                  training_config("msv", n, "streaming", cfg.quick))
    log = json.loads((path / "training_log.json").read_text())
    best = next(h for h in log["history"] if h["epoch"] == log["best_epoch"])
    metrics = {k.replace("val_", "validation "): v for k, v in best.items() if k.startswith("val_")}
    destination = Path(destination or TESTBED_VERIFIER_DIR)
    shutil.rmtree(destination, ignore_errors=True)
    verifier = MSVVerifier.from_pretrained(path)
    local = verifier.config.base_model_name_or_path  # this machine's path: the card names the package's LM instead
    verifier.config.base_model_name_or_path = "hf_msv-testbed (hf_msv/testbed/lm)"
    training_data = log["training_data"].replace(f"`{local}`", "the hf_msv testbed LM (`hf_msv/testbed/lm`)")
    save_verifier(verifier, destination, metrics=metrics | {"epoch": log["best_epoch"]},
                  training_data=training_data + " Reproduce with `scripts/train_shipped_verifier.sh`.",
                  repo_id="hf-msv/msv16-testbed")
    for stale in destination.glob("*.py"):  # remote-code copies: save_pretrained/push_to_hub regenerate them
        stale.unlink()
    return destination


# ----------------------------------------------------------------------------------------------------------------
# Summaries and claims
# ----------------------------------------------------------------------------------------------------------------


SINGLE = ("Token Probs", "DeepConf", "Probe", "MSV_1")


def _m(stat) -> float:
    return math.nan if not stat or stat.get("mean") is None else float(stat["mean"])


def _main_summary(res: dict, cfg: ReproduceConfig) -> dict:
    """Per N: MSV_N and every baseline's terminal Brier / AUROC / best-of-N accuracy (and ECE/Brier of best-of-N),
    streaming AUROC / Brier, and the early-stop token fraction."""
    out = {}
    for n in cfg.num_sequences:
        k = str(n)
        msv = res["methods"][k]["msv"]
        term, stream, es = res["terminal"][k], res["streaming"][k], res["early_stop"].get(k, {})
        out[k] = {
            "msv": msv,
            "multi_sequence": res["methods"][k]["multi_sequence"],
            "terminal": {m: {x: r[x] for x in ("brier", "auroc", "ece", "nll", "bon_accuracy", "bon_ece",
                                               "bon_brier")} for m, r in term.items()},
            "streaming": {m: {x: r[x] for x in ("auroc", "brier", "ece", "nll", "autc_tokens", "autc_tokens_norm",
                                                "autc_latency_norm", "full_accuracy", "peak_accuracy")}
                          for m, r in stream.items()},
            "early_stop_token_fraction": es.get("token_fraction"),
            "early_stop_token_fraction_per_seed": es.get("token_fraction_per_seed"),
            "early_stop_latency_fraction": es.get("latency_fraction"),
            "early_stop_best_baseline": es.get("best_baseline"),
            "early_stop_best_baseline_peak_accuracy": es.get("best_baseline_peak_accuracy"),
            "early_stop_msv_peak_accuracy": es.get("msv_peak_accuracy"),
            "lambda_selection": res.get("lambda_selection", {}).get(k, {}),
            "verifier_online_s_per_answer": res["costs"]["verifier_online_s_per_answer"].get(k, {}),
            "lm_costs": res["costs"]["lm"].get(k),
        }
    out["data"] = res["data"]
    out["figures"] = res["figures"]
    return out


def _autc_row(res: dict, n: int, methods) -> dict:
    stream = res["streaming"][str(n)]
    return {("MSV_N" if m.startswith("MSV_") and m != "MSV_1" else m): {
        "autc_tokens": stream[m]["autc_tokens"], "autc_tokens_norm": stream[m]["autc_tokens_norm"]}
        for m in methods if m in stream}


def _grouping_summary(res: dict, cfg: ReproduceConfig) -> dict:
    out = {"m": cfg.grouping_m, "per_n": {}}
    for n in cfg.grouping_ns:
        k = str(n)
        stream = res["streaming"][k]
        msv = res["methods"][k]["msv"]
        out["per_n"][k] = {
            "msv": msv,
            "autc_latency_norm": {m: stream[m]["autc_latency_norm"] for m in stream},
            "autc_tokens_norm": {m: stream[m]["autc_tokens_norm"] for m in stream},
            "peak_accuracy": {m: stream[m]["peak_accuracy"] for m in stream},
            "verifier_online_s_per_answer": res["costs"]["verifier_online_s_per_answer"].get(k, {}),
            "full_latency": {m: stream[m]["full_latency"] for m in stream},
            "early_stop": {x: res["early_stop"][k].get(x) for x in ("best_baseline", "token_fraction",
                                                                    "latency_fraction")},
        }
    out["figures"] = [f for f in res["figures"] if "tradeoff" in f["file"]]
    return out


def _size_row(res: dict, n: int) -> dict:
    """One training-set size: the Probe's and MSV_n's calibration, best-of-n against the best baseline (the C2
    gap) and MSV_n's early-stop token fraction (C3)."""
    k = str(n)
    term, stream, es = res["terminal"][k], res["streaming"][k], res["early_stop"].get(k, {})
    msv = res["methods"][k]["msv"]
    base, bb = _best_bon_baseline(term, msv)
    return {"msv": msv,
            "terminal": {m: {x: term[m][x] for x in ("brier", "auroc", "bon_accuracy")}
                         for m in ("Probe", msv, "Self-consistency", "Probe+WV") if m in term},
            "streaming": {m: {x: stream[m][x] for x in ("brier", "auroc", "peak_accuracy")}
                          for m in ("Probe", msv, "Probe+WV") if m in stream},
            "bon_best_baseline": base, "bon_best_baseline_value": bb,
            "bon_gain": _m(term[msv]["bon_accuracy"]) - bb if msv in term else math.nan,
            "early_stop_best_baseline": es.get("best_baseline"), "early_stop_token_fraction": es.get("token_fraction")}


def _best(d: dict, names, key: str, lower: bool) -> tuple[str | None, float]:
    vals = [(m, _m(d[m][key])) for m in names if m in d and not math.isnan(_m(d[m][key]))]
    if not vals:
        return None, math.nan
    return (min if lower else max)(vals, key=lambda t: t[1])


def _best_bon_baseline(terminal: dict, msv: str) -> tuple[str | None, float]:
    """The method other than `msv` with the highest best-of-N accuracy (the C2 comparison)."""
    return _best(terminal, [m for m in terminal if m != msv], "bon_accuracy", lower=False)


def _claim(cid: str, text: str, paper: str, held: bool | None, sentence: str, **numbers) -> dict:
    verdict = "Held" if held else ("Not testable" if held is None else "Did not hold")
    return {"id": cid, "claim": text, "paper": paper, "held": held, "sentence": f"{verdict}: {sentence}",
            "numbers": numbers}


def _claims(s: dict, cfg: ReproduceConfig) -> list[dict]:
    claims = []
    main = s["main"]
    ns = [n for n in cfg.num_sequences if n > 1]
    # C1: terminal Brier >= 20 % lower than the best single-sequence baseline at N = 16 and 64 (each N)
    for n in [x for x in (16, 64) if x in ns] or ns[-1:]:
        r = main[str(n)]
        msv, term = r["msv"], r["terminal"]
        base, bb = _best(term, [m for m in SINGLE if m != msv], "brier", lower=True)
        ours = _m(term[msv]["brier"]) if msv in term else math.nan
        red = 1 - ours / bb if bb and not math.isnan(ours) else math.nan
        paper = PAPER["terminal"].get(str(n), {}).get("MSV_N", {}).get("brier")
        paper_best = min(PAPER["terminal"]["1"][m]["brier"] for m in ("Probe", "MSV_1", "PRM"))
        claims.append(_claim(
            f"terminal_brier_N{n}", f"MSV_{n} terminal Brier ≥ 20 % lower than the best single-sequence baseline",
            f"AIME: MSV_N {paper} vs best single-sequence {paper_best} ({1 - paper / paper_best:.0%} lower)"
            if paper else "—",
            None if math.isnan(red) else bool(red >= 0.20),
            f"at N={n}, {msv} Brier {ours:.4f} vs {base} {bb:.4f} ("
            + (f"{red:.0%} lower" if red >= 0 else f"{-red:.0%} higher") + "; needed ≥ 20 % lower).",
            msv=ours, best_baseline=base, best_baseline_value=bb, reduction=red))
    # C2: best-of-N_max >= best baseline + 2 pp
    n = ns[-1] if ns else cfg.max_n
    r = main[str(n)]
    msv, term = r["msv"], r["terminal"]
    base, bb = _best_bon_baseline(term, msv)
    ours = _m(term[msv]["bon_accuracy"]) if msv in term else math.nan
    gain = ours - bb
    pb = PAPER["bon_accuracy"].get(str(n), {})
    claims.append(_claim(
        f"best_of_{n}", f"{msv} best-of-{n} accuracy ≥ best baseline + 2 pp",
        f"AIME: MSV_N {pb.get('MSV_N')} vs best baseline {max(v for k, v in pb.items() if k != 'MSV_N'):.4f}"
        if pb else "—",
        None if math.isnan(gain) else bool(gain >= 0.02),
        f"{msv} best-of-{n} {ours:.3f} vs {base} {bb:.3f} ({100 * gain:+.1f} pp; needed ≥ +2 pp).",
        msv=ours, best_baseline=base, best_baseline_value=bb, gain=gain))
    # C3: early-stop token fraction <= 0.40 at the largest N (and reported for 16)
    for n in [x for x in (16, 64) if x in ns] or ns[-1:]:
        r = main[str(n)]
        tf = r["early_stop_token_fraction"]
        held = None if tf is None and r["early_stop_best_baseline"] is None else (tf is not None and tf <= 0.40)
        claims.append(_claim(
            f"early_stop_N{n}", f"{r['msv']} reaches the best baseline's peak accuracy with ≤ 0.40 of its tokens",
            PAPER["early_stop"]["token_fraction_statement"], held,
            f"at N={n}, {r['msv']} needs " + (f"{tf:.2f}× the tokens" if tf is not None else
                                              "— (never reaches the peak; fraction ∞)")
            + f" of {r['early_stop_best_baseline']} to reach its peak accuracy "
              f"{(r['early_stop_best_baseline_peak_accuracy'] or math.nan):.3f} (needed ≤ 0.40).",
            fraction=tf, best_baseline=r["early_stop_best_baseline"]))
    # C4: streaming calibration: MSV_N Brier below every single-sequence baseline at each N > 1
    for n in ns:
        r = main[str(n)]
        msv, st = r["msv"], r["streaming"]
        base, bb = _best(st, [m for m in SINGLE + tuple(f"{x}+WV" for x in SINGLE) if m != msv], "brier", True)
        ours = _m(st[msv]["brier"]) if msv in st else math.nan
        pa = PAPER["streaming"].get(str(n), {}).get("MSV_N", {}).get("brier")
        claims.append(_claim(
            f"streaming_brier_N{n}", f"{msv} streaming Brier below every single-sequence baseline (and its WV)",
            f"AIME: MSV_N {pa}, best baseline {min(v['brier'] for k, v in PAPER['streaming']['1'].items())}"
            if pa else "—", None if math.isnan(ours) or base is None else bool(ours < bb),
            f"at N={n}, {msv} streaming Brier {ours:.4f} vs best baseline {base} {bb:.4f}.",
            msv=ours, best_baseline=base, best_baseline_value=bb))
    # C5: best-of-N calibration: MSV_N best-of-N ECE below the single-sequence verifiers'
    for n in [x for x in (16, 64) if x in ns] or ns[-1:]:
        r = main[str(n)]
        msv, term = r["msv"], r["terminal"]
        base, bb = _best(term, [m for m in term if m != msv], "bon_ece", True)
        ours = _m(term[msv]["bon_ece"]) if msv in term else math.nan
        pc = PAPER["bon_calibration"].get(str(n), {})
        claims.append(_claim(
            f"bon_ece_N{n}", f"{msv} best-of-{n} confidence better calibrated (ECE) than every baseline's",
            f"AIME: MSV_N ECE {pc['MSV_N']['ece']} vs best baseline "
            f"{min(v['ece'] for k, v in pc.items() if k != 'MSV_N')}" if pc else "—",
            None if math.isnan(ours) or base is None else bool(ours < bb),
            f"at N={n}, best-of-{n} ECE {ours:.3f} for {msv} vs {bb:.3f} for {base}.",
            msv=ours, best_baseline=base, best_baseline_value=bb))
    # Checkers
    if "checkers" in s:
        n = s["checkers"]["n"]
        rows = s["checkers"]["rows"]
        ref = rows.get("reference", {})
        key = f"MSV_{n} (trained with checker)"
        drops = {c: _m(ref.get(key)) - _m(r.get(key)) for c, r in rows.items() if c != "reference"}
        wv_drops = {c: _m(ref.get("Probe+WV")) - _m(r.get("Probe+WV")) for c, r in rows.items() if c != "reference"}
        worst = max(drops, key=lambda c: drops[c]) if drops else None
        held = None if not drops else bool(all(d <= 0.012 for d in drops.values()))
        claims.append(_claim(
            "checker_robustness", f"MSV_{n} trained with a weak checker loses ≤ 1.2 pp of best-of-{n} accuracy",
            "Omni-MATH: ≤ 0.4 pp (embedding), ≤ 1.2 pp (random); Probe+WV loses 2.0 / 7.5 pp", held,
            (f"largest drop {100 * drops[worst]:+.1f} pp ({worst}); Probe+WV drops "
             + ", ".join(f"{c} {100 * v:+.1f} pp" for c, v in wv_drops.items()) + "."), drops=drops,
            probe_wv_drops=wv_drops) if drops else _claim("checker_robustness", "—", "—", None, "no weak checker"))
        mn = s["main"].get(str(n), {})
        if key in ref and mn.get("msv") in mn.get("terminal", {}):
            with_avg, without = _m(mn["terminal"][mn["msv"]]["bon_accuracy"]), _m(ref[key])
            base, bb = _best_bon_baseline(mn["terminal"], mn["msv"])
            claims.append(_claim(
                "best_of_logit_averaging", f"Logit averaging over equivalent answers raises MSV_{n}'s best-of-{n}",
                "Omni-MATH: MSV_64 0.356 with vs 0.348 without", bool(with_avg > without),
                f"MSV_{n} best-of-{n} {with_avg:.3f} with averaging (main) vs {without:.3f} without (checker study, "
                f"reference checker); without it MSV_{n} is {100 * (without - bb):+.1f} pp over {base} {bb:.3f}.",
                with_averaging=with_avg, without_averaging=without, gain_without=without - bb))
        if "random" in drops:
            claims.append(_claim(
                "checker_random_vs_wv", "With the random checker MSV degrades less than Probe+WV",
                "Omni-MATH: MSV_64 −1.2 pp vs Probe+WV −7.5 pp", bool(drops["random"] < wv_drops["random"]),
                f"random checker: MSV_{n} {100 * drops['random']:+.1f} pp vs Probe+WV "
                f"{100 * wv_drops['random']:+.1f} pp (drop relative to the reference checker)."))
    # Masks
    if "masks" in s:
        n = s["masks"]["n"]
        rows = s["masks"]["rows"]
        full = _m(rows.get(f"MSV_{n}", {}).get("brier"))
        ups = {k: _m(v["brier"]) - full for k, v in rows.items() if k != f"MSV_{n}"}
        claims.append(_claim(
            "masks", "Every attention mask contributes: removing any one raises the streaming Brier",
            "AIME MSV_16: 0.038 → 0.040 / 0.045 / 0.048 / 0.050 (w/o full / equiv. / within-seq / within-ans)",
            None if not ups else bool(all(v > 0 for v in ups.values())),
            f"MSV_{n} Brier {full:.4f}; " + ", ".join(f"{k} {v:+.4f}" for k, v in ups.items()) + ".",
            brier_increase=ups))
    # Delimiters
    if "delimiters" in s:
        rows = s["delimiters"]["rows"]
        ok = {}
        for d, r in rows.items():
            if "MSV_N" in r and "Probe" in r:
                ok[d] = _m(r["MSV_N"]["autc_tokens"]) > _m(r["Probe"]["autc_tokens"])
        claims.append(_claim(
            "delimiters", f"MSV_{s['delimiters']['n']} has a larger AUTC than the Probe for every delimiter",
            "AIME N=16: holds for Wait, Alternatively, But and every 200 tokens",
            None if not ok else bool(all(ok.values())),
            "; ".join(f"{d}: MSV_N {_m(r['MSV_N']['autc_tokens']):.1f} vs Probe {_m(r['Probe']['autc_tokens']):.1f}"
                      for d, r in rows.items() if "MSV_N" in r and "Probe" in r) + " (AUTC, accuracy × tokens)."))
    # Grouping
    if "grouping" in s:
        g = s["grouping"]
        big = [k for k in g["per_n"] if int(k) > g["m"]]
        res = {}
        for k in big:
            r = g["per_n"][k]
            autc_l = r["autc_latency_norm"]
            msv = r["msv"]
            base = [m for m in autc_l if m != msv]
            bb = max(base, key=lambda m: _m(autc_l[m])) if base else None
            res[k] = (msv, _m(autc_l.get(msv)), bb, _m(autc_l.get(bb)) if bb else math.nan)
        held = None if not res else bool(all(v[1] >= v[3] for v in res.values()))
        claims.append(_claim(
            "grouping", f"MSV_{g['m']} (grouped) matches or beats the best baseline's accuracy-latency AUTC at "
                        f"N > {g['m']}", PAPER["grouping"]["statement"], held,
            "; ".join(f"N={k}: {v[0]} {v[1]:.3f} vs {v[2]} {v[3]:.3f}" for k, v in res.items())
            + " (normalised AUTC over latency)." if res else "no N above M evaluated."))
        costs = {k: g["per_n"][k]["verifier_online_s_per_answer"].get(g["per_n"][k]["msv"]) for k in g["per_n"]}
        ks = sorted((int(k) for k in costs if costs[k]), key=int)
        if len(ks) >= 2:
            ratio = costs[str(ks[-1])] / costs[str(ks[0])]
            claims.append(_claim(
                "grouping_linear", "With grouping the MSV cost per answer stays flat as N grows (linear total)",
                "latency of MSV_64 scales linearly in N", bool(ratio <= 2.0),
                f"MSV cost per answer at N={ks[-1]} is {ratio:.2f}× that at N={ks[0]} (needed ≤ 2×).", ratio=ratio))
    # Training-set size
    if "training_size" in s:
        ts = s["training_size"]
        per = ts["per_size"]
        base_k, top_k = str(cfg.train_problems), max(per, key=int)
        if base_k in per and int(top_k) > cfg.train_problems:
            b0, b1 = (_m(per[k]["terminal"]["Probe"]["brier"]) for k in (base_k, top_k))
            pt = PAPER["training_size"]["Probe"]
            claims.append(_claim(
                "training_size_probe", f"The Probe's terminal Brier plateaus beyond {base_k} problems "
                                       f"({top_k} lower it by < 5 %)",
                "AIME: " + " / ".join(f"{v}" for v in pt.values()) + f" at {' / '.join(pt)} problems",
                bool(b1 > 0.95 * b0),
                f"Probe Brier {b0:.4f} with {base_k} problems, {b1:.4f} with {top_k} ({1 - b1 / b0:+.0%} lower).",
                brier=b0, brier_more=b1))
            r = per[top_k]
            tf = r["early_stop_token_fraction"]
            claims.append(_claim(
                "training_size_msv", f"With {top_k} training problems MSV_{ts['n']} meets the best-of-N (+2 pp) and "
                                     "early-stop (≤ 0.40) targets",
                "— (not in the paper: tests whether the testbed's gaps are a lack of training data)",
                bool(r["bon_gain"] >= 0.02 and tf is not None and tf <= 0.40),
                "; ".join(f"{k} problems: best-of-{ts['n']} {100 * v['bon_gain']:+.1f} pp vs "
                          f"{v['bon_best_baseline']}, token fraction "
                          + ("∞" if v["early_stop_token_fraction"] is None else
                             f"{v['early_stop_token_fraction']:.2f}") + f" vs {v['early_stop_best_baseline']}"
                          for k, v in per.items()) + ".",
                gain=r["bon_gain"], fraction=tf))
    return claims


# ----------------------------------------------------------------------------------------------------------------
# Markdown
# ----------------------------------------------------------------------------------------------------------------


def _f(stat, digits: int = 3) -> str:
    if stat is None:
        return "—"
    if isinstance(stat, (int, float)):
        return "—" if math.isnan(stat) else f"{stat:.{digits}f}"
    if stat.get("mean") is None:
        return "—"
    return f"{stat['mean']:.{digits}f} ± {(stat.get('std') or 0.0):.{digits}f}"


def _p(x, digits: int = 4) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _paper_key(method: str, msv: str, n: int) -> str:
    return "MSV_N" if method == msv and n > 1 else method


def _tbl(header, rows) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def _claims_for(summary, prefix) -> list[str]:
    return [f"* **{c['claim']}** — {c['sentence']} (paper: {c['paper']})" for c in summary["claims"]
            if c["id"].startswith(prefix)]


def _embed_figures(figs: dict[str, str], keep) -> list[str]:
    """Markdown lines embedding each figure file (with its caption) that `keep(file)` selects."""
    return [line for f in figs if keep(f) for line in (f"![{figs[f]}]({f})", "", f"*{figs[f]}*", "")]


def _calibration_section(r: dict, setting: str, n: int) -> list[str]:
    """The calibration table of one N for `setting` ("terminal" | "streaming"), paper values beside ours."""
    paper = PAPER[setting].get(str(n), {}) | (PAPER[setting]["1"] if n > 1 else {})
    rows = []
    for m, v in r[setting].items():
        pv = paper.get(_paper_key(m, r["msv"], n), {})
        rows.append([f"**{m}**" if m == r["msv"] else m, _f(v["brier"], 4), _p(pv.get("brier")),
                     _f(v["auroc"], 4), _p(pv.get("auroc")), _f(v["ece"], 4), _f(v["nll"], 4)])
    return [f"### N = {n}", "", _tbl(["method", "Brier ↓", "paper Brier", "AUROC ↑", "paper AUROC", "ECE ↓",
                                       "NLL ↓"], rows), ""]


def render_testbed(s: dict, main_results: dict) -> str:
    cfg = s["config"]
    main = s["main"]
    ns = cfg["num_sequences"]
    d = main["data"]
    lines = [
        "# MSV on the testbed: the paper's experiments reproduced" + (" (quick run)" if cfg["quick"] else ""), "",
        "Generated by `hf-msv reproduce`" + (" --quick" if cfg["quick"] else "") + " (`hf_msv/reproduce.py`) in "
        f"{s['timing_s']['total'] / 60:.1f} min (LM sampling and verifier training on `{s.get('device', 'cpu')}`, "
        "evaluation on CPU); every number and verdict below is computed from the run, next to the paper's (AIME "
        "column unless stated).", "",
        "**Read with care.** The testbed LM is a ~1M-parameter character-level model on synthetic arithmetic word "
        "problems (`hf_msv.testbed`), not a 1.5B reasoning LM on competition math: absolute numbers are not "
        "comparable with the paper's; what is tested is whether the *relative* claims (MSV_N vs baselines) carry "
        "over. There is no PRM baseline (no 7B model on this CPU); DeepConf (trace confidence, Platt-scaled on "
        "validation) is added.", "",
        "## Setup", "",
        f"* Data: {cfg['train_problems']} train / {cfg['val_problems']} validation / {cfg['eval_problems']} "
        f"evaluation problems × {cfg['num_samples']} samples (temperature 1, ≤ {cfg['max_new_tokens']} tokens, "
        f"`Wait` delimiter, answers ≤ 40 tokens, `{cfg['reference_checker']}` checker as the reference). "
        f"Evaluation: {d['eval']['answers']} answers, {d['eval']['answers_per_sequence']:.2f} per sequence, "
        f"terminal accuracy {d['eval']['terminal_accuracy']:.3f}, mean chain of thought "
        f"{d['eval']['mean_sequence_tokens']:.0f} tokens.",
        f"* N ∈ {ns}, {cfg['seeds']} seeds (random N-subsets of the collected sequences); mean ± std over seeds.",
        "* Verifiers: Probe and MSV_1/…/MSV_N trained per mode (terminal, streaming) with "
        "`hf_msv.reproduce.training_config` (the paper's recipe, scaled to the testbed; see its docstring).",
        "* LM costs measured here (s per shared decode step / per elicited answer): " + ", ".join(
            f"N={n}: {v['decode_step_s']:.2e} / {v['elicit_s']:.2e}" for n, v in s["lm_costs"].items()) + ".",
        "* Stage times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in s["timing_s"].items()) + "."
        + ("" if not s.get("verifiers", {}).get("reused") else
           f" Stages resume: this run trained {s['verifiers']['trained']} verifiers and reused "
           f"{s['verifiers']['reused']} (and any shards) from an earlier run in the same work directory."),
        "* Full per-study reports: " + ", ".join(f"[{k}]({v})" for k, v in s["reports"].items()) + "."
        + "".join(f" Not run this time: {', '.join(missing)} (`hf-msv reproduce --studies ...`)."
                  for missing in [[x for x in ReproduceConfig.studies if x not in s["studies"]]] if missing), "",
        "## Claims", "", _tbl(["claim", "ours", "paper"], [
            [c["claim"], c["sentence"], c["paper"]] for c in s["claims"]]), "",
    ]
    # 1. Terminal calibration
    lines += ["## 1. Calibration on terminal answers", ""]
    for n in ns:
        lines += _calibration_section(main[str(n)], "terminal", n)
    lines += _claims_for(s, "terminal_brier") + [""]
    figs = {f["file"]: f["caption"] for f in main["figures"]}
    lines += _embed_figures(figs, lambda f: "reliability_answers" in f and f.endswith(f"N{ns[-1]}.png"))
    # 2. Best-of-N
    lines += ["## 2. Best-of-N accuracy and calibration", ""]
    methods = []
    for n in ns:
        multi = set(main[str(n)]["multi_sequence"]) | {main[str(n)]["msv"]}
        methods += [m for m in main[str(n)]["terminal"] if m not in methods and (m not in multi or m == "MSV_1")]
    rows = []
    for m in methods + ["MSV_N"]:
        row = [m]
        for n in ns:
            r = main[str(n)]
            v = r["terminal"].get(r["msv"] if m == "MSV_N" else m)
            pv = PAPER["bon_accuracy"]["1"]["base"] if n == 1 else PAPER["bon_accuracy"].get(str(n), {}).get(m)
            row += [_f(v["bon_accuracy"]) if v else "—", _p(pv, 3) if v else "—"]
        rows.append(row)
    lines += [_tbl(["method"] + [x for n in ns for x in (f"N={n}", f"paper N={n}")], rows), "",
              "Best-of-N calibration (ECE / Brier of the picked answer's confidence):", ""]
    for n in [x for x in ns if x > 1]:
        r = main[str(n)]
        rows = []
        for m, v in r["terminal"].items():
            pv = PAPER["bon_calibration"].get(str(n), {}).get(_paper_key(m, r["msv"], n), {})
            rows.append([f"**{m}**" if m == r["msv"] else m, _f(v["bon_ece"]), _p(pv.get("ece")),
                         _f(v["bon_brier"]), _p(pv.get("brier"))])
        lines += [f"### N = {n}", "", _tbl(["method", "BoN ECE ↓", "paper", "BoN Brier ↓", "paper"], rows), ""]
    lines += _claims_for(s, "best_of") + _claims_for(s, "bon_ece") + [""]
    lines += _embed_figures(
        figs, lambda f: "best_of_n" in f or ("reliability_bon" in f and f.endswith(f"N{ns[-1]}.png")))
    # 3. Streaming calibration
    lines += ["## 3. Calibration on streaming answers", ""]
    for n in ns:
        lines += _calibration_section(main[str(n)], "streaming", n)
    lines += _claims_for(s, "streaming_brier") + [""]
    lines += _embed_figures(figs, lambda f: "brier_position" in f and f.endswith(f"N{ns[-1]}.png"))
    # 4. Early stopping
    lines += ["## 4. Early stopping: accuracy vs tokens and latency", ""]
    rows = []
    for n in ns:
        r = main[str(n)]
        tf, lf = r["early_stop_token_fraction"], r["early_stop_latency_fraction"]
        rows.append([str(n), r["msv"], str(r["early_stop_best_baseline"]),
                     _p(r["early_stop_best_baseline_peak_accuracy"], 3), _p(r["early_stop_msv_peak_accuracy"], 3),
                     "∞" if tf is None and r["early_stop_best_baseline"] else _p(tf, 2),
                     "∞" if lf is None and r["early_stop_best_baseline"] else _p(lf, 2),
                     _f(r["streaming"].get(r["msv"], {}).get("autc_tokens_norm")),
                     _f(r["streaming"].get(r["early_stop_best_baseline"], {}).get("autc_tokens_norm"))])
    lines += [_tbl(["N", "MSV", "best baseline", "its peak acc", "MSV peak acc", "token fraction",
                    "latency fraction", "MSV AUTC (norm)", "baseline AUTC (norm)"], rows), "",
              "Token fraction = tokens the MSV needs to reach the best baseline's peak accuracy ÷ tokens that "
              "baseline needs (paper, MATH N=64: < 0.5; target here ≤ 0.40).", ""]
    lines += _claims_for(s, "early_stop") + [""]
    lines += ["Verifier cost measured online (s per answer; paper's Probe / MSV_N verifier time at N=64: "
              f"{PAPER['latency']['verifier']['Probe']['64']} / {PAPER['latency']['verifier']['MSV_N']['64']} s per "
              "problem): " + "; ".join(f"N={n}: " + ", ".join(f"{m} {v:.1e}" for m, v in
                                                            main[str(n)]["verifier_online_s_per_answer"].items())
                                       for n in ns) + ".", ""]
    lines += _embed_figures(figs, lambda f: "tradeoff" in f)
    # λ selection
    lam_rows = []
    for n in ns:
        for m, rules in main[str(n)]["lambda_selection"].items():
            if m not in (main[str(n)]["msv"], "Probe", "MSV_1", "Probe+WV"):
                continue
            for rule, r in rules.items():
                lam_rows.append([str(n), m, rule, _f(r["target"]), _f(r["eval_accuracy"]), _f(r["eval_tokens"], 1),
                                 _f(r["eval_latency"], 3), "—" if rule == "validation" else _f(r["certified"], 2)])
    if lam_rows:
        lines += ["### λ selection: validation rule and risk-controlled (LTT, δ = 0.1)", "",
                  _tbl(["N", "method", "rule", "target acc", "eval acc", "eval tokens", "eval latency (s)",
                        "certified"], lam_rows), ""]
    # 5. Checkers
    if "checkers" in s:
        n = s["checkers"]["n"]
        rows = []
        for c, r in s["checkers"]["rows"].items():
            pv = PAPER["checkers"].get(c, {})
            cols = ["Self-consistency", "Probe+WV", "MSV_1+WV", f"MSV_{n} (reference-trained)",
                    f"MSV_{n} (trained with checker)"]
            pcols = ["Self-consistency", "Probe+WV", "MSV_1+WV", "MSV_64 (reference-trained)",
                     "MSV_64 (trained with checker)"]
            rows.append([c, _p(r.get("agreement"), 3), _p(pv.get("agreement"), 3)]
                        + [f"{_f(r.get(x))} ({_p(pv.get(y), 3)})" for x, y in zip(cols, pcols)])
        lines += [f"## 5. Robustness to the equivalence checker (best-of-{n}; paper: Omni-MATH, in parentheses)", "",
                  f"MSV_{n} is trained (terminal, without logit averaging) with each checker's classes; correctness "
                  "is always the reference checker's. Agreement = pairwise accuracy of \"same class\" vs the "
                  "reference on pairs of terminal answers.", "",
                  _tbl(["checker", "agreement", "paper", "Self-consistency", "Probe+WV", "MSV_1+WV",
                        f"MSV_{n} (ref-trained)", f"MSV_{n} (trained w/ checker)"], rows), ""]
        lines += _claims_for(s, "checker") + [""]
    # 6. Masks
    if "masks" in s:
        n = s["masks"]["n"]
        rows = []
        for k, r in s["masks"]["rows"].items():
            pv = PAPER["masks"].get("MSV_16" if k == f"MSV_{n}" else k, {})
            rows.append([k, _f(r["brier"], 4), _p(pv.get("brier"), 3), _f(r["auroc"], 4), _p(pv.get("auroc"), 3),
                         _f(r["nll"], 4), _p(pv.get("nll"), 3)])
        lines += [f"## 6. Attention-mask ablation (streaming MSV_{n}; paper: AIME MSV_16)", "",
                  _tbl(["model", "Brier ↓", "paper", "AUROC ↑", "paper", "NLL ↓", "paper"], rows), ""]
        lines += _claims_for(s, "masks") + [""]
    # 7. Delimiters
    if "delimiters" in s:
        n = s["delimiters"]["n"]
        rows = []
        for dname, r in s["delimiters"]["rows"].items():
            pv = PAPER["delimiters"].get("Wait" if dname == "Wait" else "every K tokens", {})
            rows.append([dname, _p(r.get("answers_per_sequence"), 2)] + [
                f"{_f((r.get(m) or {}).get('autc_tokens'), 1)} ({_p(pv.get(m), 1)})" for m in ("Probe", "MSV_1",
                                                                                                "MSV_N")])
        lines += [f"## 7. Delimiter sensitivity (AUTC at N={n}, accuracy × tokens; paper: AIME, N=16, "
                  "in parentheses)", "",
                  "The Wait row is the main collection; the every-K row is a separate, smaller collection "
                  f"({'/'.join(map(str, cfg['delimiter_sizes']))} problems × {cfg['delimiter_samples']} samples) "
                  "with its own verifiers. Compare verifiers within a row.", "",
                  _tbl(["elicitation", "answers / sequence", "Probe", "MSV_1", f"MSV_{n}"], rows), ""]
        lines += _claims_for(s, "delimiters") + [""]
    # 8. Grouping
    if "grouping" in s:
        g = s["grouping"]
        rows = []
        for k, r in g["per_n"].items():
            for m in r["autc_latency_norm"]:
                rows.append([k, f"**{m}**" if m == r["msv"] else m, _f(r["autc_latency_norm"][m]),
                             _f(r["autc_tokens_norm"][m]), _f(r["peak_accuracy"][m]),
                             _p(r["verifier_online_s_per_answer"].get(m), 6)])
        lines += [f"## 8. Large N with grouping (MSV_{g['m']} on groups of {g['m']})", "",
                  _tbl(["N", "method", "AUTC latency (norm) ↑", "AUTC tokens (norm) ↑", "peak acc",
                        "verifier s / answer"], rows), ""]
        lines += _claims_for(s, "grouping") + [""]
        for f in g["figures"]:
            lines += [f"![{f['caption']}]({f['file']})", "", f"*{f['caption']}*", ""]
    # 9. Training-set size
    if "training_size" in s:
        ts = s["training_size"]
        n = ts["n"]
        rows = []
        for k, r in ts["per_size"].items():
            msv = r["msv"]
            tf = r["early_stop_token_fraction"]
            rows.append([k, f"{_f(r['terminal']['Probe']['brier'], 4)} "
                            f"({_p(PAPER['training_size']['Probe'].get(k), 4)})",
                         _f(r["terminal"][msv]["brier"], 4), _f(r["terminal"][msv]["bon_accuracy"]),
                         f"{_p(r['bon_best_baseline_value'], 3)} ({r['bon_best_baseline']})",
                         f"{100 * r['bon_gain']:+.1f}", _f(r["streaming"][msv]["brier"], 4),
                         ("∞" if tf is None else _p(tf, 2)) + f" ({r['early_stop_best_baseline']})"])
        lines += [f"## 9. Training-set size (Probe and MSV_{n}, N={n}; paper: AIME Probe, in parentheses)", "",
                  f"The first k training problems (nested subsets; sizes above {cfg['train_problems']} add "
                  "problems collected for this study); validation and evaluation are the main study's.", "",
                  _tbl(["train problems", "Probe Brier ↓", f"MSV_{n} Brier ↓", f"MSV_{n} best-of-{n}",
                        "best baseline", "gain (pp)", f"MSV_{n} streaming Brier ↓", "token fraction"], rows), ""]
        lines += _claims_for(s, "training_size") + [""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------


def add_reproduce_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``hf-msv reproduce`` options."""
    parser.add_argument("--output-dir", default="docs/results", help="where testbed.md / testbed.json go")
    parser.add_argument("--quick", action="store_true", help="a few-minute smoke run (few problems, N in {1, 4})")
    parser.add_argument("--work-dir", default=None, help="shards and verifiers (default outputs/reproduce[-quick])")
    parser.add_argument("--studies", nargs="+", default=None,
                        choices=["main", "checkers", "masks", "delimiters", "grouping"])
    parser.add_argument("--seeds", type=int, default=None, help="override the number of seeds")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--device", default=None, help="where the LM samples (default: the GPU when there is one)")
    parser.add_argument("--problems-per-batch", type=int, default=None,
                        help="problems sampled together (default 4, right for 2 CPU cores; 32 suits a GPU)")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--shipped-verifier", action="store_true",
                        help="only (re)build hf_msv/testbed/verifier from the train/validation shards")
    return parser


def reproduce_from_args(args: argparse.Namespace) -> dict:
    """Run `reproduce` (or `train_shipped_verifier`) from parsed `add_reproduce_arguments` options."""
    cfg = ReproduceConfig.quick_config() if args.quick else ReproduceConfig()
    if args.seeds:
        cfg = replace(cfg, seeds=args.seeds)
    if args.problems_per_batch:
        cfg = replace(cfg, problems_per_batch=args.problems_per_batch)
    if args.shipped_verifier:
        return {"shipped_verifier": str(train_shipped_verifier(args.work_dir or "outputs/reproduce",
                                                               threads=args.threads, config=cfg,
                                                               device=args.device))}
    return reproduce(args.output_dir, quick=args.quick, work_dir=args.work_dir, config=cfg, studies=args.studies,
                     threads=args.threads, progress=not args.no_progress, device=args.device)


def main(argv=None) -> None:
    parser = add_reproduce_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    reproduce_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    main()
