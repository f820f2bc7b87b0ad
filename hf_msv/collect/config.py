"""`CollectConfig`: every option of ``hf-msv collect``, declared once with its help text (flags built from it)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Literal

from ..answers import ELICITATION_PROMPT, MAX_ANSWER_TOKENS

# Options that choose the LM and the problems (the rest are `collect` keyword arguments of the same name).
_LOADING_FIELDS = ("model", "problems", "output_dir", "model_dtype", "progress")
# Options of re-encoding a trace file only (`collect_from_traces` keyword arguments of the same name).
_TRACE_FIELDS = ("traces", "skip_bad_lines", "chat_template", "keep_delimiter", "confidence", "max_batch_tokens",
                 "chunk_tokens")
# `collect` options that a trace file fixes (it was sampled already).
_SAMPLING_FIELDS = ("num_samples", "max_new_tokens", "temperature", "top_p", "top_k", "seed")


@dataclass
class CollectConfig:
    """One collection run: which LM on which problems, and every `hf_msv.collect.collect` keyword argument.

    ``hf-msv collect`` builds its flags from these fields (`transformers.HfArgumentParser`: ``--num-samples`` and
    ``--num_samples`` alike); the defaults are `collect`'s. See `collect` for what each setting does.
    """

    model: str = field(metadata={"help": 'LM path or Hub id; "testbed" for the shipped testbed LM (v2), '
                                         '"testbed-v1" for the first testbed\'s.'})
    output_dir: str = field(metadata={"help": "Where shards go; rerunning with the same settings resumes."})
    problems: str | None = field(
        default=None, metadata={"help": "testbed[-v1]:<split>:<n>[:<seed>] | <benchmark>[:<n>] | problems.jsonl "
                                        "(sample them; or give --traces)"})
    traces: str | None = field(
        default=None, metadata={"help": "Re-encode this trace file (JSON lines, hf_msv.collect.traces) instead of "
                                        "sampling: same shards, no sampling flags."})
    num_samples: int = field(default=16, metadata={"help": "N sequences sampled per problem (the paper: 64)."})
    max_new_tokens: int | None = field(default=None, metadata={
        "help": "Chain-of-thought tokens per sequence at most (default: 4096; --model testbed: its task's length "
                "cap, 272, which its LM was trained to be cut at)."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (the paper: 1)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling (1: off, as in the paper)."})
    top_k: int = field(default=0, metadata={"help": "Top-k sampling (0: off, as in the paper)."})
    mode: Literal["streaming", "terminal"] = field(
        default="streaming",
        metadata={"help": "streaming: answers at every delimiter and at the end (terminal ones flagged); "
                          "terminal: only at the end."})
    delimiters: list[str] | None = field(
        default=None,
        metadata={"help": 'Where streaming answers are elicited (default: "Wait"; the flag alone: none).'})
    every_k_tokens: int | None = field(
        default=None, metadata={"help": "Also elicit an answer every k chain-of-thought tokens."})
    elicitation_prompt: str = field(default=ELICITATION_PROMPT,
                                    metadata={"help": "Appended to a sequence to elicit its current answer."})
    max_answer_tokens: int = field(default=MAX_ANSWER_TOKENS,
                                   metadata={"help": "An answer whose box is still open after this many tokens is "
                                                     "no answer."})
    checker: str = field(default="symbolic", metadata={"help": "Equivalence checker for classes and labels: "
                                                               "symbolic | exact | jaccard | embedding | random"})
    checker_kwargs: dict | str | None = field(
        default=None, metadata={"help": 'JSON dict for get_checker, e.g. \'{"timeout": 5}\'.'})
    prompt_template: str = field(default="auto", metadata={"help": 'auto | chat | plain | testbed | a string '
                                                                   'containing "{question}" (auto with --model '
                                                                   'testbed or testbed-v1: testbed).'})
    problems_per_shard: int = field(default=16, metadata={"help": "Problems per shard file."})
    problems_per_batch: int = field(
        default=1, metadata={"help": "Prompts per generate call (batch rows = this x N); the unit of resumption."})
    seed: int = field(default=0, metadata={"help": "Base seed; each batch is seeded from it and its problem ids."})
    dtype: Literal["bfloat16", "float16"] = field(default="bfloat16",
                                                  metadata={"help": "Storage dtype of hidden states."})
    model_dtype: str = field(default="auto", metadata={"help": "dtype to load the LM in (auto, bfloat16, float32)."})
    confidence_top_k: int = field(default=20, metadata={"help": "k of DeepConf's token confidence."})
    skip_bad_lines: bool = field(default=False, metadata={"help": "--traces: skip bad lines (counted in the shard "
                                                                  "info) instead of stopping at the first."})
    chat_template: str | None = field(default=None, metadata={"help": "--traces: the chat template used at sampling "
                                                                      "time (default: the tokenizer's)."})
    keep_delimiter: bool = field(default=False, metadata={"help": "--traces: keep the delimiter in the branch "
                                                                  "context (live collection drops it)."})
    confidence: Literal["model", "trace", "none"] = field(
        default="model", metadata={"help": "--traces: DeepConf confidences recomputed by the LM, read from the "
                                           "trace's logprobs, or none (marked missing)."})
    max_batch_tokens: int = field(default=32768, metadata={"help": "--traces: KV-cache budget (tokens) of a prefill "
                                                                   "group and of an elicitation batch."})
    chunk_tokens: int = field(default=2048, metadata={"help": "--traces: positions per prefill forward."})
    progress: bool = field(default=True, metadata={"help": "Show a progress bar (--no-progress: none)."})
    overwrite: bool = field(default=False, metadata={"help": "Delete an existing collection in output_dir first."})

    def __post_init__(self):
        if (self.problems is None) == (self.traces is None):
            raise ValueError("give exactly one of --problems (sample) and --traces (re-encode a trace file)")
        if self.traces is not None:
            changed = [f.name for f in fields(self)
                       if f.name in _SAMPLING_FIELDS and getattr(self, f.name) != f.default]
            if changed:
                raise ValueError(f"--traces re-encodes what was sampled already: {changed} do not apply")
        if isinstance(self.checker_kwargs, str):  # from the command line
            self.checker_kwargs = json.loads(self.checker_kwargs)
        if not isinstance(self.checker_kwargs, (dict, type(None))):
            raise ValueError(f"checker_kwargs must be a JSON object, got {self.checker_kwargs!r}")

    def collect_kwargs(self) -> dict:
        """The keyword arguments of `collect` (everything but the LM, the problems and where they go)."""
        from ..testbed.tasks import TESTBED_LM_NAMES

        kwargs = {f.name: getattr(self, f.name) for f in fields(self)
                  if f.name not in _LOADING_FIELDS + _TRACE_FIELDS}
        if kwargs["prompt_template"] == "auto" and self.model in TESTBED_LM_NAMES:
            kwargs["prompt_template"] = "testbed"  # the testbed LM has no chat template and its own prompt format
        if kwargs["max_new_tokens"] is None:
            kwargs["max_new_tokens"] = self.default_max_new_tokens()
        return dict(kwargs, progress=self.progress)

    def default_max_new_tokens(self) -> int:
        """4096, or the length cap of a testbed task whose LM is `model` (v2's LM is trained on traces cut there and
        has no positions far beyond it)."""
        from ..testbed.tasks import TESTBED_LM_NAMES, get_task

        cap = get_task(self.model).sampling_cap() if self.model in TESTBED_LM_NAMES else None
        return cap or 4096

    def traces_kwargs(self) -> dict:
        """The keyword arguments of `collect_from_traces` (the trace file and the LM apart)."""
        kwargs = {k: v for k, v in self.collect_kwargs().items() if k not in _SAMPLING_FIELDS}
        kwargs.update({name: getattr(self, name) for name in _TRACE_FIELDS if name != "traces"})
        return kwargs


def build_parser():
    """The ``hf-msv collect`` parser: one flag per `CollectConfig` field."""
    from transformers import HfArgumentParser

    parser = HfArgumentParser(CollectConfig, prog="hf-msv collect", description=CollectConfig.__doc__.splitlines()[0])
    # HfArgumentParser gives list fields nargs="+"; "--delimiters" alone (no delimiter: answers only every k tokens
    # and at the end) has always been accepted, so it stays "*".
    for action in parser._actions:
        if action.dest == "delimiters":
            action.nargs = "*"
    return parser


__all__ = ["CollectConfig", "build_parser"]
