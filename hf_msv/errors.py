"""User errors: `UserError` and its kinds, and `check_checkpoint_dir` (a local path that is no checkpoint says so).

Every input check a user can trigger (a flag, a path, a file's content, a model that hf_msv does not support) raises
a `UserError`, which ``hf-msv`` reports as one line on stderr with exit code 2 (``--debug`` shows the traceback).
Any other exception is an internal error and keeps its traceback. The kinds also derive from the built-in exception
that says what went wrong, so callers can catch them either way:

    UserError(ValueError)                                     a bad flag value, file content or mix of settings
    ├── MissingPathError(FileNotFoundError, UserError)        no such file or directory, or it lacks a file it needs
    ├── NotADirectoryPathError(NotADirectoryError, UserError) a file where a directory is needed
    ├── UnsupportedError(UserError, NotImplementedError)      a model, cache or setting hf_msv does not support
    └── FlagError(UserError)                                  a flag the command's parser refused

Bottom layer: standard library only.
"""

from __future__ import annotations

import errno
import os
from contextvars import ContextVar
from pathlib import Path


class UserError(ValueError):
    """A user mistake with a message that says what is wrong and what to do instead."""


class MissingPathError(FileNotFoundError, UserError):
    """A path the user gave does not exist, or lacks a file it must hold.

    Takes `FileNotFoundError`'s arguments: ``(errno.ENOENT, reason, path)``, or one message.
    """


class NotADirectoryPathError(NotADirectoryError, UserError):
    """A path the user gave is a file where a directory is needed (``(errno.ENOTDIR, reason, path)``)."""


class UnsupportedError(UserError, NotImplementedError):
    """A model, cache or setting that hf_msv does not support: the message names it, why, and what works instead."""


class FlagError(UserError):
    """A flag the command's parser refused (unknown, missing, or a value of the wrong type), raised where argparse
    would print its usage and exit (``hf-msv`` adds where the flags are listed)."""


RAISE_FLAG_ERRORS: ContextVar[bool] = ContextVar("hf_msv_raise_flag_errors", default=False)
"""Whether a command's parser (`hf_msv.arguments.CommandParser`) raises `FlagError` for a refused flag, as it does
while ``hf-msv`` runs the command (one line on stderr), or prints argparse's usage and exits 2, as it does for a
command's ``main`` called directly."""


def looks_like_path(name: str) -> bool:
    """Whether ``name`` can only be a local path, never a Hub id (``namespace/repo_name``): it exists, is absolute,
    starts with ``.``, ``~`` or a separator, or has more than one ``/`` (or any ``os.sep`` that is not ``/``)."""
    name = str(name)
    if os.path.exists(os.path.expanduser(name)):
        return True
    return (
        name.startswith((".", "~", "/", os.sep))
        or os.path.isabs(name)
        or name.count("/") > 1
        or (os.sep != "/" and os.sep in name)
    )


def check_checkpoint_dir(name: str | os.PathLike, what: str, required: str | None = "config.json") -> Path | None:
    """Check a local checkpoint directory before anything loads it.

    Args:
        name: a local directory, or anything else (a Hub id, a named LM) that is left alone.
        what: what it should hold, for the messages (``"LM"``, ``"verifier"``).
        required: a file the directory must hold; ``None``: any directory.

    Returns:
        The directory (``~`` expanded), or ``None`` when ``name`` is not a local path (`looks_like_path`).

    Raises:
        MissingPathError: no such directory, or it lacks ``required`` (a `FileNotFoundError`).
        NotADirectoryPathError: ``name`` is a file (a `NotADirectoryError`).
    """
    if not looks_like_path(str(name)):
        return None
    path = Path(os.path.expanduser(str(name)))
    if not path.exists():
        raise MissingPathError(errno.ENOENT, f"No such {what} directory", str(path))
    if not path.is_dir():
        raise NotADirectoryPathError(
            errno.ENOTDIR, f"Not a directory; the {what} must be a checkpoint directory", str(path)
        )
    if required is not None and not (path / required).is_file():
        raise MissingPathError(
            errno.ENOENT,
            f"No {required} in the {what} directory (not a checkpoint written by save_pretrained)",
            str(path),
        )
    return path


__all__ = [
    "FlagError",
    "MissingPathError",
    "NotADirectoryPathError",
    "RAISE_FLAG_ERRORS",
    "UnsupportedError",
    "UserError",
    "check_checkpoint_dir",
    "looks_like_path",
]
