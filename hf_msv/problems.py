"""Problems: a question with a gold answer, from a benchmark file or the testbed generator."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Problem:
    """One problem to sample chains of thought for.

    Args:
        id: stable identifier, unique within its source (e.g. ``"gsm8k/17"``); shards and reports key on it.
        question: the text shown to the LM.
        gold: the gold answer, normalised for grading (what goes inside ``\\boxed{}``).
        source: the benchmark or generator it came from.
        meta: anything else the source provides (level, subject, answer type, ...).
    """

    id: str
    question: str
    gold: str
    source: str = ""
    meta: dict = field(default_factory=dict, compare=False, hash=False)
