"""Testbed v2: arithmetic word problems and the noisy solver that writes their reasoning traces.

A problem is a start value and 3-6 operations (``+k``/``-k``, ``*2``/``*3``) with values in ``[0, 99]``, and in
60 % of problems one irrelevant clause (``2 of them are red.``). :func:`generate_problems` draws problems by split
(:func:`split_of` hashes a problem's canonical form to its split, so no problem is in two splits; source
``testbed-arith-v2``); :func:`format_prompt` is the prompt an LM is conditioned on;
:func:`sample_trace` writes one trace (a :class:`TraceV2` of :class:`Piece` s with every piece's elicited answer and
its probability); :func:`make_trace`, :func:`make_training_trace` and :func:`make_elicitation_example` are what
sampling and LM training see; :func:`answer_distribution` is the elicitation rule's exact answer distribution;
:func:`trace_errors` / :func:`error_rates` count where a trace (the writer's or an LM's) departs from its problem.
Knobs: :class:`TaskKnobsV2` (validated by :func:`knobs_v2`).

The writer's mechanisms, the real-LM behaviour each one mirrors and the statistics of the shipped LM trained on its
traces: ``docs/testbed.md``.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import NamedTuple

from ..answers import ELICITATION_PROMPT
from ..data.problems import Problem
from ..errors import UserError

SOURCE = "testbed-arith-v2"
__all__ = [
    "DELIMITER",
    "ELICITATION_PROMPT",
    "GEN_KNOBS",
    "MAX_HEDGE",
    "SOURCE",
    "SPLITS",
    "Equation",
    "Piece",
    "TaskKnobsV2",
    "TraceV2",
    "answer_distribution",
    "apply_chain",
    "apply_op",
    "canonical",
    "carry_positions",
    "draw_distinct",
    "elicited_answer",
    "error_rates",
    "false_equations",
    "final_answer_line",
    "format_prompt",
    "generate_problems",
    "knobs_v2",
    "make_elicitation_example",
    "make_trace",
    "make_trace_parts",
    "make_training_trace",
    "sample_elicited_answer",
    "sample_trace",
    "split_of",
    "step_risk",
    "trace_errors",
    "trace_tokens",
    "written_equations",
]
DELIMITER = "Wait"
SPLITS = ("train", "validation", "evaluation")
# Buckets of the canonical hash (0-99) owned by each split.
_SPLIT_BUCKETS = {"train": range(0, 80), "validation": range(80, 90), "evaluation": range(90, 100)}
# The knobs of the problem generator (the others only shape traces)
GEN_KNOBS = (
    "min_steps",
    "max_steps",
    "max_start",
    "max_operand",
    "max_value",
    "ops",
    "mul_factors",
    "distractor_prob",
)


@dataclass(frozen=True)
class TaskKnobsV2:
    """Knobs of the v2 generator (problems) and of the noisy solver that writes the traces."""

    min_steps: int = 3
    max_steps: int = 6
    max_start: int = 60  # start value in [10, max_start]
    max_operand: int = 15  # +k / -k with k in [1, max_operand]
    max_value: int = 99  # every intermediate value of the true chain stays in [0, max_value]
    ops: str = "+-*"
    mul_factors: tuple = (2, 3)
    distractor_prob: float = 0.6  # P(the problem has an irrelevant clause "12 of them are broken.")
    # noisy solver: careful (step-by-step) error per carry / borrow, and per step
    carry_error: float = 0.08  # per carry
    borrow_error: float = 0.10  # per borrow (x4 across a zero digit)
    mul_error: float = 0.08  # per unit carried in a multiplication
    slip_error: float = 0.02
    mental_factor: float = 5.5  # a guess or a derived answer: per-carry errors times this (capped at 0.9)
    guess_prob: float = 0.55  # P(the chain opens with a one-line mental guess)
    notice_prob: float = 0.45  # P(an immediate Wait after a wrong step)
    false_alarm: float = 0.5  # P(an immediate Wait after a right step) = false_alarm * the step's risk
    recheck_factor: float = 0.3  # a re-check's error rate relative to the first computation
    persist_prob: float = 0.5  # P(a re-check of a wrong step repeats the same slip: the error is systematic)
    distractor_take: tuple = (0.8, 0.5, 0.25)  # P(a chain subtracts the irrelevant number), per wording
    reconsider_prob: float = 0.08  # P(a re-check questions the reading of the irrelevant clause instead)
    confirm_factor: float = 0.35  # a confirmed step's doubt is multiplied by this
    conflict_doubt: float = 0.5  # the doubt of a step whose re-check disagreed with it
    confident_doubt: float = 0.2  # re-check while the chain's doubt is above this
    self_check: float = 0.3  # elicitation's unease per wrong step standing in the chain (and per unlikely reading)
    overthink_prob: float = 0.85  # P(one more re-check when already confident)
    max_rechecks: int = 16
    max_trace_tokens: int = 272  # sampling cap (characters; the delimiter Wait is one token)

    def __post_init__(self):
        if not 1 <= self.min_steps <= self.max_steps:
            raise UserError(f"need 1 <= min_steps <= max_steps, got {self.min_steps}, {self.max_steps}")
        if not self.ops or set(self.ops) - set("+-*"):
            raise UserError(f"ops must be a non-empty subset of '+-*', got {self.ops!r}")
        if len(self.distractor_take) != len(_DISTRACTORS) or not all(0 <= p <= 1 for p in self.distractor_take):
            raise UserError(f"distractor_take needs {len(_DISTRACTORS)} probabilities, got {self.distractor_take!r}")
        if not (self.mul_factors and all(isinstance(f, int) and 2 <= f <= 9 for f in self.mul_factors)):
            raise UserError(f"mul_factors must be single digits in 2..9, got {self.mul_factors!r}")
        if not 10 <= self.max_start <= self.max_value or self.max_operand < 1:
            raise UserError("need 10 <= max_start <= max_value and max_operand >= 1")
        for f in fields(self):
            v = getattr(self, f.name)
            probability = f.name.endswith(("_error", "_prob", "_alarm", "_factor", "_doubt"))
            if probability and f.name != "mental_factor" and not 0.0 <= v <= 1.0:
                raise UserError(f"{f.name} must be a probability in [0, 1], got {v!r}")
        if self.mental_factor < 1.0 or self.max_rechecks < 0 or self.max_trace_tokens < 32:
            raise UserError("need mental_factor >= 1, max_rechecks >= 0, max_trace_tokens >= 32")


def knobs_v2(**knobs) -> TaskKnobsV2:
    """:class:`TaskKnobsV2` from keyword overrides; an unknown name is a ValueError listing the valid ones."""
    unknown = set(knobs) - {f.name for f in fields(TaskKnobsV2)}
    if unknown:
        raise UserError(f"unknown testbed-v2 knobs {sorted(unknown)}; valid: {[f.name for f in fields(TaskKnobsV2)]}")
    for name in ("mul_factors", "distractor_take"):  # JSON gives lists
        if name in knobs:
            knobs[name] = tuple(knobs[name])
    return TaskKnobsV2(**knobs)


# ------------------------------------------------------------------------------------ splits, problems, prompt
def canonical(start: int, ops: list[tuple[str, int]]) -> str:
    """A chain's canonical form: the start value and the operations, not the wording (``"38*2+17"``)."""
    return f"{start}" + "".join(f"{o}{k}" for o, k in ops)


