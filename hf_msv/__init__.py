"""hf_msv: Multi-Sequence Verifiers for Hugging Face transformers.

Public names are imported on first use, so ``import hf_msv`` is cheap and imports neither torch nor transformers
(``hf-msv --help`` stays instant). `register_auto_classes` registers the verifiers with the Auto classes, after which
`AutoModel.from_pretrained(dir)` loads saved verifiers without `trust_remote_code`; every ``hf-msv`` command calls it
before it runs.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> the module (relative to hf_msv) it lives in
_EXPORTS = {
    "ELICITATION_PROMPT": "elicitation",
    "MAX_ANSWER_TOKENS": "elicitation",
    "ElicitationSettings": "elicitation",
    "resolve_elicitation": "elicitation",
    "extract_boxed": "answers",
    "extract_last_boxed": "answers",
    "find_box_end": "answers",
    "MASK_NAMES": "configuration_msv",
    "MSVConfig": "configuration_msv",
    "MSVCache": "modeling_msv",
    "MSVOutput": "modeling_msv",
    "MSVVerifier": "modeling_msv",
    "average_logits": "modeling_msv",
    "build_masks": "modeling_msv",
    "check_compatible": "modeling_msv",
    "compute_gamma": "modeling_msv",
    "split_into_groups": "modeling_msv",
    "ProbeConfig": "modeling_probe",
    "ProbeVerifier": "modeling_probe",
    "NamedLM": "registry",
    "get_named_lm": "registry",
    "register_lm": "registry",
    "EquivalenceClasses": "equivalence",
    "Verdict": "equivalence",
    "assign_classes": "equivalence",
    "get_checker": "equivalence",
    "MSVAnswer": "generation",
    "MSVEarlyStop": "generation",
    "MSVResult": "generation",
    "MSVSession": "generation",
    "msv_generate": "generation",
    "prepare_generation": "generation",
    "AnswerScorer": "generation",
    "MSVScorer": "generation",
    "ProbeScorer": "generation",
    "WeightedVoteScorer": "generation",
    "StopRuleScorer": "generation",
    "StopHead": "stop_rules",
    "LambdaChoice": "lambda_rule",
    "choose_lambda": "lambda_rule",
    "Problem": "data.problems",
    "load_benchmark": "data.problems",
    "CollectedProblem": "data",
    "ShardDataset": "data",
    "collate_groups": "data",
    "read_shard": "data",
    "write_shard": "data",
    "ProblemColumns": "data",
    "load_problems": "data",
    "export_shards": "data",
    "shards_to_dataset": "data",
    "ModelArguments": "collect.lm",
    "load_lm": "collect.lm",
    "collect_from_traces": "collect",
    "MSVTrainingConfig": "training",
    "train_verifier": "training",
    "evaluate_verifier": "training",
    "EvaluateConfig": "evaluation",
    "evaluate_study": "evaluation",
    "reproduce": "reproduction",
    "build_model_card": "hub",
    "push_verifier_to_hub": "hub",
    "save_verifier": "hub",
}
# (`collect` itself stays at hf_msv.collect.collect: a package attribute named like its submodule is shadowed.)


def register_auto_classes() -> None:
    """Register `MSVConfig` / `MSVVerifier` and `ProbeConfig` / `ProbeVerifier` with `AutoConfig` / `AutoModel`, as
    transformers' guide to custom models does, so that ``AutoModel.from_pretrained(dir)`` loads a saved verifier
    without ``trust_remote_code``. Idempotent; it imports torch and transformers, hence a call, not an import side
    effect. (Saved verifiers carry their code and an ``auto_map`` whether or not this was called.)

    Example:

    ```python
    >>> import hf_msv
    >>> from transformers import AutoModel
    >>> hf_msv.register_auto_classes()
    >>> verifier = AutoModel.from_pretrained("path/to/verifier")  # doctest: +SKIP
    ```
    """
    from transformers import AutoConfig, AutoModel

    from .configuration_msv import MSVConfig
    from .modeling_msv import MSVVerifier
    from .modeling_probe import ProbeConfig, ProbeVerifier

    AutoConfig.register("msv", MSVConfig, exist_ok=True)
    AutoModel.register(MSVConfig, MSVVerifier, exist_ok=True)
    AutoConfig.register("msv_probe", ProbeConfig, exist_ok=True)
    AutoModel.register(ProbeConfig, ProbeVerifier, exist_ok=True)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hf_msv' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = sorted(_EXPORTS) + ["register_auto_classes"]
