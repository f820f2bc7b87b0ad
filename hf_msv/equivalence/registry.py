"""Checkers by name: the registry behind every ``checker=`` argument of hf_msv (collection, training, evaluation)."""

from __future__ import annotations

from ..errors import UserError
from .base import EquivalenceChecker
from .simple import EmbeddingChecker, ExactChecker, JaccardChecker, RandomChecker
from .symbolic import SymbolicChecker

CHECKERS: dict[str, type[EquivalenceChecker]] = {
    "symbolic": SymbolicChecker,
    "exact": ExactChecker,
    "jaccard": JaccardChecker,
    "embedding": EmbeddingChecker,
    "random": RandomChecker,
}


def get_checker(name: str, **kwargs) -> EquivalenceChecker:
    """A checker by name: ``"symbolic"`` | ``"exact"`` | ``"jaccard"`` | ``"embedding"`` | ``"random"``.

    ``kwargs`` go to its constructor (e.g. ``timeout=`` for symbolic, ``threshold=`` for jaccard / embedding,
    ``probability=`` and ``seed=`` for random).

    Args:
        name: a key of `CHECKERS`.
        **kwargs: the checker's constructor arguments.

    Returns:
        The `EquivalenceChecker`.

    Raises:
        UserError: for an unknown `name`.
    """
    if name not in CHECKERS:
        raise UserError(f"unknown equivalence checker {name!r}; choose one of {sorted(CHECKERS)}")
    return CHECKERS[name](**kwargs)


__all__ = ["CHECKERS", "get_checker"]
