"""Problems: a question with a gold answer; tables of problems (`ProblemColumns`, `read_table`,
`problems_from_table`: any file or dataset ``datasets`` reads) and the benchmark presets (files in
``$HF_MSV_DATA_DIR``). Problem specs: `hf_msv.data.sources`. See ``docs/datasets.md``."""

from __future__ import annotations

import csv
import itertools
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

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


# ------------------------------------------------------------------------------------------------- gold answers


@dataclass(frozen=True)
class Gold:
    """A gold answer as graded, and what reading it adds to the problem's meta.

    Args:
        answer: what goes inside ``\\boxed{}``.
        meta: entries for `Problem.meta` (``None`` values are left out).
    """

    answer: str
    meta: dict = field(default_factory=dict)


def _text_gold(value) -> Gold:
    return Gold(str(value).strip())


def _integer_gold(value) -> Gold:
    return Gold(_integer(value))


def _latex_gold(value) -> Gold:
    """A LaTeX answer; ``"A OR B"`` (Omni-MATH) keeps A, all kept in meta."""
    raw = str(value)
    alternatives = [clean_latex_answer(a) for a in raw.split(" OR ")] if " OR " in raw else None
    gold = alternatives[0] if alternatives else clean_latex_answer(raw)
    return Gold(gold, {"raw_answer": raw, "gold_alternatives": alternatives})


def _final_number_gold(value) -> Gold:
    """GSM8K: a worked solution ending in ``#### 1,600``; the solution goes to meta."""
    solution, _, final = str(value).rpartition("####")
    return Gold(final.strip().replace(",", ""), {"solution": solution.strip()})


def _accepted_integers_gold(value) -> Gold:
    """``"080 or 081 (both were accepted)"`` keeps 80; every accepted one goes to meta."""
    accepted = [_integer(a) for a in re.findall(r"\d+", str(value))]
    if not accepted:
        raise ValueError("no integer in it")
    return Gold(accepted[0], {"gold_alternatives": accepted, "raw_answer": value} if len(accepted) > 1 else {})


def _latex_list_gold(value) -> Gold:
    """OlympiadBench: a list of ``$…$`` strings; several answers are joined with ", "."""
    answers = [value] if isinstance(value, str) else value
    parts = [p.strip() for answer in answers for p in re.split(r"\$\s*,\s*\$", answer)]
    return Gold(", ".join(clean_latex_answer(p.replace("$", "").strip()) for p in parts if p.strip("$ ")))


GOLD_FORMATS: dict[str, Callable[[Any], Gold]] = {
    "text": _text_gold,
    "integer": _integer_gold,
    "latex": _latex_gold,
    "gsm8k": _final_number_gold,
    "integers": _accepted_integers_gold,
    "latex_list": _latex_list_gold,
}
"""How a gold column is read: ``text`` (as written, stripped), ``integer`` (``"025"``, ``27.0`` -> ``"25"``,
``"27"``), ``latex`` (`clean_latex_answer`; ``"A OR B"`` keeps A), ``gsm8k`` (the number after ``####``),
``integers`` (the first of the integers written), ``latex_list`` (a list of ``$…$`` answers joined with ", ")."""


# ------------------------------------------------------------------------------------------- tables of problems


@dataclass(frozen=True)
class ProblemColumns:
    """Which columns of a table hold a problem, and how its gold is read (the same fields for every source).

    Args:
        question: the column of the question text.
        gold: the column of the gold answer.
        id: the column of problem ids; `None`: the ``id`` column when there is one, else the row index.
        gold_format: how the gold column is read: a key of `GOLD_FORMATS`.
        split: the split of a dataset that has several; `None`: ``test`` when there is one, else the only split.
        subset: the configuration of a Hub dataset or dataset directory (``datasets.load_dataset``'s ``name``).
        source: the column naming each problem's source; `None`: the ``source`` column when there is one, else the
            dataset's name.
    """

    question: str = "question"
    gold: str = "gold"
    id: str | None = None
    gold_format: str = "text"
    split: str | None = None
    subset: str | None = None
    source: str | None = None

    def __post_init__(self):
        if self.gold_format not in GOLD_FORMATS:
            raise UserError(f"unknown gold format {self.gold_format!r}; choose one of {list(GOLD_FORMATS)}")


@dataclass
class ProblemTable:
    """Rows read from one source, before they become problems.

    Args:
        name: the source's name (a file's stem, a Hub id): messages and the problems' default source.
        rows: the rows, as dicts (a `datasets.Dataset` or a list).
        column_names: the columns the rows have.
        line_numbers: each row's line in a JSON Lines file (its messages name the line), else `None`.
    """

    name: str
    rows: Sequence[dict]
    column_names: list[str]
    line_numbers: list[int] | None = None

    def where(self, index: int) -> str:
        """Where row `index` is, for messages."""
        if self.line_numbers is not None:
            return f"{self.name} line {self.line_numbers[index]}"
        return f"{self.name} row {index}"


