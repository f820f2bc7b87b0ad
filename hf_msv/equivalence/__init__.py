"""Answer equivalence: checkers behind one interface, and online equivalence classes.

    checker = get_checker("symbolic", timeout=2.0)
    checker.compare("\\frac12", "0.5")      # Verdict.EQUAL
    checker.equivalent("2\\sqrt2", "\\sqrt8")  # True; symmetric; unverifiable -> False; never raises
    checker.is_correct("025", "25")         # True
    assign_classes(["1/2", "0.5", None, "3"], checker)  # [0, 0, 1, 2]

The symbolic checker runs Math-Verify in a small pool of persistent worker processes, each call bounded by an explicit
``timeout`` after which the worker is killed and replaced (a ~10 ms fork), so it is safe from threads and from several
processes and a pathological answer can neither hang nor crash the caller (Math-Verify's own ``signal.alarm`` timeouts
only work in the main thread: huggingface/Math-Verify#55, #50, #42).

Modules: `base` (`Verdict`, `answer_key`, `EquivalenceChecker`, `EquivalenceClasses`), `simple` (exact, Jaccard,
random, embedding), `symbolic` (`SymbolicChecker`, its fast paths and `is_pathological`), `pool` (the worker
processes), `worker` (the program they run), `registry` (`get_checker`, `CHECKERS`).
"""

from .base import EquivalenceChecker, EquivalenceClasses, Verdict, answer_key, assign_classes
from .registry import CHECKERS, get_checker
from .simple import EmbeddingChecker, ExactChecker, JaccardChecker, RandomChecker
from .symbolic import SymbolicChecker, is_pathological

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
