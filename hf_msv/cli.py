"""`hf-msv <command> [flags]`: a thin dispatcher to each package's ``main`` (flags built from its config dataclasses).

    hf-msv demo --problems 3          # hf_msv.demo.main(["--problems", "3"])
    hf-msv collect --help             # the flags of hf_msv.collect.CollectConfig
    hf-msv --debug train ...          # a user error shows its traceback (also HF_MSV_DEBUG=1)

Exit codes and what reaches stderr:

* 0: done (also after ``--help``).
* 2, one line ``hf-msv <command>: error: <what is wrong>``: a user error. That is an `hf_msv.errors.UserError`
  (every input check raises one: missing or wrong-kind paths, bad flag values, bad file contents, an unsupported
  model), an exception raised ``from`` one (a caller that adds context), an `OSError` the system raised on a path
  given on the command line (a file where ``--work-dir`` should be) or on a full or read-only disk, a flag argparse
  refuses (unknown ones included), or ``sys.exit("text")``. ``--debug`` (or ``HF_MSV_DEBUG=1``) raises it instead,
  traceback included.
* 130: interrupted (Ctrl-C); a command's own ``sys.exit(n)`` keeps its code.
* Anything else is an internal error, a bug to report: it is not caught, so Python prints its traceback and exits
  with code 1 (a `ValueError` or `OSError` that no input check raised is one of these).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from collections.abc import Sequence

from .errors import RAISE_FLAG_ERRORS, FlagError, UserError

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("hf_msv.demo", "N parallel samples per problem, MSV selection and early stopping"),
    "collect": ("hf_msv.collect", "sample N answers per problem and write hidden-state shards"),
    "train": ("hf_msv.training", "train an MSV_N or a probe on collected shards"),
    "evaluate": ("hf_msv.evaluation", "baselines, metrics, figures and λ rules over collected shards"),
    "reproduce": ("hf_msv.reproduction", "the paper's experiments on the testbed (--quick: ~10 min)"),
    "respace": ("hf_msv.collect.respace", "a collection's answers under a sparser elicitation schedule, no LM run"),
    "export": ("hf_msv.data.cli", "export a collection: answers as parquet, jsonl or arrow; shards to a Hub dataset"),
}
"""Command -> (module whose ``main(argv)`` runs it, one line of help)."""

USER_ERRORS = (UserError,)
"""Exceptions a command reports as a user error (one line, exit code 2) unless ``--debug`` is given: `UserError`,
which every input check raises (its kinds, `hf_msv.errors`, are also `FileNotFoundError`, `NotADirectoryError`,
`NotImplementedError`; `UserError` itself is a `ValueError`). `is_user_error` adds the exceptions raised from one and
the system's `OSError` on a path from the command line; everything else is an internal error and keeps its
traceback."""

EXIT_USER_ERROR = 2

_FULL_OR_READ_ONLY = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
"""An `OSError` with one of these (disk full, quota exceeded, read-only file system) is reported as a user error
wherever it happens: the machine needs fixing, not the program."""


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: ``--help``, ``--debug`` and the list of commands (each command parses its own flags)."""
    parser = _Parser(
        prog="hf-msv",
        description="Multi-Sequence Verifiers: sample, verify, stop early.",
        epilog="`hf-msv <command> --help` lists the flags of one command.",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="show the traceback of a user error (also: HF_MSV_DEBUG=1); before or after the command",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="<command>")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def error_line(error: BaseException) -> str:
    """One line that says what went wrong: an OS error's path and reason, otherwise the message, newlines folded."""
    if isinstance(error, FileExistsError) and error.filename is not None and not os.path.isdir(error.filename):
        message = f"not a directory (a file is in the way): {error.filename}"  # mkdir(exist_ok=True) on a file
    elif isinstance(error, OSError) and error.filename is not None and error.strerror:
        message = f"{error.strerror[:1].lower()}{error.strerror[1:]}: {error.filename}"
        if error.filename2 is not None:
            message += f" -> {error.filename2}"
    else:
        message = str(error) or type(error).__name__
        if isinstance(error, KeyError):  # str(KeyError("x")) is "'x'"
            message = str(error.args[0]) if error.args else message
    return " ".join(message.split())