CSV_OPTIONS = {"keep_default_na": False}
"""CSV cells are read as written: every column as text (``"025"`` stays a string; `csv_features`), an empty cell as
``""``, as the gold formats expect."""


def csv_features(path: Path, delimiter: str = ",", skiprows: int = 0):
    """``datasets.Features`` reading every column of a CSV file as text (names from its header)."""
    import datasets

    with open(path, encoding="utf-8", newline="") as f:
        header = next(itertools.islice(csv.reader(f, delimiter=delimiter), skiprows, None), [])
    return datasets.Features({name: datasets.Value("string") for name in header})


_BUILDERS = {".parquet": "parquet", ".csv": "csv", ".tsv": "csv", ".json": "json", ".arrow": "arrow"}


def _jsonl_table(path: Path) -> ProblemTable:
    """A JSON Lines file, line by line: a column may mix types (ids ``1`` and ``"b"``), and a bad line is named."""
    rows, numbers = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path} line {number}: expected a JSON object ({e})") from None
        if not isinstance(row, dict):
            raise UserError(f"{path} line {number}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
        numbers.append(number)
    names = list(dict.fromkeys(k for row in rows for k in row))
    return ProblemTable(name=path.stem, rows=rows, column_names=names, line_numbers=numbers)


def _pick_split(data, split: str | None, name: str) -> Any:
    """One split of what ``datasets`` loaded (a `Dataset` is returned as it is); a `datasets.Dataset`, typed `Any`
    as `ProblemTable.rows` reads it: a sequence of row dicts."""
    if not hasattr(data, "keys"):
        return data
    names = list(data.keys())
    if split is None:
        split = "test" if "test" in names else names[0] if len(names) == 1 else None
        if split is None:
            raise UserError(f"{name} has the splits {names}; choose one (ProblemColumns.split)")
    if split not in names:
        raise UserError(f"{name} has no split {split!r}; its splits: {names}")
    return data[split]


def _load_dataset(location: str, columns: ProblemColumns, hub: bool, options: dict | None):
    """``datasets.load_dataset`` (or ``load_from_disk``) on a Hub id, a directory or a data file."""
    import datasets

    path = Path(location).expanduser()
    if hub:
        features = datasets.load_dataset_builder(location, name=columns.subset).info.features
        if features is not None:  # the Hub's metadata names the columns: check them before downloading any data
            check_columns(ProblemTable(location, [], list(features)), columns)
        return datasets.load_dataset(location, name=columns.subset, split=columns.split)
    if path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file()):
        return datasets.load_from_disk(str(path))  # written by save_to_disk
    if path.is_dir():
        return datasets.load_dataset(str(path), name=columns.subset)
    builder = _BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise UserError(f"{path}: not a data file datasets reads ({sorted(_BUILDERS) + ['.jsonl']})")
    options = dict(options or {})
    if builder == "csv":
        options.setdefault("delimiter", "\t" if path.suffix.lower() == ".tsv" else ",")
        options = CSV_OPTIONS | options
        options.setdefault("features", csv_features(path, options["delimiter"], options.get("skiprows", 0)))
    return datasets.load_dataset(builder, data_files=str(path), **options)


def read_table(
    location: str | os.PathLike, columns: ProblemColumns, hub: bool = False, options: dict | None = None
) -> ProblemTable:
    """The rows of a data file, a dataset directory or a Hub dataset.

    Args:
        location: a ``.jsonl`` file (read line by line), a file ``datasets`` reads (parquet, JSON, CSV, TSV, arrow), a
            directory written by ``save_to_disk``, a directory of data files, or with `hub` a Hub dataset id.
        columns: its split and subset are used here.
        hub: `location` is a Hub dataset id.
        options: keyword arguments of ``datasets.load_dataset`` for a data file (CSV: `CSV_OPTIONS` and
            `csv_features` unless given).

    Returns:
        The `ProblemTable`.

    Raises:
        MissingPathError: a local path that does not exist.
        UserError: a file or dataset that cannot be read, or an unknown split.
    """
    location = str(location)
    path = Path(location).expanduser()
    if not hub and not path.exists():
        raise MissingPathError(f"no file or directory at {path}")
    if not hub and path.is_file() and path.stat().st_size == 0:
        raise UserError(f"{path} is empty: no problems to read")
    if not hub and path.is_file() and path.suffix.lower() == ".jsonl":
        return _nonempty(_jsonl_table(path), path)
    if not hub and path.is_file() and path.suffix.lower() == ".parquet" and _parquet_rows(path) == 0:
        raise UserError(f"{location} is empty: it has no rows (no problems to read)")
    from datasets.exceptions import DatasetsError

    name = location if hub else path.stem
    try:
        dataset = _pick_split(_load_dataset(location, columns, hub, options), columns.split, name)
    except (OSError, ValueError, DatasetsError) as error:
        if isinstance(error, UserError):
            raise
        raise UserError(f"cannot read {location}: {' '.join(str(error).split())}") from error
    return _nonempty(ProblemTable(name=name, rows=dataset, column_names=list(dataset.column_names)), location)


