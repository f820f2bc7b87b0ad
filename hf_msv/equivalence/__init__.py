"""Answer equivalence: checkers behind one interface, and online equivalence classes.

    checker = get_checker("symbolic", timeout=2.0)
    checker.compare("\\frac12", "0.5")      # Verdict.EQUAL
    checker.equivalent("2\\sqrt2", "\\sqrt8")  # True; symmetric; unverifiable -> False; never raises
    checker.is_correct("025", "25")         # True
    assign_classes(["1/2", "0.5", None, "3"], checker)  # [0, 0, 1, 2]
    checker.stats                           # {"checks": 5, "unverifiable": 0, ...}

Modules: `base` (`Verdict`, `answer_key`, `EquivalenceChecker`, `EquivalenceClasses`), `simple` (exact, Jaccard,
random, embedding), `symbolic` (`SymbolicChecker`, `MathVerifyOptions`, `is_pathological`), `pool` (its worker
processes), `worker` (the program they run), `registry` (`get_checker`, `CHECKERS`). Design and time bounds:
``docs/equivalence.md``.
"""

from .base import STAT_KEYS, EquivalenceChecker, EquivalenceClasses, Verdict, answer_key, assign_classes
from .registry import CHECKERS, get_checker
from .simple import EmbeddingChecker, ExactChecker, JaccardChecker, RandomChecker
from .symbolic import MathVerifyOptions, SymbolicChecker, is_pathological

__all__ = [
    "CHECKERS",
    "EmbeddingChecker",
    "EquivalenceChecker",
    "EquivalenceClasses",
    "ExactChecker",
    "JaccardChecker",
    "MathVerifyOptions",
    "RandomChecker",
    "STAT_KEYS",
    "SymbolicChecker",
    "Verdict",
    "answer_key",
    "assign_classes",
    "get_checker",
    "is_pathological",
]
