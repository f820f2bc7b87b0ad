"""``hf-msv reproduce``: the paper's experiments re-run end to end on the testbed (or its main study on your own
LM), with the paper's numbers beside ours.

    from hf_msv.reproduction import ReproduceArguments, reproduce
    summary = reproduce(ReproduceArguments(output_dir="docs/results"))  # the paper's sizes (hours on CPU)
    summary = reproduce(ReproduceArguments(output_dir="/tmp/quick", quick=True))  # minutes: N in {1, 4}, 2 seeds
    summary = reproduce(ReproduceArguments(model="my-lm", train_problems="train.jsonl", val_problems="val.jsonl",
                                           eval_problems="eval.jsonl"))  # the main study on your LM (a GPU)

`reproduce` runs the studies in order (collect, measure the LM's costs, train, evaluate, report), every stage
resumable in one work directory; a report is written in parts, each part continuing the committed report
(``--continue-report``). The protocol, the stages and the report's parts are described in ``docs/reproduction.md``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..errors import MissingPathError, UserError
from ..evaluation.results import StudyResults
from .claims import compute_claims
from .config import STUDIES, ReproduceArguments, ReproduceConfig
from .context import ReproductionContext, StageClock
from .own_lm import check_studies, reproduction_task
from .paper import PAPER
from .report import LEGACY_PARTS_KEY, render_testbed, report_parts
from .results import ReproductionResults
from .shipped import train_shipped_verifier
from .stages import TrainingQueue, measure_lm_costs
from .studies import STUDY_STAGES, main_study, train_main_verifiers

__all__ = [
    "reproduce",
    "write_summary",
    "load_report_to_continue",
    "continued_summary",
    "earlier_parts",
    "part_collections",
    "report_parts",
    "parse_arguments",
    "main",
]


def reproduce(args: ReproduceArguments | None = None, config: ReproduceConfig | None = None) -> ReproductionResults:
    """Run the testbed reproduction (``docs/reproduction.md``) and write ``testbed.md`` / ``testbed.json`` (quick:
    ``testbed-quick.*``) plus figures and per-study reports into ``args.output_dir``.

    Args:
        args: the run options, those of ``hf-msv reproduce`` (`ReproduceArguments`: output and work directories,
            studies, threads, device, reuse policies, ``continue_report``, ``train_workers``; default: its
            defaults). "main" always runs (the other studies build on it); on your own LM (``args.model``) it is the
            only one. With ``continue_report``, the report already in ``output_dir`` is continued
            (`load_report_to_continue`): only the studies it lacks run, with only the collections and main fits they
            need; the report gains a part. With ``train_workers`` above 1,
            call `reproduce` from under ``if __name__ == "__main__":`` in a script (the fit workers are spawned, and
            a spawned process imports the main module; ``hf-msv reproduce`` needs nothing).
        config: sizes and settings (default: ``args.reproduce_config()``, the paper's sizes on ``args.task`` or,
            with ``args.quick``, the quick ones, with its overrides).

    Returns:
        The summary, as written to ``testbed.json`` (``to_json()``).
    """
    import torch

    from ..evaluation.report import require_report_extras

    args = args or ReproduceArguments()
    require_report_extras()  # the main and grouping studies draw figures: fail before hours of work, not after
    if args.train_workers < 1:
        raise UserError(f"train_workers must be ≥ 1, got {args.train_workers}")
    for name, policy in (("reuse_shards", args.reuse_shards), ("reuse_verifiers", args.reuse_verifiers)):
        if policy not in ("matching", "keep"):
            raise UserError(f"{name} must be 'matching' or 'keep', got {policy!r}")
    cfg = config or args.reproduce_config()
    studies = tuple(dict.fromkeys(("main",) + tuple(args.studies or cfg.studies)))
    check_studies(cfg, studies)
    if args.threads:
        torch.set_num_threads(args.threads)
    log = print if args.progress else (lambda *a, **k: None)
    queue = TrainingQueue(args.train_workers, (args.threads or torch.get_num_threads()) // args.train_workers)
    ctx = ReproductionContext(
        cfg,
        Path(args.work_dir or cfg.default_work_dir),
        Path(args.output_dir),
        clock=StageClock(log),
        reuse_shards=args.reuse_shards,
        reuse_verifiers=args.reuse_verifiers,
        queue=queue,
    )
    reproduction_task(cfg)  # an own LM's problem specs read and checked: a clear error before any work
    earlier = load_report_to_continue(ctx) if args.continue_report else None  # a clear error before any work
    try:
        summary = _run_studies(ctx, studies, args.device, args.progress, log, earlier)
    except BaseException:
        queue.close(cancel=True)  # fits not yet started are dropped; an interrupted run resumes from the rest
        raise
    queue.close()
    return summary


def _run_studies(
    ctx: ReproductionContext, studies: tuple, device, progress: bool, log, earlier=None
) -> ReproductionResults:
    """`reproduce`'s body: collect, measure, train, evaluate every study (those `earlier`, a report being continued,
    lacks), write the reports."""
    from ..collect import load_lm

    ctx.output_dir.mkdir(parents=True, exist_ok=True)
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    ctx.model, ctx.tokenizer = load_lm(ctx.task.lm_name, device=device)
    if earlier is None:
        summary = {
            "config": ctx.config.to_dict(),
            "studies": list(studies),
            "paper": PAPER,
            "reports": ctx.reports,
            "verifiers": ctx.counts,
            "device": str(ctx.model.device),
            "parts": [],
        }
        _main_stages(ctx, summary, studies, progress)
    else:
        summary = continued_summary(ctx, earlier, studies)
    optional = [name for name in STUDY_STAGES if name in studies and name not in summary]
    for i, name in enumerate(optional):
        # A full v2 run takes hours: the report so far is written before each study starts, so what is finished
        # can be read (and committed) while the rest is still running.
        write_summary(ctx, summary, started, pending=optional[i:])
        study, stage = STUDY_STAGES[name]
        with ctx.clock(stage):
            summary[name] = study(ctx).to_json()
    done = write_summary(ctx, summary, started)
    log(f"[reproduce] wrote {ctx.output_dir / (ctx.stem + '.md')} in {(done.timing_s or {})['total']:.0f} s")
    return done


def _main_stages(ctx: ReproductionContext, summary: dict, studies: tuple, progress: bool) -> None:
    """A new report's first stages: the main collection, the LM's costs, the main fits and the main study."""
    cfg, task = ctx.config, ctx.task
    if cfg.max_new_tokens is None:  # set by ReproduceConfig.__post_init__
        raise ValueError("ReproduceConfig.max_new_tokens is unset")
    max_new_tokens = cfg.max_new_tokens
    with ctx.clock("collect"):
        ctx.main_data()
    with ctx.clock("lm costs"):
        ns_cost = sorted(set(cfg.num_sequences) | (set(cfg.grouping_ns) if "grouping" in studies else set()))
        ctx.lm_costs = measure_lm_costs(
            ctx.model,
            ctx.tokenizer,
            task.cost_problems(cfg.cost_problems),
            ns_cost,
            max_new_tokens,
            cache=ctx.work_dir / "lm_costs.json",
            **({} if task.delimiters is None else {"delimiters": task.delimiters}),
            prompt_template=task.prompt_template,
        )
    summary["lm_costs"] = {str(n): asdict(c) for n, c in ctx.lm_costs.items()}
    with ctx.clock("train main"):
        train_main_verifiers(ctx)
    with ctx.clock("evaluate main"):
        summary["main"] = main_study(ctx, progress=progress).to_json()


def load_report_to_continue(ctx: ReproductionContext) -> dict[str, Any]:
    """The summary in ``output_dir/{stem}.json`` that `reproduce` continues (``continue_report``), checked: it must
    exist, hold a finished main study whose results file is beside it, and have been made with this run's settings
    (the studies of one report compare with each other, so they share data sizes, seeds and N)."""
    from ..utils import json_safe

    path = ctx.output_dir / f"{ctx.stem}.json"
    if not path.exists():
        raise MissingPathError(f"--continue-report: no report {path} to continue (run without it to start one)")
    try:
        earlier = json.loads(path.read_text())
    except ValueError as e:  # not JSON, or not UTF-8
        raise UserError(
            f"--continue-report: {path} is not a JSON report ({e}); move it away or give another --output-dir"
        ) from None
    if not isinstance(earlier, dict) or "config" not in earlier:
        raise UserError(f"--continue-report: {path} is not a report of hf-msv reproduce (it has no config)")
    if LEGACY_PARTS_KEY in earlier:
        earlier.setdefault("parts", earlier.pop(LEGACY_PARTS_KEY))
    mine: dict[str, Any] = {key: json_safe(value) for key, value in ctx.config.to_dict().items()}
    differ = sorted(k for k in mine.keys() | earlier["config"].keys() if mine.get(k) != earlier["config"].get(k))
    if differ:
        raise UserError(
            f"--continue-report: {path} was made with other settings ({', '.join(differ)}); continue it "
            "with the same flags, or write a new report elsewhere with --output-dir"
        )
    main_json = _main_results_path(ctx, earlier)
    if "main" not in earlier or not main_json.exists():
        raise MissingPathError(f"--continue-report: {path} has no finished main study ({main_json} is missing)")
    return earlier


def _main_results_path(ctx: ReproductionContext, earlier: dict) -> Path:
    """The main study's results file (`evaluate_study`'s JSON) beside the report being continued."""
    return ctx.output_dir / Path(earlier.get("reports", {}).get("main", f"{ctx.stem}-main.md")).with_suffix(".json")


def continued_summary(ctx: ReproductionContext, earlier: dict, studies: tuple) -> dict[str, Any]:
    """The summary a continuing part starts from: `earlier`'s main study and finished studies, its LM costs (so
    that latency figures stay comparable across parts; they were measured by the part that made the main study),
    reports and vote checks; this part's own counts, device and reuse log. `ctx.main_results` is read from the
    main study's results file. The parts before this one are listed (a report that records none counts as one)."""
    from ..evaluation.early_stop import LatencyCosts

    ctx.lm_costs = {int(n): LatencyCosts(**c) for n, c in earlier["lm_costs"].items()}
    ctx.main_results = StudyResults.from_dict(json.loads(_main_results_path(ctx, earlier).read_text()))
    ctx.reports.update(earlier["reports"])
    ctx.vote_checks[:] = earlier.get("vote_check", [])
    finished = [k for k in STUDIES if k in earlier]
    parts = earlier_parts(earlier) or [
        {
            "studies": finished,
            "device": earlier.get("device"),
            "timing_s": earlier["timing_s"],
            "verifiers": earlier.get("verifiers"),
            "reuse": earlier.get("reuse"),
        }
    ]
    keep = {k: earlier[k] for k in ("lm_costs", *finished) if k in earlier}
    # "studies": what the report holds or this part runs (the report names the others as not run)
    return {
        "config": earlier["config"],
        "studies": [k for k in STUDIES if k in earlier or k in studies],
        "paper": PAPER,
        "reports": ctx.reports,
        "verifiers": ctx.counts,
        "device": str(ctx.model.device),
        "parts": parts,
        **keep,
    }


