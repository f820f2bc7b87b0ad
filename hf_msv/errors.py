"""User errors: `UserError`, and `check_checkpoint_dir` (a local checkpoint path that is not one says so).

``hf-msv`` reports these, like other `OSError` and `ValueError` from input checks, as one line on stderr with exit
code 2 (``--debug`` shows the traceback). Bottom layer: standard library only.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


class UserError(Exception):
    """A user mistake with a message that says what is wrong and what to do instead."""


def looks_like_path(name: str) -> bool:
    """Whether ``name`` can only be a local path, never a Hub id (``namespace/repo_name``): it exists, is absolute,
    starts with ``.``, ``~`` or a separator, or has more than one ``/`` (or any ``os.sep`` that is not ``/``)."""
    name = str(name)
    if os.path.exists(os.path.expanduser(name)):
        return True
    return (name.startswith((".", "~", "/", os.sep)) or os.path.isabs(name) or name.count("/") > 1
            or (os.sep != "/" and os.sep in name))


def check_checkpoint_dir(name: str | os.PathLike, what: str, required: str | None = "config.json") -> Path | None:
    """Check a local checkpoint directory before anything loads it.

    Args:
        name: a local directory, or anything else (a Hub id, a named LM) that is left alone.
        what: what it should hold, for the messages (``"LM"``, ``"verifier"``).
        required: a file the directory must hold; ``None``: any directory.

    Returns:
        The directory (``~`` expanded), or ``None`` when ``name`` is not a local path (`looks_like_path`).

    Raises:
        FileNotFoundError: no such directory, or it lacks ``required``.
        NotADirectoryError: ``name`` is a file.
    """
    if not looks_like_path(str(name)):
        return None
    path = Path(os.path.expanduser(str(name)))
    if not path.exists():
        raise FileNotFoundError(errno.ENOENT, f"No such {what} directory", str(path))
    if not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"Not a directory; the {what} must be a checkpoint directory",
                                 str(path))
    if required is not None and not (path / required).is_file():
        raise FileNotFoundError(errno.ENOENT, f"No {required} in the {what} directory (not a checkpoint written by "
                                "save_pretrained)", str(path))
    return path


__all__ = ["UserError", "check_checkpoint_dir", "looks_like_path"]
