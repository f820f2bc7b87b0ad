"""The symbolic checker: Math-Verify with in-process fast paths, caches and a hard time bound per check.

Cheap, in-process decisions come first (string equality, two plain numbers, `is_pathological` refusals); only what
they cannot settle goes to a worker process (`hf_msv.equivalence.pool`), which probes each answer once and runs
Math-Verify's ``verify`` last. See `SymbolicChecker` for the order of decisions.
"""

from __future__ import annotations

import decimal
import logging
import os
import re
from decimal import Decimal
from fractions import Fraction

from .base import EquivalenceChecker, Verdict, answer_key
from .pool import WorkerPool, get_pool

logger = logging.getLogger(__name__)


# ASCII digits only: Math-Verify does not read "５" as 5, and the fast paths must agree with it.
_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)", re.ASCII)
_THOUSANDS_RE = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?", re.ASCII)
_FRAC_RE = re.compile(r"([+-]?)\\frac(?:\{([+-]?\d+)\}\{([+-]?\d+)\}|(\d)(\d))", re.ASCII)
_SLASH_RE = re.compile(r"([+-]?\d+)/(\d+)", re.ASCII)
_BAD_CHARS_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def _as_number(key: str) -> tuple[Fraction, bool] | None:
    """(value, written as a decimal) of a plain number (``-12``, ``0.50``, ``1,000``, ``\\frac{1}{2}``, ``3/4``)."""
    s = key.replace("{,}", "").replace("\\$", "")
    if len(s) > 40:
        return None
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


