"""Problems: a question with a gold answer, and the benchmark loaders (files in ``$HF_MSV_DATA_DIR``)."""

from __future__ import annotations

import csv
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..answers import extract_last_boxed
from ..errors import MissingPathError, UserError


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


# ------------------------------------------------------------------------------------------- benchmark loaders

DATA_DIR_ENV = "HF_MSV_DATA_DIR"


def default_data_dir() -> Path:
    """Where benchmark files live: ``$HF_MSV_DATA_DIR``, else ``../shared/data`` from the working directory, else
    ``../shared/data`` from the repository root. The files are read in place, never copied into the repository."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env)
    candidates = [
        Path.cwd() / ".." / "shared" / "data",
        Path(__file__).resolve().parents[1] / ".." / "shared" / "data",
    ]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate.resolve()
    return candidates[-1]


# Some JSON sources lost a backslash so that "\frac" became form feed + "rac" (likewise "\b" -> backspace).
_CONTROL_ESCAPES = {"\f": "\\f", "\b": "\\b"}
_DELIMITERS = [("\\[", "\\]"), ("\\(", "\\)"), ("$$", "$$"), ("$", "$")]
_INLINE_MATH_RE = re.compile(r"\\\((.+?)\\\)|\$(.+?)\$", re.S)


def clean_latex_answer(answer: str) -> str:
    """A gold LaTeX answer as it goes inside ``\\boxed{}``: outer math delimiters and ``\\boxed`` removed.

    An answer written as a sentence (``The smallest value is \\(248\\).``) keeps its last inline formula.
    """
    s = "".join(_CONTROL_ESCAPES.get(c, c) for c in answer).strip()
    boxed = extract_last_boxed(s)
    if boxed is not None:
        return boxed
    for left, right in _DELIMITERS:
        if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
            inner = s[len(left) : len(s) - len(right)]
            if left not in inner:  # "$a$ and $b$" is not one formula
                return inner.strip()
    if re.search(r"[A-Za-z]{3,}\s+[A-Za-z]{3,}", _INLINE_MATH_RE.sub("", s)):  # prose around the formulas
        formulas = _INLINE_MATH_RE.findall(s)
        if formulas:
            return next(f for f in formulas[-1] if f).strip()
    return s


def _integer(answer) -> str:
    """``"025"`` -> ``"25"``, ``27.0`` -> ``"27"``; non-integral values are kept as written."""
    value = float(answer)
    return str(int(value)) if value.is_integer() else str(answer).strip()


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _problem(name: str, native_id, index: int, question: str, gold: str, row: dict, drop: tuple) -> Problem:
    meta = {k: v for k, v in row.items() if k not in drop and v is not None}
    ident = index if native_id is None or native_id == "" else native_id
    return Problem(id=f"{name}/{ident}", question=question.strip(), gold=gold, source=name, meta=meta)


def _parse_gsm8k(path: Path, name: str) -> list[Problem]:
    problems = []
    for i, row in enumerate(_read_jsonl(path)):
        solution, _, final = row["answer"].rpartition("####")
        gold = final.strip().replace(",", "")
        problems.append(_problem(name, None, i, row["question"], gold, {"solution": solution.strip()}, ()))
    return problems


def _parse_latex_jsonl(path: Path, name: str) -> list[Problem]:
    """MATH-500 and Omni-MATH: ``problem`` + LaTeX ``answer``. Omni's "A OR B" keeps A; all kept in meta."""
    problems = []
    for i, row in enumerate(_read_jsonl(path)):
        raw = row["answer"]
        alternatives = [clean_latex_answer(a) for a in raw.split(" OR ")] if " OR " in raw else None
        gold = alternatives[0] if alternatives else clean_latex_answer(raw)
        meta_row = dict(row, raw_answer=raw, gold_alternatives=alternatives)
        problems.append(_problem(name, row.get("id"), i, row["problem"], gold, meta_row, ("problem", "answer", "id")))
    return problems