def split_of(canon: str) -> str:
    """The split that owns a canonical problem (stable across Python runs and seeds)."""
    bucket = int.from_bytes(hashlib.sha256(canon.encode()).digest()[:4], "big") % 100
    for name, rng in _SPLIT_BUCKETS.items():
        if bucket in rng:
            return name
    raise AssertionError(bucket)


def apply_op(a: int, op: str, k: int) -> int:
    return a + k if op == "+" else a - k if op == "-" else a * k


def apply_chain(start: int, ops: list[tuple[str, int]]) -> int:
    """The value after applying every ``(op, k)`` of `ops` to `start` (a problem's gold answer)."""
    for op, k in ops:
        start = apply_op(start, op, k)
    return start


def draw_distinct(split: str, n: int, rng: random.Random, sample, build, knobs: dict) -> list[Problem]:
    """`n` problems of `split` with distinct canonical forms, by rejection: ``sample(rng) -> (canonical, item)``
    draws a candidate, kept when its canonical form is new and hashes to `split` (`split_of`); ``build(item,
    canonical, index) -> Problem`` makes the kept one (it may draw from `rng` too: the wording). Raises after
    ``200 n + 10,000`` draws (knobs too narrow for `n` distinct problems)."""
    if split not in SPLITS:
        raise UserError(f"split must be one of {SPLITS}, got {split!r}")
    out, seen, tries = [], set(), 0
    while len(out) < n:
        tries += 1
        if tries > 200 * n + 10_000:
            raise RuntimeError(f"could not generate {n} distinct {split} problems with {knobs}")
        canon, item = sample(rng)
        if canon in seen or split_of(canon) != split:
            continue
        seen.add(canon)
        out.append(build(item, canon, len(out)))
    return out


def format_prompt(problem: Problem) -> str:
    """The text the LM is conditioned on (the tokenizer adds BOS); the trace continues right after it."""
    return f"Q: {problem.question}\nA:"


def final_answer_line(answer: str) -> str:
    """The line that ends a finished trace: the elicitation prompt and the boxed answer."""
    return f"\n{ELICITATION_PROMPT}{{{answer}}}"


def _sample_chain(rng: random.Random, kn: TaskKnobsV2) -> tuple[int, list[tuple[str, int]]]:
    v = start = rng.randint(10, kn.max_start)
    ops = []
    for _ in range(rng.randint(kn.min_steps, kn.max_steps)):
        choices = [o for o in kn.ops if (o != "+" or v < kn.max_value) and (o != "-" or v >= 2)]
        if "*" in choices and not any(f * v <= kn.max_value for f in kn.mul_factors):
            choices.remove("*")
        op = rng.choice(choices)
        # operand size is itself a difficulty: one or two digits, equally often (one digit when max_operand < 10)
        big = rng.random() < 0.5 and kn.max_operand >= 10
        if op == "+":
            k = rng.randint(10 if big and kn.max_value - v >= 10 else 1, min(kn.max_operand, kn.max_value - v))
        elif op == "-":
            k = rng.randint(10 if big and v > 10 else 1, min(kn.max_operand, v - 1))
        else:
            k = rng.choice([f for f in kn.mul_factors if f * v <= kn.max_value])
        ops.append((op, k))
        v = apply_op(v, op, k)
    return start, ops


