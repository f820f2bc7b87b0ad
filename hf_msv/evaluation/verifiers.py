"""Loading trained verifiers for evaluation: checkpoints, named entries by mode, ``NAME=PATH`` specs, and training
seeds (several checkpoints of one name: one verifier per training run)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import MissingPathError, NotADirectoryPathError, UserError

__all__ = [
    "verifier_config",
    "load_verifier",
    "VerifierEntry",
    "load_verifiers",
    "load_verifier_seeds",
    "parse_verifier_specs",
]


def verifier_config(path) -> dict[str, Any]:
    """The ``config.json`` of the verifier checkpoint directory `path`. Raises `FileNotFoundError` /
    `NotADirectoryError` naming the path when it is not a checkpoint directory."""
    path = Path(path)
    if not path.exists():
        raise MissingPathError(f"no such verifier directory: {path}")
    if not path.is_dir():
        raise NotADirectoryPathError(f"a verifier is a directory (written by `hf-msv train`), not a file: {path}")
    if not (path / "config.json").is_file():
        raise MissingPathError(
            f"{path} holds no config.json: not a verifier checkpoint (give the --output-dir of `hf-msv train`)"
        )
    try:
        return json.loads((path / "config.json").read_text())
    except ValueError as error:
        raise UserError(f"{path / 'config.json'} is not valid JSON: {error}") from error


def load_verifier(path_or_model):
    """A saved MSV or Probe checkpoint (``model_type`` "msv" / "msv_probe") in eval mode; models pass through.
    Raises `FileNotFoundError` / `ValueError` naming the path when it is not one."""
    if isinstance(path_or_model, torch.nn.Module):
        return path_or_model.eval()
    path = Path(path_or_model)
    model_type = verifier_config(path).get("model_type")
    if model_type == "msv_probe":
        from ..modeling_probe import ProbeVerifier

        return ProbeVerifier.from_pretrained(path).eval()
    if model_type == "msv":
        from ..modeling_msv import MSVVerifier

        return MSVVerifier.from_pretrained(path).eval()
    raise UserError(f"{path} holds a {model_type!r} model, not an MSV or Probe verifier")


@dataclass(eq=False)
class VerifierEntry:
    """One named verifier: its checkpoints by mode and what it is (Probe, MSV₁ = single-sequence; MSV_M)."""

    name: str
    models: dict = field(default_factory=dict)  # mode -> model
    kind: str = "msv"  # "msv" | "probe"
    num_sequences: int = 1  # M (1 for the Probe)

    @property
    def single_sequence(self) -> bool:
        return self.kind == "probe" or self.num_sequences == 1

    def model_for(self, setting: str):
        """(model, mode it runs in) for a setting, or (None, None) when this verifier does not take part."""
        if setting in self.models:
            return self.models[setting], setting
        if setting == "terminal" and "streaming" in self.models:
            return self.models["streaming"], "streaming"
        return None, None


def load_verifiers(verifiers: Mapping) -> list[VerifierEntry]:
    """`VerifierEntry`s of name -> checkpoint (or model), or name -> {"terminal": ..., "streaming": ...}; each
    checkpoint's mode is read from its config and must match the declared one."""
    out = []
    for name, spec in verifiers.items():
        specs = spec if isinstance(spec, Mapping) else {None: spec}
        entry = VerifierEntry(name)
        for declared, target in specs.items():
            model = load_verifier(target)
            config: Any = model.config  # an MSVConfig or ProbeConfig (a module passed in carries its own)
            mode = config.mode
            if declared is not None and declared != mode:
                raise UserError(f"verifier {name!r}: the {declared!r} checkpoint was trained in {mode!r} mode")
            if mode in entry.models:
                raise UserError(f"verifier {name!r} has two {mode} checkpoints")
            kind = "probe" if config.model_type == "msv_probe" else "msv"
            m = 1 if kind == "probe" else int(config.num_sequences)
            if entry.models and (kind, m) != (entry.kind, entry.num_sequences):
                raise UserError(f"verifier {name!r} mixes checkpoints of different kinds or sizes")
            entry.models[mode], entry.kind, entry.num_sequences = model, kind, m
        out.append(entry)
    return out


def load_verifier_seeds(verifiers: Mapping) -> list[list[VerifierEntry]]:
    """One `load_verifiers` list per training seed.

    A name maps to one spec (a checkpoint, a model or ``{"terminal": ..., "streaming": ...}``) or to a list of them,
    one per training seed. Every name with several seeds must have the same number R; a name with one is shared by
    all R seeds (loaded once). Returns R lists of entries, in the order of `verifiers`.
    """
    per_name = {k: list(v) if isinstance(v, (list, tuple)) else [v] for k, v in verifiers.items()}
    counts = {len(v) for v in per_name.values() if len(v) > 1}
    if len(counts) > 1:
        raise UserError(
            f"every verifier with several training seeds needs the same number of them, got "
            f"{ {k: len(v) for k, v in per_name.items()} }"
        )
    if any(len(v) == 0 for v in per_name.values()):
        raise UserError("a verifier name without a checkpoint")
    r = counts.pop() if counts else 1
    loaded = {k: [load_verifiers({k: spec})[0] for spec in v] for k, v in per_name.items()}
    return [[v[s] if len(v) > 1 else v[0] for v in loaded.values()] for s in range(r)]


def parse_verifier_specs(specs: Sequence[str]) -> dict[str, dict[str, str] | list[dict[str, str]]]:
    """``NAME=PATH`` items -> the `verifiers` mapping of `load_verifier_seeds`. Repeat a NAME for its terminal and
    streaming checkpoints; a NAME whose mode is given again is another training seed (seeds are filled in order:
    a checkpoint joins the first seed of that name lacking its mode). One seed: name -> {mode: path}; several:
    name -> [{mode: path}, ...]."""
    out: dict[str, list[dict[str, str]]] = {}
    for spec in specs:
        name, path = spec.split("=", 1) if "=" in spec else ("", "")
        if not name or not path:
            raise UserError(f"--verifier takes NAME=PATH, got {spec!r}")
        try:
            mode = verifier_config(path).get("mode", "streaming")
        except (OSError, ValueError) as error:
            raise type(error)(f"--verifier {spec}: {error}") from error
        seeds = out.setdefault(name, [])
        slot = next((s for s in seeds if mode not in s), None)
        if slot is None:
            seeds.append(slot := {})
        slot[mode] = path
    return {k: v[0] if len(v) == 1 else v for k, v in out.items()}
