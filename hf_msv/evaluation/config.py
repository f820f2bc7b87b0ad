"""`EvaluateConfig`: the settings of ``hf-msv evaluate``, one field per command-line flag (with its help)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from ..baselines import WV_THRESHOLD
from ..errors import UserError
from ..lambda_rule import DELTA, EPSILON, TARGET_FRACTION

__all__ = ["EvaluateConfig", "MethodConfig"]


@dataclass(frozen=True)
class MethodConfig:
    """How the compared methods score answers (`hf_msv.evaluation.methods`): R of streaming weighted voting, and the
    DeepConf group window (tokens) and statistic of the chain-of-thought prefix. `EvaluateConfig.method_config`
    gathers them from the flags of the same names."""

    wv_threshold: int = WV_THRESHOLD
    deepconf_window: int = 2048
    deepconf_stat: Literal["lowest_group", "tail", "mean"] = "lowest_group"


@dataclass
class EvaluateConfig:
    """Settings of `hf_msv.evaluation.evaluate_study` as ``hf-msv evaluate`` takes them
    (`transformers.HfArgumentParser` builds the flags: ``--eval-dir``, ``--verifier NAME=PATH`` (repeatable),
    ``--no-figures``, ...).

    In Python the config is passed whole, with the verifiers (checkpoints or models) beside it::

        evaluate_study(EvaluateConfig(eval_dir="data/eval", output_dir="reports/eval", num_sequences=16), verifiers)

    ``verifier``, ``decode_step_s`` / ``elicit_s`` and ``problems`` / ``difficulty_field`` name, as the command line
    does, what `evaluate_study` otherwise takes as arguments; each input is given one way or the other.
    """

    eval_dir: str = field(metadata={"help": "evaluation shards (a directory of shard-*.safetensors)"})
    output_dir: str = field(metadata={"help": "where the report (.md, .json) and figures (.png) go"})
    val_dir: str | None = field(
        default=None,
        metadata={
            "help": "validation shards (DeepConf calibration, λ rules, each budget's λ; without them no budgeted "
            "accuracy is reported)"
        },
    )
    verifier: list[str] = field(
        default_factory=list,
        metadata={
            "help": "a trained verifier as NAME=PATH; repeat NAME for its terminal and streaming checkpoints, and "
            "again "
            "for each further training seed (mean ± std over training seeds)",
            "action": "extend",
            "metavar": "NAME=PATH",
        },
    )
    num_sequences: list[int] | None = field(
        default=None,
        metadata={
            "help": "N values (groups: a fixed partition of each problem's sequences into groups of N); default: 1, "
            "4, "
            "16, 64 up to the sequences collected per problem (and that count itself)"
        },
    )
    bootstrap: int = field(
        default=1000,
        metadata={
            "help": "resamples of the paired bootstrap 95 %% intervals over problems (MSV − each baseline); 0: none"
        },
    )
    checker: str | None = field(
        default=None,
        metadata={"help": "re-derive equivalence classes with this checker (labels stay the collected ones)"},
    )
    checker_kwargs: str | None = field(
        default=None, metadata={"help": "keyword arguments of the checker, a JSON object"}
    )
    decode_step_s: float | None = field(
        default=None,
        metadata={"help": "LM cost of one decode step (seconds); default: the shards' recorded latency, else 0"},
    )
    elicit_s: float | None = field(default=None, metadata={"help": "LM cost of eliciting one answer (seconds)"})
    wv_threshold: int = field(default=MethodConfig.wv_threshold, metadata={"help": "R of streaming weighted voting"})
    deepconf_window: int = field(
        default=MethodConfig.deepconf_window, metadata={"help": "DeepConf group window (tokens)"}
    )
    deepconf_stat: Literal["lowest_group", "tail", "mean"] = field(
        default=MethodConfig.deepconf_stat, metadata={"help": "DeepConf statistic of the chain-of-thought prefix"}
    )
    target_accuracy: float | None = field(
        default=None,
        metadata={
            "help": "the target λ rule's accuracy (default: target_fraction × the method's own full-decoding "
            "validation accuracy)"
        },
    )
    target_fraction: float = field(default=TARGET_FRACTION, metadata={"help": "see target_accuracy"})
    ltt_epsilon: float = field(
        default=EPSILON,
        metadata={
            "help": "tolerance ε of the guaranteed λ rule: lose at most ε of full-decoding accuracy with probability "
            ">= 1 - δ (Learn-then-Test over validation problems)"
        },
    )
    ltt_delta: float = field(default=DELTA, metadata={"help": "risk level δ of the guaranteed λ rule"})
    prm: str | None = field(
        default=None,
        metadata={
            "help": "PRM baseline: a Qwen2.5-Math-PRM-style process reward model (path or Hub id) scoring every "
            "answer "
            "from the question and its chain-of-thought prefix (one forward per answer; needs shards with CoT "
            "token ids)",
            "metavar": "MODEL",
        },
    )
    prm_trust_remote_code: bool = field(
        default=False,
        metadata={"help": "run the PRM's own modelling code (Qwen2.5-Math-PRM needs it); off unless given"},
    )
    prm_batch_size: int = field(default=4, metadata={"help": "PRM inputs per forward pass"})
    prm_aggregate: Literal["last", "min", "prod"] = field(
        default="last",
        metadata={"help": "PRM answer score: the answer step's probability (last), or min / product over the steps"},
    )
    prm_dtype: str = field(default="auto", metadata={"help": "PRM weights dtype (auto, bfloat16, float32, ...)"})
    lm_tokenizer: str | None = field(
        default=None,
        metadata={
            "help": "tokenizer decoding the chains of thought for the PRM (default: the LM named in the shards)"
        },
    )
    problems: str | None = field(
        default=None,
        metadata={
            "help": "the evaluation problems with their metadata, as hf-msv collect takes them "
            "(testbed:<split>:<n>[:<seed>], a benchmark name, or a .jsonl file): for --difficulty-field"
        },
    )
    difficulty_field: str | None = field(
        default=None,
        metadata={
            "help": "break metrics down by this problem metadata field (e.g. ops: the testbed's reasoning steps; a "
            "list "
            "counts as its length); needs --problems"
        },
    )
    figures: bool = field(default=True, metadata={"help": "write PNG figures (--no-figures: none)"})
    title: str = field(default="MSV evaluation", metadata={"help": "report heading"})
    report_name: str = field(default="report", metadata={"help": "file stem of the report and figures"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar (--no-progress: none)"})

    def __post_init__(self):
        if isinstance(self.num_sequences, int):  # one N, as Python callers naturally write it
            self.num_sequences = [self.num_sequences]
        if isinstance(self.checker_kwargs, str):
            json.loads(self.checker_kwargs)  # fail at parse time, not after the verifiers are loaded
        if (self.problems is None) != (self.difficulty_field is None):
            raise UserError("--difficulty-field and --problems go together")
        if self.bootstrap < 0:
            raise UserError(f"bootstrap must be ≥ 0, got {self.bootstrap}")
        if self.prm_batch_size < 1:
            raise UserError(f"prm_batch_size must be positive, got {self.prm_batch_size}")

    @property
    def method_config(self) -> MethodConfig:
        """How the compared methods score answers: the ``--wv-threshold`` and ``--deepconf-*`` flags."""
        return MethodConfig(self.wv_threshold, self.deepconf_window, self.deepconf_stat)

    @property
    def lambda_rules(self) -> dict[str, dict[str, float | None]]:
        """The λ rules chosen on validation, by report name, as `hf_msv.lambda_rule.choose_lambda` keyword arguments:
        the target rule (``"validation"``) and the Learn-then-Test guarantee (``"ltt"``)."""
        return {
            "validation": {"target_fraction": self.target_fraction, "target_accuracy": self.target_accuracy},
            "ltt": {"epsilon": self.ltt_epsilon, "delta": self.ltt_delta},
        }

    @property
    def prm_kwargs(self) -> dict[str, Any]:
        """`PRMScorer.from_pretrained` keyword arguments of the ``--prm-*`` flags."""
        return {
            "trust_remote_code": self.prm_trust_remote_code,
            "batch_size": self.prm_batch_size,
            "aggregate": self.prm_aggregate,
            "dtype": self.prm_dtype,
        }

    @property
    def checker_kwargs_dict(self) -> dict[str, Any] | None:
        """`checker_kwargs` parsed (a dict given in Python passes through)."""
        if isinstance(self.checker_kwargs, str):
            return json.loads(self.checker_kwargs)
        return self.checker_kwargs
