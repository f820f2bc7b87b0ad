"""What a reproduction runs: its sizes and settings (`ReproduceConfig`, on a testbed task or on your own LM), the
``hf-msv reproduce`` run options (`ReproduceArguments`, from which the command's flags are built) and the verifier
training recipe (`training_config`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import UserError
from ..testbed.tasks import DEFAULT_TASK, TASKS
from .own_lm import OWN_LM_STUDIES, OWN_LM_TASK, check_run_name, lm_run_name, load_spec
from .paper import MASKS

__all__ = ["REPORTED_TASK_CAPS", "STUDIES", "ReproduceConfig", "ReproduceArguments", "training_config"]

# Every study of the reproduction, in the order they run and are reported ("main" first: the others build on it).
STUDIES = ("main", "checkers", "masks", "delimiters", "grouping", "training_size")
# Tasks whose committed reports the package reads and renders without the task being registered, and their length
# caps (None: uncapped): v1, the first testbed (docs/results/testbed*.md; `python -m research.testbed_v1 reproduce`
# registers it and runs it).
REPORTED_TASK_CAPS = {"v1": None}
# The settings of a run on your own LM, absent from a testbed run's summary (`ReproduceConfig.to_dict`), so that its
# settings read as before and a committed report is continued with the same ones.
OWN_LM_FIELDS = ("model", "name", "problem_specs", "prompt_template", "delimiters")


def _sampling_cap(task: str) -> int | None:
    """`task`'s length cap: a registered task's (`hf_msv.testbed.get_task`, a ValueError for an unknown task), else
    its `REPORTED_TASK_CAPS` entry, so that a committed report's settings are read without its task."""
    from ..testbed import get_task

    if task == OWN_LM_TASK:
        return None  # your own LM: its context bounds each sequence (`hf_msv.collect.sequence_budget`)
    if task not in TASKS and task in REPORTED_TASK_CAPS:
        return REPORTED_TASK_CAPS[task]
    return get_task(task).sampling_cap()


def _help(text: str, **kwargs):
    return field(metadata={"help": text}, **kwargs)


