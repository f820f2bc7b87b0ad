"""`ElicitationSettings`: how answers are elicited from a chain of thought, declared once.

Standard library only: the verifier configs embed it and travel to the Hub as remote code with it. See
`docs/generation.md` for how elicitation runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

ELICITATION_PROMPT = "### Final Answer ### \\boxed"
"""Appended to a (branched) sequence to elicit an answer; the LM continues with ``{...}``."""

MAX_ANSWER_TOKENS = 40
"""The paper's cap on elicited answer tokens: a box still open after this many tokens is "no answer"."""

DEFAULT_DELIMITERS = ("Wait",)
"""The paper's delimiter."""

MODES = ("streaming", "terminal")

# Keys under which configs saved before `ElicitationSettings` stored its fields flat.
_LEGACY_KEYS = {
    "delimiters": "delimiters",
    "every_k_tokens": "every_k_tokens",
    "elicitation_prompt": "prompt",
    "max_answer_tokens": "max_answer_tokens",
    "keep_delimiter": "keep_delimiter",
}


@dataclass(frozen=True)
class ElicitationSettings:
    """Where and how answers are elicited.

    Args:
        mode: ``"streaming"`` (answers at every delimiter and at the end; terminal ones flagged) or ``"terminal"``
            (one answer per sequence, at the end).
        delimiters: text delimiters matched on decoded text, e.g. ``("Wait",)`` or ``("\\n\\n",)``; ``()`` elicits
            only at the end (or every ``every_k_tokens``).
        every_k_tokens: also elicit after every K generated tokens (the delimiter-free variant), or ``None``.
        prompt: appended to a branch to elicit its answer; the LM continues with ``{answer}``.
        max_answer_tokens: cap on answer tokens; a box still open after this many is "no answer".
        keep_delimiter: keep the delimiter in the branch context instead of branching just before it.
        min_gap_tokens: space a chain's answers: a delimiter or every-K step elicits only when at least this many
            chain tokens have passed since the chain's previous elicitation (EOS and the budget end always do), so
            an engine pays for at most one answer per that many tokens; ``None``: no spacing. A verifier is trained
            on one schedule: collect with the spacing it will run under.

    Raises:
        ValueError: for an unknown mode, an empty or non-string delimiter, ``every_k_tokens``,
            ``max_answer_tokens`` or ``min_gap_tokens`` below 1, or an empty prompt.
    """

    mode: str = "streaming"
    delimiters: tuple[str, ...] = DEFAULT_DELIMITERS
    every_k_tokens: int | None = None
    prompt: str = ELICITATION_PROMPT
    max_answer_tokens: int = MAX_ANSWER_TOKENS
    keep_delimiter: bool = False
    min_gap_tokens: int | None = None

    def __post_init__(self):
        delimiters = (self.delimiters,) if isinstance(self.delimiters, str) else tuple(self.delimiters or ())
        object.__setattr__(self, "delimiters", delimiters)
        if self.mode not in MODES:
            raise ValueError(f"unknown elicitation mode {self.mode!r}; use one of {list(MODES)}")
        if any(not isinstance(d, str) or not d for d in delimiters):
            raise ValueError(f"delimiters must be non-empty strings, got {list(delimiters)}")
        if self.every_k_tokens is not None and self.every_k_tokens < 1:
            raise ValueError(f"every_k_tokens must be at least 1, got {self.every_k_tokens}")
        if self.min_gap_tokens is not None and self.min_gap_tokens < 1:
            raise ValueError(f"min_gap_tokens must be at least 1, got {self.min_gap_tokens}")
        if self.max_answer_tokens < 1:
            raise ValueError(f"max_answer_tokens must be at least 1, got {self.max_answer_tokens}")
        if not self.prompt:
            raise ValueError("the elicitation prompt must not be empty")

    def too_soon(self, t: int, previous_tau: int | None) -> bool:
        """Whether the spacing skips a delimiter or every-K elicitation at chain step `t`: the one spacing rule
        (`hf_msv.generation.ElicitationPolicy.fire` on every engine, `hf_msv.collect.respace_problem` on shards).

        Args:
            t: the chain step of the candidate elicitation.
            previous_tau: the step of the chain's previous elicitation, or `None` (none yet).

        Returns:
            True when ``min_gap_tokens`` is set and fewer than that many tokens have passed since `previous_tau`.
        """
        gap = self.min_gap_tokens
        return gap is not None and previous_tau is not None and t - previous_tau < gap

    def replace(self, **overrides) -> ElicitationSettings:
        """A copy with the given fields changed; ``None`` values are ignored (keyword overrides left unset).

        Args:
            **overrides: field names and their new values.

        Returns:
            The new `ElicitationSettings`.
        """
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def to_dict(self) -> dict:
        """JSON-ready fields (delimiters as a list; ``min_gap_tokens`` only when set, so that configs and shards of
        unspaced schedules read the same in versions without it)."""
        out = asdict(self)
        out["delimiters"] = list(self.delimiters)
        if out["min_gap_tokens"] is None:
            del out["min_gap_tokens"]
        return out

    @classmethod
    def from_dict(cls, data: dict | None) -> ElicitationSettings:
        """Settings from `to_dict` output; unknown keys are an error, missing ones take the defaults.

        Args:
            data: the fields as a dict, or `None` (the defaults).

        Returns:
            The `ElicitationSettings`.

        Raises:
            ValueError: for an unknown key or an invalid value.
        """
        data = dict(data or {})
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown elicitation settings {unknown}; valid: {sorted(names)}")
        return cls(**data)

    @classmethod
    def pop_legacy(cls, kwargs: dict) -> dict:
        """Remove and return, renamed, the flat elicitation keys of configs and shards saved before these settings
        existed (``elicitation_prompt`` → ``prompt``; ``delimiters: null`` meant the default, or none next to
        ``every_k_tokens``).

        Args:
            kwargs: a config's or shard's keyword dict; the legacy keys are removed from it in place.

        Returns:
            The found values under their `ElicitationSettings` field names.
        """
        found = {new: kwargs.pop(old) for old, new in _LEGACY_KEYS.items() if old in kwargs}
        found = {k: v for k, v in found.items() if v is not None or k in ("delimiters", "every_k_tokens")}
        if found.get("delimiters", ()) is None:  # "not recorded": the default, unless every k tokens replaced it
            found["delimiters"] = () if found.get("every_k_tokens") else DEFAULT_DELIMITERS
        return found