def earlier_parts(earlier: dict) -> list[dict[str, Any]]:
    """The parts a report records, less the last one of an interim report (one with studies ``pending``) when it
    finished no study: that record is the snapshot a run writes before its first study starts, so a run stopped
    before finishing one left it (0 min, 0 fits), while the time it spent and the fits it trained belong to the
    part that continues (whose reuse log lists what it took over)."""
    parts = report_parts(earlier)
    if earlier.get("pending") and parts and not parts[-1]["studies"]:
        parts.pop()
    return parts


def write_summary(ctx: ReproductionContext, summary: dict, started: float, pending=()) -> ReproductionResults:
    """Complete `summary` (stage times, reuse log, vote checks, this part and its collections, claims) and write
    ``{stem}.json`` / ``{stem}.md`` into the output directory; `pending` names the studies still to run (an interim
    report says so at its top). Returns the summary as written (``to_json()`` gives the JSON)."""
    from ..utils import json_safe

    timing = dict(ctx.clock.times, total=time.perf_counter() - started)
    done = dict(summary, timing_s=timing, reuse=ctx.reuse.summary(), vote_check=list(ctx.vote_checks))
    before = report_parts(summary)
    done.pop(LEGACY_PARTS_KEY, None)
    ran = [k for k in STUDIES if k in summary and not any(k in x["studies"] for x in before)]
    done["parts"] = [
        *before,
        {
            "studies": ran,
            "device": summary.get("device"),
            "timing_s": timing,
            "verifiers": dict(ctx.counts),
            "reuse": done["reuse"],
            "git_commit": ctx.git_commit,
            **part_collections(before, ctx.collections),
        },
    ]
    if pending:
        done["pending"] = list(pending)
    done["claims"] = compute_claims(done, ctx.config)
    # Through the typed model before anything is written, as the evaluation's results are.
    typed = ReproductionResults.from_json({key: json_safe(value) for key, value in done.items()})
    (ctx.output_dir / f"{ctx.stem}.json").write_text(json.dumps(typed.to_json(), indent=1))
    (ctx.output_dir / f"{ctx.stem}.md").write_text(render_testbed(typed, ctx.main_results))
    return typed


