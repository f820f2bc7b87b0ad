"""The symbolic checker: Math-Verify with in-process fast paths, caches and a CPU-time bound per check.

`SymbolicChecker`, `MathVerifyOptions` (what it passes to ``math_verify.verify``) and `is_pathological` (the
answers it refuses before parsing). The order of decisions, the time bounds and what is cached:
``docs/equivalence.md``.
"""

from __future__ import annotations

import decimal
import logging
import math
import os
import re
import time
from dataclasses import asdict, dataclass
from decimal import Decimal
from fractions import Fraction
from typing import cast

from ..errors import UserError
from .base import EquivalenceChecker, Verdict, answer_key
from .pool import TaskResult, WorkerPool, get_pool

logger = logging.getLogger(__name__)


# ASCII digits only: Math-Verify does not read "５" as 5, and the fast paths must agree with it.
_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)", re.ASCII)
_THOUSANDS_RE = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?", re.ASCII)
_FRAC_RE = re.compile(r"([+-]?)\\frac(?:\{([+-]?\d+)\}\{([+-]?\d+)\}|(\d)(\d))", re.ASCII)
_SLASH_RE = re.compile(r"([+-]?\d+)/(\d+)", re.ASCII)
_ZERO_COMMA_RE = re.compile(r"[+-]?0\d*(?:,|\{,\})", re.ASCII)
_BAD_CHARS_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def _as_number(key: str) -> tuple[Fraction, bool] | None:
    """(value, written as a decimal) of a plain number (``-12``, ``0.50``, ``1,000``, ``\\frac{1}{2}``, ``3/4``)."""
    s = key.replace("{,}", "").replace("\\$", "")
    if len(s) > 40:
        return None
    if _ZERO_COMMA_RE.match(key):
        return None  # "0,111", "0{,}010": Math-Verify reads a decimal comma after a leading zero, not thousands
    if s.startswith("+") and not s.startswith("+\\frac"):
        return None  # Math-Verify parses no "+12", "+1,000" or "+1/2" (but "+\\frac{1}{2}")
    if _NUMBER_RE.fullmatch(s) or _THOUSANDS_RE.fullmatch(s):
        return Fraction(s.replace(",", "")), "." in s
    m = _FRAC_RE.fullmatch(s) or _SLASH_RE.fullmatch(s)
    if m is None:
        return None
    if m.re is _SLASH_RE:
        num, den = m.group(1), m.group(2)
    else:
        num, den = (m.group(2), m.group(3)) if m.group(2) is not None else (m.group(4), m.group(5))
        num = m.group(1) + num
    if int(den) == 0:
        return None
    return Fraction(int(num), int(den)), False


def _numeric_verdict(ka: str, kb: str) -> Verdict | None:
    """Verdict on two plain numbers that agrees with Math-Verify, or ``None`` when it cannot be decided here.

    Math-Verify compares exact numbers exactly and rounds to 6 decimals when a decimal is involved, so two values
    that differ by more than 1e-5 (relative) can never be equal; closer, unequal pairs go to Math-Verify.
    """
    na, nb = _as_number(ka), _as_number(kb)
    if na is None or nb is None:
        return None
    (x, x_dec), (y, y_dec) = na, nb
    if x == y:
        return Verdict.EQUAL
    if not (x_dec or y_dec) or abs(x - y) > Fraction(1, 10**5) * max(1, abs(x), abs(y)):
        return Verdict.NOT_EQUAL
    return None


def is_pathological(answer: str, max_length: int = 1000, max_depth: int = 32, max_power_depth: int = 2) -> bool:
    """Whether an answer is refused by the symbolic checker before any parsing (O(n)).

    Too long, control characters or lone surrogates, brackets nested deeper than ``max_depth``, or power towers
    higher than ``max_power_depth`` (``9^{9^{9^{9}}}`` has 3 nested exponents): parsing or evaluating these can take
    unbounded time or memory, and no real answer needs them.

    Args:
        answer: the answer string.
        max_length: the longest accepted answer, in characters.
        max_depth: the deepest accepted bracket nesting.
        max_power_depth: the most nested exponents accepted.

    Returns:
        Whether the answer is refused.
    """
    if len(answer) > max_length or _BAD_CHARS_RE.search(answer):
        return True
    depth = power = 0
    power_groups: list[bool] = []  # for every open "{": whether it is an exponent
    after_caret = False
    i, n = 0, len(answer)
    while i < n:
        c = answer[i]
        if c == "\\":
            i += 2
            after_caret = False
            continue
        if c in "([{":
            depth += 1
            if depth > max_depth:
                return True
            if c == "{":
                power_groups.append(after_caret)
                power += after_caret
        elif c in ")]}":
            depth = max(depth - 1, 0)
            if c == "}" and power_groups:
                power -= power_groups.pop()
        if c == "^" and power + 1 > max_power_depth:
            return True
        if not c.isspace():
            after_caret = c == "^"
        i += 1
    return False