def _sample_distractor(rng: random.Random, start: int, ops: list[tuple[str, int]], kn: TaskKnobsV2):
    """``[position, number, wording index]`` of an irrelevant clause placed after ``position`` operations, or None."""
    if rng.random() >= kn.distractor_prob:
        return None
    pos = rng.randint(0, len(ops) - 1)
    v = start
    for op, k in ops[:pos]:
        v = apply_op(v, op, k)
    return [pos, rng.randint(1, min(kn.max_operand, max(1, v - 1))), rng.randrange(len(_DISTRACTORS))]


_DISTRACTORS = ["broken", "old", "red"]  # how tempting it is to subtract them: see TaskKnobsV2.distractor_take
_NAMES = ["Ann", "Bob", "Cy", "Dee", "Eli", "Fay", "Gus", "Ivy"]
_ITEMS = ["pens", "cards", "coins", "beads", "stamps", "shells"]
_WORDS = {
    "+": ["Gets {k}.", "Finds {k}.", "Buys {k}."],
    "-": ["Loses {k}.", "Sells {k}.", "Gives {k} away."],
    "*": ["Times {k}."],
}


def _question(rng: random.Random, start: int, ops: list[tuple[str, int]], distractor) -> str:
    # Short wording: 8-step prompts stay under ~150 characters, so prompt + capped trace fit a 512-token context.
    words = [f"{rng.choice(_NAMES)} has {start} {rng.choice(_ITEMS)}."]
    words += [rng.choice(_WORDS[o]).format(k=k) for o, k in ops]
    if distractor:
        pos, d, w = distractor
        words.insert(pos + 1, f"{d} of them are {_DISTRACTORS[w]}.")
    return " ".join(words + ["How many?"])


def generate_problems(split: str, n: int, seed: int = 0, **knobs) -> list[Problem]:
    """``n`` distinct v2 problems of ``split`` (deterministic in ``seed`` and the knobs; solver knobs ignored)."""
    kn = knobs_v2(**knobs)

    def sample(r):
        start, ops = _sample_chain(r, kn)
        distractor = _sample_distractor(r, start, ops, kn)
        canon = canonical(start, ops) + ("|{}:{}:{}".format(*distractor) if distractor else "")
        return canon, (start, ops, distractor)

    def build(item, canon, i):
        start, ops, distractor = item
        meta = {
            "canonical": canon,
            "start": start,
            "ops": [list(x) for x in ops],
            "distractor": distractor,
            "split": split,
        }
        return Problem(
            id=f"{SOURCE}/{split}/{seed}/{i}",
            question=_question(rng, start, ops, distractor),
            gold=str(apply_chain(start, ops)),
            source=SOURCE,
            meta=meta,
        )

    rng = random.Random(f"{SOURCE}/{split}/{seed}")
    return draw_distinct(split, n, rng, sample, build, knobs)


# ------------------------------------------------------------------------------------------------ the arithmetic
def _digits(x: int) -> list[int]:
    return [int(c) for c in reversed(str(x))]


def _columns(a: int, op: str, k: int, drop: frozenset = frozenset()) -> tuple[int, list[tuple[int, int]]]:
    """Column arithmetic of ``a op k`` forgetting the carries/borrows out of the columns in ``drop``.

    Returns ``(result, carries)``: per carry / borrow into a higher column, ``(column, hardness)``; hardness is the
    carried amount for ``*`` (carrying 7 is harder than carrying 1), 4 for a borrow across a zero digit (the
    classic "borrow across zero" bug) and 1 otherwise. The carry out of the top column (a new leading digit) is
    never dropped. ``*`` takes a single-digit ``k``; ``-`` needs ``a >= k``."""
    da, dk = _digits(a), ([] if op == "*" else _digits(k))
    carry, out, cols, width = 0, [], [], max(len(da), len(dk))
    for j in range(width):
        x, y = da[j] if j < len(da) else 0, dk[j] if j < len(dk) else 0
        s = x * k + carry if op == "*" else x + y + carry if op == "+" else x - y - carry
        out.append(s % 10)
        carry = int(s < 0) if op == "-" else s // 10
        if carry and j < width - 1:
            across_zero = op == "-" and da[j + 1] == 0
            cols.append((j, carry if op == "*" else 4 if across_zero else 1))
            if j in drop:
                carry = 0
    value = sum(d * 10**j for j, d in enumerate(out)) + (carry * 10 ** len(out) if op != "-" else 0)
    return value, cols


def _columnable(a: int, op: str, k: int) -> bool:
    return a >= 0 and (op != "-" or a >= k) and (op != "*" or 2 <= k <= 9)


def carry_positions(a: int, op: str, k: int) -> list[tuple[int, int]]:
    """``(column, hardness)`` of each carry / borrow of ``a op k`` into a higher column (what makes a step risky)."""
    return _columns(a, op, k)[1] if _columnable(a, op, k) else []


def _rates(a: int, op: str, k: int, kn: TaskKnobsV2, scale: float) -> list[tuple[int, float]]:
    """Per carry column, P(the solver drops it) at error ``scale``."""
    base = kn.carry_error if op == "+" else kn.borrow_error if op == "-" else kn.mul_error
    return [(j, min(0.9, base * h * scale)) for j, h in carry_positions(a, op, k)]