def _parse_integer_jsonl(path: Path, name: str) -> list[Problem]:
    """AIME 2024 (``"025"``) and AMC 2023 (``27.0``): integer answers."""
    problems = []
    for i, row in enumerate(_read_jsonl(path)):
        question = row.get("problem") or row["question"]
        drop = ("problem", "question", "answer", "id")
        problems.append(_problem(name, row.get("id"), i, question, _integer(row["answer"]), row, drop))
    return problems


def _parse_aime_csv(path: Path, name: str) -> list[Problem]:
    """Kaggle AIME 1983-2024: a title line before the header; ``"080 or 081 (both were accepted)"`` keeps 80."""
    with open(path, encoding="utf-8", newline="") as f:
        first = f.readline()
        if first.startswith("ID,"):  # no title row after all
            f.seek(0)
        rows = list(csv.DictReader(f))
    problems = []
    for i, row in enumerate(rows):
        accepted = [_integer(a) for a in re.findall(r"\d+", row["Answer"])]
        meta = {"year": int(row["Year"]), "number": int(row["Problem Number"]), "part": row["Part"] or None}
        if len(accepted) > 1:
            meta["gold_alternatives"] = accepted
            meta["raw_answer"] = row["Answer"]
        problems.append(_problem(name, row["ID"], i, row["Question"], accepted[0], meta, ()))
    return problems


def _parse_olympiadbench(path: Path, name: str) -> list[Problem]:
    """OlympiadBench: ``final_answer`` is a list of ``$…$`` strings; several answers are joined with ", "; the
    ``unit`` stays in meta (answers are graded on the number, as Math-Verify ignores ``\\text`` units)."""
    problems = []
    for i, row in enumerate(_read_jsonl(path)):
        parts = [p.strip() for answer in row["final_answer"] for p in re.split(r"\$\s*,\s*\$", answer)]
        gold = ", ".join(clean_latex_answer(p.replace("$", "").strip()) for p in parts if p.strip("$ "))
        question = f"{row['context']}\n{row['question']}" if row.get("context") else row["question"]
        drop = ("question", "final_answer", "id", "context")
        problems.append(_problem(name, row.get("id"), i, question, gold, row, drop))
    return problems


Parser = Callable[[Path, str], "list[Problem]"]

BENCHMARKS: dict[str, tuple[str, Parser]] = {
    "gsm8k": ("gsm8k_test.jsonl", _parse_gsm8k),
    "math500": ("math500.jsonl", _parse_latex_jsonl),
    "aime_1983_2024": ("aime_1983_2024.csv", _parse_aime_csv),
    "aime24": ("aime24.jsonl", _parse_integer_jsonl),
    "amc23": ("amc23.jsonl", _parse_integer_jsonl),
    "olympiadbench": ("olympiadbench.jsonl", _parse_olympiadbench),
    "omni_math": ("omni_math_rule.jsonl", _parse_latex_jsonl),
}
"""Benchmark name -> (file name in the data directory, parser(path, name) -> problems)."""


def load_benchmark(name: str, path: str | os.PathLike | None = None) -> list[Problem]:
    """Problems of a benchmark, in file order, with ``id = f"{name}/{native id or row index}"``.

    Args:
        name: a key of `BENCHMARKS`.
        path: the file (or a directory holding it); default: its file name in `default_data_dir`.

    Returns:
        The benchmark's `Problem`s.

    Raises:
        UserError: an unknown benchmark.
        MissingPathError: the benchmark file is not there.
    """
    if name not in BENCHMARKS:
        raise UserError(f"unknown benchmark {name!r}; choose one of {sorted(BENCHMARKS)}")
    filename, parser = BENCHMARKS[name]
    file = Path(path) if path is not None else default_data_dir() / filename
    if file.is_dir():
        file = file / filename
    if not file.is_file():
        raise MissingPathError(
            f"benchmark file {str(file)!r} for {name!r} not found; set ${DATA_DIR_ENV} to the directory holding "
            f"{filename} (default: ../shared/data relative to the working directory or the repository root)."
        )
    return parser(file, name)
