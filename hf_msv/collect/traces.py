"""The trace file: N sampled completions per problem (from vLLM, an API or hf_msv itself), one JSON line each.

`read_traces` (line-level validation: `TraceError` names the line, or bad lines are skipped and listed),
`write_traces`, and the exports `traces_from_results` / `traces_from_shards`; `collect_from_traces` re-encodes such
a file into shards. `read_traces` also reads lm-eval samples and lighteval details files (`hf_msv.collect.harness`,
``docs/harnesses.md``). Nothing here needs the LM. The format: ``docs/collection.md``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..data.problems import Problem
from ..errors import UserError
from ..utils import commit_file, tmp_name
from .harness import TRACE_FORMATS, detect_trace_format, lighteval_rows, lm_eval_rows

__all__ = [
    "Completion",
    "Trace",
    "TraceError",
    "TraceFile",
    "read_traces",
    "traces_from_results",
    "traces_from_shards",
    "write_traces",
]

FINISH_EOS = ("eos", "stop")
FINISH_BUDGET = ("length", "budget")


class TraceError(UserError):
    """A bad trace line (a `UserError`, so a `ValueError`); ``line`` is its 1-based line number in the file (0 when
    not read from a file).

    Args:
        line: the 1-based line number (0: not read from a file).
        reason: what is wrong with the line.
    """

    def __init__(self, line: int, reason: str):
        super().__init__(f"trace line {line}: {reason}")
        self.line, self.reason = line, reason


@dataclass
class Completion:
    """One sampled chain of thought: `token_ids` (preferred) or `text`, how it ended, optional top-k log-probs.

    Args:
        token_ids: the generated token ids, EOS last if it ended with one.
        text: the generated text (re-tokenised), when there are no `token_ids`.
        finish_reason: how it ended (``"stop"`` / ``"eos"``, or ``"length"`` / ``"budget"``).
        logprobs: one list of top-k log-probabilities per generated token.
    """

    token_ids: list[int] | None = None
    text: str | None = None
    finish_reason: str | None = None
    logprobs: list[list[float]] | None = None

    def to_json(self) -> dict:
        out: dict = {"token_ids": self.token_ids} if self.token_ids is not None else {"text": self.text}
        if self.finish_reason is not None:
            out["finish_reason"] = self.finish_reason
        if self.logprobs is not None:
            out["logprobs"] = self.logprobs
        return out


@dataclass
class Trace:
    """One line of a trace file: a problem, how it was prompted and its N completions (format: "
    "``docs/collection.md``).

    Args:
        id: the problem id.
        question: the problem text.
        gold: the reference answer.
        completions: the N `Completion`s.
        prompt_token_ids: the prompt exactly as sampled (preferred over `messages` and `prompt`).
        messages: chat messages, rendered with the chat template.
        prompt: prompt text, tokenised with special tokens.
        gold_alternatives: other answers also graded correct.
        source: the problem's source (e.g. a benchmark name).
        sampling: the sampling settings, kept in the shard info.
        line: the 1-based line number in the file (0: not read from a file).
    """

    id: str
    question: str
    gold: str
    completions: list[Completion]
    prompt_token_ids: list[int] | None = None
    messages: list[dict] | None = None
    prompt: str | None = None
    gold_alternatives: list[str] = field(default_factory=list)
    source: str = ""
    sampling: dict = field(default_factory=dict)
    line: int = 0

    def problem(self) -> Problem:
        """The `Problem` graded by the collection checker (gold alternatives in ``meta`` as live collection reads)."""
        return Problem(
            id=self.id,
            question=self.question,
            gold=self.gold,
            source=self.source,
            meta={"gold_alternatives": list(self.gold_alternatives)},
        )

    def to_json(self) -> dict:
        out = {
            "id": self.id,
            "question": self.question,
            "gold": self.gold,
            "completions": [c.to_json() for c in self.completions],
        }
        for name in ("prompt_token_ids", "messages", "prompt"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.gold_alternatives:
            out["gold_alternatives"] = self.gold_alternatives
        if self.source:
            out["source"] = self.source
        if self.sampling:
            out["sampling"] = self.sampling
        return out


@dataclass
class TraceFile:
    """What `read_traces` returns: the good traces, the skipped lines ``[(line, reason)]`` and a fingerprint of the
    file's content (sha256 of its bytes), which resuming a re-encoding checks.

    Args:
        traces: the good `Trace`s, in file order.
        bad_lines: ``(line, reason)`` of each skipped line.
        fingerprint: the content fingerprint.
    """

    traces: list[Trace]
    bad_lines: list[tuple[int, str]]
    fingerprint: str

    @property
    def num_samples(self) -> int:
        return len(self.traces[0].completions) if self.traces else 0


def _int_list(value, what: str, line: int) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    ):
        raise TraceError(line, f"{what} must be a list of non-negative integers")
    return value


def _completion(raw, i: int, line: int) -> Completion:
    if isinstance(raw, str):
        raw = {"text": raw}
    if not isinstance(raw, dict):
        raise TraceError(line, f"completion {i} must be a string or an object")
    if raw.get("token_ids") is not None:
        ids = _int_list(raw["token_ids"], f"completion {i} token_ids", line)
        if not ids:
            raise TraceError(line, f"completion {i} is empty")
        text = None
    elif isinstance(raw.get("text"), str):
        ids, text = None, raw["text"]
        if not text:
            raise TraceError(line, f"completion {i} is empty")
    else:
        raise TraceError(line, f"completion {i} needs 'token_ids' or a 'text' string")
    finish = raw.get("finish_reason")
    if finish is not None and finish not in FINISH_EOS + FINISH_BUDGET:
        raise TraceError(
            line, f"completion {i} finish_reason must be one of {FINISH_EOS + FINISH_BUDGET} or absent, got {finish!r}"
        )
    logprobs = raw.get("logprobs")
    if logprobs is not None and not (
        isinstance(logprobs, list)
        and all(isinstance(row, list) and row and all(isinstance(x, (int, float)) for x in row) for row in logprobs)
    ):
        raise TraceError(line, f"completion {i} logprobs must be one non-empty list of numbers per token")
    if logprobs is not None and ids is not None and len(logprobs) != len(ids):
        raise TraceError(line, f"completion {i} has {len(ids)} tokens but {len(logprobs)} logprob lists")
    return Completion(token_ids=ids, text=text, finish_reason=finish, logprobs=logprobs)


def parse_trace(raw: bytes | str, line: int = 0) -> Trace:
    """One line of a trace file → `Trace` (raises `TraceError` naming `line`). N is checked by `read_traces`."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TraceError(line, f"not UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        raise TraceError(line, f"not JSON ({e.msg})") from None
    return trace_from_json(obj, line)


def trace_from_json(obj, line: int = 0) -> Trace:
    """A decoded trace line (a line of a trace file, or a harness row mapped onto one) → `Trace`.

    Args:
        obj: the decoded JSON value.
        line: its 1-based line number (0: not read from a file).

    Returns:
        The `Trace`.

    Raises:
        TraceError: a bad line, naming `line`.
    """
    if not isinstance(obj, dict):
        raise TraceError(line, "a line must be a JSON object")
    missing = [k for k in ("id", "question", "gold", "completions") if k not in obj]
    if missing:
        raise TraceError(line, f"missing field(s) {missing}")
    if not isinstance(obj["question"], str) or not isinstance(obj["id"], (str, int)):
        raise TraceError(line, "id must be a string (or integer) and question a string")
    if not isinstance(obj["completions"], list) or not obj["completions"]:
        raise TraceError(line, "completions must be a non-empty list")
    prompt_ids = obj.get("prompt_token_ids")
    if prompt_ids is not None:
        _int_list(prompt_ids, "prompt_token_ids", line)
    messages = obj.get("messages")
    if messages is not None and not (isinstance(messages, list) and all(isinstance(m, dict) for m in messages)):
        raise TraceError(line, "messages must be a list of chat message objects")
    alternatives = obj.get("gold_alternatives") or []
    if not isinstance(alternatives, list):
        raise TraceError(line, "gold_alternatives must be a list")
    sampling = obj.get("sampling") or {}
    if not isinstance(sampling, dict):
        raise TraceError(line, "sampling must be an object")
    return Trace(
        id=str(obj["id"]),
        question=obj["question"],
        gold=str(obj["gold"]),
        completions=[_completion(c, i, line) for i, c in enumerate(obj["completions"])],
        prompt_token_ids=prompt_ids,
        messages=messages,
        prompt=obj.get("prompt"),
        gold_alternatives=[str(g) for g in alternatives],
        source=str(obj.get("source") or ""),
        sampling=sampling,
        line=line,
    )


def _attempt(parse, raw, line: int) -> Trace | TraceError:
    try:
        return parse(raw, line)
    except TraceError as e:
        return e


def _parsed_lines(path, data: bytes, format: str) -> Iterator[tuple[int, Trace | TraceError]]:
    """Each non-blank line (or harness row) of the file: its number and its `Trace`, or the `TraceError` it raised."""
    if format == "hf_msv":
        for number, raw in enumerate(data.split(b"\n"), start=1):
            if raw.strip():
                yield number, _attempt(parse_trace, raw, number)
        return
    rows = lm_eval_rows(path, data) if format == "lm_eval" else lighteval_rows(path)
    for row in rows:
        if row.trace is None:
            yield row.line, TraceError(row.line, row.error or "unusable row")
        else:
            yield row.line, _attempt(trace_from_json, row.trace, row.line)


def read_traces(
    path: str | os.PathLike, skip_bad_lines: bool = False, num_samples: int | None = None, format: str = "auto"
) -> TraceFile:
    """Read and validate a trace file: hf_msv's format (``docs/collection.md``), an lm-eval samples file or a
    lighteval details file (``docs/harnesses.md``; their rows count as lines).

    Args:
        path: the trace file.
        skip_bad_lines: skip bad lines and list them in `TraceFile.bad_lines` instead of raising `TraceError`.
        num_samples: the N every line must have (default: the first good line's).
        format: ``"hf_msv"``, ``"lm_eval"``, ``"lighteval"``, or ``"auto"`` (`detect_trace_format`).

    Returns:
        The `TraceFile`.

    Raises:
        TraceError: the first bad line, unless `skip_bad_lines`.
        UserError: an unknown `format`, or a file in none of the formats.
    """
    if format not in TRACE_FORMATS:
        raise UserError(f"unknown trace format {format!r}: expected one of {TRACE_FORMATS}")
    data = Path(path).read_bytes()
    format = detect_trace_format(path, data) if format == "auto" else format
    traces, bad, seen = [], [], set()
    for number, parsed in _parsed_lines(path, data, format):
        try:
            if isinstance(parsed, TraceError):
                raise parsed
            trace = parsed
            n = num_samples if num_samples is not None else (len(traces[0].completions) if traces else None)
            if n is not None and len(trace.completions) != n:
                raise TraceError(
                    number, f"{len(trace.completions)} completions, but N = {n} (every problem needs the same number)"
                )
            if trace.id in seen:
                raise TraceError(number, f"duplicate problem id {trace.id!r}")
        except TraceError as e:
            if not skip_bad_lines:
                raise
            bad.append((e.line, e.reason))
            continue
        seen.add(trace.id)
        traces.append(trace)
    if not traces:
        raise UserError(f"{path} holds no usable trace ({len(bad)} bad lines)")
    return TraceFile(traces, bad, hashlib.sha256(data).hexdigest()[:16])


def write_traces(path: str | os.PathLike, traces: Iterable[Trace]) -> Path:
    """Write `traces` as a trace file, atomically (the format `read_traces` reads and `collect_from_traces`
    re-encodes); used by ``examples/sample_with_vllm.py`` and by the exports from hf_msv's own collections.

    Args:
        path: the trace file (its directory is created if missing).
        traces: the `Trace`s, one line each.

    Returns:
        `path` as a `Path`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(path)
    with open(tmp, "w", encoding="utf-8") as f:
        for trace in traces:
            f.write(json.dumps(trace.to_json(), ensure_ascii=False) + "\n")
    commit_file(tmp, path)
    return path


def traces_from_results(
    problems: Sequence[Problem],
    results: Sequence,
    prompt_token_ids: Sequence[Sequence[int]],
    sampling: dict | None = None,
) -> list[Trace]:
    """Traces of `MSVResult`s (one per problem, in order): each sequence's sampled token ids, EOS included, and the
    prompt tokens it was sampled from (`prompt_token_ids`, one list per problem, without padding).

    Args:
        problems: the `Problem`s.
        results: one `MSVResult` per problem.
        prompt_token_ids: one prompt token list per problem.
        sampling: the sampling settings to record in each trace.

    Returns:
        One `Trace` per problem.
    """
    traces = []
    for problem, result, prompt in zip(problems, results, prompt_token_ids, strict=True):
        completions = [
            Completion(token_ids=list(seq), finish_reason="stop" if finish == "eos" else "length")
            for seq, finish in zip(result.sequences, result.finish_reasons)
        ]
        traces.append(
            Trace(
                id=problem.id,
                question=problem.question,
                gold=problem.gold,
                completions=completions,
                prompt_token_ids=list(prompt),
                source=problem.source,
                sampling=dict(sampling or {}),
                gold_alternatives=[str(g) for g in problem.meta.get("gold_alternatives") or []],
            )
        )
    return traces


def traces_from_shards(directory: str | os.PathLike) -> list[Trace]:
    """Traces of a collection's shards (which keep each sequence's chain-of-thought token ids): no prompt, so
    re-encoding rebuilds it from the question with the collection's ``prompt_template``; sampling settings from the
    shard info. Gold alternatives are not in shards: labels re-graded from these traces use the gold answer only.

    Args:
        directory: the collection's output directory (or shard files).

    Returns:
        One `Trace` per problem, in shard order.

    Raises:
        UserError: if a shard keeps no chain-of-thought token ids or questions.
    """
    from ..data import list_shards, read_shard

    traces = []
    for path in list_shards(directory):
        problems, info = read_shard(path, hidden=False)
        sampling = {k: info[k] for k in ("temperature", "top_p", "top_k", "max_new_tokens", "seed") if k in info}
        for p in problems:
            if not p.cot_token_ids or not p.question:
                raise UserError(
                    f"{path} does not keep the chain-of-thought token ids and questions (written before "
                    "shards kept them): re-encode from the original traces instead"
                )
            completions = [
                Completion(token_ids=ids.tolist(), finish_reason="stop" if finish == "eos" else "length")
                for ids, finish in zip(p.cot_token_ids, p.sequence_finish)
            ]
            traces.append(
                Trace(
                    id=p.problem_id,
                    question=p.question,
                    gold=p.gold,
                    completions=completions,
                    source=p.source,
                    sampling=dict(sampling, engine="hf_msv"),
                )
            )
    return traces
