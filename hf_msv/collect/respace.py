"""``hf-msv respace``: a collection's answers under a sparser elicitation schedule, without running the LM.

An elicited answer depends only on its chain's prefix, and a spaced schedule (``min_gap_tokens``) elicits at a subset
of the steps where an unspaced one does, so an unspaced collection already holds every answer a spaced one would
collect from the same chains. Respacing keeps, chain by chain, the answers that `ElicitationSettings.too_soon` (the
rule every engine calls) does not skip, and writes them as a collection of that schedule: the data to train and
evaluate a verifier for a cheaper schedule, at the cost of reading shards. See ``docs/collection.md``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..arguments import parse_command_args
from ..data import CollectedProblem, collection_elicitation, list_shards, read_shard, write_shard
from ..elicitation import ElicitationSettings
from ..errors import MissingPathError, UserError
from ..generation.forking import ends_chain
from ..utils import atomic_write_json
from .store import CONFIG_FILE, write_index

__all__ = ["RespaceConfig", "RespaceResult", "respace_problem", "respace_collection", "main"]


@dataclass
class RespaceConfig:
    """Derive a collection with spaced answers (``min_gap_tokens``) from an unspaced one, without the LM.

    Args:
        source: the unspaced streaming collection directory.
        output_dir: the new collection directory.
        min_gap_tokens: the spacing: a chain elicits at a delimiter (or every-K step) only this many tokens after
            its previous answer.
        overwrite: replace an existing output directory.
    """

    source: str = field(metadata={"help": "The unspaced streaming collection directory."})
    output_dir: str = field(metadata={"help": "The new collection directory."})
    min_gap_tokens: int = field(
        metadata={"help": "Elicit at a delimiter only this many chain tokens after the chain's previous answer."}
    )
    overwrite: bool = field(default=False, metadata={"help": "Replace an existing --output-dir."})


@dataclass(frozen=True)
class RespaceResult:
    """What `respace_collection` wrote.

    Attributes:
        output_dir: the new collection.
        problems: problems written.
        answers_before, answers_after: answers in the source and in the new collection.
        early_terminals: chains cut by the token budget right at a delimiter the spacing skips. A live spaced run
            elicits their last answer after the delimiter (at the budget), the source before it; these keep the
            source's answer (an every-K answer there is the budget answer, relabelled).
    """

    output_dir: str
    problems: int
    answers_before: int
    answers_after: int
    early_terminals: int


def respace_problem(problem: CollectedProblem, settings: ElicitationSettings) -> tuple[CollectedProblem, int]:
    """One problem's answers under `settings`' spacing.

    Args:
        problem: the problem as an unspaced collection holds it.
        settings: the spaced schedule (``min_gap_tokens`` set).

    Returns:
        ``(problem, early_terminals)``: the problem with the kept answers (steps renumbered per chain; hidden
        states, tokens and CoT arrays carried over), and how many of its terminal answers sat at a skipped delimiter.
    """
    keep = np.zeros(problem.num_answers, dtype=bool)
    step = np.zeros(problem.num_answers, dtype=np.int64)
    trigger = list(problem.answer_trigger)
    early = 0
    for n in range(problem.num_sequences):
        rows = np.flatnonzero(problem.answer_sequence == n)
        previous, k = None, 0
        for a in rows[np.argsort(problem.answer_tau[rows], kind="stable")]:
            tau = int(problem.answer_tau[a])
            if not ends_chain(trigger[a]) and settings.too_soon(tau, previous):
                if not problem.answer_terminal[a]:
                    continue
                # A chain cut by the budget here: a spaced run elicits its last answer at the budget. An every-K
                # branch is that branch; a delimiter branch stops before the delimiter, the budget one after it.
                if trigger[a] == "delimiter":
                    early += 1
                else:
                    trigger[a] = "budget"
            keep[a], step[a], previous, k = True, k, tau, k + 1
    tokens = np.repeat(keep, problem.answer_length)
    kept = np.flatnonzero(keep)
    return CollectedProblem(
        problem_id=problem.problem_id,
        gold=problem.gold,
        source=problem.source,
        question=problem.question,
        hidden_states=None if problem.hidden_states is None else problem.hidden_states[tokens],
        token_ids=problem.token_ids[tokens],
        token_logprobs=problem.token_logprobs[tokens],
        answer_text=[problem.answer_text[a] for a in kept],
        answer_raw_text=[problem.answer_raw_text[a] for a in kept],
        answer_trigger=[trigger[a] for a in kept],
        answer_sequence=problem.answer_sequence[kept],
        answer_step=step[kept],
        answer_tau=problem.answer_tau[kept],
        answer_length=problem.answer_length[kept],
        answer_class=problem.answer_class[kept],
        answer_terminal=problem.answer_terminal[kept],
        answer_correct=problem.answer_correct[kept],
        sequence_length=problem.sequence_length,
        sequence_finish=problem.sequence_finish,
        cot_confidence=problem.cot_confidence,
        cot_token_ids=problem.cot_token_ids,
        answer_end=None if problem.answer_end is None else problem.answer_end[kept],
    ), early


def _spaced_settings(source: Path, min_gap_tokens: int) -> tuple[dict, ElicitationSettings]:
    """The source's ``collect_config.json`` and the spaced settings, refusing what respacing cannot derive."""
    config_file = source / CONFIG_FILE
    if not config_file.is_file():
        raise MissingPathError(f"no collection at {source} (no {CONFIG_FILE}); give an `hf-msv collect` directory")
    info = json.loads(config_file.read_text())
    settings = collection_elicitation(info)
    if settings.mode != "streaming":
        raise UserError(f"{source} is a terminal collection: it has one answer per chain, nothing to space")
    if settings.min_gap_tokens is not None:
        # A spaced schedule's answers are not a superset of a sparser one's (a skipped delimiter can be the one the
        # sparser schedule keeps), so only an unspaced collection can be respaced.
        raise UserError(
            f"{source} is already spaced (min_gap_tokens={settings.min_gap_tokens}); respace an unspaced collection"
        )
    return info, settings.replace(min_gap_tokens=min_gap_tokens)


