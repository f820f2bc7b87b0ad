"""Evaluation-harness outputs as trace files: lm-evaluation-harness samples and lighteval details.

``lm_eval ... --log_samples`` writes ``samples_<task>_<date>.jsonl`` (one JSON object per document and filter:
``doc_id``, ``doc``, ``target``, ``arguments``, ``resps``, ``filtered_resps``, ``filter``, ...); lighteval writes
``details_<task>_<date>.parquet`` (one row per document: the ``doc``, ``model_response`` and ``metric`` columns of
its ``Detail`` dataclass). Each reader maps a harness row onto one trace line (the JSON object of
``docs/collection.md``) that `hf_msv.collect.read_traces` validates like any other; `detect_trace_format` tells the
three formats apart. Recipes: ``docs/harnesses.md``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..answers import extract_last_boxed
from ..errors import UserError

__all__ = [
    "TRACE_FORMATS",
    "HarnessRow",
    "detect_trace_format",
    "harness_gold",
    "lighteval_rows",
    "lighteval_trace",
    "lm_eval_rows",
    "lm_eval_trace",
]

TRACE_FORMATS = ("auto", "hf_msv", "lm_eval", "lighteval")
LM_EVAL_KEYS = ("doc_id", "doc", "target", "arguments", "resps")
LIGHTEVAL_COLUMNS = ("doc", "model_response")
EXPECTED = (
    "an hf_msv trace file (JSON lines with id, question, gold, completions: docs/collection.md), an lm-eval "
    "samples file (JSON lines with doc_id, doc, target, arguments, resps: `lm_eval --log_samples`) or a lighteval "
    "details file (parquet with the doc and model_response columns)"
)
# lm-eval's sampling settings (`generation_kwargs`) kept in the trace's `sampling`, as hf_msv records its own.
LM_EVAL_SAMPLING = ("temperature", "top_p", "top_k", "do_sample", "until")
# The task name in an lm-eval samples file name: samples_<task>_<date id>.jsonl (date id: 2025-01-31T12-00-00.123).
LM_EVAL_FILE = re.compile(r"^samples_(?P<task>.+)_\d{4}-\d{2}-\d{2}T[\d.\-]+$")


@dataclass
class HarnessRow:
    """One harness row mapped onto the trace format: the trace line as a JSON object, or why the row is unusable.

    Args:
        line: the 1-based line (lm-eval) or row (lighteval) number in the file.
        trace: the trace line (``id``, ``question``, ``gold``, ``completions``, ``prompt`` or ``prompt_token_ids``,
            ``source``, ``sampling``), validated by `hf_msv.collect.traces.trace_from_json`.
        error: why the row gives no trace (`trace` is then `None`).
    """

    line: int
    trace: dict | None = None
    error: str | None = None


def detect_trace_format(path: str | os.PathLike, data: bytes) -> str:
    """Which trace format `data` (the bytes of `path`) is in: ``"lighteval"`` (a parquet file), ``"lm_eval"`` or
    ``"hf_msv"`` (JSON lines, told apart by the keys of the first line that is a JSON object).

    Args:
        path: the file (named in the error).
        data: its content.

    Returns:
        ``"hf_msv"``, ``"lm_eval"`` or ``"lighteval"``.

    Raises:
        UserError: a file in none of these formats.
    """
    if data[:4] == b"PAR1":
        return "lighteval"
    for raw in data.split(b"\n"):
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue  # a bad line: the format is told by the first good one (bad lines are reported by line)
        if not isinstance(obj, dict):
            continue
        if all(k in obj for k in LM_EVAL_KEYS):
            return "lm_eval"
        if any(k in obj for k in ("id", "question", "completions")):
            return "hf_msv"
        break
    raise UserError(f"{path} is not a trace file: expected {EXPECTED}")


def harness_gold(target: str) -> str:
    """The reference answer in a harness's target: after the last ``####`` (GSM8K's worked solutions), else the last
    ``\\boxed{...}`` (MATH's solutions), else the whole target, stripped.

    Args:
        target: the target text (lm-eval ``target``, lighteval ``doc.choices[gold_index]``).

    Returns:
        The gold answer.
    """
    if "####" in target:
        return target.rsplit("####", 1)[1].strip()
    boxed = extract_last_boxed(target)
    return boxed if boxed is not None else target.strip()


def _text_end(finish_reason: str | None, sampling: dict) -> str | None:
    """How a harness's text completion ended: as given, else left to re-encoding when the sampled budget is known
    (EOS after a completion shorter than it), else ``"stop"`` (the harness ended it: EOS appended)."""
    if finish_reason is not None:
        return finish_reason
    return None if sampling.get("max_new_tokens") else "stop"


def lm_eval_trace(sample: dict, finish_reason: str | None = None, source: str = "") -> dict:
    """One lm-eval ``--log_samples`` line → a trace line: the context the LM saw (``arguments``) as the prompt, the
    N raw responses (``resps``: ``repeats`` of them) as the completions, the gold from ``target``.

    Args:
        sample: the decoded line.
        finish_reason: how every completion ended. lm-eval keeps none: `None` leaves it to re-encoding, which
            appends the LM's EOS to a completion shorter than ``max_gen_toks`` (one that fills it was cut) and,
            without a recorded budget, to every completion; ``"stop"`` / ``"length"`` force one end for all.
        source: the trace's source (the task).

    Returns:
        The trace line.

    Raises:
        ValueError: a line that is not one generate_until request of one document.
    """
    missing = [k for k in LM_EVAL_KEYS if k not in sample]
    if missing:
        raise ValueError(f"missing lm-eval field(s) {missing}")
    arguments, resps, doc = sample["arguments"], sample["resps"], sample["doc"]
    requests = list(arguments.values()) if isinstance(arguments, dict) else arguments
    if not isinstance(requests, list) or len(requests) != 1 or not isinstance(resps, list) or len(resps) != 1:
        raise ValueError("one request per document expected (a generate_until task; not a multiple-choice one)")
    args = list(requests[0].values()) if isinstance(requests[0], dict) else requests[0]
    if len(args) < 2 or not isinstance(args[0], str) or not isinstance(args[1], dict):
        raise ValueError("arguments are not a generate_until request (context, generation kwargs)")
    context, gen_kwargs = args[0], args[1]
    completions = resps[0]
    if not isinstance(completions, list) or not all(isinstance(c, str) for c in completions):
        raise ValueError("resps must hold one list of generated strings")
    # The question as the task's document holds it (GSM8K, MATH); the context otherwise (it holds the question).
    fields = [doc.get(k) for k in ("question", "problem")] if isinstance(doc, dict) else []
    question = next((q for q in fields if isinstance(q, str)), None)
    sampling = {k: gen_kwargs[k] for k in LM_EVAL_SAMPLING if k in gen_kwargs}
    if "max_gen_toks" in gen_kwargs:
        sampling["max_new_tokens"] = gen_kwargs["max_gen_toks"]
    return {
        "id": sample["doc_id"],
        "question": question if question is not None else context,
        "gold": harness_gold(str(sample["target"])),
        "completions": [{"text": c, "finish_reason": _text_end(finish_reason, sampling)} for c in completions],
        "prompt": context,
        "source": source,
        "sampling": dict(sampling, engine="lm_eval"),
    }


def _task(path: str | os.PathLike) -> str:
    match = LM_EVAL_FILE.match(Path(path).stem)
    return match["task"] if match else ""


def lm_eval_rows(path: str | os.PathLike, data: bytes, finish_reason: str | None = None) -> list[HarnessRow]:
    """The trace lines of an lm-eval samples file. lm-eval writes every document once per filter (``filter``:
    ``strict-match``, ``flexible-extract``, ...) with the same responses: the lines of the first filter are kept,
    the others skipped.

    Args:
        path: the samples file (its name gives the task, the traces' source).
        data: its content.
        finish_reason: how every completion ended (see `lm_eval_trace`).

    Returns:
        One `HarnessRow` per kept non-blank line.
    """
    rows, first_filter, source = [], None, _task(path)
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            sample = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            rows.append(HarnessRow(number, error=f"not JSON ({e})"))
            continue
        if not isinstance(sample, dict):
            rows.append(HarnessRow(number, error="a line must be a JSON object"))
            continue
        first_filter = sample.get("filter") if first_filter is None else first_filter
        if sample.get("filter") != first_filter:
            continue
        try:
            rows.append(HarnessRow(number, trace=lm_eval_trace(sample, finish_reason, source)))
        except ValueError as e:
            rows.append(HarnessRow(number, error=str(e)))
    return rows


def _token_ids(value) -> list[int] | None:
    """A logged token list as plain ints, or `None` when there is none (lighteval logs ``[]``)."""
    return [int(t) for t in value] if isinstance(value, (list, tuple)) and value else None


def lighteval_trace(row: dict, number: int, finish_reason: str | None = None, token_ids: bool = True) -> dict:
    """One lighteval details row → a trace line: the prompt as the LM saw it (``model_response.input_tokens``,
    else ``model_response.input``), the N generations (``model_response.output_tokens`` when logged, EOS kept where
    a generation ended with it, else ``model_response.text``; ``num_samples`` of them), the gold
    ``doc.choices[doc.gold_index]`` (further gold indices: gold alternatives).

    Args:
        row: the row (``doc``, ``model_response``).
        number: its 1-based row number (the id when ``doc.id`` is empty).
        finish_reason: how every text completion ended (lighteval keeps none; `None`: as in `lm_eval_trace`,
            against ``doc.generation_size``).
        token_ids: take the completions from ``model_response.output_tokens`` when logged (`False`: always the
            text, e.g. when a backend padded them).

    Returns:
        The trace line.

    Raises:
        ValueError: a row without a generation, a gold or a prompt.
    """
    doc, response = row.get("doc"), row.get("model_response")
    if not isinstance(doc, dict) or not isinstance(response, dict):
        raise ValueError("doc and model_response must be objects")
    texts, outputs = response.get("text") or [], response.get("output_tokens") or []
    if token_ids and outputs:
        completions: list[dict[str, Any]] = [{"token_ids": _token_ids(ids)} for ids in outputs]
    elif texts:
        completions = [{"text": t, "finish_reason": finish_reason} for t in texts]
    else:
        raise ValueError("no generated text (not a generative task?)")
    choices, gold_index = doc.get("choices") or [], doc.get("gold_index")
    golds = [gold_index] if isinstance(gold_index, int) else list(gold_index or [])
    if not golds or not all(isinstance(g, int) and 0 <= g < len(choices) for g in golds):
        raise ValueError(f"gold_index {gold_index!r} does not index the {len(choices)} choices")
    prompt_ids, prompt = _token_ids(response.get("input_tokens")), response.get("input")
    query = doc.get("original_query") or doc.get("query")
    if prompt_ids is None and prompt is None and not query:
        raise ValueError("no prompt: model_response.input_tokens, model_response.input and doc.query are empty")
    trace = {
        "id": doc.get("id") or str(number),
        "question": query or "",
        "gold": harness_gold(str(choices[golds[0]])),
        "gold_alternatives": [harness_gold(str(choices[g])) for g in golds[1:]],
        "completions": completions,
        "source": doc.get("task_name") or "",
        "sampling": {"engine": "lighteval", "num_samples": len(completions)},
    }
    if doc.get("generation_size"):
        trace["sampling"]["max_new_tokens"] = doc["generation_size"]
    for completion in completions:
        if "text" in completion:
            completion["finish_reason"] = _text_end(finish_reason, trace["sampling"])
    if prompt_ids is not None:
        trace["prompt_token_ids"] = prompt_ids
    elif isinstance(prompt, list):
        trace["messages"] = prompt
    else:
        trace["prompt"] = prompt if isinstance(prompt, str) else query
    return trace


def lighteval_rows(
    path: str | os.PathLike, finish_reason: str | None = None, token_ids: bool = True
) -> list[HarnessRow]:
    """The trace lines of a lighteval details file (``details_<task>_<date>.parquet``).

    Args:
        path: the parquet file.
        finish_reason, token_ids: as in `lighteval_trace`.

    Returns:
        One `HarnessRow` per row.

    Raises:
        UserError: not a parquet file, or one without the ``doc`` and ``model_response`` columns.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except pa.ArrowException as e:
        raise UserError(f"{path} is not a lighteval details file (parquet): {e}") from None
    missing = [c for c in LIGHTEVAL_COLUMNS if c not in table.column_names]
    if missing:
        raise UserError(f"{path} has no {missing} column(s): expected {EXPECTED}")
    rows = []
    for number, row in enumerate(table.select(list(LIGHTEVAL_COLUMNS)).to_pylist(), start=1):
        try:
            rows.append(HarnessRow(number, trace=lighteval_trace(row, number, finish_reason, token_ids)))
        except ValueError as e:
            rows.append(HarnessRow(number, error=str(e)))
    return rows