def step_risk(a: int, op: str, k: int, kn: TaskKnobsV2, scale: float = 1.0) -> float:
    """P(the solver gets ``a op k`` wrong) at error ``scale`` (1: careful; ``mental_factor``: in the head): a
    function of the digits a reader sees."""
    p_right = 1.0 - min(0.9, kn.slip_error * scale)
    for _, r in _rates(a, op, k, kn, scale):
        p_right *= 1.0 - r
    return 1.0 - p_right


def _compute(rng: random.Random | None, a: int, op: str, k: int, kn: TaskKnobsV2, scale: float) -> tuple[int, float]:
    """One noisy computation of ``a op k``: ``(value, probability of the error pattern drawn)``; ``rng=None``
    takes the most likely pattern (what greedy decoding of an imitating LM gives)."""
    if not _columnable(a, op, k):  # a noisy chain left the task's range: plain arithmetic
        return apply_op(a, op, k), 1.0
    drop, prob = set(), 1.0
    for j, r in _rates(a, op, k, kn, scale):
        dropped = r > 0.5 if rng is None else rng.random() < r
        if dropped:
            drop.add(j)
        prob *= r if dropped else 1.0 - r
    value = _columns(a, op, k, frozenset(drop))[0]
    slip = min(0.9, kn.slip_error * scale)
    if rng is not None and rng.random() < slip:
        value = max(0, value + rng.choice([-2, -1, 1, 1, 2]))
        prob *= slip / 5
    else:
        prob *= 1.0 - slip
    return value, prob


def _mental(rng: random.Random | None, v: int, ops: list[tuple[str, int]], kn: TaskKnobsV2) -> tuple[int, float]:
    """The remaining ``ops`` done in the head from ``v``: ``(value, probability of the path)``; ``rng=None``: the
    most likely path."""
    prob = 1.0
    for op, k in ops:
        v, p = _compute(rng, v, op, k, kn, kn.mental_factor)
        prob *= p
    return v, prob


def _compute_dist(a: int, op: str, k: int, kn: TaskKnobsV2, scale: float) -> dict[int, float]:
    """The exact distribution of :func:`_compute`'s value: every drop pattern of the carries, then every slip."""
    if not _columnable(a, op, k):
        return {apply_op(a, op, k): 1.0}
    rates, slip = _rates(a, op, k, kn, scale), min(0.9, kn.slip_error * scale)
    # _compute's slip draws from [-2, -1, 1, 1, 2]: +1 twice as often
    slips = [(1.0 - slip, 0)] + [(slip * n / 5, dv) for dv, n in ((-2, 1), (-1, 1), (1, 2), (2, 1)) if slip]
    out: dict[int, float] = {}
    for pattern in itertools.product((False, True), repeat=len(rates)):
        p = math.prod(r if dropped else 1.0 - r for (_, r), dropped in zip(rates, pattern))
        v = _columns(a, op, k, frozenset(j for (j, _), dropped in zip(rates, pattern) if dropped))[0]
        for w, dv in slips:
            key = v if dv == 0 else max(0, v + dv)
            out[key] = out.get(key, 0.0) + p * w
    return out


def _mental_dist(v: int, ops, kn: TaskKnobsV2) -> dict[int, float]:
    """The exact distribution of :func:`_mental`'s value: ``{value: probability}``."""
    dist = {v: 1.0}
    for op, k in ops:
        nxt: dict[int, float] = {}
        for a, pa in dist.items():
            for b, pb in _compute_dist(a, op, k, kn, kn.mental_factor).items():
                nxt[b] = nxt.get(b, 0.0) + pa * pb
        dist = nxt
    return dist


# -------------------------------------------------------------------------------------------------------- traces
@dataclass
class Piece:
    """One piece of a trace and the answer an elicitation right after it gives.

    ``value`` is the last value written and ``rest`` the operations (as the chain reads the problem) not yet done
    from it: none, the answer is stated and an elicitation copies it; some, they are done mentally (derived)."""

    text: str
    kind: str  # "guess", "step", "so", "check" (a re-check that confirms), "fix" (one that disagrees), "reread"
    value: int
    rest: tuple
    wait: bool = False  # the piece opens a segment with the delimiter
    mid: bool = False  # a re-check inside a pass (mid-computation)
    doubt: float = 0.0  # the chain's doubt when the piece ends (visible: a function of the steps written so far)
    unease: float = 0.0  # what self-evaluation adds to the doubt at an elicitation here (see TaskKnobsV2.self_check)
    reading_unease: float = 0.0  # the part of ``unease`` that is the clause reading (what the text shows of it)
    answer: str = ""  # the greedy (most likely) elicited answer
    derived: bool = False
    answer_prob: float = 1.0  # its probability: 1 - hedge for a stated answer, the mental path's if derived


class Equation(NamedTuple):
    """One equation written in a v2 trace: ``a op k = result``; ``checked`` for a re-check (``a op k = result?``),
    whose ``fix`` is the value it replaces ``result`` with (``? no, fix.``; None when it confirms)."""

    a: int
    op: str
    k: int
    result: int
    checked: bool
    fix: int | None

    @property
    def true(self) -> bool:
        return apply_op(self.a, self.op, self.k) == self.result


