"""Named LMs: LMs that `load_lm`, problem specs and prompt templates know by a short name.

Any package can register one, directly with `register_lm` or through an entry point in the group ``hf_msv.lms``
(a callable run once, on the first lookup, that calls `register_lm`). hf_msv's own testbed registers ``testbed``
(alias ``testbed-v2``) that way, so collection and evaluation never import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path

ENTRY_POINT_GROUP = "hf_msv.lms"


@dataclass(frozen=True)
class NamedLM:
    """An LM known by name.

    Args:
        name: what ``--model``, ``load_lm`` and problem specs (``<name>:<split>:<n>[:<seed>]``) call it.
        path: a directory that ``AutoModelForCausalLM`` / ``AutoTokenizer`` load.
        prompt: its prompt format, ``Problem -> str``; used when the prompt template is ``"auto"`` or the name.
        max_new_tokens: the default sampling budget (e.g. the length cap it was trained at), or `None` for 4096.
        problems: ``(split, n, seed) -> list[Problem]`` for problem specs, or `None` if it has none.
        missing_hint: appended to the error when `path` holds no checkpoint (e.g. how to train one).
        aliases: other names for it.
    """

    name: str
    path: Path
    prompt: Callable[..., str | list] | None = None
    max_new_tokens: int | None = None
    problems: Callable | None = None
    missing_hint: str = ""
    aliases: tuple[str, ...] = field(default=())


_REGISTRY: dict[str, NamedLM] = {}
_entry_points_loaded = False


def register_lm(lm: NamedLM) -> None:
    """Make `lm` known under its name and aliases (a later registration of a name replaces the earlier one).

    Args:
        lm: the `NamedLM` to register.
    """
    for name in (lm.name, *lm.aliases):
        _REGISTRY[name] = lm


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        entry.load()()


def get_named_lm(name) -> NamedLM | None:
    """The LM registered as `name`, or `None` (also for anything that is not a string).

    Args:
        name: a registered name or alias (entry points are loaded on the first miss).

    Returns:
        The `NamedLM`, or `None`.
    """
    if not isinstance(name, str):
        return None
    if name not in _REGISTRY:
        _load_entry_points()
    return _REGISTRY.get(name)


def named_lms() -> list[str]:
    """Every registered name, aliases included, sorted."""
    _load_entry_points()
    return sorted(_REGISTRY)


__all__ = ["ENTRY_POINT_GROUP", "NamedLM", "get_named_lm", "named_lms", "register_lm"]