_WIDE = decimal.Context(prec=40, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)
_BAD_ANSWER = ("bad",)  # probe result of an answer whose parse alone ran out of time or crashed a worker


def _values_differ(pa: tuple, pb: tuple) -> bool:
    """Whether two probed values differ beyond anything Math-Verify's rounding (6 decimals) could merge."""
    with decimal.localcontext(_WIDE):  # values like 9^{9^9} ~ 1e369693099 overflow the default context
        (ra, ia), (rb, ib) = (map(Decimal, p[1:3]) for p in (pa, pb))
        scale = max(Decimal(1), abs(ra), abs(ia), abs(rb), abs(ib))
        return max(abs(ra - rb), abs(ia - ib)) > scale * Decimal("1e-5")


@dataclass
class _Attempt:
    """One try at settling a pair in the workers."""

    budget: float  # CPU seconds it may still spend
    full: float  # CPU seconds it started with
    final: bool  # the retry: a task that runs out of CPU time now decides the verdict
    lost: bool = False  # a worker stalled or failed: the outcome reflects the machine, not the answers
    timed_out: bool = False  # a task's CPU timeout decided the verdict
    deadline: float = (
        math.inf
    )  # time.monotonic() by which the pair must be decided (`SymbolicChecker.pair_wall_limit`)


@dataclass(frozen=True)
class MathVerifyOptions:
    """The options a `SymbolicChecker` passes to ``math_verify.verify`` (every check, in both directions).

    Args:
        float_rounding: decimal places floats are rounded to.
        numeric_precision: decimal places numeric comparisons consider.
        strict: strict mode: variables matter, and sets are not comparable with tuples (non-strict: variables are
            matched by position, sets compare with tuples).
        allow_set_relation_comp: let a set compare with a relation (``1 < x < 2`` against ``(1, 2)``).
    """

    float_rounding: int = 6
    numeric_precision: int = 15
    strict: bool = True
    allow_set_relation_comp: bool = False


