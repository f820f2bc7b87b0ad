"""``hf-msv collect``: `CollectConfig` flags → `collect` (``--problems``) or `collect_from_traces` (``--traces``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING

from ..arguments import parse_command_args
from ..errors import UserError
from .config import CollectConfig, build_parser

if TYPE_CHECKING:  # the rest imports torch: loaded once the flags are parsed (`--help` stays quick)
    from .job import CollectResult


def load_lm(*args, **kwargs):
    """`hf_msv.collect.lm.load_lm`, imported when first called: it imports torch, which ``--help`` does without."""
    from . import lm

    return lm.load_lm(*args, **kwargs)


def load_problems(*args, **kwargs):
    """`hf_msv.collect.lm.load_problems` (`hf_msv.data.load_problems`), imported when first called."""
    from . import lm

    return lm.load_problems(*args, **kwargs)


def quiet_progress_bars() -> None:
    """``--no-progress`` means no bar at all: transformers' (loading weights) and datasets' (reading a table) too."""
    import datasets
    from transformers.utils import logging as transformers_logging

    datasets.disable_progress_bars()
    transformers_logging.disable_progress_bar()


def collect_from_config(config: CollectConfig) -> CollectResult:
    """Load the LM and the problems `config` names and run `collect` with its settings (or, with ``traces``,
    `collect_from_traces` on that trace file).

    Args:
        config: the collection's settings.

    Returns:
        The `CollectResult` of this process.

    Raises:
        ValueError: what `CollectConfig.check_command_line`, `load_problems`, `collect` or `collect_from_traces`
            refuse, or ``engine="vllm"`` (which runs through ``hf-msv collect``).
        FileNotFoundError: a missing LM, benchmark file or trace file.
    """
    config.check_command_line()
    if config.engine == "vllm":
        raise UserError("--engine vllm runs through `hf-msv collect` (hf_msv.vllm.cli)")
    from .job import config_settings
    from .store import check_output_dir

    if not config.progress:
        quiet_progress_bars()
    config = config.resolved()  # every check below comes before the LM loads (minutes for a large one)
    output_dir = config.output_dir
    assert output_dir is not None  # check_command_line refused a command line without --output-dir
    if config.traces is not None:
        from .from_traces import TRACE_SETTINGS, collect_from_traces
        from .traces import read_traces

        check_output_dir(output_dir, config_settings(config, config.elicitation, TRACE_SETTINGS), config.overwrite)
        # Read (and check) the file before the LM: a malformed one fails in seconds, not after a large LM loads.
        traces = read_traces(config.traces, skip_bad_lines=config.skip_bad_lines, format=config.traces_format)
        model, tokenizer = load_lm(config.model_arguments, None)  # None: this process's device
        return collect_from_traces(model, tokenizer, traces, output_dir, config)
    from .live import LIVE_SETTINGS, collect

    check_output_dir(output_dir, config_settings(config, config.elicitation, LIVE_SETTINGS), config.overwrite)
    problems = load_problems(config.problems, config.problem_columns)  # before the LM: a bad spec fails fast
    model, tokenizer = load_lm(config.model_arguments, None)
    return collect(model, tokenizer, problems, output_dir, config)


def summary(result: CollectResult) -> dict:
    """`result` as the one JSON line ``hf-msv collect`` prints (shards counted, not listed)."""
    out = {k: v for k, v in asdict(result).items() if k != "shards"}
    out.update(shards_written=len(result.shards), tokens_per_s=result.tokens_per_s)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """``hf-msv collect``: flags from `CollectConfig` (and ``--config FILE``, ``--log-level``:
    `hf_msv.arguments.parse_command_args`); prints this process's `CollectResult` as one JSON line, after
    a warning on stderr for skipped trace lines or unverifiable equivalence verdicts.

    Args:
        argv: the command-line arguments; `None`: ``sys.argv[1:]``.
    """
    parser = build_parser()
    (config,) = parse_command_args(parser, argv)
    try:
        config.check_command_line()
    except ValueError as e:
        parser.error(str(e))
    result = collect_from_config(config)
    if result.skipped_lines:
        print(
            f"warning: skipped {result.skipped_lines} bad line(s) of {config.traces} (listed in the shard info, "
            "bad_lines)",
            file=sys.stderr,
        )
    if result.unverifiable:
        print(
            f"warning: {result.unverifiable} of {result.checks} equivalence checks were unverifiable (counted as "
            "different answers; per shard in its info, verdicts)",
            file=sys.stderr,
        )
    print(json.dumps(summary(result)))


__all__ = ["collect_from_config", "main", "quiet_progress_bars", "summary"]
