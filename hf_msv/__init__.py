"""hf_msv: Multi-Sequence Verifiers for Hugging Face transformers.

Importing hf_msv registers the verifier with the Auto classes, so `AutoModel.from_pretrained(dir)` works for
saved verifiers without `trust_remote_code`.
"""

from transformers import AutoConfig, AutoModel

from .answers import ELICITATION_PROMPT, MAX_ANSWER_TOKENS, extract_boxed, extract_last_boxed, find_box_end
from .configuration_msv import MASK_NAMES, MSVConfig
from .equivalence import EquivalenceClasses, Verdict, assign_classes, get_checker
from .generation import MSVAnswer, MSVEarlyStop, MSVResult, MSVSession, msv_generate, prepare_generation
from .modeling_msv import (
    MSVCache,
    MSVOutput,
    MSVVerifier,
    average_logits,
    build_masks,
    check_compatible,
    compute_gamma,
    split_into_groups,
)
from .modeling_probe import ProbeConfig, ProbeVerifier
from .data.problems import Problem, load_benchmark

__version__ = "0.1.0"

AutoConfig.register("msv", MSVConfig, exist_ok=True)
AutoModel.register(MSVConfig, MSVVerifier, exist_ok=True)
AutoConfig.register("msv_probe", ProbeConfig, exist_ok=True)
AutoModel.register(ProbeConfig, ProbeVerifier, exist_ok=True)
# Saved verifiers carry their own code and an auto_map, so the Hub copy loads with trust_remote_code=True
# for users who don't have hf_msv installed.
MSVConfig.register_for_auto_class()
MSVVerifier.register_for_auto_class("AutoModel")


def __getattr__(name):
    # Collection and training pull in accelerate and safetensors readers; import them on first use.
    # (`collect` itself stays at hf_msv.collect.collect: a package attribute named like its submodule is shadowed.)
    lazy = {"ShardDataset": "data", "collate_groups": "data",
            "MSVTrainingConfig": "training", "train_verifier": "training", "evaluate_verifier": "training",
            "read_shard": "data", "write_shard": "data", "CollectedProblem": "data",
            "load_problems": "collect", "collect_from_traces": "collect", "evaluate_study": "evaluation", "reproduce": "reproduction",
            "push_verifier_to_hub": "hub", "build_model_card": "hub",
            "save_verifier": "hub"}
    if name in lazy:
        import importlib

        return getattr(importlib.import_module(f".{lazy[name]}", __name__), name)
    raise AttributeError(f"module 'hf_msv' has no attribute {name!r}")


__all__ = [
    "ELICITATION_PROMPT",
    "MASK_NAMES",
    "MAX_ANSWER_TOKENS",
    "EquivalenceClasses",
    "MSVAnswer",
    "MSVCache",
    "MSVConfig",
    "MSVEarlyStop",
    "MSVOutput",
    "MSVResult",
    "MSVSession",
    "MSVTrainingConfig",
    "MSVVerifier",
    "Problem",
    "ProbeConfig",
    "ProbeVerifier",
    "CollectedProblem",
    "ShardDataset",
    "Verdict",
    "assign_classes",
    "average_logits",
    "build_masks",
    "build_model_card",
    "check_compatible",
    "collate_groups",
    "collect_from_traces",
    "compute_gamma",
    "extract_boxed",
    "extract_last_boxed",
    "find_box_end",
    "get_checker",
    "load_benchmark",
    "msv_generate",
    "prepare_generation",
    "evaluate_study",
    "evaluate_verifier",
    "load_problems",
    "push_verifier_to_hub",
    "read_shard",
    "reproduce",
    "write_shard",
    "save_verifier",
    "split_into_groups",
    "train_verifier",
]
