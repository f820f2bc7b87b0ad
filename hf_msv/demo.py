"""The main job: N parallel chains of thought per problem, scored by an MSV, stopped early and pruned.

On the embedded default (the testbed LM and the MSV trained on it, both shipped in the package) it runs offline on
a CPU in about a minute. Each problem is decoded twice with the same seed: once live with the verifier's certified
stop and pruning (`MSVEarlyStop.from_verifier`, what a user gets by default), and once to the end without either,
only to report what full decoding would have cost and what the first sample alone would have answered. A chain's
sampling does not depend on the other rows (the generation hook consumes no random numbers and a row that leaves
draws nothing), so the comparison is exact.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .arguments import parse_command_args
from .collect import load_lm
from .collect.lm import ModelArguments
from .data.problems import Problem
from .equivalence import get_checker
from .errors import MissingPathError, UserError, check_checkpoint_dir
from .generation import CERTIFIED, MSVEarlyStop, msv_generate
from .modeling_msv import MSVVerifier
from .testbed import TESTBED_VERIFIER_DIR, TESTBED_VERIFIER_TASK, format_prompt, get_task


@dataclass
class DemoConfig(ModelArguments):
    """The options of ``hf-msv demo`` (flags built from these fields by `transformers.HfArgumentParser`); the LM's
    are those of `ModelArguments` (``--model``, ``--revision``, ``--trust-remote-code``, ``--device-map``, ...)."""

    model: str | None = field(
        default=None, metadata={"help": "A local or Hub causal LM instead of the embedded testbed LM."}
    )
    problems: int = field(default=12, metadata={"help": "Testbed evaluation problems to run."})
    question: str | None = field(
        default=None, metadata={"help": "Your own question instead (no gold answer, so no grading)."}
    )
    num_sequences: int = field(default=16, metadata={"help": "N parallel samples per problem.", "aliases": ["-n"]})
    threshold: float | None = field(
        default=None,
        metadata={
            "help": "λ: stop once a class's statistic reaches it, without pruning (default: the λ and the pruning "
            "rule the verifier certified on held-out calibration problems)."
        },
    )
    prune: bool = field(
        default=True, metadata={"help": "prune chains as the verifier certified (--no-prune: the stop alone)."}
    )
    max_new_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Tokens per sample at most (default: 400, or the embedded testbed LM's length cap where its task "
            "has one: v2's LM was trained on traces cut at 272)."
        },
    )
    seed: int = field(default=0, metadata={"help": "Seed of the problems and of sampling."})
    verifier: str | None = field(default=None, metadata={"help": "A local or Hub MSV verifier trained for --model."})
    output_dir: str = field(
        default="outputs/demo",
        metadata={"help": 'Where the figure goes (drawn when matplotlib is installed: pip install "hf-msv[report]").'},
    )
    device: str = field(default="auto", metadata={"help": "auto (default): the GPU when there is one, else the CPU."})
    figure: bool = field(
        default=True, metadata={"help": "draw the tokens per problem into --output-dir (--no-figure: the table only)."}
    )

    @property
    def resolved_threshold(self) -> float | str:
        """``threshold=`` of the live run: `threshold`, else ``"certified"`` (the verifier's λ and pruning)."""
        return CERTIFIED if self.threshold is None else self.threshold


@dataclass
class DemoRow:
    problem: Problem
    chosen: str | None
    confidence: float | None
    correct: bool | None
    first_sample: str | None
    first_sample_correct: bool | None
    stop_step: int | None
    stopped_early: bool
    pruned: int
    tokens_used: int
    tokens_full: int
    seconds: float


def load_default(device: str | None = None, model_args: ModelArguments | None = None):
    """The embedded default: the shipped MSV, the testbed LM it was trained on (`TESTBED_VERIFIER_TASK`'s) and its
    tokenizer, on `device` (loaded as `model_args` say, its ``model`` replaced): ``(model, tokenizer, verifier)``."""
    if not (TESTBED_VERIFIER_DIR / "config.json").exists():
        raise MissingPathError(
            f"no shipped verifier at {TESTBED_VERIFIER_DIR}; train one with `scripts/train_shipped_verifier.sh`."
        )
    name = get_task(TESTBED_VERIFIER_TASK).lm_name
    model_args = ModelArguments(model=name) if model_args is None else dataclasses.replace(model_args, model=name)
    return load_custom(model_args, TESTBED_VERIFIER_DIR, device=device)


def load_custom(
    model_name: ModelArguments | str,
    verifier_name: str | Path,
    gguf_file: str | None = None,
    device: str | None = None,
):
    """Any local or Hub LM (``"testbed"``: the embedded one; a `ModelArguments` says how to load it, else
    `gguf_file` alone) + its verifier, on `device` (the verifier on the LM's; the Hub needs network; here only local
    directories work).

    Raises:
        FileNotFoundError, NotADirectoryError: a local verifier or LM path that is not a checkpoint directory (checked
            before anything loads).
    """
    check_checkpoint_dir(verifier_name, "verifier")
    if not isinstance(model_name, ModelArguments):
        model_name = ModelArguments(model=model_name, gguf_file=gguf_file)
    model, tokenizer = load_lm(model_name, device)
    return model, tokenizer, MSVVerifier.from_pretrained(verifier_name).to(model.device).eval()


def _first_sample_answer(result) -> str | None:
    terminal = [a for a in result.answers if a.sequence == 0 and a.terminal]
    return terminal[-1].text if terminal else None


def _prompt_format(tokenizer):
    """How a problem becomes a prompt for a user's LM: its chat template when it has one, else the bare question."""
    if getattr(tokenizer, "chat_template", None):
        return lambda problem: [{"role": "user", "content": problem.question}]
    return lambda problem: problem.question


def _load(config: DemoConfig) -> tuple:
    """``(model, tokenizer, verifier, to_prompt, max_new_tokens)`` of a demo run: the embedded default (the testbed
    prompt, and its LM's length cap where it has one), or the user's `model` + `verifier`."""
    if config.model or config.verifier:
        if not (config.model and config.verifier):
            raise UserError("--model and --verifier go together (the verifier must be trained for the LM)")
        model, tokenizer, verifier = load_custom(
            ModelArguments.from_fields(config), config.verifier, device=config.device
        )
        return model, tokenizer, verifier, _prompt_format(tokenizer), config.max_new_tokens or 400
    model, tokenizer, verifier = load_default(config.device, ModelArguments.from_fields(config))
    # a capped task's LM was trained on traces cut at the cap
    cap = get_task(TESTBED_VERIFIER_TASK).sampling_cap()
    return model, tokenizer, verifier, format_prompt, config.max_new_tokens or cap or 400


def _run_problem(problem: Problem, prompt, models: tuple, config: DemoConfig, max_new_tokens: int, grade) -> DemoRow:
    """Decode `problem` twice with the same seed, live with the MSV's stop and pruning and to the end, and grade both
    (`models`: ``(model, tokenizer, verifier)``)."""
    model, tokenizer, verifier = models
    runs = {}
    for name, lam in (("live", config.resolved_threshold), ("full", None)):
        torch.manual_seed(config.seed)
        start = time.perf_counter()
        runs[name] = msv_generate(
            model,
            tokenizer,
            [prompt],
            verifier=verifier,
            threshold=lam,
            prune=config.prune,
            num_sequences=config.num_sequences,
            max_new_tokens=max_new_tokens,
            generate_kwargs={"temperature": 1.0, "top_k": 0, "top_p": 1.0},
        )[0]
        runs[name + "_s"] = time.perf_counter() - start
    live, full = runs["live"], runs["full"]
    chosen = live.chosen.text if live.chosen is not None else None
    first = _first_sample_answer(full)
    known = bool(problem.gold)
    return DemoRow(
        problem=problem,
        chosen=chosen,
        confidence=live.confidence,
        correct=grade.is_correct(chosen, problem.gold) if known else None,
        first_sample=first,
        first_sample_correct=grade.is_correct(first, problem.gold) if known else None,
        stop_step=live.stop_step,
        stopped_early=live.stopped_early,
        pruned=len(live.pruned),
        tokens_used=live.tokens_decoded,
        tokens_full=full.tokens_decoded,
        seconds=runs["live_s"],
    )


def run_demo(config: DemoConfig | None = None) -> list[DemoRow]:
    """Run the demo and print a per-problem table and totals; with ``config.figure``, also draw the tokens per
    problem into ``config.output_dir`` (when matplotlib is installed, else one line says how to get it).

    Args:
        config: the run (`DemoConfig`; default: the embedded testbed LM and shipped MSV on 12 problems). Answers are
            graded with the ``symbolic`` checker.

    Returns:
        One `DemoRow` per problem.

    Raises:
        UserError: ``model`` without ``verifier`` or the reverse, or a local LM or verifier path that is not a
            checkpoint directory (checked before anything loads).
    """
    config = config or DemoConfig()
    model, tokenizer, verifier, to_prompt, max_new_tokens = _load(config)
    if config.question is not None:
        problems = [Problem(id="user/0", question=config.question, gold="", source="user")]
    else:
        problems = get_task(TESTBED_VERIFIER_TASK).generate_problems("evaluation", config.problems, seed=config.seed)
    grade = get_checker("symbolic")
    rows = [
        _run_problem(problem, to_prompt(problem), (model, tokenizer, verifier), config, max_new_tokens, grade)
        for problem in tqdm(problems, desc="problems", unit="problem")
    ]
    criterion = MSVEarlyStop.resolve(config.resolved_threshold, verifier, config.prune)
    rule = f"λ={criterion.threshold}, {criterion.prune.describe() if criterion.prune else 'no pruning'}"
    print_table(rows, config.num_sequences, rule)
    if criterion.choice is not None:  # what the verifier certified (with its pruning rule, when it has one)
        print(f"the verifier's certified rule: {criterion.choice.describe()}")
    if config.figure:
        # The figure is an extra: the table above is the demo's output, so a missing extra is a note, not an error.
        if importlib.util.find_spec("matplotlib") is None:
            from .evaluation.report import REPORT_EXTRA_HINT

            print(f"figure: not drawn, matplotlib is not installed ({REPORT_EXTRA_HINT})")
        else:
            print(f"figure: {save_figure(rows, Path(config.output_dir))}")
    return rows


def _mark(value: bool | None) -> str:
    return "?" if value is None else ("yes" if value else "no")


def print_table(rows: list[DemoRow], num_sequences: int, rule: str) -> None:
    print(f"\nMSV early stopping and pruning, N={num_sequences} parallel samples; {rule}")
    header = (
        f"{'problem':<30} {'gold':>8} {'chosen':>8} {'conf':>5} {'ok':>4} {'1st':>6} {'ok':>4} "
        f"{'stop':>4} {'pruned':>6} {'tokens':>13} {'saved':>6} {'time':>6}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        conf = f"{r.confidence:.2f}" if r.confidence is not None else "-"
        saved = 1 - r.tokens_used / max(r.tokens_full, 1)
        print(
            f"{r.problem.id:<30} {r.problem.gold or '?':>8} {r.chosen!s:>8} {conf:>5} {_mark(r.correct):>4} "
            f"{r.first_sample!s:>6} {_mark(r.first_sample_correct):>4} {_mark(r.stopped_early):>4} "
            f"{r.pruned:>6} {r.tokens_used:>6}/{r.tokens_full:<6} {saved:>6.0%} {r.seconds:>5.1f}s"
        )
    graded = [r for r in rows if r.correct is not None]
    used, full = sum(r.tokens_used for r in rows), sum(r.tokens_full for r in rows)
    print("-" * len(header))
    if graded:
        msv_acc = sum(bool(r.correct) for r in graded) / len(graded)
        first_acc = sum(bool(r.first_sample_correct) for r in graded) / len(graded)
        print(f"accuracy: MSV selection {msv_acc:.0%} vs first sample {first_acc:.0%} ({len(graded)} problems)")
    print(
        f"tokens decoded: {used} with stopping and pruning vs {full} without ({1 - used / max(full, 1):.0%} saved); "
        f"time {sum(r.seconds for r in rows):.1f}s"
    )
    unstopped = [r for r in rows if not r.stopped_early]
    print(
        f"early stops: {len(rows) - len(unstopped)} of {len(rows)} problems; chains pruned: "
        f"{sum(r.pruned for r in rows)}, {sum(r.pruned for r in unstopped)} of them in problems that never stopped"
    )


def save_figure(rows: list[DemoRow], output_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    output_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r.tokens_full for r in rows], width=0.4, label="full decoding", color="#bbb")
    ax.bar(
        [i + 0.2 for i in x],
        [r.tokens_used for r in rows],
        width=0.4,
        label="MSV early stop",
        color=["#2a7" if r.correct else "#c44" if r.correct is False else "#57a" for r in rows],
    )
    for i, r in enumerate(rows):
        if r.confidence is not None:
            ax.annotate(f"{r.confidence:.2f}", (i + 0.2, r.tokens_used), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), [r.problem.id.split("/")[-1] for r in rows])
    ax.set_ylabel("tokens decoded (all N)")
    ax.set_title("Tokens per problem; label = MSV confidence, green = correct")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = output_dir / "demo.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def build_parser():
    """The ``hf-msv demo`` parser: one flag per `DemoConfig` field."""
    from transformers import HfArgumentParser
    from transformers.hf_argparser import DataClassType

    return HfArgumentParser(DataClassType(DemoConfig), prog="hf-msv demo", description=(__doc__ or "").splitlines()[0])


def main(argv: Sequence[str] | None = None) -> list[DemoRow]:
    """``hf-msv demo``: run `run_demo` with the flags of `DemoConfig` (and ``--config FILE``, ``--log-level``)."""
    (config,) = parse_command_args(build_parser(), argv)
    return run_demo(config)


__all__ = ["DemoConfig", "DemoRow", "load_custom", "load_default", "main", "run_demo"]


if __name__ == "__main__":
    main()
