"""Input checks of the vLLM controller: elicitation settings, tokenizer coverage of delimiters, verifier width."""

from __future__ import annotations

from collections.abc import Sequence

from ..configuration_msv import ElicitationSettings

__all__ = ["check_delimiters", "resolve_elicitation"]


def resolve_elicitation(verifier, elicitation: ElicitationSettings | None, **overrides) -> ElicitationSettings:
    """The settings of a run: `elicitation`, else the verifier's, else the defaults, with the non-`None`
    `overrides` (fields of `ElicitationSettings`) applied.

    Raises:
        ValueError: an unknown field, or settings that disagree with the verifier's mode.
    """
    unknown = sorted(set(overrides) - set(ElicitationSettings.__dataclass_fields__))
    if unknown:
        raise ValueError(f"unknown elicitation settings {unknown}; valid: "
                         f"{sorted(ElicitationSettings.__dataclass_fields__)}")
    vconfig = verifier.config if verifier is not None else None
    if elicitation is None:
        elicitation = getattr(vconfig, "elicitation", None) or ElicitationSettings()
    if isinstance(elicitation, dict):
        elicitation = ElicitationSettings.from_dict(elicitation)
    if overrides.get("delimiters") is not None and isinstance(overrides["delimiters"], str):
        overrides["delimiters"] = (overrides["delimiters"],)
    settings = elicitation.replace(**overrides)
    if vconfig is not None and getattr(vconfig, "mode", settings.mode) != settings.mode:
        raise ValueError(f"the verifier was built for {vconfig.mode!r} answers but mode={settings.mode!r}.")
    return settings


def check_delimiters(tokenizer, delimiters: Sequence[str]) -> None:
    """Raise ValueError for a delimiter the tokenizer cannot produce (its text does not survive encode → decode,
    e.g. a character outside the vocabulary), which could never fire."""
    for delimiter in delimiters:
        ids = tokenizer(delimiter, add_special_tokens=False)["input_ids"]
        text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        unknown = tokenizer.unk_token_id is not None and tokenizer.unk_token_id in ids
        if not ids or unknown or delimiter not in text:
            raise ValueError(f"the tokenizer cannot express the delimiter {delimiter!r} (encodes to {ids}, decodes "
                             f"to {text!r}): it would never fire.")