_EQUATION = re.compile(r"(-?\d+)([+*-])(\d+)=(-?\d+)(\?)?(?: no, (-?\d+))?")


def written_equations(text: str) -> list[Equation]:
    """The equations of a v2 trace (the solver's or an LM's) in order, as a reader parses them."""
    return [
        Equation(int(a), op, int(k), int(r), bool(q), int(f) if f else None)
        for a, op, k, r, q, f in _EQUATION.findall(text)
    ]


def false_equations(text: str) -> int:
    """Written steps ``a op k = c`` (not the ``?`` re-checks) that are arithmetically false."""
    return sum(not e.checked and not e.true for e in written_equations(text))


# a written step and a Wait right after it
_STEP_THEN = re.compile(r"(-?\d+)([+*-])(\d+)=(-?\d+)\.\s*(Wait)?")


def trace_errors(texts: list[str], problem: Problem) -> Counter:
    """Counts of where v2 traces (an LM's or the writer's, counted alike) depart from ``problem``: written equations
    ``a op k = c`` (not the ``?`` re-checks) that are false, split by whether the step has a carry / borrow
    (``false_plain`` / ``eqs_plain``, ``false_carry`` / ``eqs_carry``); equations whose ``op k`` is in neither the
    question nor its irrelevant clause (``operand_misreads``); first-pass equations that do not start from the value
    written before (``copy_slips`` / ``first_pass_eqs``); final boxes that differ from the last ``So X.``; and how
    often a written step is followed at once by ``Wait``, for false and for true steps (``wait_after_false`` /
    ``steps_false``: does the writer notice its own slips?). :func:`error_rates` turns them into rates."""
    ops = {(op, int(k)) for op, k in problem.meta["ops"]}
    if problem.meta.get("distractor"):
        ops.add(("-", int(problem.meta["distractor"][1])))
    c = Counter()
    for text in texts:
        prev = problem.meta["start"]
        for e in written_equations(text.split(" So ")[0]):  # the first pass
            if not e.checked:
                c["first_pass_eqs"] += 1
                c["copy_slips"] += e.a != prev
                prev = e.result
            elif e.fix is not None:  # "Wait, a op k = r? no, x.": the pass goes on from x
                prev = e.fix
        for e in written_equations(text):
            if not e.checked:
                carry = bool(carry_positions(e.a, e.op, e.k)) if 0 <= e.a <= 999 else True
                c["eqs_carry" if carry else "eqs_plain"] += 1
                c["false_carry" if carry else "false_plain"] += not e.true
                c["operand_misreads"] += (e.op, e.k) not in ops
        for a, op, k, r, wait in _STEP_THEN.findall(text):
            kind = "true" if apply_op(int(a), op, int(k)) == int(r) else "false"
            c[f"steps_{kind}"] += 1
            c[f"wait_after_{kind}"] += bool(wait)
        so, box = re.findall(r"So (-?\d+)\.", text), re.findall(r"\\boxed\{([^}]*)\}", text)
        if so and box:
            c["finished_with_so"] += 1
            c["box_differs_from_so"] += box[-1] != so[-1]
    return c


def error_rates(c: Counter) -> dict:
    """:func:`trace_errors`' counts as rates (nan where nothing was counted)."""

    def rate(num, den):
        return round(c[num] / c[den], 4) if c[den] else float("nan")

    c = Counter(c)
    c.update(eqs=c["eqs_plain"] + c["eqs_carry"])
    return {
        "false_eq_plain": rate("false_plain", "eqs_plain"),
        "false_eq_carry": rate("false_carry", "eqs_carry"),
        "operand_misread": rate("operand_misreads", "eqs"),
        "copy_slip": rate("copy_slips", "first_pass_eqs"),
        "box_differs_from_so": rate("box_differs_from_so", "finished_with_so"),
        "wait_after_false": rate("wait_after_false", "steps_false"),
        "wait_after_true": rate("wait_after_true", "steps_true"),
    }


def trace_tokens(text: str) -> int:
    """Tokens of ``text`` for the char-level testbed tokenizer (``Wait`` is one token; BOS/EOS not counted)."""
    return len(text) - (len(DELIMITER) - 1) * text.count(DELIMITER)


TARGET_MOST_DOUBTFUL = 0.8  # P(a re-check goes to the most doubtful step; else to one drawn by doubt)


