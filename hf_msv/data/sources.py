"""Where problems come from: `load_problems`, the one parser of problem specs (``hf-msv collect --problems``).

A spec is a named LM's generator (``testbed:train:64``), a benchmark preset (``math500:100``), a local file or
directory that ``datasets`` reads (``my.parquet:50``), or a Hub dataset (``hub:openai/gsm8k:test:100``). Files and
datasets map their columns with `ProblemColumns`. See ``docs/datasets.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import MissingPathError, UserError
from ..registry import get_named_lm, named_lms
from .problems import (
    BENCHMARKS,
    DATA_DIR_ENV,
    Problem,
    ProblemColumns,
    load_benchmark,
    problems_from_table,
    read_table,
)

HUB_PREFIX = "hub:"
"""A spec starting with it names a Hub dataset (a bare id would be taken for a missing local path)."""

__all__ = ["HUB_PREFIX", "ProblemColumns", "TableSpec", "load_problems", "parse_table_spec"]


@dataclass(frozen=True)
class TableSpec:
    """A spec of a file, directory or Hub dataset: ``<path or hub:<id>>[:<split>][:<n>]``.

    Args:
        location: the local path or the Hub dataset id.
        hub: whether `location` is a Hub dataset id.
        split: the split named in the spec (it wins over `ProblemColumns.split`), or `None`.
        limit: keep the first `limit` problems, or `None` for all.
    """

    location: str
    hub: bool = False
    split: str | None = None
    limit: int | None = None


def _exists(location: str) -> bool:
    return Path(location).expanduser().exists()


def parse_table_spec(spec: str) -> TableSpec:
    """``<path>[:<split>][:<n>]`` or ``hub:<org>/<name>[:<split>][:<n>]``; a path that exists is taken whole.

    Args:
        spec: the spec.

    Returns:
        The `TableSpec` (its local path may not exist: `load_problems` says so).
    """
    hub = spec.startswith(HUB_PREFIX)
    rest = spec[len(HUB_PREFIX) :] if hub else spec
    if not hub and _exists(rest):
        return TableSpec(rest)
    split = limit = None
    head, sep, tail = rest.rpartition(":")
    if sep and tail.isdigit():
        rest, limit = head, int(tail)
    if hub or not _exists(rest):
        head, sep, tail = rest.rpartition(":")
        if sep and tail:
            rest, split = head, tail
    return TableSpec(rest, hub, split, limit)


def _named_problems(spec: str, parts: list[str]) -> list[Problem]:
    lm = get_named_lm(parts[0])
    if lm is None or lm.problems is None:
        raise UserError(f"the named LM {parts[0]!r} has no problem generator; use a benchmark or a .jsonl file")
    if len(parts) not in (3, 4) or not all(p.isdigit() for p in parts[2:]):
        raise UserError(f"problem spec {spec!r}: use {parts[0]}:<split>:<n>[:<seed>]")
    return lm.problems(parts[1], int(parts[2]), int(parts[3]) if len(parts) == 4 else 0)


def _preset_problems(spec: str, parts: list[str]) -> list[Problem]:
    if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise UserError(f"problem spec {spec!r}: use {parts[0]}[:<n>]")
    try:
        return load_benchmark(parts[0], limit=int(parts[1]) if len(parts) > 1 else None)
    except FileNotFoundError as e:
        raise MissingPathError(
            f"{e} Or give --problems your own .jsonl file with one "
            '{"id": ..., "question": ..., "gold": ...} object per line.'
        ) from None


def _table_problems(spec: str, columns: ProblemColumns) -> list[Problem]:
    table_spec = parse_table_spec(spec)
    if not table_spec.hub and not _exists(table_spec.location):
        raise UserError(
            f"unknown problem spec {spec!r} (no such file): use a .jsonl file of "
            '{"id", "question", "gold"} lines, a file or directory datasets reads, '
            f"{HUB_PREFIX}<org>/<name>[:<split>][:<n>] for a Hub dataset, one of "
            f"{sorted(BENCHMARKS)}[:<n>] (files in ${DATA_DIR_ENV}), or <named LM>:<split>:<n>[:<seed>] with a "
            f"named LM of {list(named_lms())}"
        )
    if table_spec.hub:
        from huggingface_hub.utils import HFValidationError, validate_repo_id

        try:
            validate_repo_id(table_spec.location)
        except HFValidationError as e:
            raise UserError(f"problem spec {spec!r}: {e}") from None
    if table_spec.split is not None:
        columns = replace(columns, split=table_spec.split)
    table = read_table(table_spec.location, columns, hub=table_spec.hub)
    return problems_from_table(table, columns, table_spec.limit)


def load_problems(spec: str, columns: ProblemColumns | None = None) -> list[Problem]:
    """Problems from a spec.

    Args:
        spec: ``<named LM>:<split>:<n>[:<seed>]`` (an LM of `hf_msv.registry` with a problem generator, e.g.
            ``testbed:train:64``); ``<benchmark>[:<n>]`` (a preset of `hf_msv.data.BENCHMARKS`, its first n
            problems, read from ``$HF_MSV_DATA_DIR``); ``<path>[:<split>][:<n>]``: a ``.jsonl`` file (``{"id",
            "question", "gold"}`` lines by default), a parquet / JSON / CSV / TSV / arrow file, a directory written by
            ``Dataset.save_to_disk`` or a directory of data files; or ``hub:<org>/<name>[:<split>][:<n>]``, a Hub
            dataset (``datasets.load_dataset``).
        columns: which columns of a file or dataset hold the question, gold and id (default `ProblemColumns()`);
            named LMs and presets bring their own, so anything but the default is refused there.

    Returns:
        The `Problem`s, in the source's order.

    Raises:
        UserError: an unknown or malformed spec, a missing column (the message lists the columns there are), a
            malformed row, or `columns` given with a named LM or a preset.
        MissingPathError: a benchmark whose file is not in the data directory.
    """
    parts = spec.split(":")
    builtin = get_named_lm(parts[0]) is not None or parts[0] in BENCHMARKS
    if builtin and columns not in (None, ProblemColumns()):
        raise UserError(f"problem spec {spec!r} has its own columns; ProblemColumns apply to files and datasets")
    if get_named_lm(parts[0]) is not None:
        return _named_problems(spec, parts)
    if parts[0] in BENCHMARKS:
        return _preset_problems(spec, parts)
    return _table_problems(spec, columns or ProblemColumns())
