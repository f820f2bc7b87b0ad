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
several hours on 2 cores: split it over runs (every stage resumes in one work directory, and ``--continue-report``
continues the committed report on another machine, making only what the studies it still lacks need) or use a GPU.

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

Modules: `stages` (collections, fits and the training queue, LM costs, checker agreement), `context`
(`ReproductionContext`, the state the stages share), `studies` (one public function per study, each returning its
entry of the summary), `shipped` (the package's verifier); this one runs them in order and writes the report.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from .claims import compute_claims
from .config import STUDIES, ReproduceArguments, ReproduceConfig
from .context import ReproductionContext, StageClock
from .paper import PAPER
from .report import render_testbed
from .shipped import train_shipped_verifier
from .stages import TrainingQueue, measure_lm_costs
from .studies import STUDY_STAGES, main_study, train_main_verifiers

__all__ = ["reproduce", "write_summary", "load_report_to_continue", "continued_summary", "earlier_sittings",
           "sitting_collections", "parse_arguments", "main"]


def reproduce(output_dir="docs/results", quick: bool = False, work_dir=None, config: ReproduceConfig | None = None,
              studies=None, threads: int | None = None, progress: bool = True, device=None,
              reuse_shards: str = "matching", train_workers: int = 1, reuse_verifiers: str = "matching",
              continue_report: bool = False) -> dict:
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
            and data match but whose training code differs: `kept_despite_code`; the report lists each), and a fit
            interrupted under other training code is resumed (`pending_despite_code`).
        continue_report: continue the report already in `output_dir` (``{stem}.json`` and its main study's
            results) instead of starting one: its main study and finished studies are kept, only the `studies` it
            lacks run, and only the collections and main fits those need are made (`load_report_to_continue`).
            A later sitting on a fresh machine continues a committed report this way.
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
                              Path(output_dir), clock=StageClock(log), reuse_shards=reuse_shards,
                              reuse_verifiers=reuse_verifiers, queue=queue)
    earlier = load_report_to_continue(ctx) if continue_report else None  # a clear error before any work
    try:
        summary = _run_studies(ctx, studies, device, progress, log, earlier)
    except BaseException:
        queue.close(cancel=True)  # fits not yet started are dropped; an interrupted run resumes from the rest
        raise
    queue.close()
    return summary


def _run_studies(ctx: ReproductionContext, studies: tuple, device, progress: bool, log, earlier=None) -> dict:
    """`reproduce`'s body: collect, measure, train, evaluate every study (those `earlier`, a report being continued,
    lacks), write the reports."""
    from ..collect import load_lm
    from ..testbed import get_task

    ctx.output_dir.mkdir(parents=True, exist_ok=True)
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    ctx.model, ctx.tokenizer = load_lm(get_task(ctx.config.task).lm_name, device=device)
    if earlier is None:
        summary = {"config": asdict(ctx.config), "studies": list(studies), "paper": PAPER, "reports": ctx.reports,
                   "verifiers": ctx.counts, "device": str(ctx.model.device), "sittings": []}
        _main_stages(ctx, summary, studies, progress)
    else:
        summary = continued_summary(ctx, earlier, studies)
    optional = [name for name in STUDY_STAGES if name in studies and name not in summary]
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


def _main_stages(ctx: ReproductionContext, summary: dict, studies: tuple, progress: bool) -> None:
    """A new report's first stages: the main collection, the LM's costs, the main fits and the main study."""
    from ..testbed import get_task

    cfg = ctx.config
    with ctx.clock("collect"):
        ctx.main_data()
    with ctx.clock("lm costs"):
        ns_cost = sorted(set(cfg.num_sequences) | (set(cfg.grouping_ns) if "grouping" in studies else set()))
        ctx.lm_costs = measure_lm_costs(ctx.model, ctx.tokenizer,
                                        get_task(cfg.task).generate_problems("evaluation", cfg.cost_problems, seed=99),
                                        ns_cost, cfg.max_new_tokens, cache=ctx.work_dir / "lm_costs.json")
    summary["lm_costs"] = {str(n): asdict(c) for n, c in ctx.lm_costs.items()}
    with ctx.clock("train main"):
        train_main_verifiers(ctx)
    with ctx.clock("evaluate main"):
        summary["main"] = main_study(ctx, progress=progress)


def load_report_to_continue(ctx: ReproductionContext) -> dict:
    """The summary in ``output_dir/{stem}.json`` that `reproduce(continue_report=True)` continues, checked: it must
    exist, hold a finished main study whose results file is beside it, and have been made with this run's settings
    (the studies of one report compare with each other, so they share data sizes, seeds and N)."""
    from ..utils import json_safe

    path = ctx.output_dir / f"{ctx.stem}.json"
    if not path.exists():
        raise FileNotFoundError(f"--continue-report: no report {path} to continue (run without it to start one)")
    earlier = json.loads(path.read_text())
    mine = json_safe(asdict(ctx.config))
    differ = sorted(k for k in mine.keys() | earlier["config"].keys() if mine.get(k) != earlier["config"].get(k))
    if differ:
        raise ValueError(f"--continue-report: {path} was made with other settings ({', '.join(differ)}); continue it "
                         "with the same flags, or write a new report elsewhere with --output-dir")
    main_json = _main_results_path(ctx, earlier)
    if "main" not in earlier or not main_json.exists():
        raise FileNotFoundError(f"--continue-report: {path} has no finished main study ({main_json} is missing)")
    return earlier


