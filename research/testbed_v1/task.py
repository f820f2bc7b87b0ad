"""Testbed v1: the first testbed's arithmetic word problems and noisy-solver traces.

A problem is a start value and 2-4 operations (``+k``, ``-k``, ``*2``) whose values stay in ``[0, max_value]``; its
canonical form (start value and operations, not the wording) is hashed to its split by v2's
:func:`~hf_msv.testbed.task_v2.split_of`, so a problem is never in two of ``train`` / ``validation`` / ``evaluation``.
:func:`generate_problems` draws problems, :func:`make_trace` / :func:`make_trace_parts` write a trace (steps, ``Wait``
re-checks that restate the answer, a boxed final answer line), :func:`make_elicitation_example` a trace cut where an
answer is elicited; the prompt is v2's (:func:`~hf_msv.testbed.task_v2.format_prompt`). Knobs: :class:`TaskKnobs`.
What the LM trained on these traces shows: ``docs/testbed.md`` ("Testbed v1, for comparison").
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hf_msv.answers import ELICITATION_PROMPT
from hf_msv.data.problems import Problem
from hf_msv.testbed.task_v2 import (
    DELIMITER,
    SPLITS,
    apply_chain,
    apply_op,
    canonical,
    draw_distinct,
    final_answer_line,
    format_prompt,
    split_of,
)

SOURCE = "testbed-arith"
__all__ = [
    "DELIMITER",
    "ELICITATION_PROMPT",
    "GEN_KNOBS",
    "SOURCE",
    "SPLITS",
    "TaskKnobs",
    "apply_op",
    "format_prompt",
    "generate_problems",
    "make_elicitation_example",
    "make_trace",
    "make_trace_parts",
    "make_training_trace",
    "split_of",
]

_NAMES = ["Ann", "Bob", "Cy", "Dee", "Eli", "Fay", "Gus", "Ivy", "Jo", "Kim", "Lu", "Max", "Ned", "Oli", "Pam"]
_PRONOUN = {n: ("She" if n in {"Ann", "Dee", "Fay", "Ivy", "Kim", "Lu", "Pam"} else "He") for n in _NAMES}
_ITEMS = ["coins", "apples", "cards", "books", "shells", "stamps", "pens", "eggs"]
_ADD = ["{p} gets {k} more.", "{p} finds {k}.", "{p} buys {k}.", "Add {k}."]
_SUB = ["{p} loses {k}.", "{p} sells {k}.", "{p} eats {k}.", "Take {k} away."]
_MUL = {2: ["{p} doubles them.", "They double."], 3: ["{p} triples them.", "They triple."]}


@dataclass(frozen=True)
class TaskKnobs:
    """Difficulty knobs of the generator and of the noisy solver that writes the training traces."""

    min_steps: int = 2
    max_steps: int = 4
    max_start: int = 60  # start value in [2, max_start]
    max_operand: int = 9  # +k / -k with k in [1, max_operand]
    max_value: int = 99  # every intermediate value stays in [0, max_value]
    ops: str = "+-*"
    mul_factors: tuple = (2,)  # multipliers of "*" steps
    # noisy solver (training traces only)
    carry_error: float = 0.4  # P(forget the carry) on an addition that has one
    borrow_error: float = 0.75  # P(forget the borrow) on a subtraction that has one
    mul_error: float = 0.65  # P(drop the tens carry) on a multiplication that has one
    slip_error: float = 0.04  # P(off by 1 or 2) on any step
    fix_prob: float = 0.85  # P(a re-check fixes a wrong step)
    break_prob: float = 0.03  # P(a re-check breaks a correct step)
    # P(a re-check goes to the first step not yet re-checked that has a carry or borrow, a cue the LM can see);
    # else to a random step
    target_prob: float = 0.8
    wait_counts: tuple = (1, 2, 3, 4)
    wait_weights: tuple = (0.25, 0.35, 0.25, 0.15)


def _sample_chain(rng: random.Random, kn: TaskKnobs) -> tuple[int, list[tuple[str, int]]]:
    n_steps = rng.randint(kn.min_steps, kn.max_steps)
    v = rng.randint(2, kn.max_start)
    start, ops = v, []
    for _ in range(n_steps):
        choices = []
        if "+" in kn.ops and v + 1 <= kn.max_value:
            choices += ["+", "+"]
        if "-" in kn.ops and v >= 2:
            choices += ["-", "-"]
        if "*" in kn.ops and min(kn.mul_factors) * v <= kn.max_value and v >= 2:
            choices += ["*"]
        op = rng.choice(choices)
        if op == "+":
            k = rng.randint(1, min(kn.max_operand, kn.max_value - v))
        elif op == "-":
            k = rng.randint(1, min(kn.max_operand, v - 1))
        else:
            k = rng.choice([f for f in kn.mul_factors if f * v <= kn.max_value])
        ops.append((op, k))
        v = apply_op(v, op, k)
    return start, ops


def _question(rng: random.Random, start: int, ops: list[tuple[str, int]], kn: TaskKnobs) -> str:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    p = _PRONOUN[name]
    parts = [f"{name} has {start} {item}."]
    for o, k in ops:
        tpl = rng.choice(_ADD if o == "+" else _SUB if o == "-" else _MUL[k])
        parts.append(tpl.format(p=p, k=k))
    parts.append("How many?")
    return " ".join(parts)


def generate_problems(split: str, n: int, seed: int = 0, **knobs) -> list[Problem]:
    """``n`` distinct problems of ``split`` (deterministic in ``seed`` and the knobs).

    Knobs (see :class:`TaskKnobs`): ``min_steps``, ``max_steps``, ``max_start``, ``max_operand``, ``max_value``,
    ``ops``, ``mul_factors`` (the noisy-solver knobs only matter for :func:`make_trace`).
    """
    kn = TaskKnobs(**knobs)

    def build(chain, canon, i):
        start, ops = chain
        return Problem(
            id=f"{SOURCE}/{split}/{seed}/{i}",
            question=_question(rng, start, ops, kn),
            gold=str(apply_chain(start, ops)),
            source=SOURCE,
            meta={"canonical": canon, "start": start, "ops": [list(x) for x in ops], "split": split},
        )

    def sample(r):
        chain = _sample_chain(r, kn)
        return canonical(*chain), chain

    rng = random.Random(f"{split}/{seed}")
    return draw_distinct(split, n, rng, sample, build, knobs)


# ----------------------------------------------------------------------------------------------------------- traces
def _has_carry(a: int, op: str, k: int) -> bool:
    if op == "+":
        return (a % 10) + (k % 10) >= 10
    if op == "-":
        return (a % 10) < (k % 10)
    return (a % 10) * k >= 10


def _carry_error(a: int, op: str, k: int) -> int:
    c = apply_op(a, op, k)
    return c + 10 if op == "-" else c - 10 * ((a % 10) * k // 10 if op == "*" else 1)


def _slip(rng: random.Random, c: int) -> int:
    d = rng.choice([-2, -1, 1, 1, 2]) if c > 2 else rng.choice([1, 2])
    return c + d


def _noisy(rng: random.Random, a: int, op: str, k: int, kn: TaskKnobs) -> int:
    c = apply_op(a, op, k)
    p_err = kn.carry_error if op == "+" else kn.borrow_error if op == "-" else kn.mul_error
    if _has_carry(a, op, k) and rng.random() < p_err:
        c = _carry_error(a, op, k)
    if rng.random() < kn.slip_error:
        c = _slip(rng, c)
    return c


def _recheck(rng: random.Random, a: int, op: str, k: int, old: int, kn: TaskKnobs) -> int:
    true = apply_op(a, op, k)
    if old != true:
        return true if rng.random() < kn.fix_prob else old
    if rng.random() < kn.break_prob:
        return _carry_error(a, op, k) if _has_carry(a, op, k) else _slip(rng, true)
    return true


def _fmt(a: int, op: str, k: int, c: int) -> str:
    return f"{a}{op}{k}={c}"


def make_trace_parts(problem: Problem, rng: random.Random, **knobs) -> list[tuple[str, str]]:
    """The trace as ``(segment, current_answer)`` pairs: the concatenated segments are the trace body (without the
    final answer line); ``current_answer`` is the answer the trace stands at after the segment. Each ``Wait``
    segment starts with the delimiter, so cutting right after a ``Wait`` gives the previous segment's answer."""
    kn = TaskKnobs(**knobs)
    start = problem.meta["start"]
    ops = [tuple(x) for x in problem.meta["ops"]]
    vals = [start]
    steps = []
    for op, k in ops:
        c = _noisy(rng, vals[-1], op, k, kn)
        steps.append(_fmt(vals[-1], op, k, c))
        vals.append(c)
    parts = [(" " + ". ".join(steps) + f". So {vals[-1]}.", str(vals[-1]))]
    n_wait = rng.choices(kn.wait_counts, weights=kn.wait_weights)[0]
    checked = set()  # steps re-checked since they were last written
    for _ in range(n_wait):
        targets = [j for j, (op, k) in enumerate(ops) if j not in checked and _has_carry(vals[j], op, k)]
        i = targets[0] if targets and rng.random() < kn.target_prob else rng.randrange(len(ops))
        checked.add(i)
        op, k = ops[i]
        a, old = vals[i], vals[i + 1]
        new = _recheck(rng, a, op, k, old, kn)
        if new == old:
            parts.append((f" {DELIMITER}, {_fmt(a, op, k, old)} ok, so {vals[-1]}.", str(vals[-1])))
            continue
        redo = []
        vals[i + 1] = new
        for j in range(i + 1, len(ops)):
            op2, k2 = ops[j]
            vals[j + 1] = _noisy(rng, vals[j], op2, k2, kn)
            redo.append(_fmt(vals[j], op2, k2, vals[j + 1]))
            checked.discard(j)
        seg = f" {DELIMITER}, {_fmt(a, op, k, old)} no, {new}."
        if redo:
            seg += " " + ". ".join(redo) + "."
        seg += f" So {vals[-1]}."
        parts.append((seg, str(vals[-1])))
    return parts


