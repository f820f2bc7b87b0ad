"""hf_msv: Multi-Sequence Verifiers for Hugging Face transformers.

Importing hf_msv registers the verifier with the Auto classes, so `AutoModel.from_pretrained(dir)` works for
saved verifiers without `trust_remote_code`.
"""

from transformers import AutoConfig, AutoModel

from .configuration_msv import MASK_NAMES, MSVConfig
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
from .problems import Problem

__version__ = "0.1.0"

AutoConfig.register("msv", MSVConfig, exist_ok=True)
AutoModel.register(MSVConfig, MSVVerifier, exist_ok=True)
# Saved verifiers carry their own code and an auto_map, so the Hub copy loads with trust_remote_code=True
# for users who don't have hf_msv installed.
MSVConfig.register_for_auto_class()
MSVVerifier.register_for_auto_class("AutoModel")

__all__ = [
    "MASK_NAMES",
    "MSVCache",
    "MSVConfig",
    "MSVOutput",
    "MSVVerifier",
    "Problem",
    "average_logits",
    "build_masks",
    "check_compatible",
    "compute_gamma",
    "split_into_groups",
]