def respace_collection(config: RespaceConfig) -> RespaceResult:
    """Write `config.source`'s answers under the spacing ``config.min_gap_tokens`` to `config.output_dir`.

    Args:
        config: the settings.

    Returns:
        The `RespaceResult`.

    Raises:
        UserError: for a missing, terminal or already spaced source, a gap below 1, the source as output, or an
            existing output without ``overwrite``; all before anything is written.
    """
    source, output = Path(config.source), Path(config.output_dir)
    if config.min_gap_tokens < 1:
        raise UserError(f"--min-gap-tokens must be at least 1, got {config.min_gap_tokens}")
    info, settings = _spaced_settings(source, config.min_gap_tokens)
    shards = list_shards(source)
    if not shards:
        raise UserError(f"{source} has no shards yet: let its collection finish first")
    if output.resolve() == source.resolve():
        raise UserError("--output-dir must differ from --source")
    if output.exists() and any(output.iterdir()):
        if not config.overwrite:
            raise UserError(f"{output} is not empty; pass --overwrite to replace it")
        shutil.rmtree(output)
    output.mkdir(parents=True, exist_ok=True)
    info = info | {"elicitation": settings.to_dict(), "respaced_from": str(source)}
    atomic_write_json(output / CONFIG_FILE, info)
    problems = before = after = early = 0
    for path in shards:
        originals, shard_info = read_shard(path)
        respaced = [respace_problem(p, settings) for p in originals]
        shard_info = shard_info | {"elicitation": settings.to_dict(), "respaced_from": str(source)}
        states = originals[0].hidden_states
        assert states is not None  # shards always store them
        dtype = str(states.dtype).removeprefix("torch.")  # as stored: no re-rounding
        write_shard(output / path.name, [p for p, _ in respaced], shard_info, dtype=dtype)
        problems += len(originals)
        before += sum(p.num_answers for p in originals)
        after += sum(p.num_answers for p, _ in respaced)
        early += sum(e for _, e in respaced)
    write_index(output)
    return RespaceResult(str(output), problems, before, after, early)


def main(argv: Sequence[str] | None = None) -> None:
    """``hf-msv respace``: flags from `RespaceConfig`; prints the `RespaceResult` as one JSON line.

    Args:
        argv: the command-line arguments; `None`: ``sys.argv[1:]``.
    """
    from ..arguments import CommandParser, doc_summary

    parser = CommandParser(RespaceConfig, prog="hf-msv respace", description=doc_summary(RespaceConfig))
    (config,) = parse_command_args(parser, argv)
    print(json.dumps(asdict(respace_collection(config))))
