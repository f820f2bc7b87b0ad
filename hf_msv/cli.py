"""`hf-msv <command> [flags]`: a thin dispatcher to each package's ``main`` (flags built from its config dataclasses).

    hf-msv demo --problems 3          # hf_msv.demo.main(["--problems", "3"])
    hf-msv collect --help             # the flags of hf_msv.collect.CollectConfig
    hf-msv --debug train ...          # a user error shows its traceback (also HF_MSV_DEBUG=1)

User errors (missing or wrong-kind paths, bad flags, bad data) end as one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Iterator, Sequence

from .errors import UserError

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("hf_msv.demo", "N parallel samples per problem, MSV selection and early stopping"),
    "collect": ("hf_msv.collect", "sample N answers per problem and write hidden-state shards"),
    "train": ("hf_msv.training", "train an MSV_N or a probe on collected shards"),
    "evaluate": ("hf_msv.evaluation", "baselines, metrics, figures and λ rules over collected shards"),
    "reproduce": ("hf_msv.reproduction", "the paper's experiments on the testbed (--quick: ~10 min)"),
}
"""Command -> (module whose ``main(argv)`` runs it, one line of help)."""

USER_ERRORS = (UserError, OSError, ValueError)
"""Exceptions a command reports as a user error (one line, exit code 2) unless ``--debug`` is given: a bad path or
file (`OSError`: FileNotFoundError, NotADirectoryError, a checkpoint transformers cannot read, ...), a value an input
check refused (`ValueError`), or `UserError`."""

EXIT_USER_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: ``--help``, ``--debug`` and the list of commands (each command parses its own flags)."""
    parser = argparse.ArgumentParser(prog="hf-msv", description="Multi-Sequence Verifiers: sample, verify, stop early.",
                                     epilog="`hf-msv <command> --help` lists the flags of one command.")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of a user error (also: HF_MSV_DEBUG=1); before or after the command")
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


class _ArgumentError(UserError):
    """A flag argparse refused (raised instead of its usage text and exit)."""


def _raise_argument_error(self: argparse.ArgumentParser, message: str):
    raise _ArgumentError(message)


@contextlib.contextmanager
def _flag_errors_raise() -> Iterator[None]:
    """Within: every argparse parser raises `_ArgumentError` where it would print its usage and exit 2."""
    original = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = _raise_argument_error
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original


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
    if command == "collect" and any(a == "--engine=vllm" or (a == "--engine" and argv[i + 1:i + 2] == ["vllm"])
                                    for i, a in enumerate(argv)):
        return "hf_msv.vllm.cli"
    return COMMANDS[command][0]


def run_command(command: str, argv: list[str], debug: bool = False):
    """Run ``command``'s ``main(argv)``; a user error (`USER_ERRORS`, a flag argparse refused, ``sys.exit("text")``)
    ends as one line on stderr and `SystemExit` (2), unless ``debug``.

    Raises:
        SystemExit: 2 for a user error; the command's own exit code otherwise.
    """
    try:
        with _flag_errors_raise():
            module = importlib.import_module(command_module(command, argv))  # imported late: only what runs
            from . import register_auto_classes

            register_auto_classes()  # `hf-msv` defers it (it imports torch) until a command runs
            return module.main(argv)
    except _ArgumentError as e:
        if debug:
            raise
        _fail(command, f"{error_line(e)} (`hf-msv {command} --help` lists the flags)")
    except USER_ERRORS as e:
        if debug:
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


def main(argv: Sequence[str] | None = None) -> None:
    """``hf-msv [--debug] <command> [flags]`` (``argv``: without the program name; default ``sys.argv[1:]``).

    Raises:
        SystemExit: 0 after ``--help``; 2 for a user error or an unknown command; the command's own exit code.
    """
    argv, debug = _split_debug(list(sys.argv[1:] if argv is None else argv))
    if not argv or argv[0] not in COMMANDS:
        try:
            with _flag_errors_raise():
                build_parser().parse_args(argv)  # prints the help and exits, or raises naming the valid commands
        except _ArgumentError as e:
            print(f"hf-msv: error: {e} (`hf-msv --help` lists the commands)", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_USER_ERROR) from None
        return
    if debug:
        os.environ["HF_MSV_DEBUG"] = "1"  # commands that start other processes pass it on
    run_command(argv[0], argv[1:], debug)


if __name__ == "__main__":
    main()