class SymbolicChecker(EquivalenceChecker):
    """Math-Verify (`parse` + `verify`, answers wrapped in ``$…$``) with fast paths, caches and a hard time bound.

    Order of decisions in `compare` (each answer normalised with `answer_key`):

    1. same normalised string -> EQUAL; a cached verdict for the pair;
    2. an answer longer than ``max_length`` or `is_pathological` -> UNVERIFIABLE at once;
    3. two plain numbers (``0.5``, ``\\frac{1}{2}``, ``1,000``) -> decided in-process (`_numeric_verdict`);
    4. each answer is *probed* once in a worker: parsed, and evaluated if it is an expression (constants as they
       are, symbols at fixed points derived from their names). An answer that does not parse, or whose probe alone
       runs out of time, is UNVERIFIABLE against everything. Without running ``verify``, two values that differ by
       more than 1e-5 (relative) are NOT_EQUAL (Math-Verify compares such expressions by value or by simplifying the
       difference to zero), and so is a value against a tuple / set of 2+ elements or a proper interval. Bare
       symbols, relations, matrices, percentages and undefined functions are left to ``verify``;
    5. otherwise a worker runs Math-Verify's ``verify``.

    Steps 4-5 run in worker processes with Math-Verify's own timeouts disabled; one check may keep workers busy for
    at most ``timeout`` seconds in all, after which the busy worker is killed and replaced (a ~10 ms fork) and the
    verdict is UNVERIFIABLE. Waiting for a free worker (more threads than ``max_workers``) and starting one are not
    counted. A worker found dead is replaced once, transparently.

    Symmetry: ``equivalent(a, b)`` is ``verify(a, b) OR verify(b, a)``. Math-Verify's asymmetry comes from leniency
    granted to the gold side (assignments ``x=5`` unwrapped, relations ``1<x<2`` read as intervals); between two
    predictions neither is gold, so they are the same answer if one would be graded correct with the other as gold.
    OR also halves the false negatives of AND, and Math-Verify errs on the side of False. `is_correct(pred, gold)`
    keeps the graded direction, ``verify(gold, pred)``.

    Verdicts (UNVERIFIABLE from a timeout included, so a hostile pair costs its timeout once) and probes are cached
    per checker; parses are cached in the workers.

    Args:
        timeout: seconds one check may spend in worker processes before it is abandoned.
        max_length: longer answers are UNVERIFIABLE (unless identical after normalisation).
        max_workers: worker processes (shared by checkers with the same ``max_workers`` and ``memory_limit_mb``).
        memory_limit_mb: address space a worker may add before its allocations fail (Linux); ``None``: no limit.
        float_rounding, numeric_precision, strict, allow_set_relation_comp: passed to ``math_verify.verify``.
        cache_size: verdicts (and probes) kept before the cache is cleared.
        fast_paths: ``False`` skips steps 1 (string equality), 3 and 4 and sends every pair to ``verify`` (to test
            that the fast paths agree with Math-Verify).
    """

    name = "symbolic"

    def __init__(
        self,
        timeout: float = 2.0,
        max_length: int = 1000,
        max_workers: int | None = None,
        memory_limit_mb: int | None = 2048,
        float_rounding: int = 6,
        numeric_precision: int = 15,
        strict: bool = True,
        allow_set_relation_comp: bool = False,
        cache_size: int = 1 << 20,
        fast_paths: bool = True,
    ):
        self.timeout = timeout
        self.max_length = max_length
        self.max_workers = max_workers or max(1, min(4, os.cpu_count() or 1))
        self.memory_limit_mb = memory_limit_mb
        self.verify_options = dict(
            float_rounding=float_rounding,
            numeric_precision=numeric_precision,
            strict=strict,
            allow_set_relation_comp=allow_set_relation_comp,
        )
        self.cache_size = cache_size
        self.fast_paths = fast_paths
        self._cache: dict[tuple, Verdict] = {}
        self._probes: dict[str, tuple] = {}

    def _pool(self) -> WorkerPool:
        return get_pool(self.max_workers, self.memory_limit_mb)

    def _probe(self, key: str, budget: list[float]) -> tuple | None:
        """The answer's probe (cached), or ``None`` when this check's time (``budget[0]`` s left) ran out first."""
        probe = self._probes.get(key)
        if probe is None:
            full = budget[0] >= self.timeout / 2
            probe, spent = self._pool().run(("probe", key), budget[0]) if budget[0] > 0 else (None, 0.0)
            budget[0] -= spent
            if probe is None:
                if not full:  # the other answer used the time: no judgement on this one
                    return None
                probe = _BAD_ANSWER
            if len(self._probes) >= self.cache_size:
                self._probes.clear()
            self._probes[key] = probe
        return probe

    def _probes_differ(self, pa: tuple, pb: tuple) -> bool:
        """Whether Math-Verify cannot find two probed answers equal (sound, not complete)."""
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
        if ka == kb and self.fast_paths:
            return Verdict.EQUAL
        cache_key = (kind, ka, kb) if kind == "gold" or ka < kb else (kind, kb, ka)
        verdict = self._cache.get(cache_key)
        if verdict is not None:
            return verdict
        if is_pathological(ka, self.max_length) or is_pathological(kb, self.max_length):
            return Verdict.UNVERIFIABLE
        budget = [self.timeout]  # seconds this check may still spend in workers
        complete = True  # whether the verdict had its whole time budget (only those are cached)
        verdict = _numeric_verdict(ka, kb) if self.fast_paths else None
        if verdict is None and self.fast_paths:
            pa = self._probe(ka, budget)
            pb = self._probe(kb, budget) if pa is not None else None
            if pa is None or pb is None:
                verdict, complete = Verdict.UNVERIFIABLE, False
            elif pa[0] in ("bad", "none") or pb[0] in ("bad", "none"):
                verdict = Verdict.UNVERIFIABLE
            elif self._probes_differ(pa, pb):
                verdict = Verdict.NOT_EQUAL
        if verdict is None:
            full = budget[0] >= self.timeout / 2
            task = ("verify", kind, ka, kb, self.verify_options)
            result, _ = self._pool().run(task, budget[0]) if budget[0] > 0 else (None, 0.0)
            verdict = Verdict.UNVERIFIABLE if result is None else Verdict.EQUAL if result else Verdict.NOT_EQUAL
            complete = result is not None or full
        if complete:
            if len(self._cache) >= self.cache_size:
                self._cache.clear()
            self._cache[cache_key] = verdict
        return verdict

    def _compare(self, a: str, b: str) -> Verdict:
        return self._decide("either", answer_key(a), answer_key(b))

    def compare_to_gold(self, pred: str | None, gold: str) -> Verdict:
        """Verdict of ``verify(gold, pred)`` (the graded direction); ``None`` or empty prediction -> NOT_EQUAL."""
        try:
            kp, kg = ("" if pred is None else answer_key(str(pred))), answer_key(str(gold))
            if not kp or not kg:
                return Verdict.NOT_EQUAL
            return self._decide("gold", kg, kp)
        except Exception:
            logger.debug("equivalence check failed", exc_info=True)
            return Verdict.UNVERIFIABLE

    def is_correct(self, pred: str | None, gold: str) -> bool:
        return self.compare_to_gold(pred, gold) is Verdict.EQUAL

    def warmup(self) -> None:
        """Start a worker now (the first also starts the process that forks them, ~1 s), so no check waits."""
        self._pool().warmup()

    def clear_cache(self) -> None:
        """Forget verdicts and probes (worker-side parse caches stay)."""
        self._cache.clear()
        self._probes.clear()


__all__ = ["SymbolicChecker", "is_pathological"]