class _Solver:
    """Writes one trace as a list of pieces (the policy: ``docs/testbed.md``)."""

    def __init__(self, problem: Problem, rng: random.Random, kn: TaskKnobsV2):
        self.rng, self.kn = rng, kn
        self.distractor = problem.meta.get("distractor")
        self.ops, self.taken = _reading(problem, rng, kn)
        self.n = len(self.ops)
        self.vals = [problem.meta["start"]] + [None] * self.n
        self.doubt = [0.0] * self.n
        self.pieces: list[Piece] = []
        self.reconsidered = False

    def add(self, text, kind, i_next, **kw):
        value = self.vals[i_next] if kind != "guess" else kw.pop("value")
        kw.setdefault("doubt", self.chain_doubt())
        kw.setdefault("unease", self.unease())
        kw.setdefault("reading_unease", self.kn.self_check * self.reading())
        self.pieces.append(Piece(text, kind, value, tuple(self.ops[i_next:]) if kind != "guess" else (), **kw))

    def guess(self) -> float:
        """``About X.``: the whole chain in the head; returns the solver's doubt in it (visible difficulty)."""
        g, _ = _mental(self.rng, self.vals[0], self.ops, self.kn)
        true, p_right = self.vals[0], 1.0
        for op, k in self.ops:
            p_right *= 1.0 - step_risk(true, op, k, self.kn, self.kn.mental_factor)
            true = apply_op(true, op, k)
        self.add(f" About {g}.", "guess", 0, value=g, doubt=1.0 - p_right)
        return 1.0 - p_right

    def run_pass(self, i0: int, prefix: str = "") -> None:
        """Steps ``i0..n-1`` written out; after each, an immediate re-check when the solver doubts it."""
        for i in range(i0, self.n):
            (op, k), a = self.ops[i], self.vals[i]
            self.vals[i + 1], _ = _compute(self.rng, a, op, k, self.kn, 1.0)
            risk = step_risk(a, op, k, self.kn)
            self.doubt[i] = risk
            self.add(f"{prefix} {a}{op}{k}={self.vals[i + 1]}.", "step", i + 1, wait=prefix.startswith(" Wait"))
            prefix = ""
            wrong = self.vals[i + 1] != apply_op(a, op, k)
            if self.rng.random() < (self.kn.notice_prob if wrong else self.kn.false_alarm * risk):
                self.recheck(i, mid=True)

    def recheck(self, i: int, mid: bool) -> bool:
        """Recompute step ``i`` carefully; a disagreement replaces it (a fix, or a break). True if it changed."""
        (op, k), a, old = self.ops[i], self.vals[i], self.vals[i + 1]
        if old != apply_op(a, op, k) and self.rng.random() < self.kn.persist_prob:
            new = old  # the same misconception again
        else:
            new, _ = _compute(self.rng, a, op, k, self.kn, self.kn.recheck_factor)
        head = f" {DELIMITER}, {a}{op}{k}={old}?"
        if new == old:
            self.doubt[i] *= self.kn.confirm_factor
            self.add(head + " yes.", "check", i + 1 if mid else self.n, wait=True, mid=mid)
            return False
        self.vals[i + 1], self.doubt[i] = new, self.kn.conflict_doubt
        self.add(head + f" no, {new}.", "fix", i + 1, wait=True, mid=mid)
        return True

    def unease(self) -> float:
        """Self-evaluation's unease about the chain so far: ``self_check`` per written step that is wrong, and per
        clause reading as unlikely as its wording makes it (``1 - distractor_take``: subtracting the "red" ones)."""
        written = zip(self.vals, self.vals[1:], self.ops)
        wrong = sum(None not in (a, b) and b != apply_op(a, op, k) for a, b, (op, k) in written)
        return self.kn.self_check * (wrong + self.reading())

    def reading(self) -> float:
        """How unlikely the clause reading is, while taken: ``1 - distractor_take`` of its wording (else 0)."""
        if not self.taken or self.distractor is None:
            return 0.0
        return 1.0 - self.kn.distractor_take[self.distractor[2]]

    def say_so(self) -> None:
        self.add(f" So {self.vals[self.n]}.", "so", self.n)

    def chain_doubt(self) -> float:
        p_right = 1.0
        for d in self.doubt:
            p_right *= 1.0 - d
        return 1.0 - p_right

    def reread(self) -> None:
        """Question the reading of the irrelevant clause (once): drop its subtraction, or take it, and redo."""
        self.reconsidered = True
        assert self.distractor is not None  # only a problem with a distractor clause is reread
        pos, d, w = self.distractor
        if self.taken:
            text = f" {DELIMITER}, the {_DISTRACTORS[w]} ones still count."
            del self.ops[pos], self.vals[pos + 1], self.doubt[pos]
        else:
            text = f" {DELIMITER}, {d} are {_DISTRACTORS[w]}, take them away."
            self.ops.insert(pos, ("-", d))
            self.vals.insert(pos + 1, None)
            self.doubt.insert(pos, 0.0)
        self.taken, self.n = not self.taken, len(self.ops)
        self.add(text, "reread", pos, wait=True)
        self.run_pass(pos)
        self.say_so()

    def end_loop(self) -> None:
        """Re-check the most doubtful step until confident (or once more, overthinking); a fix redoes the rest."""
        for _ in range(self.kn.max_rechecks):
            if self.chain_doubt() <= self.kn.confident_doubt and self.rng.random() >= self.kn.overthink_prob:
                return
            if self.distractor and not self.reconsidered and self.rng.random() < self.kn.reconsider_prob:
                self.reread()
                continue
            if self.rng.random() < TARGET_MOST_DOUBTFUL:
                i = max(range(self.n), key=lambda j: self.doubt[j])
            else:
                i = self.rng.choices(range(self.n), weights=[d + 0.01 for d in self.doubt])[0]
            if self.recheck(i, mid=False):
                self.run_pass(i + 1)
                self.say_so()


