"""Answers elicited inside `model.generate`, their hidden states, and MSV early stopping."""

from .session import (
    DelimiterMatch,
    DelimiterMatcher,
    MSVAnswer,
    MSVEarlyStop,
    MSVResult,
    MSVSession,
    fork_cache,
    msv_generate,
    prepare_generation,
)

__all__ = [
    "DelimiterMatch",
    "DelimiterMatcher",
    "MSVAnswer",
    "MSVEarlyStop",
    "MSVResult",
    "MSVSession",
    "fork_cache",
    "msv_generate",
    "prepare_generation",
]