def _parquet_rows(path: Path) -> int | None:
    """The row count in a parquet file's footer (datasets fails on a file of none with a message that names nothing),
    or `None` when the footer cannot be read (``datasets`` then says why)."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception:  # pyarrow's errors for a file that is not parquet: left to datasets' message
        return None


def _nonempty(table: ProblemTable, location) -> ProblemTable:
    """`table`, which must have a row: an empty one is named as such, not as one that lacks every column."""
    if len(table.rows) == 0:
        raise UserError(f"{location} is empty: it has no rows (no problems to read)")
    return table


def _column_choice(table: ProblemTable, named: str | None, default: str) -> str | None:
    """A named column, else `default` when the table has it."""
    return named if named is not None else default if default in table.column_names else None


def check_columns(table: ProblemTable, columns: ProblemColumns) -> None:
    """Raise a `UserError` naming the table's columns when one that `columns` names is not there."""
    named = [columns.question, columns.gold, columns.id, columns.source]
    missing = [c for c in named if c is not None and c not in table.column_names]
    if missing:
        raise UserError(
            f"{table.name} has no column {', '.join(map(repr, missing))}; its columns: {table.column_names} "
            "(name yours with --question-column, --gold-column, --id-column; from Python, "
            "ProblemColumns(question=..., gold=..., id=...))"
        )


def problems_from_table(
    table: ProblemTable,
    columns: ProblemColumns,
    limit: int | None = None,
    source: str | None = None,
    id_prefix: str = "",
    drop: Sequence[str] = (),
) -> list[Problem]:
    """The problems of `table`'s rows (its first `limit`), in order: every source and preset goes through here.

    A problem's id is ``id_prefix`` + its id column's value (the row index where there is none or it is empty), its
    question is stripped, and its meta holds the other non-null columns (a ``meta`` column of dicts is merged in)
    and what the gold format adds.

    Args:
        table: the rows.
        columns: which columns hold what (checked first).
        limit: keep the first `limit` rows.
        source: every problem's source; `None`: `columns.source` (`ProblemColumns`).
        id_prefix: put before every id (a preset's ``"<name>/"``).
        drop: columns left out of meta.

    Returns:
        The `Problem`s.

    Raises:
        UserError: a missing column, an empty table, a row without a question or gold, a gold its format cannot
            read, or two problems with one id.
    """
    check_columns(table, columns)
    if not table.rows:
        raise UserError(f"{table.name} holds no problem")
    id_column = _column_choice(table, columns.id, "id")
    source_column = None if source is not None else _column_choice(table, columns.source, "source")
    left_out = {columns.question, columns.gold, id_column, source_column, "meta", *drop}
    problems, seen = [], set()
    for index, row in enumerate(itertools.islice(table.rows, limit)):
        problem = _row_problem(table, index, row, columns, id_column, source_column, left_out)
        problem = replace(problem, id=f"{id_prefix}{problem.id}", source=source or problem.source)
        if problem.id in seen:
            raise UserError(f"{table.where(index)}: a second problem with the id {problem.id!r}")
        seen.add(problem.id)
        problems.append(problem)
    return problems


def _row_problem(table, index, row, columns, id_column, source_column, left_out) -> Problem:
    question, value = row.get(columns.question), row.get(columns.gold)
    if question is None or value is None:
        kind = "JSON object" if table.line_numbers is not None else "row"
        raise UserError(f'{table.where(index)}: expected a {kind} with "{columns.question}" and "{columns.gold}"')
    try:
        gold = GOLD_FORMATS[columns.gold_format](value)
    except (ValueError, TypeError) as e:
        raise UserError(
            f"{table.where(index)}: cannot read the gold {value!r} as {columns.gold_format} ({e})"
        ) from None
    native = row.get(id_column) if id_column else None
    meta = {k: v for k, v in row.items() if k not in left_out and v is not None}
    if isinstance(row.get("meta"), dict):
        meta.update(row["meta"])
    meta.update({k: v for k, v in gold.meta.items() if v is not None})
    return Problem(
        id=str(index if native is None or native == "" else native),
        question=str(question).strip(),
        gold=gold.answer,
        source=str(row.get(source_column) or table.name) if source_column else table.name,
        meta=meta,
    )


