"""The paper's studies on the testbed, one public function each: it trains (or reuses) its verifiers through the
`ReproductionContext`, evaluates them, records its report in ``ctx.reports`` and returns its summary entry, typed
(`hf_msv.reproduction.results`; ``to_json()`` is the summary's JSON)."""

from __future__ import annotations

from pathlib import Path

from ..elicitation import ElicitationSettings
from ..evaluation.results import as_study_results
from .config import training_config
from .context import ReproductionContext, seed_specs
from .paper import CHECKER_KWARGS, MASKS
from .results import CheckerStudy, DelimiterStudy, GroupingStudy, MainStudySummary, MaskStudy, TrainingSizeStudy
from .stages import checker_agreement, collect_problems, collect_splits
from .summary import autc_row, grouping_summary, main_summary, size_row

__all__ = [
    "train_main_verifiers",
    "main_study",
    "checkers_study",
    "masks_study",
    "delimiters_study",
    "grouping_study",
    "training_size_study",
    "STUDY_STAGES",
]


def train_main_verifiers(ctx: ReproductionContext) -> dict[str, dict[str, list[str]]]:
    """Probe and MSV_n for every n of the main study, terminal and streaming: ``{method: {mode: [path per training
    seed]}}``."""
    for mode in ("terminal", "streaming"):
        for method in ("Probe", *(f"MSV_{n}" for n in ctx.config.num_sequences)):
            ctx.main_fit(method, mode)
    ctx.queue.wait()  # so that the "train main" stage times the training
    return ctx.verifiers


def main_study(ctx: ReproductionContext, progress: bool = True) -> MainStudySummary:
    """The main study (C1-C5): the main verifiers and every baseline on the evaluation split, each N, with figures
    and λ rules chosen on validation. Needs `train_main_verifiers` first; keeps the results in `ctx.main_results`."""
    cfg = ctx.config
    steps, difficulty_name = ctx.task.difficulty(cfg.eval_problems)  # a testbed's reasoning steps; none for your LM
    data = ctx.main_data()
    ctx.main_results = ctx.evaluate(
        data / "eval",
        {k: ctx.specs(k) for k in ctx.verifiers},
        cfg.num_sequences,
        data / "val",
        difficulty=steps,
        difficulty_name=difficulty_name,
        title=f"{ctx.task.title}: main study",
        report_name="main",
        subdir=False,
        figures=True,
        progress=progress,
    )
    ctx.reports["main"] = f"{ctx.stem}-main.md"
    return main_summary(ctx.main_results, cfg.num_sequences)


def checkers_study(ctx: ReproductionContext) -> CheckerStudy:
    """Checker robustness: terminal MSV_N (without logit averaging) trained with each weak checker's classes, and
    best-of-N of it and of the checker-dependent baselines when evaluation groups answers with that checker."""
    from ..evaluation import load_split

    cfg, data, n = ctx.config, ctx.main_data(), ctx.config.max_n
    ref_problems, _ = load_split(data / "eval", hidden=False)
    no_averaging = {"architecture": {"logit_averaging": False}}
    trained = {
        "reference": ctx.train(
            data / "train", f"msv{n}-terminal-nolavg", training_config("msv", n, "terminal", cfg.quick, **no_averaging)
        )
    }
    for c in cfg.checkers:
        trained[c] = ctx.train(
            data / "train",
            f"msv{n}-terminal-nolavg-{c}",
            training_config(
                "msv", n, "terminal", cfg.quick, **no_averaging, checker=c, checker_kwargs=CHECKER_KWARGS[c]
            ),
        )
    rows = {}
    for c in ("reference",) + tuple(cfg.checkers):
        vs = {
            f"MSV_{n} (reference-trained)": ctx.main_fit(f"MSV_{n}", "terminal"),
            f"MSV_{n} (trained with checker)": trained[c],
            "Probe": ctx.main_fit("Probe", "terminal"),
            "MSV_1": ctx.main_fit("MSV_1", "terminal"),
        }
        # name -> [path per training seed]
        checker = None if c == "reference" else c
        res = ctx.evaluate(
            data / "eval",
            vs,
            [n],
            checker=checker,
            checker_kwargs=CHECKER_KWARGS.get(c),
            title=f"Checker robustness: {c}",
            report_name=f"checker-{c}",
        )
        weak = (
            ref_problems if checker is None else load_split(data / "eval", checker, CHECKER_KWARGS[c], hidden=False)[0]
        )
        term = as_study_results(res).terminal[str(n)]
        rows[c] = {
            "agreement": checker_agreement(ref_problems, weak),
            **{
                m: term[m].metrics["bon_accuracy"].to_dict()
                for m in (
                    "Self-consistency",
                    "Probe+WV",
                    "MSV_1+WV",
                    f"MSV_{n} (reference-trained)",
                    f"MSV_{n} (trained with checker)",
                )
                if m in term
            },
        }
        ctx.reports[f"checker-{c}"] = f"studies/{ctx.stem}-checker-{c}.md"
    return CheckerStudy.from_json({"n": n, "rows": rows})


