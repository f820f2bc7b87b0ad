"""The options every ``hf-msv`` command shares: ``--config FILE`` (a YAML file of its flags) and ``--log-level``, and
`CommandParser`, the parser of every command.

`parse_command_args` parses a command's `CommandParser` as TRL's ``TrlParser`` does: the YAML file's values become
the parser's defaults, so flags on the command line override them. See ``docs/own_lm.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, cast

from transformers import HfArgumentParser  # no torch: `hf-msv <command> --help` stays quick
from transformers.hf_argparser import DataClassType

from .errors import RAISE_FLAG_ERRORS, FlagError, MissingPathError, UserError

LOG_LEVELS = ("debug", "info", "warning", "error")
"""The values of ``--log-level`` (levels of the ``hf_msv`` logger)."""

_OWN = ("config", "log_level")  # the dests of the shared options, never dataclass fields


class _SharedParser(argparse.ArgumentParser):
    """The parser of the shared options alone; refuses a flag as `CommandParser` does."""

    def error(self, message: str):  # pyright: ignore[reportIncompatibleMethodOverride]
        if RAISE_FLAG_ERRORS.get():
            raise FlagError(message)
        super().error(message)


class CommandParser(HfArgumentParser):
    """The parser of an ``hf-msv`` command (flags from dataclasses, as `transformers.HfArgumentParser` builds them),
    as TRL's ``TrlParser`` is. A refused flag (unknown, missing, a value of the wrong type) goes to `error`: under
    ``hf-msv`` (`RAISE_FLAG_ERRORS`) a `FlagError`, which it reports in one line; called directly, argparse's usage
    and exit code 2."""

    def __init__(self, dataclass_types: type[Any] | Iterable[type[Any]], **kwargs):
        # transformers types `dataclass_types` as a NewType of Any, which no class is declared as
        super().__init__(cast("Iterable[DataClassType]", dataclass_types), **kwargs)

    def error(self, message: str):  # pyright: ignore[reportIncompatibleMethodOverride]
        if RAISE_FLAG_ERRORS.get():
            raise FlagError(message)
        super().error(message)

    def parse_args_into_dataclasses(self, args=None, return_remaining_strings=False, *rest, **kwargs):
        """`HfArgumentParser.parse_args_into_dataclasses`, with flags left over sent to `error` (argparse's
        "unrecognized arguments", where it raises a plain `ValueError`), and a plain `ValueError` of a dataclass's
        checks (a value it could not read, e.g. malformed JSON) raised as the `UserError` it is."""
        try:
            outputs = super().parse_args_into_dataclasses(args, True, *rest, **kwargs)
        except ValueError as refused:  # argparse's refusals went to error(): this is a dataclass's, of a flag value
            if isinstance(refused, UserError):
                raise
            raise UserError(f"a flag's value was refused ({type(refused).__name__}: {refused})") from refused
        if return_remaining_strings:
            return outputs
        *outputs, remaining = outputs
        if remaining:
            self.error(f"unrecognized arguments: {' '.join(remaining)}")
        return (*outputs,)

    @classmethod
    def of(cls, parser: HfArgumentParser) -> CommandParser:
        """`parser` itself if it is a `CommandParser`, else one with its dataclasses, ``prog`` and description (a
        command that built a plain `HfArgumentParser` and changed no flag)."""
        if isinstance(parser, cls):
            return parser
        return cls(parser.dataclass_types, prog=parser.prog, description=parser.description)


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
        default=None,
        choices=LOG_LEVELS,
        help="Level of the hf_msv log lines shown on stderr (default: warning).",
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
        UserError: a name that is none of the parser's options (all of them named in the message), or a value the
            option's flag would refuse (the wrong type, not one of its choices).
    """
    actions = {a.dest: a for a in parser._actions if a.dest not in (*_OWN, "help")}
    unknown = sorted(set(values) - set(actions))
    if unknown:
        raise UserError(f"--config {path}: unknown option(s) {unknown}; valid: {sorted(actions)}")
    for name in values:
        actions[name].required = False
    mappings = {
        f.name for t in getattr(parser, "dataclass_types", ()) for f in dataclasses.fields(t) if "dict" in str(f.type)
    }
    parser.set_defaults(
        **{name: _config_value(actions[name], name, value, path, name in mappings) for name, value in values.items()}
    )