def is_user_error(error: BaseException, argv: Sequence[str] = ()) -> bool:
    """Whether `error` is reported as a user error: a `USER_ERRORS` instance, an exception raised ``from`` one (its
    ``__cause__`` chain; an error merely raised while handling one is not), or an `OSError` the system raised on a
    path given in `argv` (``--flag PATH``, ``--flag=PATH``, ``NAME=PATH``)."""
    seen = set()
    cause = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, USER_ERRORS):
            return True
        seen.add(id(cause))
        cause = cause.__cause__
    if isinstance(error, OSError) and error.errno in _FULL_OR_READ_ONLY:
        return True  # the disk, not the program: nothing to fix in the code, something to free or remount
    if isinstance(error, OSError) and error.filename is not None and argv:
        given = {_path_key(part) for arg in argv for part in (arg, *arg.split("=")[1:]) if part}
        return any(
            _path_key(name) in given
            for name in (error.filename, error.filename2)
            if isinstance(name, (str, bytes, os.PathLike))
        )
    return False


def _path_key(name) -> str:
    return os.path.normpath(os.path.abspath(os.path.expanduser(os.fsdecode(name))))


class _Parser(argparse.ArgumentParser):
    """The top-level parser (and its subparsers): raises `FlagError` where argparse prints its usage and exits 2."""

    def error(self, message: str):  # pyright: ignore[reportIncompatibleMethodOverride]
        raise FlagError(message)


def _asks_for_help(argv: Sequence[str]) -> bool:
    """Whether `argv` asks for a command's help (``-h`` or ``--help`` before any ``--``)."""
    end = list(argv).index("--") if "--" in argv else len(argv)
    return any(a in ("-h", "--help") for a in argv[:end])


def _split_debug(argv: list[str]) -> tuple[list[str], bool]:
    """(argv without ``--debug``, whether it or ``HF_MSV_DEBUG`` asks for tracebacks); nothing after ``--`` is
    touched."""
    end = argv.index("--") if "--" in argv else len(argv)
    debug = "--debug" in argv[:end]
    kept = [a for a in argv[:end] if a != "--debug"] + argv[end:]
    return kept, debug or os.environ.get("HF_MSV_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def _fail(command: str, message: str) -> None:
    print(f"hf-msv {command}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_USER_ERROR) from None


def command_module(command: str, argv: list[str]) -> str:
    """The module that runs `command`: ``collect --engine vllm`` goes to `hf_msv.vllm.cli`."""
    if command == "collect" and any(
        a == "--engine=vllm" or (a == "--engine" and argv[i + 1 : i + 2] == ["vllm"]) for i, a in enumerate(argv)
    ):
        return "hf_msv.vllm.cli"
    return COMMANDS[command][0]


def run_command(command: str, argv: list[str], debug: bool = False):
    """Run ``command``'s ``main(argv)``; a user error (`is_user_error`, a flag argparse refused,
    ``sys.exit("text")``) ends as one line on stderr and `SystemExit` (2), unless ``debug``.

    Raises:
        SystemExit: 2 for a user error; the command's own exit code otherwise.
        Exception: an internal error (anything else), as raised, traceback included.
    """
    raising = RAISE_FLAG_ERRORS.set(True)  # the command's parser raises FlagError, reported below in one line
    try:
        module = importlib.import_module(command_module(command, argv))  # imported late: only what runs
        if not _asks_for_help(argv):  # a command's help imports no torch
            from . import register_auto_classes

            register_auto_classes()  # `hf-msv` defers it (it imports torch) until a command runs
        return module.main(argv)
    except FlagError as e:
        if debug:
            raise
        _fail(command, f"{error_line(e)} (`hf-msv {command} --help` lists the flags)")
    except Exception as e:
        if debug or not is_user_error(e, argv):
            raise
        _fail(command, error_line(e))
    except SystemExit as e:
        if isinstance(e.code, str) and not debug:  # sys.exit("what is wrong"): a usage error
            _fail(command, " ".join(e.code.split()))
        raise
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"hf-msv {command}: interrupted", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    finally:
        RAISE_FLAG_ERRORS.reset(raising)


def main(argv: Sequence[str] | None = None) -> None:
    """``hf-msv [--debug] <command> [flags]`` (``argv``: without the program name; default ``sys.argv[1:]``).

    Raises:
        SystemExit: 0 after ``--help``; 2 for a user error or an unknown command; the command's own exit code.
        Exception: an internal error, uncaught (`run_command`).
    """
    argv, debug = _split_debug(list(sys.argv[1:] if argv is None else argv))
    if not argv or argv[0] not in COMMANDS:
        try:
            build_parser().parse_args(argv)  # prints the help and exits, or raises naming the valid commands
        except FlagError as e:
            print(f"hf-msv: error: {e} (`hf-msv --help` lists the commands)", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_USER_ERROR) from None
        return
    if debug:
        os.environ["HF_MSV_DEBUG"] = "1"  # commands that start other processes pass it on
    run_command(argv[0], argv[1:], debug)


if __name__ == "__main__":
    main()