def masks_study(ctx: ReproductionContext) -> MaskStudy:
    """Mask ablation: streaming MSV_N with each attention mask removed, against the full MSV_N (Brier/AUROC/NLL)."""
    cfg, n, data = ctx.config, ctx.config.mask_n, ctx.main_data()
    vs = {f"MSV_{n}": ctx.main_fit(f"MSV_{n}", "streaming")}
    for m in cfg.mask_ablations:
        masks = [x for x in MASKS if x != m]
        vs[f"w/o {m}"] = ctx.train(
            data / "train",
            f"msv{n}-streaming-no-{m}",
            training_config("msv", n, "streaming", cfg.quick, architecture={"masks": masks}),
        )
    vs = {k: seed_specs({"streaming": v}) for k, v in vs.items()}
    res = ctx.evaluate(data / "eval", vs, [n], title="Mask ablation", report_name="masks")
    stream = as_study_results(res).streaming[str(n)]
    ctx.reports["masks"] = f"studies/{ctx.stem}-masks.md"
    rows = {k: {m: stream[k].metrics[m].to_dict() for m in ("brier", "auroc", "nll")} for k in vs if k in stream}
    return MaskStudy.from_json({"n": n, "rows": rows})


def delimiters_study(ctx: ReproductionContext) -> DelimiterStudy:
    """Delimiter sensitivity: a delimiter-free collection elicited every K tokens, with its own Probe / MSV_1 /
    MSV_N, against the main (``Wait``) study's: streaming AUTC over tokens and answers per sequence."""
    cfg, n = ctx.config, ctx.config.delimiter_n
    dk = ctx.work_dir / "data-every-k"
    collect_splits(
        ctx.model,
        ctx.tokenizer,
        dk,
        cfg,
        cfg.delimiter_samples,
        cfg.delimiter_sizes,
        elicitation=ElicitationSettings(delimiters=(), every_k_tokens=cfg.every_k_tokens),
        reuse=ctx.shard_reuse,
    )
    vs = {}
    for name, kind, m in (("Probe", "probe", 1), ("MSV_1", "msv", 1), (f"MSV_{n}", "msv", n)):
        vs[name] = seed_specs(
            {
                "streaming": ctx.train(
                    dk / "train",
                    f"everyk-{kind}{m}",
                    training_config(kind, m, "streaming", cfg.quick),
                    val_dir=dk / "val",
                )
            }
        )
    res = ctx.evaluate(
        dk / "eval",
        vs,
        [n],
        dk / "val",
        report_name="every-k",
        title=f"Delimiter-free elicitation every {cfg.every_k_tokens} tokens",
    )
    every_k = f"every {cfg.every_k_tokens} tokens"
    methods = ("Probe", "MSV_1", f"MSV_{n}")
    if ctx.main_results is None:
        raise ValueError("the delimiter study compares with the main study: evaluate it first")
    rows = {"Wait": autc_row(ctx.main_results, n, methods), every_k: autc_row(res, n, methods)}
    wait = as_study_results(ctx.main_results).data["eval"]
    rows["Wait"].answers_per_sequence = wait["answers_per_sequence"]
    rows[every_k].answers_per_sequence = as_study_results(res).data["eval"]["answers_per_sequence"]
    ctx.reports["delimiters"] = f"studies/{ctx.stem}-every-k.md"
    return DelimiterStudy(n=n, rows=rows, mean_sequence_tokens=wait["mean_sequence_tokens"])