def _main_results_path(ctx: ReproductionContext, earlier: dict) -> Path:
    """The main study's results file (`evaluate_study`'s JSON) beside the report being continued."""
    return ctx.output_dir / Path(earlier.get("reports", {}).get("main", f"{ctx.stem}-main.md")).with_suffix(".json")


def continued_summary(ctx: ReproductionContext, earlier: dict, studies: tuple) -> dict:
    """The summary a continuing sitting starts from: `earlier`'s main study and finished studies, its LM costs (so
    that latency figures stay comparable across sittings; they were measured by the sitting that made the main
    study), reports and vote checks; this sitting's own counts, device and reuse log. `ctx.main_results` is read
    from the main study's results file. The sittings before this one are listed (a report from before sittings
    were recorded counts as one)."""
    from ..evaluation.early_stop import LatencyCosts

    ctx.lm_costs = {int(n): LatencyCosts(**c) for n, c in earlier["lm_costs"].items()}
    ctx.main_results = json.loads(_main_results_path(ctx, earlier).read_text())
    ctx.reports.update(earlier["reports"])
    ctx.vote_checks[:] = earlier.get("vote_check", [])
    finished = [k for k in STUDIES if k in earlier]
    sittings = earlier_sittings(earlier) or [{"studies": finished, "device": earlier.get("device"),
                                              "timing_s": earlier["timing_s"], "verifiers": earlier.get("verifiers"),
                                              "reuse": earlier.get("reuse")}]
    keep = {k: earlier[k] for k in ("lm_costs", *finished) if k in earlier}
    # "studies": what the report holds or this sitting runs (the report names the others as not run)
    return {"config": earlier["config"], "studies": [k for k in STUDIES if k in earlier or k in studies],
            "paper": PAPER, "reports": ctx.reports, "verifiers": ctx.counts, "device": str(ctx.model.device),
            "sittings": sittings, **keep}


def earlier_sittings(earlier: dict) -> list[dict]:
    """The sittings a report records, less the last one of an interim report (one with studies ``pending``) when
    it finished no study: that record is the snapshot a run writes before its first study starts, so a run stopped
    before finishing one left it (0 min, 0 fits), while the time it spent and the fits it trained belong to the
    sitting that continues (whose reuse log lists what it took over)."""
    sittings = list(earlier.get("sittings") or [])
    if earlier.get("pending") and sittings and not sittings[-1]["studies"]:
        sittings.pop()
    return sittings


def write_summary(ctx: ReproductionContext, summary: dict, started: float, pending=()) -> dict:
    """Complete `summary` (stage times, reuse log, vote checks, this sitting and its collections, claims) and write
    ``{stem}.json`` / ``{stem}.md`` into the output directory; `pending` names the studies still to run (an interim
    report says so at its top). Returns the JSON-safe summary as written."""
    from ..utils import json_safe

    timing = dict(ctx.clock.times, total=time.perf_counter() - started)
    done = dict(summary, timing_s=timing, reuse=ctx.reuse.summary(), vote_check=list(ctx.vote_checks))
    before = summary.get("sittings", [])
    ran = [k for k in STUDIES if k in summary and not any(k in x["studies"] for x in before)]
    done["sittings"] = [*before, {"studies": ran, "device": summary.get("device"), "timing_s": timing,
                                  "verifiers": dict(ctx.counts), "reuse": done["reuse"], "git_commit": ctx.git_commit,
                                  **sitting_collections(before, ctx.collections)}]
    if pending:
        done["pending"] = list(pending)
    done["claims"] = compute_claims(done, ctx.config)
    done = json_safe(done)
    (ctx.output_dir / f"{ctx.stem}.json").write_text(json.dumps(done, indent=1))
    (ctx.output_dir / f"{ctx.stem}.md").write_text(render_testbed(done, ctx.main_results))
    return done


def sitting_collections(before: list[dict], made: dict) -> dict:
    """What a sitting records of the main collection it made (`made`: split -> shard fingerprint; empty when it made
    none): the fingerprints, and the splits in which they differ from those of the sitting that ran the main study.
    Collection is deterministic on one machine; on another, CPU kernels may round differently (a v2 evaluation
    collection re-made on a new machine had the same 189,006 answers and labels and one token fewer in 5.5 M). Such
    a sitting's studies still compare fits trained on its own data; the report says which splits differ rather than
    hiding it or stopping."""
    if not made:
        return {}
    main = next((x.get("collections", {}) for x in before if "main" in x["studies"]), {})
    differ = [k for k in made if k in main and main[k] != made[k]]
    return {"collections": made, **({"collections_differ_from_main": differ} if differ else {})}


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
                     train_workers=args.train_workers, reuse_verifiers=args.reuse_verifiers,
                     continue_report=args.continue_report)


if __name__ == "__main__":
    main()