def _reading(problem: Problem, rng: random.Random, kn: TaskKnobsV2) -> tuple[list[tuple[str, int]], bool]:
    """The operations as one chain reads the problem: the irrelevant clause taken as a subtraction or not.

    Models take irrelevant but relevant-looking clauses into account, consistently (Mirzadeh et al. 2024,
    GSM-NoOp: "five of them were smaller than average" gets subtracted), and more so the more relevant the wording
    looks; re-checking the arithmetic does not undo the reading. One draw from :func:`_readings`."""
    readings = _readings(problem, kn)
    if len(readings) == 2 and rng.random() < readings[0][0]:
        return readings[0][1], True
    return readings[-1][1], False


def _readings(problem: Problem, kn: TaskKnobsV2) -> list[tuple[float, list[tuple[str, int]]]]:
    """Every reading of the problem with its probability, ``[(probability, ops), ...]``: with an irrelevant clause,
    first the clause taken (its wording's ``distractor_take``), then not; else the one reading (fresh lists)."""
    ops = [tuple(x) for x in problem.meta["ops"]]
    d = problem.meta.get("distractor")
    if not d:
        return [(1.0, ops)]
    take = kn.distractor_take[d[2]]
    return [(take, ops[: d[0]] + [("-", d[1])] + ops[d[0] :]), (1.0 - take, ops)]


MAX_HEDGE = 0.45  # an elicited stated answer stays the most likely one, however doubtful the chain


def _hedge(piece: Piece) -> float:
    """P(an elicitation at a stated answer answers a fresh recomputation instead of copying it)."""
    return min(MAX_HEDGE, piece.doubt + piece.unease)


def _elicit(piece: Piece, kn: TaskKnobsV2) -> None:
    """Set the piece's greedy elicited answer and its probability (see :func:`sample_elicited_answer`)."""
    if not piece.rest:
        piece.answer, piece.derived, piece.answer_prob = str(piece.value), False, 1.0 - _hedge(piece)
    else:
        v, prob = _mental(None, piece.value, list(piece.rest), kn)
        piece.answer, piece.derived, piece.answer_prob = str(v), True, prob


def sample_elicited_answer(piece: Piece, problem: Problem, rng: random.Random, **knobs) -> str:
    """An answer drawn from the elicitation rule after ``piece`` (what an elicitation training example teaches).

    Mid-computation: the rest done mentally from the last written value. At a stated answer: that answer, except
    with probability ``min(MAX_HEDGE, doubt + unease)`` a fresh mental recomputation of the whole problem, so the
    answer's probability is the chain's confidence (reasoning LMs' trial answers are confident when the reasoning
    is: Yang et al. 2025, DEER; Zhang et al. 2025). The most likely answer is ``piece.answer`` either way."""
    kn = knobs_v2(**knobs)
    if piece.rest:
        return str(_mental(rng, piece.value, list(piece.rest), kn)[0])
    if rng.random() < _hedge(piece):
        return str(_mental(rng, problem.meta["start"], _reading(problem, rng, kn)[0], kn)[0])
    return str(piece.value)


def answer_distribution(piece: Piece, problem: Problem, **knobs) -> dict[str, float]:
    """The exact distribution :func:`sample_elicited_answer` draws from after ``piece``: ``{answer: probability}``.

    What an LM that learnt the elicitation rule perfectly would give (the writer's own answer probability)."""
    kn = knobs_v2(**knobs)
    if piece.rest:
        return {str(v): p for v, p in _mental_dist(piece.value, piece.rest, kn).items()}
    hedge = _hedge(piece)
    out = {str(piece.value): 1.0 - hedge}
    for w, ops in _readings(problem, kn):
        for v, p in _mental_dist(problem.meta["start"], ops, kn).items():
            out[str(v)] = out.get(str(v), 0.0) + hedge * w * p
    return out


def elicited_answer(pieces: list[Piece], upto: int) -> Piece:
    """The piece whose answer an elicitation after ``pieces[:upto]`` gives (``upto`` >= 1)."""
    if upto < 1:
        raise ValueError("an elicitation needs at least one complete piece before it")
    return pieces[upto - 1]


@dataclass
class TraceV2:
    """One sampled v2 trace: the solver's full text, and what a sampler capped at ``max_trace_tokens`` sees.

    ``pieces`` tile ``text`` up to the final answer line; ``capped_pieces`` are the pieces complete within the cap.
    ``terminal`` is the piece whose answer the terminal elicitation gives (the last complete one; for a finished
    trace, its ``So X.``); ``wait_pieces`` are the indices of the pieces that open with a ``Wait`` within the cap
    (the elicitation at ``Wait`` j answers as ``pieces[j - 1]``)."""

    pieces: list[Piece]
    text: str  # full: every piece + the final answer line
    capped_text: str  # the first max_trace_tokens tokens of text
    finished: bool  # the final answer line fits within the cap
    capped_pieces: int
    wait_pieces: list[int] = field(default_factory=list)
    final_answer: str = ""  # the answer the solver's own final line boxes
    took_clause: bool = False  # the chain's last reading subtracts the irrelevant clause (a misreading)

    @property
    def terminal(self) -> Piece:
        return self.pieces[self.capped_pieces - 1]

    @property
    def waits(self) -> list[Piece]:
        """Per ``Wait`` within the cap, the piece whose answer the elicitation there gives."""
        return [self.pieces[j - 1] for j in self.wait_pieces]