def grouping_study(ctx: ReproductionContext) -> GroupingStudy:
    """Large N with grouping: the streaming MSV_M scoring groups of M at N > M (a 256-sample collection; the main
    evaluation split when ``grouping_problems`` is 0) against Probe and MSV_1, over latency and tokens."""
    cfg, m = ctx.config, ctx.config.grouping_m
    if cfg.grouping_problems:
        gdir = ctx.work_dir / f"data-n{cfg.grouping_samples}" / "eval"
        collect_problems(
            ctx.model,
            ctx.tokenizer,
            "evaluation",
            range(cfg.grouping_problems),
            gdir,
            cfg,
            cfg.grouping_samples,
            problem_seed=1,
            reuse=ctx.shard_reuse,
        )
    else:
        gdir = ctx.main_data() / "eval"
    vs = {k: ctx.specs(k, ("streaming",)) for k in ("Probe", "MSV_1", f"MSV_{m}")}
    res = ctx.evaluate(
        gdir,
        vs,
        list(cfg.grouping_ns),
        title=f"Grouping with MSV_{m} for large N",
        report_name="grouping",
        subdir=False,
        figures=True,
    )
    ctx.reports["grouping"] = f"{ctx.stem}-grouping.md"
    return grouping_summary(res, cfg.grouping_ns, m)


def _size_verifiers(ctx: ReproductionContext, k: int, more: Path) -> dict:
    """Probe and MSV_N (both modes) trained on the first `k` training problems: the main study's at its own size;
    beyond it, the main training split plus `more` (problems collected for this study)."""
    cfg, data, n = ctx.config, ctx.main_data(), ctx.config.max_n
    vs = {}  # name -> mode -> [path per training seed]
    for name, kind, m in (("Probe", "probe", 1), (f"MSV_{n}", "msv", n)):
        for mode in ("terminal", "streaming"):
            if k == cfg.train_problems:  # the main study's verifiers
                vs.setdefault(name, {})[mode] = ctx.main_fit(name, mode)
                continue
            bigger = k > cfg.train_problems
            train_dirs = [data / "train", more] if bigger else data / "train"
            # No limit when `k` is everything the directories hold (so the stored config names no prefix).
            limit = None if k == (max(cfg.training_sizes) if bigger else cfg.train_problems) else k
            vs.setdefault(name, {})[mode] = ctx.train(
                train_dirs,
                f"size{k}-{kind}{m}-{mode}",
                training_config(kind, m, mode, cfg.quick, max_train_problems=limit),
            )
    return {k: seed_specs(v) for k, v in vs.items()}


def training_size_study(ctx: ReproductionContext) -> TrainingSizeStudy:
    """Training-set size: Probe and MSV_N trained on nested prefixes of the training problems (collecting more
    when a size exceeds the main split), each evaluated at N = max N."""
    cfg, n = ctx.config, ctx.config.max_n
    more = ctx.work_dir / "data-more-train" / "train"
    if max(cfg.training_sizes) > cfg.train_problems:
        collect_problems(
            ctx.model,
            ctx.tokenizer,
            "train",
            range(cfg.train_problems, max(cfg.training_sizes)),
            more,
            cfg,
            cfg.num_samples,
            reuse=ctx.shard_reuse,
        )
    # Every size's fits are queued first, so that a size is evaluated while the larger ones still train (with
    # --train-workers the largest sizes' fits take hours on 2 cores; their evaluations no longer wait in line).
    verifiers = {k: _size_verifiers(ctx, k, more) for k in cfg.training_sizes}
    per_size = {}
    for k in cfg.training_sizes:
        res = ctx.evaluate(
            ctx.main_data() / "eval",
            verifiers[k],
            [n],
            title=f"Training-set size: {k} problems",
            report_name=f"size-{k}",
        )
        per_size[str(k)] = size_row(res, n)
        ctx.reports[f"size-{k}"] = f"studies/{ctx.stem}-size-{k}.md"
    return TrainingSizeStudy(n=n, per_size=per_size)


# Each optional study: its function and the name its stage time is logged under.
STUDY_STAGES = {
    "checkers": (checkers_study, "checkers"),
    "masks": (masks_study, "masks"),
    "delimiters": (delimiters_study, "delimiters"),
    "grouping": (grouping_study, "grouping"),
    "training_size": (training_size_study, "training size"),
}