# ------------------------------------------------------------------------------------------- benchmark presets


@dataclass(frozen=True)
class Preset:
    """A built-in benchmark: a file in the data directory read by `read_table` and `problems_from_table`.

    Args:
        filename: its file name in `default_data_dir`.
        columns: its columns and gold format.
        drop: columns left out of meta.
        prepare: turns a row as read into the row `columns` names (derived fields), or `None`.
        options: ``datasets.load_dataset`` keyword arguments for the file (`path` -> options), or `None`.
    """

    filename: str
    columns: ProblemColumns
    drop: tuple[str, ...] = ()
    prepare: Callable[[dict], dict] | None = None
    options: Callable[[Path], dict] | None = None


def _aime_csv_options(path: Path) -> dict:
    """Kaggle AIME 1983-2024 has a title line before its header."""
    with open(path, encoding="utf-8") as f:
        titled = not f.readline().startswith("ID,")
    return {"skiprows": 1 if titled else 0}


def _aime_csv_row(row: dict) -> dict:
    meta = {"year": int(row["Year"]), "number": int(row["Problem Number"]), "part": row["Part"] or None}
    return {"ID": row["ID"], "Question": row["Question"], "Answer": row["Answer"], **meta}


def _olympiadbench_row(row: dict) -> dict:
    """The context (when there is one) goes before the question; the ``unit`` stays in meta (answers are graded on
    the number, as Math-Verify ignores ``\\text`` units)."""
    question = f"{row['context']}\n{row['question']}" if row.get("context") else row["question"]
    return {k: v for k, v in row.items() if k != "context"} | {"question": question}


_LATEX = ProblemColumns(question="problem", gold="answer", gold_format="latex")
_INTEGER = ProblemColumns(question="problem", gold="answer", gold_format="integer")

BENCHMARKS: dict[str, Preset] = {
    "gsm8k": Preset("gsm8k_test.jsonl", ProblemColumns(question="question", gold="answer", gold_format="gsm8k")),
    "math500": Preset("math500.jsonl", _LATEX),
    "aime_1983_2024": Preset(
        "aime_1983_2024.csv",
        ProblemColumns(question="Question", gold="Answer", id="ID", gold_format="integers"),
        prepare=_aime_csv_row,
        options=_aime_csv_options,
    ),
    "aime24": Preset("aime24.jsonl", _INTEGER, drop=("question",)),
    "amc23": Preset("amc23.jsonl", _INTEGER, drop=("question",)),
    "olympiadbench": Preset(
        "olympiadbench.jsonl",
        ProblemColumns(question="question", gold="final_answer", gold_format="latex_list"),
        prepare=_olympiadbench_row,
    ),
    "omni_math": Preset("omni_math_rule.jsonl", _LATEX),
}
"""Benchmark name -> its `Preset` (file name in the data directory, columns, gold format)."""


def load_benchmark(name: str, path: str | os.PathLike | None = None, limit: int | None = None) -> list[Problem]:
    """Problems of a benchmark, in file order, with ``id = f"{name}/{native id or row index}"``.

    Args:
        name: a key of `BENCHMARKS`.
        path: the file (or a directory holding it); default: its file name in `default_data_dir`.
        limit: keep the first `limit` problems.

    Returns:
        The benchmark's `Problem`s.

    Raises:
        UserError: an unknown benchmark.
        MissingPathError: the benchmark file is not there.
    """
    if name not in BENCHMARKS:
        raise UserError(f"unknown benchmark {name!r}; choose one of {sorted(BENCHMARKS)}")
    preset = BENCHMARKS[name]
    file = Path(path) if path is not None else default_data_dir() / preset.filename
    if file.is_dir():
        file = file / preset.filename
    if not file.is_file():
        raise MissingPathError(
            f"benchmark file {str(file)!r} for {name!r} not found; set ${DATA_DIR_ENV} to the directory holding "
            f"{preset.filename} (default: ../shared/data relative to the working directory or the repository root)."
        )
    table = read_table(file, preset.columns, options=preset.options(file) if preset.options else None)
    if preset.prepare is not None:
        rows = [preset.prepare(row) for row in table.rows]
        table = replace(table, rows=rows, column_names=list(rows[0]) if rows else [])
    return problems_from_table(table, preset.columns, limit, source=name, id_prefix=f"{name}/", drop=preset.drop)