def part_collections(before: list[dict], made: dict) -> dict[str, Any]:
    """What a part records of the main collection it made (`made`: split -> shard fingerprint; empty when it made
    none): the fingerprints, and the splits in which they differ from those of the part that ran the main study.
    Collection is deterministic on one machine; on another, CPU kernels may round differently. Such a part's
    studies still compare fits trained on its own data; the report says which splits differ rather than hiding it
    or stopping."""
    if not made:
        return {}
    main = next((x.get("collections", {}) for x in before if "main" in x["studies"]), {})
    differ = [k for k in made if k in main and main[k] != made[k]]
    return {"collections": made, **({"collections_differ_from_main": differ} if differ else {})}


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------


def parse_arguments(argv: list[str] | None = None) -> ReproduceArguments:
    """The ``hf-msv reproduce`` options, one flag per `ReproduceArguments` field (``--work-dir`` or ``--work_dir``),
    after ``--config FILE`` and ``--log-level`` as every command takes them (`hf_msv.arguments.parse_command_args`).

    Args:
        argv: the command-line arguments; `None`: ``sys.argv[1:]``.

    Returns:
        The `ReproduceArguments`.
    """
    from transformers import HfArgumentParser
    from transformers.hf_argparser import DataClassType

    from ..arguments import parse_command_args

    parser = HfArgumentParser(
        DataClassType(ReproduceArguments), prog="hf-msv reproduce", description=(__doc__ or "").splitlines()[0]
    )
    (args,) = parse_command_args(parser, argv)
    return args


def main(argv: list[str] | None = None) -> ReproductionResults | Path:
    """``hf-msv reproduce``: runs `reproduce` (or, with ``--shipped-verifier``, `train_shipped_verifier`) with the
    parsed options and returns its summary (the shipped verifier's directory)."""
    args = parse_arguments(argv)
    cfg = args.reproduce_config()
    if args.shipped_verifier:
        return train_shipped_verifier(
            args.work_dir,
            threads=args.threads,
            config=cfg,
            device=args.device,
            reuse_shards=args.reuse_shards,
            reuse_verifiers=args.reuse_verifiers,
        )
    return reproduce(args, cfg)


if __name__ == "__main__":
    main()