def make_trace(problem: Problem, rng: random.Random, **knobs) -> str:
    """One sampled training trace (the continuation of :func:`format_prompt`), ending with the boxed final answer."""
    parts = make_trace_parts(problem, rng, **knobs)
    return "".join(s for s, _ in parts) + final_answer_line(parts[-1][1])


def make_training_trace(problem: Problem, rng: random.Random, **knobs) -> tuple[str, bool]:
    """:func:`make_trace` and whether it ends there (always: v1 traces are never cut), i.e. whether a training
    example puts EOS after it. The same random draws as :func:`make_trace`."""
    return make_trace(problem, rng, **knobs), True


def make_elicitation_example(problem: Problem, rng: random.Random, **knobs) -> tuple[str, str, str]:
    """A trace cut right after a random ``Wait`` (or, rarely, after a step, or after the trace's own final answer
    line: the paper elicits the terminal answer by appending the prompt to the finished sequence), for training
    elicitation.

    Returns ``(prefix, elicitation, answer)``: the LM is trained on ``prefix`` (as trace text) and on ``answer`` +
    EOS after ``elicitation``, never on emitting ``elicitation`` itself (so mid-trace it does not stop by itself)."""
    parts = make_trace_parts(problem, rng, **knobs)
    sep = rng.choice(["", "", " ", "\n"])
    where = rng.random()
    if where < 0.2:  # the finished trace, final answer line included
        answer = parts[-1][1]
        prefix = "".join(s for s, _ in parts) + final_answer_line(answer)
    elif len(parts) > 1 and where < 0.88:
        j = rng.randrange(1, len(parts))  # cut right after the delimiter of segment j
        prefix = "".join(s for s, _ in parts[:j]) + " " + DELIMITER
        answer = parts[j - 1][1]
    else:
        j = rng.randrange(1, len(parts) + 1)  # cut at the end of a segment
        prefix = "".join(s for s, _ in parts[:j])
        answer = parts[j - 1][1]
    return prefix, sep + ELICITATION_PROMPT, "{" + answer + "}"


GEN_KNOBS = ("min_steps", "max_steps", "max_start", "max_operand", "max_value", "ops", "mul_factors")
