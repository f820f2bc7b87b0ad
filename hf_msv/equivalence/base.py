"""The checker interface, the answer normal form, and online equivalence classes.

Everything MSV does with answers (the equivalence mask, γ, logit averaging, weighted voting, self-consistency and the
correctness labels) depends on deciding when two answers are "the same". An `EquivalenceChecker` decides it for one
pair; `EquivalenceClasses` turns those verdicts into the class ids of one group's answers, in arrival order.
Every checker counts its verdicts (`EquivalenceChecker.stats`). See ``docs/equivalence.md``.
"""

from __future__ import annotations

import enum
import functools
import logging
import os
import threading
from collections.abc import Iterable

from ..answers import normalize_answer

logger = logging.getLogger(__name__)

STAT_KEYS = ("checks", "unverifiable", "retries", "timeouts", "stalled", "worker_failures", "worker_cpu_s")
"""The counters of `EquivalenceChecker.stats`, in order."""

_STATS_LOCK = threading.Lock()  # one for all checkers: counters are cheap, and a checker stays picklable


def _new_stats_lock() -> None:
    global _STATS_LOCK
    _STATS_LOCK = threading.Lock()  # a child forked while another thread held the lock must not wait for it


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_stats_lock)


class Verdict(enum.Enum):
    """Outcome of one comparison. ``UNVERIFIABLE`` (timeout, failure, input refused) is never counted as equal."""

    EQUAL = "equal"
    NOT_EQUAL = "not_equal"
    UNVERIFIABLE = "unverifiable"


@functools.lru_cache(maxsize=1 << 16)
def answer_key(answer: str) -> str:
    """Normal form used for exact matching, dictionary hits and cache keys (cached `normalize_answer`)."""
    return normalize_answer(answer)


class EquivalenceChecker:
    """Decides whether two answers are the same. Subclasses implement `_compare` on two non-``None`` strings.

    ``None`` (no boxed answer), like an answer that normalises to the empty string, is never equal to anything, itself
    included. Answers with the same `answer_key` are equal for every checker except ``random`` (a pure coin flip);
    `EquivalenceClasses` groups them in any case.
    """

    name = "base"

    def compare(self, a: str | None, b: str | None) -> Verdict:
        """Symmetric verdict on two answers; never raises (an internal error gives ``UNVERIFIABLE``).

        Args:
            a, b: the answers (``None``: no answer).

        Returns:
            The `Verdict`.
        """
        return self._counted(self._compare_safely(a, b))

    def _compare_safely(self, a: str | None, b: str | None) -> Verdict:
        if a is None or b is None:
            return Verdict.NOT_EQUAL
        try:
            a, b = str(a), str(b)
            if not answer_key(a) or not answer_key(b):  # nothing left after normalisation: no answer either
                return Verdict.NOT_EQUAL
            return self._compare(a, b)
        except Exception:  # a checker bug must not take the verifier down: report "could not verify"
            logger.debug("equivalence check failed", exc_info=True)
            return Verdict.UNVERIFIABLE

    @property
    def stats(self) -> dict[str, float]:
        """Counters since creation or `reset_stats` (a copy; keys `STAT_KEYS`, thread-safe).

        ``checks``: verdicts returned (``compare``, ``equivalent``, ``is_correct``; cache hits included);
        ``unverifiable``: those that were ``UNVERIFIABLE``. The symbolic checker also counts ``retries`` (checks whose
        first CPU budget ran out, retried with a larger one), ``timeouts`` (UNVERIFIABLE because the retry ran out
        too), ``stalled`` (workers killed by the wall-clock limit), ``worker_failures`` (workers that died or did
        not start) and ``worker_cpu_s`` (CPU seconds spent in workers); other checkers leave those at 0.
        """
        with _STATS_LOCK:
            return dict(self.__dict__.get("_stats") or dict.fromkeys(STAT_KEYS, 0))

    def reset_stats(self) -> None:
        """Set every counter of `stats` to 0."""
        with _STATS_LOCK:
            self.__dict__.pop("_stats", None)

    def _add_stats(self, **amounts: float) -> None:
        with _STATS_LOCK:
            stats = self.__dict__.setdefault("_stats", dict.fromkeys(STAT_KEYS, 0))
            for key, amount in amounts.items():
                stats[key] += amount

    def _counted(self, verdict: Verdict) -> Verdict:
        self._add_stats(checks=1, unverifiable=int(verdict is Verdict.UNVERIFIABLE))
        return verdict

    def equivalent(self, a: str | None, b: str | None) -> bool:
        """``compare(a, b) is Verdict.EQUAL``: symmetric, unverifiable counts as different, never raises.

        Args:
            a, b: the answers (``None``: no answer).

        Returns:
            Whether they are equal.
        """
        return self.compare(a, b) is Verdict.EQUAL

    def is_correct(self, pred: str | None, gold: str) -> bool:
        """Whether ``pred`` is graded correct against ``gold``. Labels in the paper always use ``symbolic``.

        Args:
            pred: the predicted answer (``None``: no answer, never correct).
            gold: the reference answer.

        Returns:
            Whether `pred` is correct.
        """
        return pred is not None and self.equivalent(pred, gold)

    def key(self, answer: str) -> str:
        """Normal form under which two answers are the same answer (see `answer_key`).

        Args:
            answer: an answer string.

        Returns:
            Its normal form.
        """
        return answer_key(answer)

    def _compare(self, a: str, b: str) -> Verdict:
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


