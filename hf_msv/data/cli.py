"""``hf-msv export``: a collection's answers as parquet / JSON Lines / arrow, or its shards to a Hub dataset repo."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from ..arguments import CommandParser, doc_summary, parse_command_args
from ..errors import UserError
from .export import EXPORT_FORMATS, ExportResult, PushResult, export_shards, push_shards_to_hub


@dataclass
class ExportConfig:
    """Export a collection's shards: one row per answer to a file, and/or the shards to a Hub dataset repo.

    Args:
        shards: the collection directory (or one shard file).
        output: the file (parquet, jsonl) or directory (arrow) to write the answer rows to.
        format: parquet, jsonl or arrow.
        hidden_states: add the answer tokens' hidden states to the rows (a list column: large).
        overwrite: replace an existing output.
        push_to_hub: a Hub dataset repo (``<org>/<name>``) to upload the shards themselves to.
        revision: the branch of that repo to commit to.
        private: make a new repo private.
    """

    shards: str = field(metadata={"help": "The collection directory (or one shard file)."})
    output: str | None = field(
        default=None, metadata={"help": "File (parquet, jsonl) or directory (arrow) to write one row per answer to."}
    )
    format: str = field(default="parquet", metadata={"help": "Format of --output.", "choices": list(EXPORT_FORMATS)})
    hidden_states: bool = field(
        default=False, metadata={"help": "Add the answer tokens' hidden states to the rows (a list column: large)."}
    )
    overwrite: bool = field(default=False, metadata={"help": "Replace an existing --output."})
    push_to_hub: str | None = field(
        default=None, metadata={"help": "Hub dataset repo (<org>/<name>) to upload the shard files themselves to."}
    )
    revision: str | None = field(default=None, metadata={"help": "Branch of --push-to-hub to commit to."})
    private: bool = field(default=False, metadata={"help": "Make a new --push-to-hub repo private."})

    def __post_init__(self):
        if self.output is None and self.push_to_hub is None:
            raise UserError("give --output (a file of answer rows), --push-to-hub (a Hub dataset repo), or both")


@dataclass(frozen=True)
class ExportRun:
    """What ``hf-msv export`` did: the file it wrote and the upload it made (`None` where not asked)."""

    export: ExportResult | None
    push: PushResult | None


def export_from_config(config: ExportConfig) -> ExportRun:
    """Run the export and the upload that `config` asks for.

    Args:
        config: the settings.

    Returns:
        The `ExportRun`.
    """
    exported = pushed = None
    if config.output is not None:
        exported = export_shards(config.shards, config.output, config.format, config.hidden_states, config.overwrite)
    if config.push_to_hub is not None:
        pushed = push_shards_to_hub(config.shards, config.push_to_hub, config.revision, config.private or None)
    return ExportRun(exported, pushed)


def build_parser():
    """The ``hf-msv export`` parser: one flag per `ExportConfig` field."""
    return CommandParser(ExportConfig, prog="hf-msv export", description=doc_summary(ExportConfig))


def main(argv: Sequence[str] | None = None) -> None:
    """``hf-msv export``: flags from `ExportConfig`; prints the `ExportRun` as one JSON line.

    Args:
        argv: the command-line arguments; `None`: ``sys.argv[1:]``.
    """
    (config,) = parse_command_args(build_parser(), argv)
    print(json.dumps(asdict(export_from_config(config)), default=str))


__all__ = ["ExportConfig", "ExportRun", "build_parser", "export_from_config", "main"]
