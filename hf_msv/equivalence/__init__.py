"""Answer equivalence: checkers (exact, Jaccard, random, embedding, symbolic) and online classes."""

from .checkers import (
    CHECKERS,
    EmbeddingChecker,
    EquivalenceChecker,
    EquivalenceClasses,
    ExactChecker,
    JaccardChecker,
    RandomChecker,
    SymbolicChecker,
    Verdict,
    answer_key,
    assign_classes,
    get_checker,
    is_pathological,
)

__all__ = [
    "CHECKERS",
    "EmbeddingChecker",
    "EquivalenceChecker",
    "EquivalenceClasses",
    "ExactChecker",
    "JaccardChecker",
    "RandomChecker",
    "SymbolicChecker",
    "Verdict",
    "answer_key",
    "assign_classes",
    "get_checker",
    "is_pathological",
]