class EquivalenceClasses:
    """Online leader clustering of one group's answers into equivalence classes.

    `add` looks the answer's normalised string up in a dict first; otherwise it compares the answer with the
    representative (first member) of each existing class, in creation order, joins the first match, or opens a new
    class. Classes never merge afterwards. This resolves non-transitive verdicts (a~b, b~c, a≁c) by arrival order and
    makes online and offline assignment identical when answers are added in arrival order, which the verifier's KV
    cache relies on. ``None`` (no answer, also an empty one) always opens a class of its own. Not thread-safe: one
    instance per group.

    Args:
        checker: the `EquivalenceChecker` that compares an answer with the class representatives.
    """

    def __init__(self, checker: EquivalenceChecker):
        self.checker = checker
        self.representatives: list[str | None] = []  # one per class, index = class id
        self.classes: list[int] = []  # class id of every answer added, in order
        self._by_key: dict[str, int] = {}

    def add(self, answer: str | None) -> int:
        """Class id of ``answer`` (existing or new).

        Args:
            answer: the next answer of the group (``None``: no answer).

        Returns:
            Its class id (int, 0-based, in creation order).
        """
        key = None if answer is None else self.checker.key(str(answer))
        if not key:  # no answer: a class of its own
            cls = self._new(None)
        else:
            answer = str(answer)
            cls = self._by_key.get(key)
            if cls is None:
                reps = enumerate(self.representatives)
                cls = next((c for c, rep in reps if rep is not None and self.checker.equivalent(answer, rep)), None)
                if cls is None:
                    cls = self._new(answer)
                self._by_key[key] = cls
        self.classes.append(cls)
        return cls

    def _new(self, representative: str | None) -> int:
        self.representatives.append(representative)
        return len(self.representatives) - 1

    @property
    def num_classes(self) -> int:
        return len(self.representatives)

    def __len__(self) -> int:
        return len(self.classes)


def assign_classes(answers: Iterable[str | None], checker: EquivalenceChecker) -> list[int]:
    """Class ids of ``answers`` added in order to a fresh `EquivalenceClasses` (the offline assignment).

    Args:
        answers: one group's answers in arrival order (``None``: no answer).
        checker: the `EquivalenceChecker` to compare them with.

    Returns:
        One class id per answer.
    """
    classes = EquivalenceClasses(checker)
    return [classes.add(a) for a in answers]


__all__ = ["STAT_KEYS", "EquivalenceChecker", "EquivalenceClasses", "Verdict", "answer_key", "assign_classes"]