@dataclass
class ReproduceConfig:
    """Sizes and settings of a reproduction (defaults: the paper's sizes; `quick_config`: a smoke run)."""

    task: str = _help(
        "testbed task and LM: v2 (the testbed, hf_msv/testbed/lm-v2; reports testbed-v2*.md) or a "
        "registered one (v1: the first testbed, research/testbed_v1; reports testbed*.md)",
        default=DEFAULT_TASK,
    )
    train_problems: int = _help("training problems of the main collection", default=224)
    val_problems: int = _help("validation problems (early stopping of training, λ rules, Platt scaling)", default=64)
    eval_problems: int = _help("evaluation problems", default=448)
    num_samples: int = _help("sequences sampled per problem", default=64)
    num_sequences: tuple = _help("the N of the main study (MSV_N and baselines on N-subsets)", default=(1, 4, 16, 64))
    training_seeds: int = _help(
        "verifiers trained per (method, N, mode), each with its own seed; tables report mean ± std over them",
        default=3,
    )
    max_new_tokens: int | None = _help(
        "chain-of-thought token budget per sequence (default: 320, or the task's "
        "length cap: v2 272, which a smaller budget may cut, never exceed)",
        default=None,
    )
    reference_checker: str = _help(
        "equivalence checker whose classes and correctness are the reference", default="symbolic"
    )
    # On 2 CPU cores one problem's 64 samples already fill the cores, and problems sampled together wait for the
    # longest trace: 8 v2 train problems × 64 samples took 16 s a problem one at a time, 26 s in batches of 4.
    problems_per_batch: int = _help("problems sampled together (1 suits 2 CPU cores; 32 a GPU)", default=1)
    problems_per_shard: int = _help("problems per hidden-state shard", default=16)
    collect_seed: int = _help("sampling seed of the collections", default=0)
    # DeepConf's 2048 is ~half of a 4k-token trace; testbed traces are ~100 tokens
    deepconf_window: int = _help("DeepConf's sliding window of token confidences", default=32)
    studies: tuple = _help("studies to run (see STUDIES)", default=STUDIES)
    checkers: tuple = _help(
        "weak checkers of the checker-robustness study (see CHECKER_KWARGS)",
        default=("exact", "jaccard", "embedding", "random"),
    )
    mask_ablations: tuple = _help("masks removed one at a time in the mask ablation", default=MASKS)
    mask_n: int = _help("N of the mask ablation (streaming MSV_N)", default=16)
    # about the testbed's mean distance between "Wait"s
    every_k_tokens: int = _help("elicitation interval of the delimiter-free collection", default=40)
    delimiter_sizes: tuple = _help(
        "train / validation / evaluation problems of the every-K collection", default=(112, 32, 224)
    )
    delimiter_samples: int = _help("sequences per problem of the every-K collection", default=16)
    delimiter_n: int = _help("N of the delimiter study", default=16)
    grouping_problems: int = _help(
        "evaluation problems of the large-N collection (0: reuse the main evaluation split)", default=32
    )
    grouping_samples: int = _help("sequences per problem of the large-N collection", default=256)
    grouping_ns: tuple = _help("the N of the grouping study", default=(64, 128, 256))
    grouping_m: int = _help("group size M of the grouped MSV_M", default=64)
    training_sizes: tuple = _help(
        "training problems of the training-set-size study (nested prefixes; those beyond "
        "train_problems are collected in addition)",
        default=(56, 112, 224, 448),
    )
    cost_problems: int = _help("problems the LM's decode / elicitation costs are timed on", default=2)
    quick: bool = _help("a smoke run's configuration (file stem testbed-quick, 2-epoch training)", default=False)
    model: str | None = _help(
        f"your own LM (directory, Hub id or named LM) instead of a testbed task's (task {OWN_LM_TASK!r}: the main "
        "study on the problems of problem_specs)",
        default=None,
    )
    name: str | None = _help(
        "a run on your own LM: its name in report titles, report files (msv-<name>.md) and the work directory "
        "(default: the model's last path component)",
        default=None,
    )
    problem_specs: tuple = _help(
        "a run on your own LM: its train, validation and evaluation problem specs (as `hf-msv collect --problems` "
        "takes them); train_problems / val_problems / eval_problems take the first ones of each",
        default=(),
    )
    prompt_template: str | None = _help(
        "the collections' prompt template (as `hf-msv collect --prompt-template` takes it; default: the testbed's "
        "format, or auto on your own LM: its chat template, else the question)",
        default=None,
    )
    delimiters: tuple | None = _help(
        "where streaming answers are elicited (default: the library's, Wait)", default=None
    )

    @classmethod
    def quick_config(cls, task: str = DEFAULT_TASK, **overrides) -> ReproduceConfig:
        """A smoke run's sizes on `task` (`overrides`: fields set differently, e.g. an own LM's ``model``)."""
        quick: dict[str, Any] = dict(
            task=task,
            train_problems=16,
            val_problems=8,
            eval_problems=16,
            num_samples=8,
            num_sequences=(1, 4),
            training_seeds=2,
            checkers=("random",),
            mask_ablations=("equivalence",),
            mask_n=4,
            delimiter_sizes=(12, 6, 12),
            delimiter_samples=4,
            delimiter_n=4,
            grouping_problems=0,
            grouping_samples=8,
            grouping_ns=(4, 8),
            grouping_m=4,
            training_sizes=(8, 16, 24),
            cost_problems=1,
            problems_per_batch=4,
            quick=True,
        )  # 8 samples: batch problems to fill the cores
        return cls(**(quick | overrides))

    def __post_init__(self):
        if self.training_seeds < 1:
            raise UserError(f"training_seeds must be ≥ 1, got {self.training_seeds}")
        self._own_lm_defaults()
        # v2's LM is trained on traces cut at the cap and has no positions far beyond it (its context is cap + 288)
        cap = _sampling_cap(self.task)
        if self.max_new_tokens is None:
            self.max_new_tokens = cap or 320
        elif cap is not None and self.max_new_tokens > cap:
            raise UserError(
                f"max_new_tokens={self.max_new_tokens} is beyond testbed {self.task}'s length cap {cap}: "
                f"its LM was trained on traces cut there (give at most {cap}, or leave it unset)"
            )
        if self.max_new_tokens < 1:
            raise UserError(f"max_new_tokens must be ≥ 1, got {self.max_new_tokens}")

    def _own_lm_defaults(self) -> None:
        """A `model` makes this a run on your own LM (task `OWN_LM_TASK`) and gives it its defaults: the main study
        alone, its name, and its sampling budget (a named LM's, else `hf_msv.collect.DEFAULT_MAX_NEW_TOKENS`, cut to
        each prompt's room in the LM's context by the collection)."""
        if self.model is not None and self.task not in (DEFAULT_TASK, OWN_LM_TASK):
            raise UserError(f"model={self.model!r} is a run on your own LM; task={self.task!r} names a testbed task")
        if self.model is not None:
            self.task = OWN_LM_TASK
        if self.task != OWN_LM_TASK:
            return
        self.problem_specs = tuple(self.problem_specs)
        self.studies = (
            OWN_LM_STUDIES if tuple(self.studies) == STUDIES else tuple(self.studies)
        )  # checked by reproduce
        self.delimiters = None if self.delimiters is None else tuple(self.delimiters)
        self.name = self.name or (lm_run_name(self.model) if self.model else OWN_LM_TASK)
        check_run_name(self.name)
        if self.max_new_tokens is None:
            from ..collect.lm import default_max_new_tokens

            self.max_new_tokens = default_max_new_tokens(self.model)

    @property
    def own_lm(self) -> bool:
        """Whether this is a run on your own LM (`model`) rather than on a testbed task."""
        return self.task == OWN_LM_TASK

    @property
    def collection_prompt_template(self) -> str:
        """The collections' prompt template: `prompt_template`, else the testbed's format (``testbed``) or, on your
        own LM, ``auto`` (its chat template when it has one)."""
        return self.prompt_template or ("auto" if self.own_lm else "testbed")

    def to_dict(self) -> dict[str, Any]:
        """The settings as a summary records them: every field, less the own-LM ones (`OWN_LM_FIELDS`) of a testbed
        run (whose settings then read as a committed report's)."""
        out = asdict(self)
        return out if self.own_lm else {k: v for k, v in out.items() if k not in OWN_LM_FIELDS}

    @property
    def _suffix(self) -> str:
        """``-v2`` for testbed v2 (``-<name>`` on your own LM), then ``-quick`` for a quick run (v1 at full size:
        none; v1's reports kept the names they had when v1 was the only testbed)."""
        tag = self.name if self.own_lm else self.task
        return ("" if tag == "v1" else f"-{tag}") + ("-quick" if self.quick else "")

    @property
    def stem(self) -> str:
        """File stem of the reports: ``testbed`` (on your own LM: ``msv``) + `_suffix`."""
        return ("msv" if self.own_lm else "testbed") + self._suffix

    @property
    def default_work_dir(self) -> str:
        """Shards, verifiers and caches: ``outputs/reproduce`` + `_suffix`."""
        return "outputs/reproduce" + self._suffix

    @property
    def max_n(self) -> int:
        return max(self.num_sequences)

    def collect_config(self, num_samples: int):
        """The `hf_msv.collect.CollectConfig` of the run's collections with `num_samples` sequences per problem (the
        elicitation is the library's default unless a study passes its own)."""
        from ..collect import CollectConfig

        return CollectConfig(
            num_samples=num_samples,
            max_new_tokens=self.max_new_tokens,
            checker=self.reference_checker,
            prompt_template=self.collection_prompt_template,
            delimiters=None if self.delimiters is None else list(self.delimiters),
            problems_per_shard=self.problems_per_shard,
            problems_per_batch=self.problems_per_batch,
            seed=self.collect_seed,
            progress=False,
        )


