"""The options every ``hf-msv`` command shares: ``--config FILE`` (a YAML file of its flags) and ``--log-level``.

`parse_command_args` parses a command's `transformers.HfArgumentParser` as TRL's ``TrlParser`` does: the YAML file's
values become the parser's defaults, so flags on the command line override them. See ``docs/own_lm.md``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from .errors import MissingPathError, UserError

LOG_LEVELS = ("debug", "info", "warning", "error")
"""The values of ``--log-level`` (levels of the ``hf_msv`` logger)."""

_OWN = ("config", "log_level")  # the dests of the shared options, never dataclass fields


def _shared_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="YAML file of this command's options (field names -> values); flags given on the command line win.",
    )
    parser.add_argument(
        "--log-level",
        "--log_level",
        default="warning",
        choices=LOG_LEVELS,
        help="Level of the hf_msv log lines shown on stderr.",
    )


def read_config_file(path: str | Path) -> dict:
    """The options of a ``--config`` YAML file.

    Args:
        path: a YAML file holding one mapping of option names to values.

    Returns:
        The mapping, names with ``-`` written as ``_`` (``num-samples`` is ``num_samples``).

    Raises:
        MissingPathError: no such file.
        UserError: a file that is not YAML or not a mapping.
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise MissingPathError(f"--config {path}: no such file")
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise UserError(f"--config {path}: not YAML ({' '.join(str(error).split())})") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise UserError(f"--config {path}: expected a mapping of option names to values, got {type(values).__name__}")
    return {str(key).replace("-", "_"): value for key, value in values.items()}


def apply_config_file(parser: argparse.ArgumentParser, values: dict, path: str | Path) -> None:
    """Make `values` the defaults of `parser`'s options: a required option given there is required no more.

    Raises:
        UserError: a name that is none of the parser's options (all of them named in the message).
    """
    actions = {a.dest: a for a in parser._actions if a.dest not in (*_OWN, "help")}
    unknown = sorted(set(values) - set(actions))
    if unknown:
        raise UserError(f"--config {path}: unknown option(s) {unknown}; valid: {sorted(actions)}")
    for name in values:
        actions[name].required = False
    parser.set_defaults(**values)


class _StderrHandler(logging.StreamHandler):
    """Writes to `sys.stderr` as it is when a line is logged, not as it was when the handler was made (a command run
    in-process, under a replaced stderr, leaves no handler writing to a closed stream)."""

    _hf_msv_cli = True  # ours to replace, not a handler the user added

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def configure_logging(level: str = "warning") -> logging.Handler:
    """One stderr handler on the ``hf_msv`` logger at `level` (a second call replaces the first one's handler).

    Args:
        level: one of `LOG_LEVELS`.

    Returns:
        The handler.
    """
    logger = logging.getLogger("hf_msv")
    for handler in [h for h in logger.handlers if getattr(h, "_hf_msv_cli", False)]:
        logger.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.setLevel(level.upper())
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    return handler


def parse_command_args(parser, argv: Sequence[str] | None = None) -> tuple:
    """A command's dataclasses from `argv`, after ``--config FILE`` and ``--log-level``.

    Args:
        parser: the command's `transformers.HfArgumentParser`; ``--config`` and ``--log-level`` are added to it (so
            its ``--help`` lists them).
        argv: the command-line arguments; `None`: ``sys.argv[1:]``.

    Returns:
        What ``parser.parse_args_into_dataclasses`` returns, one instance per dataclass.

    Raises:
        UserError: an unknown option in the ``--config`` file, or a file that is not a YAML mapping.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(a.dest == "config" for a in parser._actions):
        _shared_options(parser)
    shared = argparse.ArgumentParser(add_help=False)
    _shared_options(shared)
    known, _ = shared.parse_known_args(argv)
    configure_logging(known.log_level)
    if known.config is not None:
        apply_config_file(parser, read_config_file(known.config), known.config)
    outputs = parser.parse_args_into_dataclasses(argv)
    # the shared options parse into a trailing namespace of their own, not into a dataclass
    return tuple(o for o in outputs if not isinstance(o, argparse.Namespace))


__all__ = ["LOG_LEVELS", "apply_config_file", "configure_logging", "parse_command_args", "read_config_file"]