def _config_value(action: argparse.Action, name: str, value, path: str | Path, takes_mapping: bool = False):
    """A ``--config`` file's `value` for option `name` as its flag would parse it (each item of a list through the
    flag's type, then its choices); `None`, and a mapping for an option that takes one (`takes_mapping`: a JSON
    object on the command line), are left as they are.

    Raises:
        UserError: a value the flag would refuse.
    """
    many = action.nargs in ("+", "*")
    if isinstance(value, list) and not many:
        raise UserError(f"--config {path}: {name} takes one value, got a list")
    items = value if isinstance(value, list) else [value]
    converted = []
    for item in items:
        if isinstance(item, dict) and not takes_mapping:
            raise UserError(f"--config {path}: {name} takes no mapping, got {item!r}")
        if item is not None and not isinstance(item, dict) and callable(action.type):
            try:
                item = action.type(str(item).lower() if isinstance(item, bool) else str(item))
            except (TypeError, ValueError, argparse.ArgumentTypeError):
                raise UserError(f"--config {path}: {name}: invalid value {item!r}") from None
        if item is not None and action.choices is not None and item not in action.choices:
            raise UserError(f"--config {path}: {name}: {item!r} is not one of {list(action.choices)}")
        converted.append(item)
    return converted if isinstance(value, list) or (many and value is not None) else converted[0]


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


def doc_summary(obj: object) -> str:
    """The first line of `obj`'s docstring (a parser's description); empty without one."""
    return next(iter((obj.__doc__ or "").strip().splitlines()), "")


def parse_command_args(parser: HfArgumentParser, argv: Sequence[str] | None = None) -> tuple:
    """A command's dataclasses from `argv`, after ``--config FILE`` and ``--log-level`` (which the file may set too).

    Args:
        parser: the command's `CommandParser` (a plain `transformers.HfArgumentParser` is rebuilt as one:
            `CommandParser.of`); ``--config`` and ``--log-level`` are added to it (so its ``--help`` lists them).
        argv: the command-line arguments; `None`: ``sys.argv[1:]``.

    Returns:
        What ``parser.parse_args_into_dataclasses`` returns, one instance per dataclass.

    Raises:
        FlagError: a flag the parser refuses.
        UserError: an unknown option or a bad value in the ``--config`` file, or a file that is not a YAML mapping.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = CommandParser.of(parser)
    if not any(a.dest == "config" for a in parser._actions):
        _shared_options(parser)
    shared = _SharedParser(add_help=False)
    _shared_options(shared)
    known, _ = shared.parse_known_args(argv)
    values = read_config_file(known.config) if known.config is not None else {}
    values.pop("config", None)  # a file naming another file: not followed
    level = values.pop("log_level", None)
    if level is not None and str(level).lower() not in LOG_LEVELS:
        raise UserError(f"--config {known.config}: log_level: {level!r} is not one of {list(LOG_LEVELS)}")
    configure_logging(known.log_level or (str(level).lower() if level is not None else "warning"))
    if values and known.config is not None:  # values come from the file only
        apply_config_file(parser, values, known.config)
    outputs = parser.parse_args_into_dataclasses(argv)
    # the shared options parse into a trailing namespace of their own, not into a dataclass
    return tuple(o for o in outputs if not isinstance(o, argparse.Namespace))


__all__ = [
    "CommandParser",
    "LOG_LEVELS",
    "apply_config_file",
    "configure_logging",
    "parse_command_args",
    "read_config_file",
]