# `prepare_generation`'s keyword for `ElicitationSettings.prompt` (the collection's flag name).
_ALIASES = {"elicitation_prompt": "prompt"}


def resolve_elicitation(
    verifier_config=None, elicitation: ElicitationSettings | dict | None = None, **overrides
) -> ElicitationSettings:
    """The elicitation settings of a run, on every engine (``generate``, vLLM, trace re-encoding).

    The base is `elicitation`, else the verifier's (``verifier_config.elicitation``), else the defaults; each
    non-`None` override then replaces its field and nothing else, as `dataclasses.replace` and
    ``GenerationConfig.update`` do: ``every_k_tokens=40`` elicits every 40 tokens *and* at the base's delimiters;
    add ``delimiters=()`` for the delimiter-free schedule.

    Args:
        verifier_config: the config of the verifier that will score the answers (`MSVConfig`, `ProbeConfig`), or
            `None`.
        elicitation: `ElicitationSettings`, its `to_dict` form, or `None`.
        **overrides: `ElicitationSettings` fields (``elicitation_prompt`` is accepted for ``prompt``).

    Returns:
        The `ElicitationSettings`.

    Raises:
        ValueError: an unknown field, invalid settings, or a mode other than the verifier's.
    """
    overrides = {_ALIASES.get(name, name): value for name, value in overrides.items()}
    valid = {f.name for f in fields(ElicitationSettings)}
    unknown = sorted(set(overrides) - valid)
    if unknown:
        raise ValueError(f"unknown elicitation settings {unknown}; valid: {sorted(valid | set(_ALIASES))}")
    if elicitation is None:
        elicitation = getattr(verifier_config, "elicitation", None) or ElicitationSettings()
    base = elicitation if isinstance(elicitation, ElicitationSettings) else ElicitationSettings.from_dict(elicitation)
    settings = base.replace(**overrides)
    mode = getattr(verifier_config, "mode", settings.mode)
    if mode != settings.mode:
        raise ValueError(f"the verifier was built for {mode!r} answers but mode={settings.mode!r}.")
    return settings


__all__ = [
    "DEFAULT_DELIMITERS",
    "ELICITATION_PROMPT",
    "MAX_ANSWER_TOKENS",
    "ElicitationSettings",
    "resolve_elicitation",
]