class SymbolicChecker(EquivalenceChecker):
    """Math-Verify (`parse` + `verify`, answers wrapped in ``$…$``) with fast paths, caches and CPU-time bounds.

    ``equivalent(a, b)`` is ``verify(a, b) OR verify(b, a)``; `is_correct(pred, gold)` keeps the graded direction
    ``verify(gold, pred)``. What runs in-process and what in workers, the time bounds and what is cached:
    ``docs/equivalence.md``.

    Args:
        timeout: CPU seconds one check may use in worker processes; a check that runs out is retried once.
        retry_timeout: CPU seconds of that retry (``None``: 3 × ``timeout``); if it runs out too the verdict is
            UNVERIFIABLE for this call (never cached: the next check of the pair tries again).
        wall_limit: wall-clock seconds after which a worker is killed whatever CPU time it used (``None``: 10 × its
            CPU budget + 10): the check is retried, and if the retry is killed too it is UNVERIFIABLE, never cached.
        max_length: longer answers are UNVERIFIABLE (unless identical after normalisation).
        max_workers: worker processes (shared by checkers with the same ``max_workers`` and ``memory_limit_mb``).
        memory_limit_mb: address space a worker may add before its allocations fail (Linux); ``None``: no limit.
        verify_options: what ``math_verify.verify`` is passed (`MathVerifyOptions`, or its fields as a dict: the
            form a JSON ``checker_kwargs`` takes, e.g. ``{"verify_options": {"strict": false}}``).
        cache_size: verdicts (and probes) kept before the cache is cleared.
        fast_paths: ``False`` sends every pair to ``verify`` (to test that the fast paths agree with Math-Verify).
        pair_wall_limit: wall-clock seconds one pair may take in all, this process's parsing and caching included,
            however loaded the machine: then it is UNVERIFIABLE (not cached). ``None``: 2.25 × ``timeout`` when
            neither ``retry_timeout`` nor ``wall_limit`` is given (so a pair ends within 2.5 × ``timeout``, 5 s at
            the defaults), else no such limit (the limits given rule).

    Raises:
        ValueError: a non-positive ``timeout``, ``retry_timeout`` smaller than ``timeout``, or a non-positive
            ``wall_limit``.
    """

    name = "symbolic"

    def __init__(
        self,
        timeout: float = 2.0,
        retry_timeout: float | None = None,
        wall_limit: float | None = None,
        max_length: int = 1000,
        max_workers: int | None = None,
        memory_limit_mb: int | None = 2048,
        verify_options: MathVerifyOptions | dict | None = None,
        cache_size: int = 1 << 20,
        fast_paths: bool = True,
        pair_wall_limit: float | None = None,
    ):
        if not timeout > 0:
            raise UserError(f"timeout must be > 0 CPU seconds, got {timeout!r}")
        if retry_timeout is not None and not retry_timeout >= timeout:
            raise UserError(f"retry_timeout ({retry_timeout!r}) must be at least timeout ({timeout!r})")
        if wall_limit is not None and not wall_limit > 0:
            raise UserError(f"wall_limit must be > 0 seconds, got {wall_limit!r}")
        self.timeout = timeout
        self.retry_timeout = 3 * timeout if retry_timeout is None else retry_timeout
        self.wall_limit = wall_limit
        if pair_wall_limit is None and retry_timeout is None and wall_limit is None:
            pair_wall_limit = 2.25 * timeout  # killing the worker and returning fit in the promised 2.5 x timeout
        self.pair_wall_limit = math.inf if pair_wall_limit is None else pair_wall_limit
        self.max_length = max_length
        self.max_workers = max_workers or max(1, min(4, os.cpu_count() or 1))
        self.memory_limit_mb = memory_limit_mb
        if not isinstance(verify_options, MathVerifyOptions):
            verify_options = MathVerifyOptions(**(verify_options or {}))
        self.verify_options = asdict(verify_options)  # the keywords of `verify`, as the workers receive them
        self.cache_size = cache_size
        self.fast_paths = fast_paths
        self._cache: dict[tuple, Verdict] = {}
        self._probes: dict[str, tuple] = {}

    def _pool(self) -> WorkerPool:
        return get_pool(self.max_workers, self.memory_limit_mb)

    def _run(self, task: tuple, attempt: _Attempt) -> TaskResult:
        """``task`` in a worker with what is left of the attempt's budget; updates the budget and the counters."""
        wall = self.wall_limit if self.wall_limit is not None else 10 * attempt.full + 10
        left = attempt.deadline - time.monotonic()
        if left <= wall:  # the pair's own limit comes first: running out of it decides (UNVERIFIABLE)
            result = (
                self._pool().run(task, attempt.budget, max(left, 0.0)) if left > 0 else TaskResult(None, 0, "stalled")
            )
            # stalled by the pair's limit (not a worker stopped from outside early): that decides
            attempt.timed_out |= result.status == "stalled" and time.monotonic() >= attempt.deadline - 0.01
        else:
            result = self._pool().run(task, attempt.budget, wall)
        attempt.budget -= result.cpu_s
        attempt.lost |= result.status in ("stalled", "failed")
        self._add_stats(
            worker_cpu_s=result.cpu_s,
            stalled=int(result.status == "stalled"),
            worker_failures=int(result.status == "failed"),
        )
        return result

    def _out_of_time(self, result: TaskResult, attempt: _Attempt, had: float) -> bool:
        """Whether a task's CPU timeout decides the verdict: in the retry, and with at least half its budget."""
        decisive = result.status == "timeout" and attempt.final and had >= attempt.full / 2
        attempt.timed_out |= decisive
        return decisive

    def _probe(self, key: str, attempt: _Attempt) -> tuple | None:
        """The answer's probe (cached), or ``None`` when the attempt ran out of time before it was known."""
        probe = self._probes.get(key)
        if probe is not None:
            return probe
        had = attempt.budget
        if had <= 0:
            return None
        result = self._run(("probe", key), attempt)
        if result.status == "ok":
            # None: the worker raised; else the worker's probe tuple (`worker.probe`)
            probe = _BAD_ANSWER if result.value is None else cast(tuple, result.value)
        elif self._out_of_time(result, attempt, had):
            return _BAD_ANSWER  # not cached: a timeout is never a final answer
        else:
            return None
        if len(self._probes) >= self.cache_size:
            self._probes.clear()
        self._probes[key] = probe
        return probe

    def _settle(self, kind: str, ka: str, kb: str, attempt: _Attempt) -> Verdict | None:
        """Steps 4-5 of ``docs/equivalence.md`` within ``attempt``; ``None`` when it ran out of time first."""
        if self.fast_paths:
            pa = self._probe(ka, attempt)
            pb = self._probe(kb, attempt) if pa is not None else None
            if pa is None or pb is None:
                return None
            if pa[0] in ("bad", "none") or pb[0] in ("bad", "none"):
                return Verdict.UNVERIFIABLE
            if self._probes_differ(pa, pb):
                return Verdict.NOT_EQUAL
        had = attempt.budget
        if had <= 0:
            return None
        result = self._run(("verify", kind, ka, kb, self.verify_options), attempt)
        if result.status == "ok":
            if result.value is None:  # a side did not parse, or the worker raised
                return Verdict.UNVERIFIABLE
            return Verdict.EQUAL if result.value else Verdict.NOT_EQUAL
        return Verdict.UNVERIFIABLE if self._out_of_time(result, attempt, had) else None

    def _probes_differ(self, pa: tuple, pb: tuple) -> bool:
        """Whether Math-Verify cannot find two probed answers equal (sound, not complete)."""
        if set(pa[-1]) & set(pb[-1]):  # a shared string candidate: verify matches strings too
            return False
        kinds = {pa[0], pb[0]}
        if kinds == {"collection", "value"}:  # x vs {x}: a set of 2+ elements never equals one value
            return True
        if kinds != {"value"}:
            return False
        # Expressions in symbols differing at one point are not identically equal; with strict=False Math-Verify
        # renames variables, so only constants are compared then.
        if (pa[3] or pb[3]) and not self.verify_options["strict"]:
            return False
        return _values_differ(pa, pb)

    def _decide(self, kind: str, ka: str, kb: str) -> Verdict:
        start = time.monotonic()  # the pair's wall-clock limit counts from here: parsing and caching included
        if ka == kb and self.fast_paths:
            return Verdict.EQUAL
        cache_key = (kind, ka, kb) if kind == "gold" or ka < kb else (kind, kb, ka)
        verdict = self._cache.get(cache_key)
        if verdict is not None:
            return verdict
        if is_pathological(ka, self.max_length) or is_pathological(kb, self.max_length):
            return Verdict.UNVERIFIABLE
        verdict = _numeric_verdict(ka, kb) if self.fast_paths else None
        deadline = start + self.pair_wall_limit
        if verdict is None:
            first = _Attempt(self.timeout, self.timeout, final=False, deadline=deadline)
            verdict = self._settle(kind, ka, kb, first)
            if first.timed_out:  # the pair's wall-clock limit ran out: no retry
                self._add_stats(timeouts=1)
                return Verdict.UNVERIFIABLE
        if verdict is None:  # out of CPU time (or a worker lost): once more, with the larger budget
            self._add_stats(retries=1)
            retry = _Attempt(self.retry_timeout, self.retry_timeout, final=True, deadline=deadline)
            verdict = self._settle(kind, ka, kb, retry)
            self._add_stats(timeouts=int(verdict is None or retry.timed_out))
            if verdict is None or retry.timed_out or (retry.lost and verdict is Verdict.UNVERIFIABLE):
                return verdict or Verdict.UNVERIFIABLE  # not cached: a later check tries again
        if len(self._cache) >= self.cache_size:
            self._cache.clear()
        self._cache[cache_key] = verdict
        return verdict

    def _compare(self, a: str, b: str) -> Verdict:
        return self._decide("either", answer_key(a), answer_key(b))

    def compare_to_gold(self, pred: str | None, gold: str) -> Verdict:
        """Verdict of ``verify(gold, pred)`` (the graded direction); ``None`` or empty prediction -> NOT_EQUAL.

        Args:
            pred: the predicted answer.
            gold: the reference answer.

        Returns:
            The `Verdict` (counted in `stats`; never raises).
        """
        try:
            kp, kg = ("" if pred is None else answer_key(str(pred))), answer_key(str(gold))
            verdict = self._decide("gold", kg, kp) if kp and kg else Verdict.NOT_EQUAL
        except Exception:
            logger.debug("equivalence check failed", exc_info=True)
            verdict = Verdict.UNVERIFIABLE
        return self._counted(verdict)

    def is_correct(self, pred: str | None, gold: str) -> bool:
        """Whether `compare_to_gold` is EQUAL (the graded direction).

        Args:
            pred: the predicted answer.
            gold: the reference answer.

        Returns:
            Whether `pred` is correct.
        """
        return self.compare_to_gold(pred, gold) is Verdict.EQUAL

    def warmup(self) -> None:
        """Start a worker now (the first also starts the process that forks them, ~1 s), so no check waits."""
        self._pool().warmup()

    def clear_cache(self) -> None:
        """Forget verdicts and probes (worker-side parse caches stay)."""
        self._cache.clear()
        self._probes.clear()


__all__ = ["SymbolicChecker", "is_pathological"]