@dataclass
class ReproduceArguments:
    """The ``hf-msv reproduce`` run options (sizes come from `ReproduceConfig`: the paper's, or `--quick`'s)."""

    output_dir: str = _help(
        "where testbed.md / testbed.json go (on your own LM: msv-<name>.md / .json)", default="docs/results"
    )
    task: str | None = field(
        default=None,
        metadata={
            "help": "testbed task: v2 (the default: the testbed, LM in hf_msv/testbed/lm-v2) or a registered one "
            "(the first testbed, v1, with `python -m research.testbed_v1 reproduce`); not with --model",
            "choices": TASKS,
        },
    )  # the mapping itself: a task registered after this import is a choice too
    model: str | None = _help(
        "your own LM (directory, Hub id or named LM): run the main study on it and on --train-problems, "
        "--val-problems and --eval-problems instead of on a testbed task (docs/reproduction.md)",
        default=None,
    )
    train_problems: str | None = _help(
        "with --model: the training problems, a spec as `hf-msv collect --problems` takes it (problems.jsonl of "
        "{id, question, gold} lines, <benchmark>[:<n>], <named LM>:<split>:<n>[:<seed>])",
        default=None,
    )
    val_problems: str | None = _help(
        "with --model: the validation problems (early stopping of training, λ rules, Platt scaling), a spec",
        default=None,
    )
    eval_problems: str | None = _help("with --model: the evaluation problems, a spec", default=None)
    name: str | None = _help(
        "with --model: the run's name in report titles and files (msv-<name>.md; work directory "
        "outputs/reproduce-<name>; default: the model's last path component)",
        default=None,
    )
    prompt_template: str | None = _help(
        "with --model: how a problem becomes a prompt, as `hf-msv collect --prompt-template` takes it (default: "
        "auto: the LM's chat template, else the question alone)",
        default=None,
    )
    delimiters: list[str] | None = _help(
        "with --model: where streaming answers are elicited (default: Wait)", default=None
    )
    num_samples: int | None = _help("override the sequences sampled per problem (default 64; --quick 8)", default=None)
    num_sequences: list[int] | None = _help(
        "override the N of the main study (default 1 4 16 64; --quick 1 4; at most --num-samples)", default=None
    )
    max_new_tokens: int | None = _help(
        "override the chain-of-thought token budget per sequence (default: the testbed task's length cap; on your "
        "own LM a named LM's budget, else 4096, cut to what its context leaves room for)",
        default=None,
    )
    checker: str | None = _help(
        "override the reference equivalence checker (classes and correctness; default symbolic)", default=None
    )
    quick: bool = _help("a few-minute smoke run (few problems, N in {1, 4})", default=False)
    work_dir: str | None = _help("shards and verifiers (default outputs/reproduce[-v2][-quick])", default=None)
    studies: list[str] | None = field(
        default=None,
        metadata={
            "help": "studies to run (default: all; main always runs, unless --continue-report)",
            "choices": list(STUDIES),
        },
    )
    continue_report: bool = _help(
        "continue the report already in --output-dir (e.g. the committed docs/results/testbed-v2.json): keep its "
        "main study and finished studies, run only the studies it lacks, and make only the collections and main "
        "fits those need, in a work directory that may be new (e.g. on another machine); the report gains a part; "
        "the settings must be the report's",
        default=False,
    )
    training_seeds: int | None = _help("override the number of training seeds", default=None)
    reuse_shards: str = field(
        default="matching",
        metadata={
            "help": "shards of an earlier run in the work directory: reuse only those collected with the same "
            "settings "
            "and collection code (matching; others are collected again), or reuse them whatever their key "
            "(keep: re-evaluate old collections with new training / evaluation code; the report says so)",
            "choices": ["matching", "keep"],
        },
    )
    reuse_verifiers: str = field(
        default="matching",
        metadata={
            "help": "finished verifier fits in the work directory: reuse only those trained with the same settings, "
            "data and training code (matching), or also those whose training code differs while settings and "
            "data match (keep: after a code change shown not to change training; the report lists each; a fit "
            "interrupted under other code is resumed from its saved state)",
            "choices": ["matching", "keep"],
        },
    )
    threads: int | None = _help("torch threads", default=None)
    train_workers: int = _help(
        "verifiers trained at once, each in its own process with threads / train_workers "
        "torch threads (2 on 2 CPU cores: ~1.4x faster training than 1)",
        default=1,
    )
    device: str | None = _help("where the LM samples (default: the GPU when there is one)", default=None)
    problems_per_batch: int | None = _help(
        "problems sampled together (default 1, right for 2 CPU cores; 32 suits a GPU)", default=None
    )
    progress: bool = _help("log each stage as it starts and ends (--no-progress: quiet)", default=True)
    shipped_verifier: bool = _help(
        "only (re)build hf_msv/testbed/verifier from the train/validation shards", default=False
    )

    def reproduce_config(self) -> ReproduceConfig:
        """The run's `ReproduceConfig`: the paper's sizes (or the quick ones) with the overrides given; with
        `model`, a run on that LM (`own_lm_settings`).

        Raises:
            UserError: `model` with `task`, or an own LM's option without `model` (`own_lm_settings`).
        """
        overrides = self.own_lm_settings()
        for name, value in (
            ("training_seeds", self.training_seeds),
            ("problems_per_batch", self.problems_per_batch),
            ("num_samples", self.num_samples),
            ("num_sequences", tuple(self.num_sequences or ())),
            ("max_new_tokens", self.max_new_tokens),
            ("reference_checker", self.checker),
        ):
            if value:
                overrides[name] = value
        task = OWN_LM_TASK if self.model else self.task or DEFAULT_TASK
        # built at once, not replaced into: a model's defaults (name, budget) are resolved when it is built
        return (
            ReproduceConfig.quick_config(task=task, **overrides)
            if self.quick
            else ReproduceConfig(task=task, **overrides)
        )

    def own_lm_settings(self) -> dict[str, Any]:
        """The `ReproduceConfig` fields of a run on your own LM (`model`): its model, name, problem specs with their
        problem counts (every problem of each spec, read and checked here, before any work), prompt template and
        delimiters; {} without `model`.

        Raises:
            UserError: `model` with `task`, `--shipped-verifier` or `--continue-report`; a missing problem spec or one
                with no problems; an own LM's option without `model`.
        """
        own = {
            "name": self.name,
            "prompt_template": self.prompt_template,
            "delimiters": None if self.delimiters is None else tuple(self.delimiters),
        }
        specs = (self.train_problems, self.val_problems, self.eval_problems)
        if self.model is None:
            given = [k for k, v in own.items() if v is not None] + [
                k for k, v in zip(("train_problems", "val_problems", "eval_problems"), specs) if v is not None
            ]
            if given:
                raise UserError(f"--{given[0].replace('_', '-')} is an option of a run on your own LM: give --model")
            return {}
        for flag, clash in (("--task", self.task), ("--shipped-verifier", self.shipped_verifier)):
            if clash:
                raise UserError(f"--model runs the main study on your own LM; {flag} is for a testbed task")
        if self.continue_report:
            raise UserError("--continue-report adds testbed studies to a report; on your own LM rerun to resume")
        given_specs = [spec for spec in specs if spec is not None]
        if len(given_specs) < len(specs):
            raise UserError("--model needs --train-problems, --val-problems and --eval-problems (problem specs)")
        counts = [len(load_spec(spec)) for spec in given_specs]
        sizes = dict(zip(("train_problems", "val_problems", "eval_problems"), counts))
        return {"model": self.model, "problem_specs": specs, **sizes} | {k: v for k, v in own.items() if v is not None}


def training_config(kind: str, n: int, mode: str, quick: bool = False, **overrides):
    """The `MSVTrainingConfig` of a Probe or an MSV_n in the reproduction: the library defaults (``recipe="auto"``,
    what ``hf-msv train`` uses), so users and the reproduction train the same way. `quick` caps the step budget for
    the smoke run; `overrides` are the studies' deliberate changes (the checker; masks or no logit averaging as
    ``architecture={...}``, ...)."""
    from ..training import MSVTrainingConfig

    cfg: dict[str, Any] = dict(kind=kind, num_sequences=1 if kind == "probe" else n, mode=mode, progress=False)
    if quick:
        cfg |= dict(max_steps=40, eval_steps=10)
    return MSVTrainingConfig(**(cfg | overrides))
