"""`CollectConfig`: every option of ``hf-msv collect``, declared once with its help text (flags built from it).

`collect` and `collect_from_traces` take it whole (``config=``) or its fields as keywords. See
``docs/collection.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Literal, cast

from ..elicitation import ElicitationSettings
from ..errors import UserError
from .model_arguments import (
    DEFAULT_MAX_NEW_TOKENS,
    DTYPE_ALIASES,
    ModelArguments,
    default_max_new_tokens,
    dtype_name,
    resolve_prompt_template,
)

if TYPE_CHECKING:
    from ..data.problems import ProblemColumns

_ELICIT = ElicitationSettings()  # the defaults, declared in hf_msv.elicitation
# Flat flags of `ElicitationSettings` fields (flag name -> field name).
ELICITATION_FLAGS = {
    "mode": "mode",
    "delimiters": "delimiters",
    "every_k_tokens": "every_k_tokens",
    "elicitation_prompt": "prompt",
    "max_answer_tokens": "max_answer_tokens",
    "keep_delimiter": "keep_delimiter",
    "min_gap_tokens": "min_gap_tokens",
}
# Options that choose the LM and how it loads (`ModelArguments`; the LM's identity is recorded by `lm_info`), the
# problems or the trace file, and where shards go (not collection settings: resuming does not compare them).
PROBLEM_FIELDS = ("question_column", "gold_column", "id_column", "gold_format", "problems_split", "problems_subset")
SOURCE_FIELDS = (*(f.name for f in fields(ModelArguments)), "problems", *PROBLEM_FIELDS, "traces", "output_dir")
# Options of sampling, which a trace file has fixed already.
SAMPLING_FIELDS = ("num_samples", "max_new_tokens", "temperature", "top_p", "top_k", "seed")
# Options of re-encoding a trace file only.
TRACE_FIELDS = ("skip_bad_lines", "chat_template", "confidence", "max_batch_tokens", "chunk_tokens")
CONFIDENCE_SOURCES = ("model", "trace", "none")


@dataclass
class CollectConfig(ModelArguments):
    """One collection: which LM on which problems (or trace file), and every setting of `collect` and
    `collect_from_traces`.

    ``hf-msv collect`` builds its flags from these fields (`transformers.HfArgumentParser`: ``--num-samples`` and
    ``--num_samples`` alike); from Python, pass it as ``config=`` or give its fields as keywords. The elicitation
    fields are flat flags of one `ElicitationSettings` (`elicitation`).

    Args:
        model: LM directory, Hub id or a named LM (hf_msv.registry, e.g. testbed). Required on the command line.
        output_dir: Where shards go; rerunning with the same settings resumes. Required on the command line.
        problems: a file (.jsonl/.json/.parquet/.csv/.arrow) or dataset directory [:<split>][:<n>] |
            hub:<org>/<dataset>[:<split>][:<n>] | <benchmark>[:<n>] (files in $HF_MSV_DATA_DIR) |
            <named LM>:<split>:<n>[:<seed>] (sample them; or give --traces). docs/datasets.md
        question_column / gold_column / id_column / gold_format / problems_split / problems_subset: how
            --problems' table is read (`hf_msv.data.ProblemColumns`).
        traces: Re-encode this trace file (JSON lines, docs/collection.md) instead of sampling: same shards, no
            sampling flags.
        engine: Sample with transformers, or with a vLLM engine (hf_msv.vllm, docs/vllm.md; engine options as
            --vllm-arg KEY=VALUE, repeatable).
        num_samples: N sequences sampled per problem (the paper: 64).
        max_new_tokens: Chain-of-thought tokens per sequence at most (default: a named LM's budget, else 4096; never
            more than the LM's context leaves room for).
        temperature: Sampling temperature (the paper: 1).
        top_p: Nucleus sampling (1: off, as in the paper).
        top_k: Top-k sampling (0: off, as in the paper).
        mode: streaming: answers at every delimiter and at the end (terminal ones flagged); terminal: only at the end.
        delimiters: Where streaming answers are elicited (default: Wait; the flag alone: none).
        every_k_tokens: Also elicit an answer every k chain-of-thought tokens.
        elicitation_prompt: Appended to a sequence to elicit its current answer.
        max_answer_tokens: An answer whose box is still open after this many tokens is no answer.
        keep_delimiter: Keep the delimiter in the branch context (default: branch just before it).
        min_gap_tokens: Space a chain's answers: a delimiter or every-k step elicits only this many chain tokens
            after the chain's previous answer (EOS and the budget end always do). Default: no spacing.
        checker: Equivalence checker for classes and labels: symbolic | exact | jaccard | embedding | random
        checker_kwargs: JSON dict for get_checker, e.g. '{"timeout": 5}'.
        prompt_template: auto | chat | plain | a named LM's prompt format (e.g. testbed) | a string containing
            "{question}" (auto with a named LM: its prompt format).
        problems_per_shard: Problems per shard file.
        problems_per_batch: Prompts per generate call (batch rows = this x N); the unit of resumption.
        seed: Base seed; each batch is seeded from it and its problem ids.
        dtype: Storage dtype of the hidden states in shards: bfloat16 (bf16) or float16 (fp16); the LM's dtype is
            ``model_dtype`` (TRL's ``--dtype``).
        confidence_top_k: k of DeepConf's token confidence.
        skip_bad_lines: --traces: skip bad lines (counted in the summary and the shard info, with a warning) instead of
            stopping at the first.
        traces_format: --traces: the trace file's format (auto: detected from its content; lm_eval: an
            lm-evaluation-harness --log_samples file; lighteval: a details parquet; docs/harnesses.md).
        chat_template: --traces: the chat template used at sampling time (default: the tokenizer's).
        confidence: --traces: DeepConf confidences recomputed by the LM, read from the trace's logprobs, or none
            (marked missing).
        max_batch_tokens: --traces: KV-cache budget (tokens) of a prefill group and of an elicitation batch.
        chunk_tokens: --traces: positions per prefill forward.
        progress: Show a progress bar (--no-progress: none).
        overwrite: Delete an existing collection in output_dir first.

    Raises:
        UserError: ``checker_kwargs`` that is not a JSON object, a count or budget below 1, an unknown
            ``confidence`` source, invalid elicitation settings, or what `ModelArguments` refuses.
    """

    output_dir: str | None = field(
        default=None,
        metadata={"help": "Where shards go; rerunning with the same settings resumes. Required on the command line."},
    )
    problems: str | None = field(
        default=None,
        metadata={
            "help": "a file (.jsonl/.json/.parquet/.csv/.arrow) or dataset directory [:<split>][:<n>] | "
            "hub:<org>/<dataset>[:<split>][:<n>] | <benchmark>[:<n>] (files in $HF_MSV_DATA_DIR) | "
            "<named LM>:<split>:<n>[:<seed>] (sample them; or give --traces). docs/datasets.md"
        },
    )
    question_column: str = field(default="question", metadata={"help": "--problems: the column of the question."})
    gold_column: str = field(default="gold", metadata={"help": "--problems: the column of the gold answer."})
    id_column: str | None = field(
        default=None,
        metadata={"help": "--problems: the column of problem ids (default: id if present, else the row)."},
    )
    gold_format: Literal["text", "integer", "latex", "gsm8k", "integers", "latex_list"] = field(
        default="text",
        metadata={"help": "--problems: how the gold column is read (gsm8k: the number after ####; docs/datasets.md)."},
    )
    problems_split: str | None = field(
        default=None, metadata={"help": "--problems: the dataset split (default: test if present, else the only one)."}
    )
    problems_subset: str | None = field(
        default=None, metadata={"help": "--problems: the configuration of a Hub dataset (load_dataset's name)."}
    )
    traces: str | None = field(
        default=None,
        metadata={
            "help": "Re-encode this trace file (JSON lines, docs/collection.md) instead of sampling: same shards, no "
            "sampling flags."
        },
    )
    engine: Literal["transformers", "vllm"] = field(
        default="transformers",
        metadata={
            "help": "Sample with transformers, or with a vLLM engine (hf_msv.vllm, docs/vllm.md; engine options as "
            "--vllm-arg KEY=VALUE, repeatable)."
        },
    )
    num_samples: int = field(default=16, metadata={"help": "N sequences sampled per problem (the paper: 64)."})
    max_new_tokens: int | None = field(
        default=None,
        metadata={
            "help": f"Chain-of-thought tokens per sequence at most (default: a named LM's budget, else "
            f"{DEFAULT_MAX_NEW_TOKENS}; never more than the LM's context leaves room for)."
        },
    )
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (the paper: 1)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling (1: off, as in the paper)."})
    top_k: int = field(default=0, metadata={"help": "Top-k sampling (0: off, as in the paper)."})
    mode: Literal["streaming", "terminal"] = field(
        default=cast(Literal["streaming", "terminal"], _ELICIT.mode),  # ElicitationSettings checks it at run time
        metadata={
            "help": "streaming: answers at every delimiter and at the end (terminal ones flagged); terminal: only at "
            "the end."
        },
    )
    delimiters: list[str] | None = field(
        default=None,
        metadata={
            "help": f"Where streaming answers are elicited (default: {' '.join(_ELICIT.delimiters)}; the flag alone: "
            "none)."
        },
    )
    every_k_tokens: int | None = field(
        default=_ELICIT.every_k_tokens, metadata={"help": "Also elicit an answer every k chain-of-thought tokens."}
    )
    elicitation_prompt: str = field(
        default=_ELICIT.prompt, metadata={"help": "Appended to a sequence to elicit its current answer."}
    )
    max_answer_tokens: int = field(
        default=_ELICIT.max_answer_tokens,
        metadata={"help": "An answer whose box is still open after this many tokens is no answer."},
    )
    keep_delimiter: bool = field(
        default=_ELICIT.keep_delimiter,
        metadata={"help": "Keep the delimiter in the branch context (default: branch just before it)."},
    )
    min_gap_tokens: int | None = field(
        default=_ELICIT.min_gap_tokens,
        metadata={
            "help": "Space a chain's answers: a delimiter or every-k step elicits only this many chain tokens after "
            "the chain's previous answer (EOS and the budget end always do). Default: no spacing."
        },
    )
    checker: str = field(
        default="symbolic",
        metadata={
            "help": "Equivalence checker for classes and labels: symbolic | exact | jaccard | embedding | random"
        },
    )
    checker_kwargs: dict | str | None = field(
        default=None, metadata={"help": "JSON dict for get_checker, e.g. '{\"timeout\": 5}'."}
    )
    prompt_template: str = field(
        default="auto",
        metadata={
            "help": "auto | chat | plain | a named LM's prompt format (e.g. testbed) | a string containing "
            '"{question}" '
            "(auto with a named LM: its prompt format)."
        },
    )
    problems_per_shard: int = field(default=16, metadata={"help": "Problems per shard file."})
    problems_per_batch: int = field(
        default=1, metadata={"help": "Prompts per generate call (batch rows = this x N); the unit of resumption."}
    )
    seed: int = field(default=0, metadata={"help": "Base seed; each batch is seeded from it and its problem ids."})
    dtype: Literal["bfloat16", "float16"] = field(
        default="bfloat16",
        metadata={
            "help": "Storage dtype of the hidden states in shards: bfloat16 (bf16) or float16 (fp16); the LM's dtype "
            "is --model-dtype."
        },
    )
    confidence_top_k: int = field(default=20, metadata={"help": "k of DeepConf's token confidence."})
    skip_bad_lines: bool = field(
        default=False,
        metadata={
            "help": "--traces: skip bad lines (counted in the summary and the shard info, with a warning) instead of "
            "stopping at the first."
        },
    )
    traces_format: Literal["auto", "hf_msv", "lm_eval", "lighteval"] = field(
        default="auto",
        metadata={
            "help": "--traces: the trace file's format (auto: detected from its content; lm_eval: an "
            "lm-evaluation-harness --log_samples file; lighteval: a details parquet; docs/harnesses.md)."
        },
    )
    chat_template: str | None = field(
        default=None,
        metadata={"help": "--traces: the chat template used at sampling time (default: the tokenizer's)."},
    )
    confidence: Literal["model", "trace", "none"] = field(
        default="model",
        metadata={
            "help": "--traces: DeepConf confidences recomputed by the LM, read from the trace's logprobs, or none "
            "(marked missing)."
        },
    )
    max_batch_tokens: int = field(
        default=32768,
        metadata={"help": "--traces: KV-cache budget (tokens) of a prefill group and of an elicitation batch."},
    )
    chunk_tokens: int = field(default=2048, metadata={"help": "--traces: positions per prefill forward."})
    progress: bool = field(default=True, metadata={"help": "Show a progress bar (--no-progress: none)."})
    overwrite: bool = field(default=False, metadata={"help": "Delete an existing collection in output_dir first."})

    def __post_init__(self):
        super().__post_init__()
        self.dtype = storage_dtype_name(self.dtype)  # pyright: ignore[reportAttributeAccessIssue]
        if isinstance(self.checker_kwargs, str):  # from the command line
            try:
                self.checker_kwargs = json.loads(self.checker_kwargs)
            except json.JSONDecodeError as e:
                raise UserError(f"--checker-kwargs must be a JSON object: {e}") from None
        if not isinstance(self.checker_kwargs, (dict, type(None))):
            raise UserError(f"checker_kwargs must be a JSON object, got {self.checker_kwargs!r}")
        positive = (
            "num_samples",
            "problems_per_shard",
            "problems_per_batch",
            "max_batch_tokens",
            "chunk_tokens",
            "confidence_top_k",
        )
        bad = [name for name in positive if getattr(self, name) < 1]
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            bad.append("max_new_tokens")
        if bad:
            given = ", ".join(f"--{name.replace('_', '-')} {getattr(self, name)}" for name in bad)
            raise UserError(f"{given}: must be positive")
        if self.confidence not in CONFIDENCE_SOURCES:
            raise UserError(f"confidence must be one of {list(CONFIDENCE_SOURCES)}, got {self.confidence!r}")
        try:
            _ = self.elicitation  # invalid elicitation settings fail here, before any work
        except ValueError as error:  # ElicitationSettings' checks (stdlib-only remote code: plain ValueError)
            if isinstance(error, UserError):
                raise
            raise UserError(str(error)) from error

    @property
    def token_budget(self) -> int:
        """``max_new_tokens`` of a `resolved` config (which always has one)."""
        assert self.max_new_tokens is not None, "call resolved() first"
        return self.max_new_tokens

    @property
    def checker_options(self) -> dict:
        """`checker_kwargs` as `__post_init__` left them: a dict (the command line's JSON object parsed)."""
        assert not isinstance(self.checker_kwargs, str)
        return dict(self.checker_kwargs or {})

    @property
    def problem_columns(self) -> ProblemColumns:
        """How `load_problems` reads ``--problems``' table: the column flags as one `ProblemColumns`."""
        from ..data.problems import ProblemColumns

        return ProblemColumns(
            question=self.question_column,
            gold=self.gold_column,
            id=self.id_column,
            gold_format=self.gold_format,
            split=self.problems_split,
            subset=self.problems_subset,
        )

    @property
    def model_arguments(self) -> ModelArguments:
        """How `load_lm` loads the LM: the `ModelArguments` fields of this config."""
        return ModelArguments.from_fields(self)

    @property
    def elicitation(self) -> ElicitationSettings:
        """The flat elicitation flags as one `ElicitationSettings` (``delimiters=None``: the default delimiters)."""
        values = {name: getattr(self, flag) for flag, name in ELICITATION_FLAGS.items()}
        if values["delimiters"] is None:
            values["delimiters"] = _ELICIT.delimiters
        return ElicitationSettings(**values)

    def replace(self, elicitation: ElicitationSettings | None = None, **changes) -> CollectConfig:
        """A copy with `changes` (field names) applied, then `elicitation`'s fields, if given, over the flat flags.

        Args:
            elicitation: settings whose fields replace the flat elicitation flags.
            **changes: field names and their new values.

        Returns:
            The new `CollectConfig` (validated again).

        Raises:
            TypeError: a name that is not a field.
        """
        unknown = sorted(set(changes) - {f.name for f in fields(self)})
        if unknown:
            raise TypeError(f"unknown collection setting(s) {unknown}; valid: {sorted(f.name for f in fields(self))}")
        if elicitation is not None:
            changes.update({flag: getattr(elicitation, name) for flag, name in ELICITATION_FLAGS.items()})
            changes["delimiters"] = list(elicitation.delimiters)
        return dataclasses.replace(self, **changes)

    def resolved(self) -> CollectConfig:
        """A copy with the `model`-dependent defaults filled in: ``max_new_tokens`` (a named LM's budget, else
        4096) and ``prompt_template="auto"`` of a named LM (its prompt format's name)."""
        return dataclasses.replace(
            self,
            prompt_template=resolve_prompt_template(self.prompt_template, self.model),
            max_new_tokens=self.max_new_tokens or default_max_new_tokens(self.model),
        )

    def check_command_line(self) -> None:
        """What the command line needs beyond the field types.

        Raises:
            ValueError: no ``--model`` or ``--output-dir``, not exactly one of ``--problems`` / ``--traces``, or
                sampling flags next to ``--traces``.
        """
        missing = [f"--{name.replace('_', '-')}" for name in ("model", "output_dir") if not getattr(self, name)]
        if missing:
            raise UserError(f"{' and '.join(missing)} required")
        if (self.problems is None) == (self.traces is None):
            raise UserError("give exactly one of --problems (sample) and --traces (re-encode a trace file)")
        if self.traces is not None and self.engine != "transformers":
            raise UserError("--traces re-encodes with transformers: --engine does not apply")
        if self.traces is not None:
            defaults = CollectConfig()
            changed = [name for name in SAMPLING_FIELDS if getattr(self, name) != getattr(defaults, name)]
            if changed:
                raise UserError(f"--traces re-encodes what was sampled already: {changed} do not apply")


def storage_dtype_name(value) -> str:
    """``--dtype``'s value as the storage dtype it names (``bf16`` -> ``bfloat16``).

    Raises:
        UserError: not a 16-bit dtype; a dtype the LM could load in (TRL's ``--dtype float32``) is named as
            ``--model-dtype``'s.
    """
    name = DTYPE_ALIASES.get(str(value).strip().lower().removeprefix("torch."))
    if name in ("float32", "float64", "auto"):
        raise UserError(
            f"--dtype {value}: --dtype is the dtype shards store hidden states in (bfloat16 or float16); to load "
            f"the LM in {name}, give --model-dtype {name}"
        )
    return dtype_name(value, "--dtype", ("bfloat16", "float16"))


def as_config(config: CollectConfig | None, elicitation: ElicitationSettings | None, overrides: dict) -> CollectConfig:
    """`config` (default: `CollectConfig()`) with keyword `overrides` (field names) and then `elicitation` applied:
    what `collect` and `collect_from_traces` run with."""
    if config is not None and not isinstance(config, CollectConfig):
        raise TypeError(f"config must be a CollectConfig, got {type(config).__name__}")
    return (config or CollectConfig()).replace(**overrides).replace(elicitation=elicitation)


def _flag_type(check):
    """An argparse ``type`` of `check` (a value -> its parsed form, raising `UserError`): argparse reports a refusal
    as it reports a malformed int."""

    def parse(value: str):
        try:
            return check(value)
        except UserError as refused:
            raise argparse.ArgumentTypeError(" ".join(str(refused).split())) from None

    return parse


def build_parser():
    """The ``hf-msv collect`` parser: one flag per `CollectConfig` field."""
    from ..arguments import CommandParser, doc_summary

    parser = CommandParser(CollectConfig, prog="hf-msv collect", description=doc_summary(CollectConfig))
    # HfArgumentParser gives list fields nargs="+"; "--delimiters" alone (no delimiter: answers only every k tokens
    # and at the end) has always been accepted, so it stays "*".
    # --dtype takes the usual spellings (bf16) and names --model-dtype for the LM's dtype: checked by
    # `storage_dtype_name`, not by argparse's choices, whose refusal would name neither.
    for action in parser._actions:
        if action.dest == "delimiters":
            action.nargs = "*"
        if action.dest == "dtype":
            action.choices, action.type, action.metavar = None, _flag_type(storage_dtype_name), "{bfloat16,float16}"
        if action.dest == "model_dtype":
            action.type = _flag_type(lambda value: dtype_name(value, "--model-dtype"))
    return parser


__all__ = ["CollectConfig", "as_config", "build_parser", "storage_dtype_name"]