def _cut(text: str, max_tokens: int) -> str:
    out = []
    for used, tok in enumerate(_token_pieces(text)):
        if used == max_tokens:
            break
        out.append(tok)
    return "".join(out)


def _token_pieces(text: str):
    i = 0
    while i < len(text):
        if text.startswith(DELIMITER, i):
            yield DELIMITER
            i += len(DELIMITER)
        else:
            yield text[i]
            i += 1


def sample_trace(problem: Problem, rng: random.Random, **knobs) -> TraceV2:
    """One trace of the v2 noisy solver for ``problem`` (a ``testbed-arith-v2`` problem), with every piece's
    greedy elicited answer (the most likely one under the elicitation rule) and its probability."""
    kn = knobs_v2(**knobs)
    s = _Solver(problem, rng, kn)
    prefix = ""
    if rng.random() < kn.guess_prob:
        if s.guess() <= kn.confident_doubt and rng.random() >= kn.overthink_prob:
            s.vals[-1] = s.pieces[0].value  # confident in the guess: it is the answer
            s.add(f" So {s.vals[-1]}.", "so", s.n)
            return _finish(s, problem, rng, kn)
        prefix = f" {DELIMITER}, step by step:"
    s.run_pass(0, prefix)
    s.say_so()
    s.end_loop()
    return _finish(s, problem, rng, kn)


def _finish(s: _Solver, problem: Problem, rng: random.Random, kn: TaskKnobsV2) -> TraceV2:
    for p in s.pieces:
        _elicit(p, kn)
    body = "".join(p.text for p in s.pieces)
    final = s.pieces[-1].answer
    text = body + final_answer_line(final)
    finished = trace_tokens(text) <= kn.max_trace_tokens
    used, complete, waits = 0, 0, []
    for j, p in enumerate(s.pieces):
        if p.wait and used + trace_tokens(p.text[: p.text.index(DELIMITER) + len(DELIMITER)]) <= kn.max_trace_tokens:
            waits.append(j)
        used += trace_tokens(p.text)
        complete += used <= kn.max_trace_tokens
    if complete == 0:  # the cap cuts the first piece: everything is still to be done in the head
        start = Piece("", "step", s.vals[0], tuple(s.ops))
        _elicit(start, kn)
        s.pieces.insert(0, start)
        complete, waits = 1, [j + 1 for j in waits]
    capped = text if finished else _cut(text, kn.max_trace_tokens)
    return TraceV2(s.pieces, text, capped, finished, complete, waits, final, s.taken)


def make_trace(problem: Problem, rng: random.Random, **knobs) -> str:
    """One sampled trace as a sampler capped at ``max_trace_tokens`` sees it (the continuation of
    :func:`format_prompt`): ending with the boxed final answer line when it finished, cut mid-text (no final line:
    do not append EOS to train on it) when the cap binds. ``sample_trace(...).text`` is the uncapped text."""
    return sample_trace(problem, rng, **knobs).capped_text


def make_training_trace(problem: Problem, rng: random.Random, **knobs) -> tuple[str, bool]:
    """:func:`make_trace` and whether the trace finished within the cap: a training example puts EOS after a
    finished trace only, so the LM learns to keep going at the cap (sampling stops it there, by
    ``max_new_tokens``) instead of ending cut traces itself. The same random draws as :func:`make_trace`."""
    t = sample_trace(problem, rng, **knobs)
    return t.capped_text, t.finished


def make_trace_parts(problem: Problem, rng: random.Random, **knobs) -> list[tuple[str, str]]:
    """The uncapped trace as ``(segment, answer)`` pairs: each segment after the first opens with the delimiter;
    ``answer`` is the greedy answer an elicitation at the end of the segment (so: at the next ``Wait``) gives,
    copied or derived by the elicitation rule."""
    parts: list[list] = []
    for p in sample_trace(problem, rng, **knobs).pieces:
        if p.wait or not parts:
            parts.append([p.text, p.answer])
        else:
            parts[-1][0] += p.text
            parts[-1][1] = p.answer
    return [(seg, ans) for seg, ans in parts]


def make_elicitation_example(problem: Problem, rng: random.Random, **knobs) -> tuple[str, str, str]:
    """A capped trace cut where answers are elicited, for training elicitation: ``(prefix, elicitation, answer)``.

    20 %: the whole capped trace (the paper's terminal elicitation: finished traces keep their own final line, cut
    ones are answered from their last complete piece); 65 %: right after a random ``Wait``; else after a random
    piece. The LM trains on ``prefix`` as trace text and on ``answer`` + EOS, never on ``elicitation`` itself."""
    t = sample_trace(problem, rng, **knobs)
    sep, where = rng.choice(["", "", " ", "\n"]), rng.random()
    if where < 0.2:
        prefix, piece = t.capped_text, t.terminal
    elif t.wait_pieces and where < 0.85:
        j = rng.choice(t.wait_pieces)
        prefix = "".join(p.text for p in t.pieces[:j]) + " " + DELIMITER
        piece = elicited_answer(t.pieces, j)
    else:
        j = rng.randint(1, t.capped_pieces)
        prefix, piece = "".join(p.text for p in t.pieces[:j]), elicited_answer(t.pieces, j)
    answer = "{" + sample_elicited_answer(piece, problem, rng, **knobs) + "}"
    return prefix, sep + ELICITATION_PROMPT, answer
